"""Front (asyncio) <-> engine worker (separate process) transports and payload encodings.

    python bench/bench_ipc.py [--quick] [--runs 3] [--round-trips 5000] [--seconds 2]
        [--transports unix_stream,unix_proto,unix_bufproto,mp_pipe,zmq_pair]
        [--encodings pickle,msgpack]
        [--workloads rtt,step,conc] [--concurrency 32] [--start-method forkserver]
        [--affinity none|split|same]

What it measures: the cost of the channel between a front process that runs an asyncio event
loop (where gRPC lives) and an engine worker process (started with multiprocessing's
forkserver or spawn), nothing else: the worker does no model work.

Transports (front side / worker side):

- `unix_stream`: `socket.socketpair(AF_UNIX, SOCK_STREAM)`, 4-byte big-endian length-prefixed
  frames; front: `asyncio.open_unix_connection(sock=...)` streams (`readexactly` twice per
  frame); worker: a blocking reader thread (buffered `makefile("rb")`), sends with `sendall`
  under a lock.
- `unix_proto`: the same socket and worker, but the front is an `asyncio.Protocol` that
  splits frames out of `data_received` itself (no coroutine per frame).
- `unix_bufproto`: the same with an `asyncio.BufferedProtocol` (`recv_into` one reused buffer
  instead of a fresh 256 KiB `recv` per read).
- `mp_pipe`: `multiprocessing.Pipe()` (duplex: a socketpair underneath, with the same 4-byte
  framing) via `send_bytes`/`recv_bytes`; front: `loop.add_reader(conn.fileno(), ...)`, one
  `recv_bytes` per readiness callback; worker: as above (reader thread, sends under a lock).
- `zmq_pair`: pyzmq PAIR sockets over `ipc://` in a temporary folder; front: `zmq.asyncio`;
  worker: a plain zmq socket used by one thread only (a zmq socket is not thread-safe, so an
  engine thread that sends while a reader thread receives would need a second socket).

Encodings: `pickle` (protocol 5) and `msgpack` (`msgspec.msgpack`, plain tuples/lists, typed
decoders so the front gets tuples back). Token ids and scores travel as raw int32/float64 bytes
(`ndarray.tobytes()` / `np.frombuffer`) inside the tuples in both encodings.

Workloads, each with a fresh worker process per run:

- `rtt`: one outstanding round trip at a time: a Score-like request (4 lines of int32 ids,
  ~100 bytes) answered by a float64 array of 4. Record: median latency in µs (per run: the
  median over `--round-trips` round trips after 500 warm-up ones; p99 as an extra field), CPU
  µs per round trip in each process (`time.process_time()`, all threads of the process).
- `step`: the worker sends "engine step" messages (64 streams, each `(stream_id, token_id,
  text of ~5 chars, log_prob)`) as fast as the channel takes them for `--seconds`; the front
  decodes each into a list of per-stream tuples. Record: messages/s, CPU µs per message in each
  process.
- `conc`: `--concurrency` (32) asyncio tasks each looping round trips for `--seconds`, so 32
  requests are outstanding at once; the worker answers each as it reads it. Record: round
  trips/s, CPU µs per round trip in each process.

Each configuration runs `--runs` times (interleaved: run 1 of every configuration, then run 2,
...); a record's `median` is the median over runs. One JSON record per (transport, encoding,
workload) on stdout; progress and a final markdown table on stderr. Keep other work off the
machine while it runs. `--affinity split` pins the front to CPU 0 and the worker (all its
threads) to CPU 1, `same` pins both to CPU 0; the default leaves placement to the scheduler.
One-at-a-time latency depends on it: on a small VM a wakeup on the other core costs tens of µs
(and shows as CPU time), while two processes sharing one core hand over directly.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import importlib.util
import multiprocessing as mp
import os
import pickle
import random
import socket
import statistics
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, Protocol

import numpy as np
from common import emit, log, percentile, quick, record

TRANSPORTS = ("unix_stream", "unix_proto", "unix_bufproto", "mp_pipe", "zmq_pair")
ENCODINGS = ("pickle", "msgpack")
WORKLOADS = ("rtt", "step", "conc")

HEADER = struct.Struct(">I")
# A Score request of 4 short lines, as int32 token ids (84 bytes of ids).
LINES: list[bytes] = [
    np.arange(start, start + n, dtype=np.int32).tobytes()
    for start, n in ((17, 5), (4000, 6), (31000, 4), (250, 6))
]
STREAMS = 64
WARMUP_ROUND_TRIPS = 500
StepItem = tuple[int, int, str, float]


def step_items(streams: int = STREAMS) -> list[StepItem]:
    """One engine step's new tokens: (stream id, token id, ~5-char text, log prob) per stream."""
    rng = random.Random(0)
    words = [" the", " lord", " and", " unto", " said,", " shall", " God", " thee."]
    return [
        (1000 + i, rng.randrange(50_000), rng.choice(words), -rng.random() * 8.0)
        for i in range(streams)
    ]


