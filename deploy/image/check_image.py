"""Runs the built image as an operator would and checks it from outside (`make image-test`).

    python deploy/image/check_image.py [IMAGE] [--base BASE] [--gpu-image]

With the models baked into the image, then with a model folder mounted over `/models`, then
as three replicas behind one client (round_robin over its address list), one of them killed
under a Score loop: no call may fail. Each run starts the image's own entrypoint as the
image's user and checks, from this host: gRPC health, ListModels, Score on kjv-5gram equal to
KenLM's on the repository's ARPA of that model (models/kjv-5gram, from `make models`; the image
bakes only the binary, which must be byte-identical to the repository's), a Generate stream,
the Prometheus scrape and the HTTP health, then SIGTERM: the server drains and exits 0. Prints
JSON lines (image size, the layers over the base, seconds to SERVING, the replicas' calls) and
exits non-zero on the first failed check.

--gpu-image checks the GPU image (deploy/Dockerfile.gpu, `make image-gpu-test`) with what needs no
GPU: inside the image, ONNX Runtime lists the CUDA execution provider and the provider's shared
library resolves every library it links (ldd with the image's linker paths) except the driver's
libcuda.so.1, which the NVIDIA container toolkit mounts at run time; then the baked models run
alone (on the CPU provider where there is no device). No mounted folder, no replicas.

Containers are run with podman or docker when they can start one here; where they cannot
(this VM: `crun: setrlimit RLIMIT_NOFILE: Operation not permitted`), the entrypoint runs in the
image's root filesystem with `buildah run --isolation chroot`, as the image's user, on the
host's network.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import psutil
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lmserve.client import GeneratedToken, GenerationFinished, LmServeClient

REPO = Path(__file__).resolve().parents[2]
# The repository's kjv-5gram (`make models`), trained as the image's build stage trains the baked
# one: its ARPA is KenLM's reference, and its binary must be the one the image serves.
REFERENCE = REPO / "models" / "kjv-5gram"
IMAGE_NGRAM = "/opt/lmserve/models/kjv-5gram"
SHIPPED = ["kjv-5gram", "kjv-ffnn", "kjv-gru", "kjv-lstm", "kjv-lstm-5gram"]
IMAGE_USER = 10001
LOCAL_BASE = "localhost/lmserve-base:bookworm"  # deploy/image/make_base.sh
OFFICIAL_BASE = "python:3.11.14-slim-bookworm"
LOCAL_CUDA_BASE = "localhost/lmserve-cuda-base:bookworm"  # deploy/image/Containerfile.cuda-base
OFFICIAL_CUDA_BASE = "nvidia/cuda:12.6.3-cudnn-runtime-ubuntu24.04"
# The driver's libraries: never in an image, mounted by the NVIDIA container toolkit.
DRIVER_LIBRARIES = {"libcuda.so.1", "libnvidia-ml.so.1"}
TEXTS = [
    "in the beginning god created the heaven and the earth",
    "and the lord spake unto moses saying",
    "blessed are the poor in spirit for theirs is the kingdom of heaven",
]


class CheckFailed(Exception):
    pass


def check(ok: bool, what: str) -> None:
    if not ok:
        raise CheckFailed(what)
    print(f"  ok: {what}", file=sys.stderr)


def emit(name: str, value: float, unit: str, **extra: Any) -> None:
    print(json.dumps({"name": name, "value": value, "unit": unit, **extra}), flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def sh(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


class Runner:
    """Starts the image's entrypoint with extra environment and mounts; stops it with SIGTERM."""

    def __init__(self, image: str, tool: str | None = None) -> None:
        self.image = image
        self.tool = tool or self._container_tool()
        config: dict[str, Any] = {}
        if self.tool == "buildah":
            config = json.loads(sh("buildah", "inspect", "--type", "image", image))["OCIv1"]
            config = config["config"]
        self.entrypoint: list[str] = (config.get("Entrypoint") or []) + (config.get("Cmd") or [])
        self.ctr = ""
        self.proc: subprocess.Popen[bytes] | None = None

    def _container_tool(self) -> str:
        for tool in ("podman", "docker"):
            try:
                probe = subprocess.run(
                    [tool, "run", "--rm", "--entrypoint", "true", self.image],
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
            except (OSError, subprocess.TimeoutExpired):
                continue
            if probe.returncode == 0:
                return tool
            print(
                f"{tool} cannot start a container here: {probe.stderr.strip()[-200:]}",
                file=sys.stderr,
            )
        return "buildah"

    def start(self, env: dict[str, str], volumes: list[str], log: Path) -> None:
        flags = [f"--env={k}={v}" for k, v in env.items()] + [f"--volume={v}" for v in volumes]
        if self.tool == "buildah":
            self.ctr = sh("buildah", "from", self.image)
            cmd = [
                "buildah",
                "run",
                "--isolation",
                "chroot",
                *flags,
                self.ctr,
                "--",
                *self.entrypoint,
            ]
        else:
            self.ctr = f"lmserve-check-{os.getpid()}"
            cmd = [
                self.tool,
                "run",
                "--rm",
                "--name",
                self.ctr,
                "--network",
                "host",
                *flags,
                self.image,
            ]
        print("$ " + " ".join(cmd), file=sys.stderr)
        self.proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT)

    def server(self) -> psutil.Process:
        """The entrypoint's process (under buildah's chroot helpers)."""
        assert self.proc is not None
        for child in psutil.Process(self.proc.pid).children(recursive=True):
            cmdline = " ".join(child.cmdline())
            if "python" in os.path.basename(child.cmdline()[0]) and "serve" in cmdline:
                return child
        raise CheckFailed("the server process is not running")

    def kill(self) -> None:
        """SIGKILL to the entrypoint: a replica dying mid-request."""
        if self.tool == "buildah":
            self.server().send_signal(signal.SIGKILL)
        else:
            subprocess.run([self.tool, "kill", "--signal", "KILL", self.ctr], check=False)

    def stop(self) -> int:
        """SIGTERM to the entrypoint, as a container runtime's stop sends it; its exit code."""
        assert self.proc is not None
        if self.tool == "buildah":
            self.server().send_signal(signal.SIGTERM)
        else:
            subprocess.run([self.tool, "kill", "--signal", "TERM", self.ctr], check=False)
        code = self.proc.wait(timeout=60)
        if self.tool == "buildah":
            subprocess.run(["buildah", "rm", self.ctr], check=False, capture_output=True)
        return code

    def run_once(self, *argv: str) -> subprocess.CompletedProcess[str]:
        """A command in a fresh container of the image, as its user, with its environment."""
        if self.tool == "buildah":
            ctr = sh("buildah", "from", self.image)
            try:
                cmd = ["buildah", "run", "--isolation", "chroot", ctr, "--", *argv]
                return subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            finally:
                subprocess.run(["buildah", "rm", ctr], check=False, capture_output=True)
        cmd = [self.tool, "run", "--rm", "--entrypoint", argv[0], self.image, *argv[1:]]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=300)

    def read_file(self, path: str) -> bytes:
        """A file of the image (its filesystem mounted, or copied out of a container)."""
        if self.tool == "docker":
            with tempfile.TemporaryDirectory() as tmp:
                ctr = sh("docker", "create", self.image)
                try:
                    sh("docker", "cp", f"{ctr}:{path}", f"{tmp}/f")
                    return Path(tmp, "f").read_bytes()
                finally:
                    sh("docker", "rm", ctr)
        ctr = sh("buildah", "from", self.image)
        try:
            return (Path(sh("buildah", "mount", ctr)) / path.lstrip("/")).read_bytes()
        finally:
            subprocess.run(["buildah", "rm", ctr], check=False, capture_output=True)


