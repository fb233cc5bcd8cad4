"""Assembles and runs the server: repository, gRPC (aio) with health and reflection, metrics,
and (with `health_port`) a plaintext health-only port for probes (`front.process.health_port`).

In-process use (tests, benchmarks):

    with start_background_server(load_settings({"port": 0, "metrics_port": 0})) as running:
        channel = grpc.insecure_channel(f"localhost:{running.port}")

`serve(settings)` is what `lmserve serve` runs: SIGHUP reloads the model repository
(`front.process.reloading`); it starts, waits for SIGTERM/SIGINT and stops
gracefully: health goes NOT_SERVING at once, RPCs are still served for `shutdown_notice_seconds`
(load balancers notice), then new RPCs are refused and in-flight ones get `grace_period_seconds`
to finish; it exits when the last one ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING

from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from lmserve.server.front.api.auth import configured_token, server_credentials
from lmserve.server.front.api.health import SERVICE_NAME, HealthServicer, publish_health
from lmserve.server.front.api.http.front import HttpFront, HypercornFront
from lmserve.server.front.api.http.site import start_http_front
from lmserve.server.front.api.observe import server_interceptors
from lmserve.server.front.api.reflection import enable_reflection
from lmserve.server.front.api.servicer import LanguageModelServicer
from lmserve.server.front.models.served_models import ServedModels
from lmserve.server.front.process.engine_choice import choose_engines
from lmserve.server.front.process.extra_fronts import ExtraFronts
from lmserve.server.front.process.health_port import start_health_server
from lmserve.server.front.process.ports import bind, check_bindable
from lmserve.server.front.process.reloading import Reloader
from lmserve.server.front.workers.directory import WorkerDirectory
from lmserve.server.front.workers.pool import WorkerPool
from lmserve.server.long_lived import freeze_long_lived
from lmserve.server.metrics import Metrics, serve_metrics
from lmserve.server.registry.repository import (
    LoadOptions,
    ModelEntry,
    ModelRepository,
    ModelState,
)
from lmserve.server.registry.rescan import RepositoryScanner, RescanResult
from lmserve.server.settings import Settings
from lmserve.server.worker.limits import EngineLimits
from lmserve.v1 import lm_service_pb2 as pb
from lmserve.v1 import lm_service_pb2_grpc

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

log = logging.getLogger(__name__)


@dataclass
class RunningServer:
    """A started server: its bound ports and what `stop` must shut down."""

    server: aio.Server
    port: int
    metrics: Metrics
    health: HealthServicer
    models: ServedModels
    reloader: Reloader
    # The engine worker processes (None with `engine_workers: false`).
    workers: WorkerPool | None = None
    # The HTTP front (None with `http_enabled: false`).
    http: HttpFront | HypercornFront | None = None
    # The other front processes (`fronts: N`; None with one front).
    fronts: ExtraFronts | None = None
    metrics_port: int | None = None
    health_port: int | None = None
    _health_server: aio.Server | None = field(default=None, repr=False)
    _poller: asyncio.Task[None] | None = field(default=None, repr=False)
    _metrics_httpd: WSGIServer | None = None
    _stopped: bool = field(default=False, repr=False)
    _hurry: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    async def stop(self, grace: float | None, *, notice: float = 0.0) -> None:
        """Health goes NOT_SERVING; RPCs are still served for `notice` seconds; then new ones
        are refused and in-flight ones get `grace` seconds (returns when the last one ends)."""
        if self._stopped:
            return
        self._stopped = True
        if self._poller is not None:
            self._poller.cancel()
        await self.health.enter_graceful_shutdown()
        if notice > 0:
            log.info("health NOT_SERVING; still serving for %.1f s", notice)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._hurry.wait(), notice)
        grace = 0 if self._hurry.is_set() else grace
        if self.fronts is not None:  # they drain their own calls meanwhile
            self.fronts.stop()
        if self.http is not None:
            await asyncio.gather(self.server.stop(grace), self.http.stop(grace))
        else:
            await self.server.stop(grace)
        if self._health_server is not None:  # answered NOT_SERVING until the main port closed
            await self._health_server.stop(0)
        # Model threads stop after the pass or step in flight; that is waited for (bounded), so
        # no native model code runs on while the interpreter shuts down (it aborted, SIGABRT).
        self.models.close()
        await asyncio.to_thread(self.models.join, 5.0)
        if self.fronts is not None:
            await asyncio.to_thread(self.fronts.join, 5.0)
        if self._metrics_httpd is not None:
            self._metrics_httpd.shutdown()
            self._metrics_httpd.server_close()

    @property
    def repository(self) -> ModelRepository:
        """The repository served now (a reload replaces it)."""
        return self.models.repository

    async def reload(self) -> RescanResult:
        """Rescans the model repository and serves what changed (`front.process.reloading`);
        then the other fronts do the same, with the workers this one started."""
        result = await self.reloader.reload()
        if self.fronts is not None:
            self.fronts.reload()
        return result

    async def hurry(self) -> None:
        """Ends a `stop` in progress now: no more notice, in-flight RPCs cancelled (a second
        SIGTERM or Ctrl-C)."""
        self._hurry.set()
        if self.http is not None:
            self.http.hurry()
        if self._stopped:
            await self.server.stop(0)  # a smaller grace than the running stop's wins


def load_repository(settings: Settings, metrics: Metrics | None = None) -> ModelRepository:
    """Loads every model of `settings.model_repository`, recording load metrics."""

    def on_loaded(entry: ModelEntry) -> None:
        if metrics is not None and entry.state is ModelState.READY:
            metrics.model_load_seconds.labels(model=entry.name).set(entry.load_seconds)

    return ModelRepository.load(
        settings.model_repository, on_loaded=on_loaded, options=front_load_options(settings)
    )


def front_load_options(settings: Settings) -> LoadOptions:
    """How the front reads the repository: with engine workers, the vocabularies, codecs and
    manifests only (each worker loads its model's weights); in-process engines, everything."""
    options = LoadOptions.from_settings(settings)
    return options.without_weights() if settings.engine_workers else options


@dataclass(frozen=True)
class OtherFront:
    """This process is front number `index` (> 0) of `fronts: N`: it serves gRPC on the first
    front's port, with the workers that front started (found through `directory`)."""

    index: int
    directory: WorkerDirectory


async def start_server(
    settings: Settings,
    *,
    registry: CollectorRegistry | None = None,
    repository: ModelRepository | None = None,
    other_front: OtherFront | None = None,
) -> RunningServer:
    """Loads the models (unless given), binds, and starts serving. Port 0 picks a free port.

    A port in use (or any failed bind) is an OSError that names the address. With `fronts: N`
    it then starts the other fronts (`extra_fronts`), which share the port."""
    first_front = other_front is None
    if first_front:
        check_bindable(settings.host, settings.port)  # before minutes of model loading
    if settings.metrics_enabled:
        check_bindable(settings.metrics_host, settings.metrics_port)
    if settings.health_port:
        check_bindable(settings.health_host, settings.health_port)
    if settings.http_enabled:
        check_bindable(settings.host, settings.http_port)
    credentials = server_credentials(settings)
    token = configured_token(settings)
    metrics = Metrics(registry if registry is not None else CollectorRegistry())
    front_index = 0 if other_front is None else other_front.index
    interceptors = server_interceptors(settings, metrics, token, front_index)
    # Fingerprinted before loading: a folder changed while the models load is reloaded later.
    root = repository.root if repository is not None else settings.model_repository
    scanner = await asyncio.to_thread(RepositoryScanner, root, front_load_options(settings))
    if repository is None:
        repository = await asyncio.to_thread(load_repository, settings, metrics)
    else:
        for entry in repository.entries():
            if entry.state is ModelState.READY:
                metrics.model_load_seconds.labels(model=entry.name).set(entry.load_seconds)

    options = [
        ("grpc.max_receive_message_length", settings.max_message_bytes),
        ("grpc.max_send_message_length", settings.max_message_bytes),
        # gRPC sets SO_REUSEPORT by default: a second server on a taken port would bind too and
        # share the traffic silently. Refused, the second one fails (check_bindable says why),
        # unless this server's own fronts share it (`fronts: N`).
        ("grpc.so_reuseport", 1 if settings.fronts > 1 else 0),
    ]
    if settings.max_connection_age_seconds:
        # Clients reconnect (and re-resolve) after this, so new replicas get traffic.
        age_ms = int(settings.max_connection_age_seconds * 1000)
        options += [
            ("grpc.max_connection_age_ms", age_ms),
            ("grpc.max_connection_age_grace_ms", int(settings.grace_period_seconds * 1000)),
        ]
    server = aio.server(
        interceptors=interceptors,
        options=options,
        maximum_concurrent_rpcs=settings.max_concurrent_rpcs,
    )
    health = HealthServicer()
    limits = EngineLimits.from_settings(settings)
    directory = None
    if other_front is not None:
        directory = other_front.directory
    elif settings.fronts > 1:
        directory = WorkerDirectory.create()
    engines, workers = choose_engines(
        settings, limits, metrics, health, directory, remote=not first_front
    )
    # Blocking: each worker loads its model (all at once) before the port opens.
    models = await asyncio.to_thread(ServedModels, repository, limits, metrics, engines)
    for state in ModelState:  # a model whose worker could not load it counts as failed
        count = sum(e.state is state for e in models.entries())
        metrics.models.labels(state=state.value).set(count)
    servicer = LanguageModelServicer(models, metrics)
    # The generated grpc module has no annotations (`make proto` writes no stubs for it).
    lm_service_pb2_grpc.add_LanguageModelServiceServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    await publish_health(health, models.entries())
    freeze_long_lived()  # models and gRPC are loaded: later full collections skip them
    enable_reflection(  # v1 and v1alpha
        server,
        (
            pb.DESCRIPTOR.services_by_name["LanguageModelService"].full_name,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
        ),
    )
    try:
        port = bind(server, f"{settings.host}:{settings.port}", credentials)
    except OSError:
        models.close()  # its worker threads would outlive a failed start
        raise
    await server.start()
    running = RunningServer(
        server, port, metrics, health, models, Reloader(models, health, metrics, scanner), workers
    )
    if not first_front:
        log.info("front %d serving on %s:%d", front_index, settings.host, port)
        return running
    if directory is not None:
        running.fronts = ExtraFronts(settings, port, directory)
        await running.fronts.start()
    if settings.metrics_enabled:
        try:
            httpd, running.metrics_port = serve_metrics(
                metrics.registry, settings.metrics_host, settings.metrics_port
            )
        except OSError as exc:  # taken since check_bindable looked
            await server.stop(None)
            models.close()
            address = f"{settings.metrics_host}:{settings.metrics_port}"
            raise OSError(f"cannot bind {address} (metrics): {exc.strerror or exc}") from None
        running._metrics_httpd = httpd
        log.info("metrics on http://%s:%d/metrics", settings.metrics_host, running.metrics_port)
    if settings.http_enabled:
        try:
            running.http = await start_http_front(settings, servicer, health, metrics, token)
        except OSError:  # taken since check_bindable looked
            await running.stop(None)
            raise
    if settings.health_port:
        address = f"{settings.health_host}:{settings.health_port}"
        try:
            running._health_server, running.health_port = await start_health_server(health, address)
        except OSError:  # taken since check_bindable looked
            await running.stop(None)
            raise
        log.info(
            "health on %s:%d (plaintext, grpc.health.v1 only)",
            settings.health_host,
            running.health_port,
        )
    if settings.reload_poll_seconds:
        running._poller = asyncio.create_task(running.reloader.poll(settings.reload_poll_seconds))
    ready = sum(e.state is ModelState.READY for e in models.entries())
    log.info(
        "lmserve serving %s on %s:%d (%d of %d models ready%s%s)",
        SERVICE_NAME,
        settings.host,
        port,
        ready,
        len(repository.entries()),
        "" if credentials is None else (", mTLS" if settings.tls_client_ca_file else ", TLS"),
        ", bearer-token auth" if token is not None else "",
    )
    return running


async def serve(settings: Settings) -> None:
    """Runs until SIGTERM or SIGINT, then shuts down gracefully."""
    running = await start_server(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    reloads: set[asyncio.Task[RescanResult]] = set()  # held, so they are not collected mid-reload

    def on_sighup() -> None:
        log.info("SIGHUP: reloading the model repository")
        task = asyncio.create_task(running.reload())
        reloads.add(task)
        task.add_done_callback(reload_done(reloads))

    loop.add_signal_handler(signal.SIGHUP, on_sighup)
    await stop.wait()
    log.info(
        "shutting down: %.1f s notice, then %.1f s for in-flight requests (signal again: now)",
        settings.shutdown_notice_seconds,
        settings.grace_period_seconds,
    )
    stop.clear()
    stopping = asyncio.create_task(
        running.stop(settings.grace_period_seconds, notice=settings.shutdown_notice_seconds)
    )
    again = asyncio.create_task(stop.wait())
    await asyncio.wait((stopping, again), return_when=asyncio.FIRST_COMPLETED)
    if not stopping.done():
        log.warning("second signal: stopping now, cancelling in-flight requests")
        await running.hurry()
    again.cancel()
    await stopping
    log.info("stopped")


def reload_done(
    tasks: set[asyncio.Task[RescanResult]],
) -> Callable[[asyncio.Task[RescanResult]], None]:
    """A reload task's callback: forgets the task, logs a failed reload."""

    def done(task: asyncio.Task[RescanResult]) -> None:
        tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("repository reload failed: %s", task.exception())

    return done


class BackgroundServer:
    """A server on its own event loop in a daemon thread, for sync tests and benchmarks."""

    def __init__(
        self,
        settings: Settings,
        *,
        registry: CollectorRegistry | None = None,
        repository: ModelRepository | None = None,
    ) -> None:
        self.settings = settings
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(
            start_server(settings, registry=registry, repository=repository), self._loop
        )
        try:
            self.running: RunningServer = future.result()
        except BaseException:
            self._close_loop()
            raise

    @property
    def port(self) -> int:
        return self.running.port

    @property
    def metrics_port(self) -> int | None:
        return self.running.metrics_port

    @property
    def health_port(self) -> int | None:
        return self.running.health_port

    @property
    def http_port(self) -> int | None:
        return None if self.running.http is None else self.running.http.port

    @property
    def address(self) -> str:
        return f"localhost:{self.port}"

    def reload(self, timeout: float = 60.0) -> RescanResult:
        """Rescans the repository now (what SIGHUP does) and returns what changed."""
        return asyncio.run_coroutine_threadsafe(self.running.reload(), self._loop).result(timeout)

    def stop(self, grace: float | None = None) -> None:
        if not self._loop.is_closed():
            asyncio.run_coroutine_threadsafe(self.running.stop(grace), self._loop).result()
            self._close_loop()

    def _close_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> BackgroundServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def start_background_server(
    settings: Settings,
    *,
    registry: CollectorRegistry | None = None,
    repository: ModelRepository | None = None,
) -> BackgroundServer:
    """Starts a server in a background thread; use as a context manager or call `stop()`."""
    return BackgroundServer(settings, registry=registry, repository=repository)


__all__ = [
    "BackgroundServer",
    "RunningServer",
    "load_repository",
    "serve",
    "start_background_server",
    "start_server",
]