# -- encodings -------------------------------------------------------------------------------


class Codec(Protocol):
    def encode(self, obj: Any) -> bytes: ...
    def decode_request(self, data: bytes) -> tuple[int, str, list[bytes]]: ...
    def decode_reply(self, data: bytes) -> tuple[int, bytes]: ...
    def decode_step(self, data: bytes) -> list[StepItem]: ...


class PickleCodec:
    def encode(self, obj: Any) -> bytes:
        return pickle.dumps(obj, protocol=5)

    def decode_request(self, data: bytes) -> tuple[int, str, list[bytes]]:
        return pickle.loads(data)

    def decode_reply(self, data: bytes) -> tuple[int, bytes]:
        return pickle.loads(data)

    def decode_step(self, data: bytes) -> list[StepItem]:
        return pickle.loads(data)


class MsgpackCodec:
    def __init__(self) -> None:
        import msgspec

        self._encoder = msgspec.msgpack.Encoder()
        self._request = msgspec.msgpack.Decoder(tuple[int, str, list[bytes]])
        self._reply = msgspec.msgpack.Decoder(tuple[int, bytes])
        self._step = msgspec.msgpack.Decoder(list[tuple[int, int, str, float]])

    def encode(self, obj: Any) -> bytes:
        return self._encoder.encode(obj)

    def decode_request(self, data: bytes) -> tuple[int, str, list[bytes]]:
        return self._request.decode(data)

    def decode_reply(self, data: bytes) -> tuple[int, bytes]:
        return self._reply.decode(data)

    def decode_step(self, data: bytes) -> list[StepItem]:
        return self._step.decode(data)


def make_codec(name: str) -> Codec:
    if name == "pickle":
        return PickleCodec()
    if name == "msgpack":
        return MsgpackCodec()
    raise ValueError(f"unknown encoding {name!r}")


# -- worker side (blocking, threads) ---------------------------------------------------------


class WorkerChannel(Protocol):
    def recv(self) -> bytes | None: ...  # None at end of stream
    def send(self, payload: bytes) -> None: ...
    def close(self) -> None: ...


class UnixWorker:
    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(True)
        self._sock = sock
        self._rfile = sock.makefile("rb", buffering=256 * 1024)
        self._lock = threading.Lock()

    def recv(self) -> bytes | None:
        head = self._rfile.read(4)
        if len(head) < 4:
            return None
        (n,) = HEADER.unpack(head)
        data = self._rfile.read(n)
        return data if len(data) == n else None

    def send(self, payload: bytes) -> None:
        with self._lock:
            self._sock.sendall(HEADER.pack(len(payload)) + payload)

    def close(self) -> None:
        self._rfile.close()
        self._sock.close()