def wait_serving(target: str, started: float, deadline: float) -> float:
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            try:
                answer = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                if answer.status == health_pb2.HealthCheckResponse.SERVING:
                    return time.monotonic() - started
            except grpc.RpcError:
                pass
            time.sleep(0.05)
    raise CheckFailed("the server never answered SERVING")


def kenlm_totals(arpa_gz: bytes, texts: list[str]) -> list[float]:
    import kenlm

    with tempfile.NamedTemporaryFile(suffix=".arpa") as f:
        f.write(gzip.decompress(arpa_gz))
        f.flush()
        model = kenlm.Model(f.name)
        return [math.fsum(p for p, _, _ in model.full_scores(t)) * math.log(10) for t in texts]


def run_baked(runner: Runner, work: Path) -> None:
    grpc_port, http_port, metrics_port = free_port(), free_port(), free_port()
    env = {
        "LMSERVE_PORT": str(grpc_port),
        "LMSERVE_HTTP_PORT": str(http_port),
        "LMSERVE_METRICS_PORT": str(metrics_port),
        "LMSERVE_SHUTDOWN_NOTICE_SECONDS": "1",
    }
    started = time.monotonic()
    runner.start(env, [], work / "baked.log")
    target = f"127.0.0.1:{grpc_port}"
    serving = wait_serving(target, started, started + 120)
    emit("image_seconds_to_serving", round(serving, 2), "s", models="baked", tool=runner.tool)
    server = runner.server()
    check(server.uids().real == IMAGE_USER, f"the server runs as uid {IMAGE_USER}")
    with LmServeClient(target, timeout=60) as client:
        models = client.list_models()
        check(sorted(m.name for m in models) == SHIPPED, "ListModels: the shipped models")
        check(all(m.ready for m in models), "every shipped model is ready")
        served = hashlib.sha256(runner.read_file(f"{IMAGE_NGRAM}/model.lmbin")).hexdigest()
        reference = hashlib.sha256((REFERENCE / "model.lmbin").read_bytes()).hexdigest()
        check(
            served == reference,
            f"the image's kjv-5gram model.lmbin is the repository's (sha256 {served[:12]}, "
            f"models/kjv-5gram {reference[:12]})",
        )
        scores = [s.log_prob for s in client.score("kjv-5gram", TEXTS)]
        want = kenlm_totals((REFERENCE / "model.arpa.gz").read_bytes(), TEXTS)
        worst = max(abs(a - b) for a, b in zip(scores, want, strict=True))
        check(worst < 1e-4, f"Score on kjv-5gram equals KenLM on its ARPA ({worst:.1e})")
        events = list(client.generate("kjv-lstm", "and god said", max_new_tokens=8, seed=1))
        tokens = [e for e in events if isinstance(e, GeneratedToken)]
        ends = [e for e in events if isinstance(e, GenerationFinished)]
        check(len(tokens) >= 1 and len(ends) == 1, f"a Generate stream ({len(tokens)} tokens)")
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10)
    check(b"lmserve_requests_total" in metrics.read(), "the Prometheus scrape")
    health = urllib.request.urlopen(f"http://127.0.0.1:{http_port}/healthz", timeout=10)
    check(health.status == 200, "HTTP /healthz")
    code = runner.stop()
    check(code == 0, f"SIGTERM: drained and exited {code}")


