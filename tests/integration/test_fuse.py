"""Shallow fusion over the wire (`Fuse`) against an independent reference, on a real server.

A beam search written here runs over synthetic per-frame token scores (seeded) with the model
fused in: score = frame score + LM_WEIGHT * log P(token | hypothesis), beam 8, the pruned ids
dropped. Fused through `Fuse` it must find the hypotheses and scores that the same search finds
when every LM score comes from Score of the hypothesis's whole token list (the backend's
full-sequence path, not the stepper the fusion uses): an n-gram word model (KJV 3-gram), an
LSTM and a tiny GPT-2. Every bad message ends its stream with its status; the server serves on.
"""

from __future__ import annotations

import math
import queue
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest
from http_calls import stream_call
from served import ServerFactory

from lmserve.client import LmServeClient
from lmserve.client.errors import InvalidArgumentError, ResourceExhaustedError
from lmserve.server.front.process.app import BackgroundServer
from lmserve.v1 import lm_service_pb2 as pb
from lmserve.v1 import lm_service_pb2_grpc

BEAM = 8
CANDIDATES = 5  # tokens a frame offers
FRAMES = 6
LM_WEIGHT = 0.6
MODELS = ("kjv3", "lstm", "tiny-gpt2")
STREAM_LIMIT = 64
MODEL_LIMIT = 100


@pytest.fixture(scope="module")
def server(
    serve: ServerFactory,
    tmp_path_factory: pytest.TempPathFactory,
    model_repository: Path,
    tiny_lstm: Path,
    hf_folders: dict[str, Path],
) -> BackgroundServer:
    root = tmp_path_factory.mktemp("fuse-models")
    (root / "kjv3").symlink_to(model_repository / "kjv3", target_is_directory=True)
    (root / "lstm").symlink_to(tiny_lstm, target_is_directory=True)
    (root / "tiny-gpt2").symlink_to(hf_folders["gpt2"], target_is_directory=True)
    return serve(
        root,
        fuse_max_hypotheses=STREAM_LIMIT,
        fuse_max_live_hypotheses=MODEL_LIMIT,
        fuse_max_candidates=60_000,
        http_port=0,
    )


@pytest.fixture(scope="module")
def stub(server: BackgroundServer) -> Iterator[lm_service_pb2_grpc.LanguageModelServiceStub]:
    with grpc.insecure_channel(server.address) as channel:
        yield lm_service_pb2_grpc.LanguageModelServiceStub(channel)


class Stream:
    """One Fuse call, a message at a time (the next is sent once the last is answered)."""

    _END = object()

    def __init__(self, stub: lm_service_pb2_grpc.LanguageModelServiceStub) -> None:
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self.call = stub.Fuse(iter(self._queue.get, self._END))
        self._answers = iter(self.call)

    def ask(self, request: pb.FuseRequest) -> pb.FuseResponse:
        self._queue.put(request)
        return next(self._answers)

    def close(self) -> None:
        self._queue.put(self._END)
        self.call.cancel()


def _vocab_size(stub: lm_service_pb2_grpc.LanguageModelServiceStub, model: str) -> int:
    return stub.GetModel(pb.GetModelRequest(model=model)).model.vocab_size


def _frames(model: str, vocab: int, seed: int) -> list[dict[int, float]]:
    """Per frame: CANDIDATES token ids (never the first three: <unk>, <s>, </s> or the
    specials a BPE vocabulary starts with) and their frame log-scores."""
    rng = np.random.default_rng(seed)
    frames = []
    for _ in range(FRAMES):
        ids = rng.choice(np.arange(3, vocab), size=CANDIDATES, replace=False)
        scores = np.log(rng.dirichlet(np.ones(CANDIDATES)))
        frames.append({int(i): float(s) for i, s in zip(ids, scores, strict=True)})
    return frames


@dataclass
class Hyp:
    tokens: tuple[int, ...]
    score: float
    lm: float
    id: int = 0


def _best(children: list[Hyp]) -> list[Hyp]:
    return sorted(children, key=lambda h: (-h.score, h.tokens))[:BEAM]


TokenLps = dict[tuple[int, ...], float]