class PipeWorker:
    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._lock = threading.Lock()

    def recv(self) -> bytes | None:
        try:
            return self._conn.recv_bytes()
        except (EOFError, OSError):
            return None

    def send(self, payload: bytes) -> None:
        with self._lock:
            self._conn.send_bytes(payload)

    def close(self) -> None:
        self._conn.close()


class ZmqWorker:
    def __init__(self, address: str) -> None:
        import zmq

        self._zmq = zmq
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.PAIR)
        self._sock.connect(address)
        self._lock = threading.Lock()

    def recv(self) -> bytes | None:
        return self._sock.recv()

    def send(self, payload: bytes) -> None:
        # The lock only mirrors the other workers: a zmq socket must stay with one thread.
        with self._lock:
            self._sock.send(payload)

    def close(self) -> None:
        self._sock.close(linger=1000)
        self._ctx.term()


def open_worker_channel(transport: str, endpoint: Any) -> WorkerChannel:
    if transport.startswith("unix_"):
        return UnixWorker(endpoint)
    if transport == "mp_pipe":
        return PipeWorker(endpoint)
    if transport == "zmq_pair":
        return ZmqWorker(endpoint)
    raise ValueError(f"unknown transport {transport!r}")


def serve_requests(chan: WorkerChannel, codec: Codec, results: Connection) -> None:
    """The reader thread: answers each request as read; 'mark' starts, 'stop' ends the count."""
    cpu_start = time.process_time()
    count = 0
    while (data := chan.recv()) is not None:
        req_id, op, lines = codec.decode_request(data)
        if op == "score":
            ids = [np.frombuffer(line, dtype=np.int32) for line in lines]
            scores = np.array([len(a) for a in ids], dtype=np.float64)
            chan.send(codec.encode((req_id, scores.tobytes())))
            count += 1
        elif op == "mark":
            cpu_start, count = time.process_time(), 0
            chan.send(codec.encode((req_id, b"")))
        elif op == "stop":
            results.send({"cpu_s": time.process_time() - cpu_start, "count": count})
            chan.send(codec.encode((req_id, b"")))
            break


def stream_steps(chan: WorkerChannel, codec: Codec, results: Connection, seconds: float) -> None:
    """Waits for 'go', sends step messages for `seconds`, then an empty step, then waits."""
    items = step_items()
    data = chan.recv()
    assert data is not None and codec.decode_request(data)[1] == "go"
    cpu_start = time.process_time()
    deadline = time.perf_counter() + seconds
    count = 0
    while time.perf_counter() < deadline:
        chan.send(codec.encode(items))
        count += 1
    chan.send(codec.encode([]))
    results.send({"cpu_s": time.process_time() - cpu_start, "count": count})
    chan.recv()  # 'stop' (or the end of the stream): the front has read everything


def worker_main(
    transport: str,
    encoding: str,
    workload: str,
    endpoint: Any,
    results: Connection,
    seconds: float,
    cpus: set[int] | None,
) -> None:
    if cpus is not None:
        os.sched_setaffinity(0, cpus)
    chan = open_worker_channel(transport, endpoint)
    codec = make_codec(encoding)
    if workload == "step":
        stream_steps(chan, codec, results, seconds)
    else:
        reader = threading.Thread(target=serve_requests, args=(chan, codec, results))
        reader.start()
        reader.join()
    chan.close()
    results.close()


# -- front side (asyncio) --------------------------------------------------------------------

OnMessage = Callable[[bytes], None]


class FrontChannel(Protocol):
    async def start(self, on_message: OnMessage) -> None: ...
    def send(self, payload: bytes) -> None: ...
    async def close(self) -> None: ...


class UnixStreamFront:
    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._task: asyncio.Task[None] | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def start(self, on_message: OnMessage) -> None:
        reader, self._writer = await asyncio.open_unix_connection(sock=self._sock)

        async def read_loop() -> None:
            try:
                while True:
                    (n,) = HEADER.unpack(await reader.readexactly(4))
                    on_message(await reader.readexactly(n))
            except asyncio.IncompleteReadError:
                pass

        self._task = asyncio.create_task(read_loop())

    def send(self, payload: bytes) -> None:
        assert self._writer is not None
        self._writer.write(HEADER.pack(len(payload)) + payload)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._writer is not None:
            self._writer.close()