def run_mounted(runner: Runner, work: Path) -> None:
    repo = work / "models"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "lmserve.server.cli",
            "import-arpa",
            str(REPO / "tests" / "fixtures" / "ngram" / "toy.arpa"),
            str(repo / "toy"),
        ],
        check=True,
        capture_output=True,
    )
    for path in [work, repo, *repo.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)  # readable by the image's user
    grpc_port = free_port()
    env = {
        "LMSERVE_PORT": str(grpc_port),
        "LMSERVE_HTTP_PORT": str(free_port()),
        "LMSERVE_METRICS_PORT": str(free_port()),
        "LMSERVE_MODEL_REPOSITORY": "/models",
        "LMSERVE_SHUTDOWN_NOTICE_SECONDS": "1",
    }
    started = time.monotonic()
    runner.start(env, [f"{repo}:/models:ro"], work / "mounted.log")
    target = f"127.0.0.1:{grpc_port}"
    emit(
        "image_seconds_to_serving",
        round(wait_serving(target, started, started + 120), 2),
        "s",
        models="mounted",
        tool=runner.tool,
    )
    with LmServeClient(target, timeout=60) as client:
        check([m.name for m in client.list_models()] == ["toy"], "ListModels: the mounted model")
        check(math.isfinite(client.score("toy", ["a b c"])[0].log_prob), "Score on it")
    code = runner.stop()
    check(code == 0, f"SIGTERM: drained and exited {code}")