def search_fused(stub: lm_service_pb2_grpc.LanguageModelServiceStub, model: str,
                 frames: list[dict[int, float]]) -> tuple[list[Hyp], TokenLps]:  # fmt: skip
    """The search with its LM scores from `Fuse`: each frame extends every beam hypothesis by
    every candidate and drops the last frame's children (the old beam and the pruned). Also
    returns each hypothesis's token log-prob as Fuse gave it."""
    stream = Stream(stub)
    try:
        first = stream.ask(pb.FuseRequest(model=model, query=[0], sequence=0))
        assert [h.id for h in first.hypotheses] == [0] and first.live == 1
        beam = [Hyp((), 0.0, 0.0, 0)]
        previous: list[int] = [0]
        next_id = 1
        token_lps: TokenLps = {}
        for t, frame in enumerate(frames):
            children, extend = [], []
            for h in beam:
                for token, am in frame.items():
                    children.append(Hyp((*h.tokens, token), h.score + am, h.lm, next_id))
                    extend.append(pb.FuseExtension(id=next_id, parent=h.id, token_id=token))
                    next_id += 1
            answer = stream.ask(pb.FuseRequest(extend=extend, drop=previous, sequence=t + 1))
            assert answer.sequence == t + 1 and answer.model == model
            assert [h.id for h in answer.hypotheses] == [c.id for c in children]
            for child, fused in zip(children, answer.hypotheses, strict=True):
                child.score += LM_WEIGHT * fused.token_log_prob
                child.lm += fused.token_log_prob
                token_lps[child.tokens] = fused.token_log_prob
            assert answer.live == len(children)
            beam = _best(children)
            previous = [c.id for c in children]
        return beam, token_lps
    finally:
        stream.close()


def search_scored(stub: lm_service_pb2_grpc.LanguageModelServiceStub, model: str,
                  frames: list[dict[int, float]]) -> list[Hyp]:  # fmt: skip
    """The same search with each child's LM score from Score of its whole token list."""
    beam = [Hyp((), 0.0, 0.0)]
    for frame in frames:
        children = [
            Hyp((*h.tokens, token), h.score + am, h.lm) for h in beam for token, am in frame.items()
        ]
        lps = _score_last(stub, model, [c.tokens for c in children])
        for child, lp in zip(children, lps, strict=True):
            child.score += LM_WEIGHT * lp
            child.lm += lp
        beam = _best(children)
    return beam


def _score_tokens(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub, model: str, texts: list[tuple[int, ...]]
) -> list[list[float]]:
    request = pb.ScoreRequest(
        model=model,
        token_ids=[pb.TokenIds(ids=list(t)) for t in texts],
        options=pb.ScoreOptions(bos=True, eos=False),
        return_tokens=True,
    )
    return [list(r.details.log_probs) for r in stub.Score(request).results]


def _score_last(stub: lm_service_pb2_grpc.LanguageModelServiceStub, model: str,
                texts: list[tuple[int, ...]]) -> list[float]:  # fmt: skip
    return [lps[-1] for lps in _score_tokens(stub, model, texts)]


@pytest.mark.parametrize("model", MODELS)
def test_fused_search_equals_the_search_scored_by_score(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub, model: str
) -> None:
    frames = _frames(model, _vocab_size(stub, model), seed=7)
    fused, token_lps = search_fused(stub, model, frames)
    scored = search_scored(stub, model, frames)
    assert [h.tokens for h in fused] == [h.tokens for h in scored]
    for f, s in zip(fused, scored, strict=True):
        assert f.score == pytest.approx(s.score, abs=1e-4)
        assert f.lm == pytest.approx(s.lm, abs=1e-4)
    # Every hypothesis's token log-probs are Score's per-token log-probs of its tokens.
    texts = sorted(token_lps)
    for text, lps in zip(texts, _score_tokens(stub, model, texts), strict=True):
        assert token_lps[text] == pytest.approx(lps[-1], abs=1e-5)