class _FrameProtocol(asyncio.Protocol):
    def __init__(self, on_message: OnMessage) -> None:
        self._on_message = on_message
        self._buf = bytearray()

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        pos, end = 0, len(buf)
        while end - pos >= 4:
            (n,) = HEADER.unpack_from(buf, pos)
            if end - pos - 4 < n:
                break
            self._on_message(bytes(buf[pos + 4 : pos + 4 + n]))
            pos += 4 + n
        if pos:
            del buf[:pos]


class _BufferedFrameProtocol(asyncio.BufferedProtocol):
    """Frames read with `recv_into` a reused buffer: no 256 KiB `recv` allocation per read."""

    def __init__(self, on_message: OnMessage, size: int = 1 << 20) -> None:
        self._on_message = on_message
        self._buf = bytearray(size)
        self._view = memoryview(self._buf)
        self._start = 0
        self._end = 0

    def get_buffer(self, sizehint: int) -> memoryview:
        if len(self._buf) - self._end < 65536:
            pending = self._end - self._start
            if pending + 65536 > len(self._buf) // 2:
                grown = bytearray(max(2 * len(self._buf), 2 * (pending + 65536)))
                grown[:pending] = self._view[self._start : self._end]
                self._view.release()
                self._buf, self._view = grown, memoryview(grown)
            else:
                self._view[:pending] = self._view[self._start : self._end]
            self._start, self._end = 0, pending
        return self._view[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        self._end += nbytes
        view, pos, end = self._view, self._start, self._end
        while end - pos >= 4:
            (n,) = HEADER.unpack_from(view, pos)
            if end - pos - 4 < n:
                break
            self._on_message(bytes(view[pos + 4 : pos + 4 + n]))
            pos += 4 + n
        if pos == end:
            self._start = self._end = 0
        else:
            self._start = pos


class UnixProtoFront:
    def __init__(self, sock: socket.socket, buffered: bool = False) -> None:
        self._sock = sock
        self._buffered = buffered
        self._transport: asyncio.Transport | None = None

    async def start(self, on_message: OnMessage) -> None:
        loop = asyncio.get_running_loop()
        factory: Callable[[], asyncio.BaseProtocol]
        if self._buffered:
            factory = functools.partial(_BufferedFrameProtocol, on_message)
        else:
            factory = functools.partial(_FrameProtocol, on_message)
        self._transport, _ = await loop.create_unix_connection(factory, sock=self._sock)

    def send(self, payload: bytes) -> None:
        assert self._transport is not None
        self._transport.write(HEADER.pack(len(payload)) + payload)

    async def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


class PipeFront:
    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self, on_message: OnMessage) -> None:
        self._loop = asyncio.get_running_loop()
        conn = self._conn

        def readable() -> None:
            on_message(conn.recv_bytes())

        self._loop.add_reader(conn.fileno(), readable)

    def send(self, payload: bytes) -> None:
        self._conn.send_bytes(payload)  # blocking socket: fine while the peer keeps reading

    async def close(self) -> None:
        if self._loop is not None:
            self._loop.remove_reader(self._conn.fileno())
        self._conn.close()


class ZmqFront:
    def __init__(self, address: str) -> None:
        import zmq
        import zmq.asyncio

        self._ctx = zmq.asyncio.Context()
        self._sock = self._ctx.socket(zmq.PAIR)
        self._sock.bind(address)
        self._task: asyncio.Task[None] | None = None

    async def start(self, on_message: OnMessage) -> None:
        sock = self._sock

        async def read_loop() -> None:
            while True:
                on_message(await sock.recv())

        self._task = asyncio.create_task(read_loop())

    def send(self, payload: bytes) -> None:
        self._sock.send(payload)  # a Future, already done unless the high-water mark is hit

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._sock.close(linger=0)
        self._ctx.term()