PROVIDERS = """
import json, os, onnxruntime as ort
capi = os.path.join(os.path.dirname(ort.__file__), "capi")
print(json.dumps({"version": ort.__version__, "providers": ort.get_available_providers(),
                  "cuda": os.path.join(capi, "libonnxruntime_providers_cuda.so")}))
"""


def ldd(runner: Runner, *files: str) -> tuple[dict[str, str], set[str]]:
    """The libraries `files` link, as the image's dynamic linker resolves them, and those it
    cannot find."""
    found = runner.run_once("ldd", *files)
    check(found.returncode == 0, f"ldd in the image: {found.stderr[-300:]}")
    resolved: dict[str, str] = {}
    missing: set[str] = set()
    for line in found.stdout.splitlines():
        name, arrow, where = line.strip().partition(" => ")
        if not arrow:
            continue
        if where.startswith("not found"):
            missing.add(name)
        else:
            resolved[name] = where.split(" (")[0]
    return resolved, missing


def run_gpu_libraries(runner: Runner) -> None:
    """ONNX Runtime inside the image offers the CUDA provider, and the provider's library finds
    every library it links (CUDA runtime, cuBLAS, cuFFT, cuRAND, cuDNN), as do those libraries'
    folders (cuDNN 9 opens its engine libraries at run time), all but the driver's."""
    found = runner.run_once("python", "-c", PROVIDERS)
    check(found.returncode == 0, f"onnxruntime imports in the image {found.stderr[-300:]}")
    info = json.loads(found.stdout.strip().splitlines()[-1])
    emit("image_onnxruntime_providers", len(info["providers"]), "providers", **info)
    check("CUDAExecutionProvider" in info["providers"], f"CUDA provider: {info['providers']}")
    resolved, missing = ldd(runner, info["cuda"])
    cuda = {k: v for k, v in resolved.items() if k.startswith(("libcu", "libnv"))}
    emit(
        "image_cuda_provider_libraries",
        len(resolved),
        "libraries",
        missing=sorted(missing),
        cuda=cuda,
    )
    check(missing <= DRIVER_LIBRARIES, f"the CUDA provider's libraries resolve ({sorted(missing)})")
    for needed in ("libcudart.so.12", "libcublas.so.12", "libcudnn.so.9"):
        check(needed in cuda, f"the CUDA provider links {needed}: {cuda.get(needed)}")
    folders = sorted({os.path.dirname(path) for path in cuda.values()})
    listing = runner.run_once("sh", "-c", 'for d; do ls -d "$d"/lib*.so*; done', "sh", *folders)
    libraries = listing.stdout.split()
    _, missing = ldd(runner, *libraries)
    check(
        missing <= DRIVER_LIBRARIES,
        f"the {len(libraries)} libraries in {len(folders)} CUDA folders resolve {sorted(missing)}",
    )


def score_calls(metrics_port: int) -> float:
    """The OK Score calls a replica's /metrics counted."""
    from prometheus_client.parser import text_string_to_metric_families

    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "lmserve_requests_total"
        and sample.labels.get("method") == "Score"
        and sample.labels.get("code") == "OK"
    )


