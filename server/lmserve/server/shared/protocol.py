"""The front/worker protocol as declared message types (msgspec Structs), one per frame.

    sock.sendall(encode(ScoreCall(rid, work, deadline)))          # any side
    for message in FrameReader(TO_FRONT).feed(data): ...           # asyncio side
    message = recv_frame(sock, TO_WORKER)                          # blocking side

A frame is a 4-byte little-endian length and a MessagePack-encoded Struct; each Struct carries
its type as a tag, so a receiver decodes into exactly the declared types and dispatches on the
type (`match`), never on a method name. Arrays travel as `Array` (dtype, shape, bytes); the
engine's plain dataclasses (`GenerateParams`, `BeamParams`, `CompleteEdit`, `CompleteAnswer`,
`FuseStep`, beam `Hypothesis`) are declared types msgspec encodes as they are; errors cross as
`ErrorInfo` and are rebuilt as the same `lmserve.server.errors` class.

Pickle remains in two places, both frames that are not on a request's path: the worker's start
(`Start`: the `WorkerSpec` with its settings objects and paths, once per worker) and a scrape's
engine statistics (`MetricsReply`: `EngineStats` with its histograms, once per /metrics scrape).

What a Generate stream and a Score reply carry is already the response's protobuf bytes
(`StreamChunk.messages`, `ScoreReply.response`), built in the worker where the tokens were
computed: the front hands them to gRPC as they are.
"""

from __future__ import annotations

import pickle
import socket
import struct
from typing import Generic, TypeVar

import msgspec
import numpy as np
import numpy.typing as npt

from lmserve.server import errors
from lmserve.server.backends.base import BatchScores, EncodedBatch
from lmserve.server.decoding.beam import Hypothesis
from lmserve.server.decoding.lattice.expand import LatticeParams, RescoredPaths, TokenLattice
from lmserve.server.decoding.params import BeamParams, GenerateParams
from lmserve.server.decoding.scoring import PreparedScoring, ScoreOptions
from lmserve.server.shared.edits import CompleteAnswer, CompleteEdit
from lmserve.server.shared.fusion import FuseAnswer, FuseStep

_HEADER = struct.Struct("<I")
T = TypeVar("T")
G = TypeVar("G", bound=np.generic)


class Array(msgspec.Struct, array_like=True, frozen=True):
    """A numpy array's bytes with its dtype and shape."""

    dtype: str
    shape: tuple[int, ...]
    data: bytes

    @classmethod
    def of(cls, array: npt.ArrayLike) -> Array:
        a = np.ascontiguousarray(array)
        return cls(a.dtype.str, tuple(a.shape), a.tobytes())

    def numpy(self) -> npt.NDArray[np.generic]:
        """The array, of whatever dtype it was sent with."""
        return np.frombuffer(self.data, dtype=np.dtype(self.dtype)).reshape(self.shape)

    def of_type(self, dtype: type[G]) -> npt.NDArray[G]:
        """The array, which the sender declared of `dtype` (a frame naming another dtype is
        refused: the receiver's types would be wrong)."""
        if np.dtype(self.dtype).type is not dtype:
            raise TypeError(f"an array of {self.dtype}, not of {np.dtype(dtype).str}")
        return np.frombuffer(self.data, dtype=dtype).reshape(self.shape)


def optional_array(array: npt.ArrayLike | None) -> Array | None:
    return None if array is None else Array.of(array)


class ErrorInfo(msgspec.Struct, array_like=True, frozen=True):
    """An exception: its `errors` class name (else a fault), message and attributes."""

    kind: str
    message: str
    attributes: dict[str, str | int | float | None] = {}

    @classmethod
    def of(cls, exc: BaseException) -> ErrorInfo:
        if isinstance(exc, errors.LmServeError):
            plain = {
                k: v for k, v in exc.__dict__.items() if isinstance(v, str | int | float | None)
            }
            return cls(type(exc).__name__, str(exc), plain)
        return cls("", f"{type(exc).__name__}: {exc}")

    def error(self) -> BaseException:
        """The exception as the front raises it: the same class where it is one of ours, a
        RuntimeError (answered INTERNAL) for a fault in model code."""
        kind = getattr(errors, self.kind, None) if self.kind else None
        if not (isinstance(kind, type) and issubclass(kind, errors.LmServeError)):
            return RuntimeError(self.message)
        exc = kind.__new__(kind)
        exc.args = (self.message,)
        exc.__dict__.update(self.attributes)
        return exc