class RpcClient:
    """Request/reply over a front channel: a future per request id, resolved by the reader."""

    def __init__(self, chan: FrontChannel, codec: Codec) -> None:
        self._chan = chan
        self._codec = codec
        self._loop = asyncio.get_running_loop()
        self._pending: dict[int, asyncio.Future[np.ndarray]] = {}
        self._next_id = 0

    def on_message(self, data: bytes) -> None:
        req_id, blob = self._codec.decode_reply(data)
        self._pending.pop(req_id).set_result(np.frombuffer(blob, dtype=np.float64))

    async def call(self, op: str = "score") -> np.ndarray:
        self._next_id += 1
        req_id = self._next_id
        fut: asyncio.Future[np.ndarray] = self._loop.create_future()
        self._pending[req_id] = fut
        self._chan.send(self._codec.encode((req_id, op, LINES)))
        return await fut


def worker_stats(results: Connection) -> dict[str, Any]:
    if not results.poll(60):
        raise RuntimeError("the worker sent no statistics")
    stats: dict[str, Any] = results.recv()
    return stats


async def front_rtt(
    chan: FrontChannel, codec: Codec, results: Connection, round_trips: int
) -> dict[str, float]:
    client = RpcClient(chan, codec)
    await chan.start(client.on_message)
    for _ in range(WARMUP_ROUND_TRIPS):
        await client.call()
    await client.call("mark")
    latencies = []
    cpu0 = time.process_time()
    for _ in range(round_trips):
        t0 = time.perf_counter()
        await client.call()
        latencies.append(time.perf_counter() - t0)
    cpu1 = time.process_time()
    await client.call("stop")
    worker = worker_stats(results)
    return {
        "p50_us": statistics.median(latencies) * 1e6,
        "p99_us": percentile(latencies, 99) * 1e6,
        "front_cpu_us": (cpu1 - cpu0) / round_trips * 1e6,
        "worker_cpu_us": worker["cpu_s"] / worker["count"] * 1e6,
    }


async def front_conc(
    chan: FrontChannel, codec: Codec, results: Connection, seconds: float, concurrency: int
) -> dict[str, float]:
    client = RpcClient(chan, codec)
    await chan.start(client.on_message)

    async def loop_calls(until: float) -> int:
        n = 0
        while time.perf_counter() < until:
            await client.call()
            n += 1
        return n

    await asyncio.gather(*(loop_calls(time.perf_counter() + 0.3) for _ in range(concurrency)))
    await client.call("mark")
    t0, cpu0 = time.perf_counter(), time.process_time()
    counts = await asyncio.gather(*(loop_calls(t0 + seconds) for _ in range(concurrency)))
    t1, cpu1 = time.perf_counter(), time.process_time()
    await client.call("stop")
    worker = worker_stats(results)
    total = sum(counts)
    return {
        "round_trips_per_s": total / (t1 - t0),
        "front_cpu_us": (cpu1 - cpu0) / total * 1e6,
        "worker_cpu_us": worker["cpu_s"] / worker["count"] * 1e6,
    }


async def front_step(chan: FrontChannel, codec: Codec, results: Connection) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    messages = 0
    streams = 0

    def on_message(data: bytes) -> None:
        nonlocal messages, streams
        items = codec.decode_step(data)
        if not items:
            done.set_result(None)
            return
        messages += 1
        streams += len(items)

    await chan.start(on_message)
    t0, cpu0 = time.perf_counter(), time.process_time()
    chan.send(codec.encode((0, "go", [])))
    await done
    t1, cpu1 = time.perf_counter(), time.process_time()
    chan.send(codec.encode((0, "stop", [])))
    worker = worker_stats(results)
    assert worker["count"] == messages and streams == messages * STREAMS
    return {
        "messages_per_s": messages / (t1 - t0),
        "front_cpu_us": (cpu1 - cpu0) / messages * 1e6,
        "worker_cpu_us": worker["cpu_s"] / worker["count"] * 1e6,
    }