def run_replicas(image: str, tool: str, work: Path) -> None:
    """Three replicas of the image behind one client (its address list: round_robin); one is
    killed with SIGKILL under a loop of Score calls from four threads: no call may fail."""
    runners = [Runner(image, tool) for _ in range(3)]
    ports = [(free_port(), free_port(), free_port()) for _ in runners]
    started = time.monotonic()
    for i, (runner, (grpc_port, http_port, metrics_port)) in enumerate(
        zip(runners, ports, strict=True)
    ):
        env = {
            "LMSERVE_PORT": str(grpc_port),
            "LMSERVE_HTTP_PORT": str(http_port),
            "LMSERVE_METRICS_PORT": str(metrics_port),
            "LMSERVE_SHUTDOWN_NOTICE_SECONDS": "0",
        }
        runner.start(env, [], work / f"replica{i}.log")
    addresses = [f"127.0.0.1:{g}" for g, _, _ in ports]
    for address in addresses:
        wait_serving(address, started, started + 180)
    emit(
        "image_replicas_seconds_to_serving",
        round(time.monotonic() - started, 2),
        "s",
        replicas=len(runners),
        tool=tool,
    )
    text = ["in the beginning god created the heaven and the earth"]
    with LmServeClient(addresses, timeout=30) as client:
        for _ in range(60):
            client.score("kjv-5gram", text)
        spread = [score_calls(m) for _, _, m in ports]
        check(sum(spread) == 60 and min(spread) >= 5, f"round_robin spreads 60 calls: {spread}")
        failures: list[BaseException] = []
        lock = threading.Lock()
        done = 0

        def call(_: int) -> None:
            nonlocal done
            try:
                client.score("kjv-5gram", text)
            except Exception as exc:  # noqa: BLE001 (every failure counts)
                failures.append(exc)
            with lock:
                done += 1
                if done == 50:
                    runners[0].kill()

        loop_started = time.monotonic()
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(call, range(400)))
        seconds = time.monotonic() - loop_started
        check(not failures, f"a replica killed under the loop: {len(failures)} failed calls")
        emit(
            "image_replicas_calls",
            400,
            "calls",
            failed=len(failures),
            calls_per_s=round(400 / seconds),
            killed_after=50,
        )
    victim = runners[0].proc
    assert victim is not None
    victim.wait(timeout=30)
    for runner in runners[1:]:
        check(runner.stop() == 0, "a surviving replica drains and exits 0")
    subprocess.run(["buildah", "rm", runners[0].ctr], check=False, capture_output=True)


def image_size(image: str) -> int | None:
    """Bytes of the image's layers (podman counts them as `docker images` does), or None when
    there is no such image."""
    tool = "podman" if shutil.which("podman") else "docker"
    found = subprocess.run(
        [tool, "image", "inspect", "--format", "{{.Size}}", image], capture_output=True, text=True
    )
    return int(found.stdout.strip()) if found.returncode == 0 else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("image", nargs="?", default="localhost/lmserve:cpu")
    parser.add_argument(
        "--base",
        nargs="*",
        default=[LOCAL_BASE, OFFICIAL_BASE],
        help="base images the layers are counted over: the first present is the one built on",
    )
    parser.add_argument(
        "--gpu-image",
        action="store_true",
        help="the GPU image: its CUDA provider and libraries, then the baked models alone",
    )
    args = parser.parse_args()
    missing = [f for f in ("model.lmbin", "model.arpa.gz") if not (REFERENCE / f).is_file()]
    if missing:
        print(
            f"check_image: no {', '.join(missing)} in {REFERENCE}: build it first (make models)",
            file=sys.stderr,
        )
        return 2
    if args.gpu_image and args.base == [LOCAL_BASE, OFFICIAL_BASE]:
        args.base = [LOCAL_CUDA_BASE, OFFICIAL_CUDA_BASE]
    size = image_size(args.image)
    if size is None:
        print(f"check_image: no image {args.image}: build it first (make image)", file=sys.stderr)
        return 2
    extra: dict[str, Any] = {}
    for base in args.base:
        base_size = image_size(base)
        if base_size is not None:
            extra = {"base": base, "base_bytes": base_size, "added_bytes": size - base_size}
            break
    emit("image_bytes", size, "bytes", image=args.image, **extra)
    runner = Runner(args.image)
    with tempfile.TemporaryDirectory(prefix="lmserve-image-") as tmp:
        work = Path(tmp)
        try:
            if args.gpu_image:
                print(f"{args.image}: the CUDA provider and its libraries", file=sys.stderr)
                run_gpu_libraries(runner)
            print(f"{args.image}: the baked models", file=sys.stderr)
            run_baked(runner, work)
            if args.gpu_image:
                print("check_image: every check passed", file=sys.stderr)
                return 0
            print(f"{args.image}: a mounted model folder", file=sys.stderr)
            run_mounted(runner, work)
            print(f"{args.image}: three replicas, one killed under load", file=sys.stderr)
            run_replicas(args.image, runner.tool, work)
        except (CheckFailed, grpc.RpcError, OSError, subprocess.SubprocessError) as exc:
            for log in work.glob("*.log"):
                print(f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}", file=sys.stderr)
            print(f"check_image: FAILED: {exc}", file=sys.stderr)
            if runner.proc is not None and runner.proc.poll() is None:
                runner.proc.kill()
            return 1
    print("check_image: every check passed", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