@pytest.mark.parametrize("model", MODELS)
def test_candidates_top_k_and_end_are_the_full_distribution(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub, model: str
) -> None:
    vocab = _vocab_size(stub, model)
    everything = list(range(vocab))
    stream = Stream(stub)
    try:
        stream.ask(pb.FuseRequest(model=model, sequence=1))
        answer = stream.ask(
            pb.FuseRequest(
                extend=[pb.FuseExtension(id=1, parent=0, token_id=5)],
                query=[0],
                candidate_ids=everything,
                top_k=10,
                end_log_prob=True,
            )
        )
    finally:
        stream.close()
    assert [h.id for h in answer.hypotheses] == [1, 0]
    child, root = answer.hypotheses
    assert root.token_log_prob == 0.0
    assert child.token_log_prob == pytest.approx(root.candidate_log_probs[5], abs=1e-6)
    for h, context in ((child, (5,)), (root, ())):
        full = np.asarray(h.candidate_log_probs)
        if model != "kjv3":  # (a backed-off ARPA model's rows need not sum to 1)
            assert np.logaddexp.reduce(full) == pytest.approx(0.0, abs=1e-3)
        order = np.lexsort((np.arange(vocab), -full))[:10]  # most probable first, ties by id
        assert list(h.top_ids) == order.tolist()
        assert list(h.top_log_probs) == pytest.approx(full[order].tolist(), abs=1e-9)
        assert len(h.top_tokens) == 10
        # The candidates' log-probs are Score's of the context followed by each candidate.
        picks = [3, 7, vocab - 1]
        scored = _score_last(stub, model, [(*context, c) for c in picks])
        assert [full[c] for c in picks] == pytest.approx(scored, abs=1e-5)
    # log P(</s> | hypothesis) is Score's of the hypothesis with </s> counted.
    request = pb.ScoreRequest(
        model=model, token_ids=[pb.TokenIds(ids=[5])], options=pb.ScoreOptions(eos=True),
        return_tokens=True,
    )  # fmt: skip
    end = stub.Score(request).results[0].details.log_probs[-1]
    assert child.end_log_prob == pytest.approx(end, abs=1e-5)


def _fails(stub: lm_service_pb2_grpc.LanguageModelServiceStub,
           messages: list[pb.FuseRequest]) -> grpc.RpcError:  # fmt: skip
    """Sends `messages` on one stream; the error that ends it."""
    with pytest.raises(grpc.RpcError) as caught:
        for _ in stub.Fuse(iter(messages)):
            pass
    return caught.value


def _ext(hid: int, parent: int, token: int = 4, text: str = "") -> pb.FuseExtension:
    return (
        pb.FuseExtension(id=hid, parent=parent, token=text)
        if text
        else pb.FuseExtension(id=hid, parent=parent, token_id=token)
    )


INVALID = [
    ([pb.FuseRequest(query=[0])], "model: is empty"),
    ([pb.FuseRequest(model="lstm", extend=[_ext(1, 17)])], "extend[0].parent: 17 is not a live"),
    (
        [pb.FuseRequest(model="lstm", extend=[_ext(1, 0), _ext(1, 0)])],
        "extend[1].id: 1 is also extend[0].id",
    ),
    (
        [pb.FuseRequest(model="lstm", extend=[_ext(1, 0)]), pb.FuseRequest(extend=[_ext(1, 0)])],
        "extend[0].id: 1 is already a live hypothesis",
    ),
    ([pb.FuseRequest(model="lstm", extend=[_ext(0, 0)])], "extend[0].id: 0 is the root"),
    ([pb.FuseRequest(model="lstm", extend=[_ext(1, 0, 99)])], "extend[0].token_id: 99 is outside"),
    (
        [pb.FuseRequest(model="lstm", extend=[_ext(1, 0, text="zebra")])],
        "extend[0].token: 'zebra' is not in",
    ),
    (
        [pb.FuseRequest(model="lstm", extend=[_ext(1, 0), _ext(2, 1)])],
        "extend[1].parent: 1 is created by this message",
    ),
    ([pb.FuseRequest(model="lstm"), pb.FuseRequest(model="kjv3")], "model: changed mid-stream"),
    ([pb.FuseRequest(model="lstm", drop=[3])], "drop[0]: 3 is not a live"),
    ([pb.FuseRequest(model="lstm", drop=[0], query=[0])], "query[0]: 0 is not a live"),
    ([pb.FuseRequest(model="lstm", top_k=-1)], "top_k: is -1"),
    ([pb.FuseRequest(model="lstm", candidate_ids=[3, 40])], "candidate_ids[1]: 40 is outside"),
]


@pytest.mark.parametrize(("messages", "message"), INVALID)
def test_a_bad_message_ends_its_stream_with_invalid_argument(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub,
    messages: list[pb.FuseRequest],
    message: str,
) -> None:
    error = _fails(stub, messages)
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert str(error.details()).startswith(message)
    assert "\n" not in str(error.details())
    _still_serves(stub)


def _still_serves(stub: lm_service_pb2_grpc.LanguageModelServiceStub) -> None:
    answers = list(stub.Fuse(iter([pb.FuseRequest(model="lstm", extend=[_ext(1, 0, text="the")])])))
    assert answers[0].hypotheses[0].token_log_prob < 0