# -- front -> worker ---------------------------------------------------------------------------


class ScoringWork(msgspec.Struct, array_like=True, frozen=True):
    """A prepared scoring request (`decoding.scoring.PreparedScoring`) as arrays."""

    ids: Array
    offsets: Array
    oov: Array
    oov_counts: Array
    lengths: Array
    bos: bool
    eos: bool
    details: bool
    oov_log_probs: bool
    per_token: bool
    words: list[int] | None = None
    word_lists: list[list[str]] | None = None
    # The id each text is read from in place of `<s>` (`EncodedBatch.starts`), if any.
    starts: Array | None = None


class BiasFound(msgspec.Struct, array_like=True, frozen=True):
    """A text's bias matches (`decoding.bias.BiasMatch`)."""

    boost: float
    phrases: list[int]


class ScoreCall(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """Scores; the reply is `BatchScoresReply`."""

    rid: int
    work: ScoringWork
    deadline: float | None


class ScoreResponseCall(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """Score's whole answer: the reply is the ScoreResponse's wire bytes (`ScoreReply`)."""

    rid: int
    work: ScoringWork
    model: str
    bias: list[BiasFound] | None
    deadline: float | None


class PrefixTotalsCall(msgspec.Struct, tag=True, array_like=True, frozen=True):
    rid: int
    ids: Array
    offsets: Array
    eos: bool
    deadline: float | None


class BeamSearchCall(msgspec.Struct, tag=True, array_like=True, frozen=True):
    rid: int
    prompt_ids: list[int]
    params: BeamParams
    deadline: float | None


class RescoreLatticesCall(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """Lattices to rescore; the reply is `RescoreLatticesReply`, one result per lattice."""

    rid: int
    lattices: list[TokenLattice]
    params: LatticeParams
    deadline: float | None


class CompleteCall(msgspec.Struct, tag=True, array_like=True, frozen=True):
    rid: int
    edit: CompleteEdit


class FuseCall(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """One message of Fuse stream `session` (the front's id for it on this connection)."""

    rid: int
    session: int
    step: FuseStep


class FuseClose(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """Fuse stream `session` ended: release its hypotheses (no reply)."""

    session: int


class MetricsCall(msgspec.Struct, tag=True, array_like=True, frozen=True):
    rid: int


class Cancel(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """The caller of `rid` left: stop its work."""

    rid: int


class Generate(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """Opens stream `sid`: its chunks come back as `StreamChunk`s in `Events` frames."""

    sid: int
    prompt_ids: list[int]
    params: GenerateParams
    deadline: float | None
    arrived: float


class StreamCancel(msgspec.Struct, tag=True, array_like=True, frozen=True):
    sid: int


class Taken(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """Backpressure: the front's handler of `sid` has taken `taken` events so far."""

    sid: int
    taken: int


class Stop(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """Close the engine and exit."""


class Start(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """The first frame: the pickled `WorkerSpec` (sent once; see the module doc)."""

    spec: bytes

    @classmethod
    def of(cls, spec: object) -> Start:
        return cls(pickle.dumps(spec, protocol=5))

    def worker_spec(self, kind: type[T]) -> T:
        """The spec, as the worker's own `kind` (`worker.process.WorkerSpec`: this module sits
        under the worker and may not name it)."""
        spec = pickle.loads(self.spec)
        if not isinstance(spec, kind):
            raise TypeError(f"Start carries a {type(spec).__name__}, not a {kind.__name__}")
        return spec


# The calls: each answered by one `Reply` with its `rid`.
Call = (
    ScoreCall
    | ScoreResponseCall
    | PrefixTotalsCall
    | BeamSearchCall
    | RescoreLatticesCall
    | CompleteCall
    | FuseCall
    | MetricsCall
)

ToWorker = (
    ScoreCall
    | ScoreResponseCall
    | PrefixTotalsCall
    | BeamSearchCall
    | RescoreLatticesCall
    | CompleteCall
    | FuseCall
    | FuseClose
    | MetricsCall
    | Cancel
    | Generate
    | StreamCancel
    | Taken
    | Stop
    | Start
)

# -- worker -> front ---------------------------------------------------------------------------


class Ready(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """The model is loaded; other fronts connect at `address` (empty: none may)."""

    pid: int
    address: str = ""


class Failed(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """The model did not load; `reason` is its load error as clients see it."""

    reason: str


class BatchScoresReply(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """`backends.base.BatchScores`."""

    rid: int
    totals: Array
    token_log_probs: Array | None = None
    token_offsets: Array | None = None
    ngram_lengths: Array | None = None


class ScoreReply(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """A ScoreResponse as wire bytes (the front counts the request from what it prepared)."""

    rid: int
    response: bytes


class PrefixTotalsReply(msgspec.Struct, tag=True, array_like=True, frozen=True):
    rid: int
    totals: Array
    computed: int


class BeamSearchReply(msgspec.Struct, tag=True, array_like=True, frozen=True):
    rid: int
    hypotheses: list[Hypothesis]


class RescoreLatticesReply(msgspec.Struct, tag=True, array_like=True, frozen=True):
    rid: int
    results: list[RescoredPaths]


class CompleteReply(msgspec.Struct, tag=True, array_like=True, frozen=True):
    rid: int
    answer: CompleteAnswer


class FuseReply(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """`shared.fusion.FuseAnswer`, its arrays as `Array`s."""

    rid: int
    ids: list[int]
    token_log_probs: Array
    candidate_log_probs: Array
    top_ids: Array
    top_log_probs: Array
    end_log_probs: Array
    live: int

    @classmethod
    def of(cls, rid: int, answer: FuseAnswer) -> FuseReply:
        return cls(
            rid,
            answer.ids,
            Array.of(answer.token_log_probs),
            Array.of(answer.candidate_log_probs),
            Array.of(answer.top_ids),
            Array.of(answer.top_log_probs),
            Array.of(answer.end_log_probs),
            answer.live,
        )

    def answer(self) -> FuseAnswer:
        return FuseAnswer(
            self.ids,
            self.token_log_probs.of_type(np.float64),
            self.candidate_log_probs.of_type(np.float64),
            self.top_ids.of_type(np.int64),
            self.top_log_probs.of_type(np.float64),
            self.end_log_probs.of_type(np.float64),
            self.live,
        )


class MetricsReply(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """The engine's statistics, pickled (see the module doc)."""

    rid: int
    stats: bytes


class ErrorReply(msgspec.Struct, tag=True, array_like=True, frozen=True):
    rid: int
    error: ErrorInfo


class StreamChunk(msgspec.Struct, array_like=True, frozen=True):
    """One stream's hand-over: GenerateResponse wire bytes, the events they hold (for
    backpressure), how many samples ended in them, whether the last message is still open
    (no sample ended in it: a later chunk's first message may be merged into it), whether the
    stream ends here, and the error that ends it instead."""

    sid: int
    messages: list[bytes]
    events: int
    finished: int
    open_tail: bool
    last: bool
    error: ErrorInfo | None = None


class Events(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """One scheduler hand-over: every stream's chunk, in one frame."""

    chunks: list[StreamChunk]


class Parked(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """Backpressure: stream `sid` was parked (True) or resumed (False)."""

    sid: int
    parked: bool


ToFront = (
    Ready
    | Failed
    | BatchScoresReply
    | ScoreReply
    | PrefixTotalsReply
    | BeamSearchReply
    | RescoreLatticesReply
    | CompleteReply
    | FuseReply
    | MetricsReply
    | ErrorReply
    | Events
    | Parked
)
Reply = (
    BatchScoresReply
    | ScoreReply
    | PrefixTotalsReply
    | BeamSearchReply
    | RescoreLatticesReply
    | CompleteReply
    | FuseReply
    | MetricsReply
    | ErrorReply
)

# -- conversions ---------------------------------------------------------------------------


def scoring_work(prepared: PreparedScoring) -> ScoringWork:
    """A prepared request as the protocol carries it (front side)."""
    batch = prepared.batch
    oov_counts = prepared.oov_counts
    return ScoringWork(
        Array.of(batch.ids),
        Array.of(batch.offsets),
        Array.of(batch.oov),
        Array.of(oov_counts),
        Array.of(prepared.lengths),
        prepared.options.bos,
        prepared.options.eos,
        prepared.details,
        prepared.oov_log_probs,
        prepared.per_token,
        None if prepared.words is None else [int(w) for w in prepared.words],
        None if prepared.word_lists is None else [list(w) for w in prepared.word_lists],
        None if batch.starts is None else Array.of(batch.starts),
    )


def prepared_of(work: ScoringWork) -> PreparedScoring:
    """The prepared request back from the protocol (worker side)."""
    oov_counts = work.oov_counts.of_type(np.int64)
    batch = EncodedBatch(
        ids=work.ids.of_type(np.int32),
        offsets=work.offsets.of_type(np.int64),
        oov=work.oov.of_type(np.bool_),
        oov_counts=oov_counts,
        starts=None if work.starts is None else work.starts.of_type(np.int32),
    )
    return PreparedScoring(
        batch=batch,
        lengths=work.lengths.of_type(np.int64),
        words=work.words,
        word_lists=work.word_lists,
        options=ScoreOptions(bos=work.bos, eos=work.eos),
        details=work.details,
        oov_log_probs=work.oov_log_probs,
        oov_counts=oov_counts,
        per_token=work.per_token,
    )


def batch_scores_reply(rid: int, scores: BatchScores) -> BatchScoresReply:
    return BatchScoresReply(
        rid,
        Array.of(scores.totals),
        optional_array(scores.token_log_probs),
        optional_array(scores.token_offsets),
        optional_array(scores.ngram_lengths),
    )


_encoder = msgspec.msgpack.Encoder()


# Socket buffers: a large scoring request or reply is written in few system calls.
SOCKET_BUFFER_BYTES = 4 << 20


def tune_socket(sock: socket.socket) -> None:
    """Sizes a front-worker socket's buffers (both ends, every way the two connect)."""
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER_BYTES)


def encode(message: msgspec.Struct) -> bytearray:
    """One frame: its length, then the message (encoded after the header's room, not copied
    behind it: Score replies run to megabytes)."""
    frame = bytearray(_HEADER.size)
    _encoder.encode_into(message, frame, _HEADER.size)
    _HEADER.pack_into(frame, 0, len(frame) - _HEADER.size)
    return frame


M = TypeVar("M", ToFront, ToWorker)


class Direction(Generic[M]):
    """One direction's frames: the union of its message types (`TO_FRONT`, `TO_WORKER`).

    A union is no `type[T]` to mypy, so msgspec's stubs cannot infer a decoder's message type
    from it; the direction names that type once, here, and `decoder` returns it."""

    def __init__(self, kind: object) -> None:
        self.kind = kind

    def decoder(self) -> msgspec.msgpack.Decoder[M]:
        decoder: msgspec.msgpack.Decoder[M] = msgspec.msgpack.Decoder(self.kind)
        return decoder


TO_FRONT: Direction[ToFront] = Direction(ToFront)
TO_WORKER: Direction[ToWorker] = Direction(ToWorker)


def decoder(direction: Direction[M]) -> msgspec.msgpack.Decoder[M]:
    """A decoder for one direction's messages (`TO_FRONT` or `TO_WORKER`)."""
    return direction.decoder()


class FrameReader(Generic[M]):
    """Cuts a byte stream into messages (the asyncio side: bytes arrive in any pieces)."""

    def __init__(self, direction: Direction[M]) -> None:
        self._buffer = bytearray()
        self._decoder: msgspec.msgpack.Decoder[M] = direction.decoder()

    def feed(self, data: bytes) -> list[M]:
        buffer = self._buffer
        buffer += data
        out: list[M] = []
        start = 0
        end = len(buffer)
        decode = self._decoder.decode
        while end - start >= 4:
            (size,) = _HEADER.unpack_from(buffer, start)
            if end - start - 4 < size:
                break
            out.append(decode(memoryview(buffer)[start + 4 : start + 4 + size]))
            start += 4 + size
        if start:
            del buffer[:start]
        return out


def recv_frame(sock: socket.socket, decode: msgspec.msgpack.Decoder[M]) -> M | None:
    """One message from a blocking socket; None when the other end closed."""
    header = _recv_exactly(sock, 4)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    payload = _recv_exactly(sock, size)
    if payload is None:
        return None
    return decode.decode(payload)


def _recv_exactly(sock: socket.socket, size: int) -> bytearray | None:
    data = bytearray(size)
    view = memoryview(data)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:])
        if n == 0:
            return None
        got += n
    return data