async def front_main(
    chan: FrontChannel, codec: Codec, results: Connection, workload: str, args: argparse.Namespace
) -> dict[str, float]:
    try:
        if workload == "rtt":
            return await front_rtt(chan, codec, results, args.round_trips)
        if workload == "conc":
            return await front_conc(chan, codec, results, args.seconds, args.concurrency)
        return await front_step(chan, codec, results)
    finally:
        await chan.close()


def run_config(
    ctx: Any, transport: str, encoding: str, workload: str, args: argparse.Namespace
) -> dict[str, float]:
    """One run: a fresh worker process, the front's loop in this process."""
    worker_cpus = {"none": None, "split": {1}, "same": {0}}[args.affinity]
    results_front, results_worker = ctx.Pipe(duplex=False)
    tmp: tempfile.TemporaryDirectory[str] | None = None
    chan: FrontChannel
    # The worker's end of the channel: closed here once the worker has its own copy.
    worker_end: socket.socket | Connection | None = None
    endpoint: Any
    if transport.startswith("unix_"):
        front_sock, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        if transport == "unix_stream":
            chan = UnixStreamFront(front_sock)
        else:
            chan = UnixProtoFront(front_sock, buffered=transport == "unix_bufproto")
        endpoint = worker_end
    elif transport == "mp_pipe":
        front_conn, worker_end = ctx.Pipe()
        chan = PipeFront(front_conn)
        endpoint = worker_end
    else:
        tmp = tempfile.TemporaryDirectory(prefix="bench_ipc_")
        endpoint = f"ipc://{tmp.name}/engine.sock"
        chan = ZmqFront(endpoint)
    proc = ctx.Process(
        target=worker_main,
        args=(transport, encoding, workload, endpoint, results_worker, args.seconds, worker_cpus),
        daemon=True,
    )
    proc.start()
    results_worker.close()
    if worker_end is not None:
        worker_end.close()
    try:
        timeout = args.seconds * 5 + args.round_trips * 0.002 + 60
        return asyncio.run(
            asyncio.wait_for(
                front_main(chan, make_codec(encoding), results_front, workload, args), timeout
            )
        )
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join()
        results_front.close()
        if tmp is not None:
            tmp.cleanup()


def payload_sizes(encoding: str) -> dict[str, int]:
    codec = make_codec(encoding)
    return {
        "request_bytes": len(codec.encode((12345, "score", LINES))),
        "reply_bytes": len(codec.encode((12345, np.zeros(4).tobytes()))),
        "step_bytes": len(codec.encode(step_items())),
    }


def available(names: list[str], what: str) -> list[str]:
    need = {"zmq_pair": "zmq", "msgpack": "msgspec"}
    kept = []
    for name in names:
        module = need.get(name)
        if module is not None and importlib.util.find_spec(module) is None:
            log(f"skipping {what} {name}: {module} is not installed")
            continue
        kept.append(name)
    return kept