def test_unknown_model_is_not_found(stub: lm_service_pb2_grpc.LanguageModelServiceStub) -> None:
    error = _fails(stub, [pb.FuseRequest(model="no-such-model")])
    assert error.code() is grpc.StatusCode.NOT_FOUND
    _still_serves(stub)


def test_too_many_hypotheses_is_resource_exhausted_per_stream_and_per_model(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub,
) -> None:
    many = [_ext(i, 0) for i in range(1, STREAM_LIMIT + 1)]  # + the root: one too many
    error = _fails(stub, [pb.FuseRequest(model="lstm", extend=many)])
    assert error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "fuse_max_hypotheses" in str(error.details())
    # Across streams: one holds 60, the next may not add 45 (the model's bound is 100).
    holder = Stream(stub)
    try:
        holder.ask(pb.FuseRequest(model="lstm", extend=[_ext(i, 0) for i in range(1, 60)]))
        error = _fails(
            stub, [pb.FuseRequest(model="lstm", extend=[_ext(i, 0) for i in range(1, 45)])]
        )
        assert error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "fuse_max_live_hypotheses" in str(error.details())
        _still_serves(stub)
    finally:
        holder.close()
    # The cancelled stream's states are released: the same request then fits.
    for _ in range(100):
        try:
            list(stub.Fuse(iter([pb.FuseRequest(model="lstm", extend=many[:55])])))
            break
        except grpc.RpcError as again:
            assert again.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            time.sleep(0.05)
    else:
        pytest.fail("a cancelled Fuse stream kept its hypotheses")


def test_client_session_sync_and_async(server: BackgroundServer) -> None:
    import asyncio

    from lmserve.client import AsyncLmServeClient

    with LmServeClient(server.address) as client, client.fuse("lstm") as lm:
        (root,) = lm.step(query=[0], candidate_ids=[3, 4], top_k=3, end_log_prob=True)
        kids = lm.step([(1, 0, "the"), (2, 0, 4)], drop=[0])
        assert kids[0].token_log_prob == pytest.approx(root.candidate_log_probs[0], abs=1e-6)
        assert kids[1].token_log_prob == pytest.approx(root.candidate_log_probs[1], abs=1e-6)
        assert [t.log_prob for t in root.top] == sorted(
            (t.log_prob for t in root.top), reverse=True
        )
        assert root.end_log_prob is not None and lm.live == 2
        with pytest.raises(InvalidArgumentError, match=r"extend\[0\].parent: 0 is not a live"):
            lm.step([(3, 0, "the")])

    async def run() -> float:
        async with AsyncLmServeClient(server.address) as client:
            async with client.fuse("lstm") as lm:
                (kid,) = await lm.step([(1, 0, "the")])
                with pytest.raises(ResourceExhaustedError):
                    await lm.step([(i, 1, 3) for i in range(2, STREAM_LIMIT + 2)])
                return kid.token_log_prob

    assert asyncio.run(run()) == pytest.approx(kids[0].token_log_prob, abs=1e-6)
    assert math.isfinite(kids[0].token_log_prob)


def test_fuse_over_connect_json(server: BackgroundServer) -> None:
    """The HTTP front serves Fuse as a Connect stream (here half-duplex: every message sent,
    then every answer read), the same answers as gRPC's."""
    assert server.http_port
    messages = [
        {"model": "lstm", "query": ["0"], "candidateIds": [3], "sequence": "1"},
        {"extend": [{"id": "1", "parent": "0", "token": "the"}], "drop": ["0"], "sequence": "2"},
        {"extend": [{"id": "2", "parent": "9", "tokenId": 3}]},
    ]
    status, answers, end = stream_call(server.http_port, "Fuse", messages)
    assert status == 200 and len(answers) == 2
    root, kid = answers[0]["hypotheses"][0], answers[1]["hypotheses"][0]
    assert kid["id"] == "1" and answers[1]["live"] == 1
    the = kid["tokenLogProb"]
    with LmServeClient(server.address) as client, client.fuse("lstm") as lm:
        (fused,) = lm.step([(1, 0, "the")])
    assert the == pytest.approx(fused.token_log_prob, abs=1e-9)
    assert root["candidateLogProbs"][0] < 0
    assert end["error"]["code"] == "invalid_argument"
    assert end["error"]["message"].startswith("extend[0].parent: 9 is not a live hypothesis")