def pick(value: str, allowed: tuple[str, ...]) -> list[str]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    for name in names:
        if name not in allowed:
            raise SystemExit(f"unknown name {name!r}; choose from {', '.join(allowed)}")
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter runs")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--round-trips", type=int, default=None, help="rtt: timed round trips")
    parser.add_argument("--seconds", type=float, default=None, help="step and conc: per run")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--transports", default=",".join(TRANSPORTS))
    parser.add_argument("--encodings", default=",".join(ENCODINGS))
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--start-method", choices=("forkserver", "spawn"), default="forkserver")
    parser.add_argument(
        "--affinity",
        choices=("none", "split", "same"),
        default="none",
        help="split: front on CPU 0, worker on CPU 1; same: both on CPU 0",
    )
    args = parser.parse_args()
    if args.affinity != "none":
        if not {0, 1} <= os.sched_getaffinity(0):
            raise SystemExit("--affinity needs CPUs 0 and 1")
        os.sched_setaffinity(0, {0})
    short = args.quick or quick()
    if args.round_trips is None:
        args.round_trips = 2000 if short else 5000
    if args.seconds is None:
        args.seconds = 1.0 if short else 2.0
    transports = available(pick(args.transports, TRANSPORTS), "transport")
    encodings = available(pick(args.encodings, ENCODINGS), "encoding")
    workloads = pick(args.workloads, WORKLOADS)

    ctx = mp.get_context(args.start_method)
    if args.start_method == "forkserver":
        ctx.set_forkserver_preload(["numpy", "msgspec", "zmq"])
    configs = [(t, e, w) for t in transports for e in encodings for w in workloads]
    runs: dict[tuple[str, str, str], list[dict[str, float]]] = {c: [] for c in configs}
    for i in range(args.runs):
        for config in configs:
            result = run_config(ctx, *config, args)
            runs[config].append(result)
            shown = ", ".join(f"{k}={v:.4g}" for k, v in result.items())
            log(f"run {i + 1}/{args.runs} {'/'.join(config)}: {shown}")

    sizes = {e: payload_sizes(e) for e in encodings}
    common_extra: dict[str, Any] = {
        "start_method": args.start_method,
        "affinity": args.affinity,
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
    }
    medians: dict[tuple[str, str, str], dict[str, float]] = {}
    for (transport, encoding, workload), results in runs.items():
        med = {k: statistics.median(r[k] for r in results) for k in results[0]}
        medians[(transport, encoding, workload)] = med
        main_key, unit = {
            "rtt": ("p50_us", "us"),
            "step": ("messages_per_s", "messages/s"),
            "conc": ("round_trips_per_s", "round_trips/s"),
        }[workload]
        extra: dict[str, Any] = {
            f"{k}_median": float(f"{v:.6g}") for k, v in med.items() if k != main_key
        }
        extra.update(transport=transport, encoding=encoding, workload=workload)
        if workload == "rtt":
            extra["round_trips"] = args.round_trips
        elif workload == "conc":
            extra.update(seconds=args.seconds, concurrency=args.concurrency)
        else:
            extra.update(seconds=args.seconds, streams=STREAMS)
        extra.update(sizes[encoding], **common_extra)
        name = f"ipc_{transport}_{encoding}_{workload}"
        emit(record(name, unit, [r[main_key] for r in results], **extra))

    def cell(t: str, e: str, w: str, key: str, fmt: str = ".1f") -> str:
        med = medians.get((t, e, w))
        return format(med[key], fmt) if med and key in med else "-"

    lines = [
        "",
        f"median of {args.runs} runs, affinity {args.affinity}; "
        "CPU in µs per round trip / message, front + worker",
        "| transport | encoding | rtt p50 µs | rtt p99 µs | rtt CPU f+w | step msg/s "
        "| step CPU f+w | conc RT/s | conc CPU f+w |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for t in transports:
        for e in encodings:
            row = [
                t,
                e,
                cell(t, e, "rtt", "p50_us"),
                cell(t, e, "rtt", "p99_us"),
                f"{cell(t, e, 'rtt', 'front_cpu_us')} + {cell(t, e, 'rtt', 'worker_cpu_us')}",
                cell(t, e, "step", "messages_per_s", ".0f"),
                f"{cell(t, e, 'step', 'front_cpu_us')} + {cell(t, e, 'step', 'worker_cpu_us')}",
                cell(t, e, "conc", "round_trips_per_s", ".0f"),
                f"{cell(t, e, 'conc', 'front_cpu_us')} + {cell(t, e, 'conc', 'worker_cpu_us')}",
            ]
            lines.append("| " + " | ".join(row) + " |")
    log("\n".join(lines))
    log("payload bytes: " + ", ".join(f"{e}: {s}" for e, s in sizes.items()))


if __name__ == "__main__":
    main()
