"""Complete (autocomplete sessions) against a real server: exact answers and the contract.

N-gram answers are checked against a brute-force top k over the whole vocabulary, by the n-gram
backend's `next_token_log_probs` and by KenLM's own probabilities (the `kenlm` module on the
same ARPA); neural answers against the ONNX backend's full distribution and a re-score of
context + word through Score. The rest is the wire contract: rollback, reset, sequence and
skipped, sessions that outlive their stream and their server process, and every bad input.
"""

from __future__ import annotations

import math
import os
import queue
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from integration_data import KJV_PATTERN
from served import ServerFactory

from lmserve.client import Completion, LmServeClient
from lmserve.server.backends.ngram.folder import write_model_folder
from lmserve.server.backends.ngram.model import NgramModel
from lmserve.server.backends.onnx import OnnxBackend, OnnxOptions
from lmserve.server.front.process.app import BackgroundServer
from lmserve.server.manifest import Provenance, TokenizerSpec, read_manifest
from lmserve.server.text.vocab import Vocabulary
from lmserve.v1 import lm_service_pb2 as pb
from lmserve.v1 import lm_service_pb2_grpc

REPO_ROOT = Path(__file__).resolve().parents[2]
LSTM_FOLDER = REPO_ROOT / "models" / "kjv-lstm"
LN10 = math.log(10.0)
MAX_TOKENS = 40
K_LIMIT = 100
NGRAM, LSTM = "kjv3", "kjv-lstm"
# Contexts (word lists) and the word typed next, from the KJV test set and edge cases.
CASES = [
    ([], "in"),
    (["in", "the"], "beginning"),
    (["and", "god", "said", "let", "there", "be"], "light"),
    (["and", "the", "lord", "spake", "unto"], "moses"),
    (["zzyzx", "of"], "the"),  # an OOV word in the context
]


# -- fixtures ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(serve: ServerFactory, kjv_repository: Path) -> BackgroundServer:
    return serve(
        kjv_repository,
        max_tokens_per_text=MAX_TOKENS,
        # The base model's exact answers: the session cache is off here and tested in
        # test_complete_cache.py.
        complete_cache_weight=0.0,
    )


@pytest.fixture(scope="module")
def client(server: BackgroundServer) -> Iterator[LmServeClient]:
    with LmServeClient(server.address) as c:
        yield c


@pytest.fixture(scope="module")
def stub(server: BackgroundServer) -> Iterator[lm_service_pb2_grpc.LanguageModelServiceStub]:
    with grpc.insecure_channel(server.address) as channel:
        yield lm_service_pb2_grpc.LanguageModelServiceStub(channel)


@pytest.fixture(scope="module")
def ngram(shared_data: Path) -> NgramModel:
    return NgramModel.from_arpa(shared_data / "kjv" / "kenlm" / "kjv.3gram.arpa")


@pytest.fixture(scope="module")
def kenlm_model(shared_data: Path) -> Any:
    import kenlm

    return kenlm.Model(str(shared_data / "kjv" / "kenlm" / "kjv.3gram.arpa"))


@pytest.fixture(scope="module")
def lstm() -> OnnxBackend:
    return OnnxBackend.load(LSTM_FOLDER, read_manifest(LSTM_FOLDER), OnnxOptions())


# -- references ----------------------------------------------------------------------------------


def _ids(vocab: Vocabulary, words: Sequence[str]) -> list[int]:
    return [vocab.index.get(w, vocab.unk_id) for w in words]


def _by_word(vocab: Vocabulary, log_probs: np.ndarray, prefix: str) -> dict[str, float]:
    """Every ordinary word of the vocabulary that starts with `prefix`, with its log-prob."""
    specials = {vocab.bos_id, vocab.eos_id, vocab.unk_id, vocab.pad_id}
    return {
        w: float(log_probs[i])
        for i, w in enumerate(vocab.words)
        if i not in specials and w.startswith(prefix)
    }


def _kenlm_by_word(model: Any, vocab: Vocabulary, context: Sequence[str], prefix: str) -> dict:
    """KenLM's log P(w | <s> context) in nats for every word with the prefix (state API)."""
    import kenlm

    state, out = kenlm.State(), kenlm.State()
    model.BeginSentenceWrite(state)
    for word in context:
        model.BaseScore(state, word, out)
        state, out = out, state
    scratch = kenlm.State()
    words = _by_word(vocab, np.zeros(len(vocab)), prefix)
    return {w: model.BaseScore(state, w, scratch) * LN10 for w in words}


def assert_top_k(got: Sequence[Completion], reference: dict[str, float], k: int) -> None:
    """`got` holds k distinct words of the reference, each with its reference log-prob, and
    their log-probs are the k best of the reference, best first (ties in any order)."""
    assert len(got) == min(k, len(reference))
    assert len({c.word for c in got}) == len(got)
    for c in got:
        assert c.word in reference, c.word
        assert c.log_prob == pytest.approx(reference[c.word], abs=1e-4), c.word
    best = sorted(reference.values(), reverse=True)[:k]
    np.testing.assert_allclose([c.log_prob for c in got], best, atol=1e-4)


def _prefixes(word: str) -> list[str]:
    return ["", word[:1], word[:2], word]


# -- exact answers -------------------------------------------------------------------------------


@pytest.mark.parametrize(("context", "word"), CASES)
def test_ngram_answers_are_the_brute_force_top_k_by_backend_and_by_kenlm(
    client: LmServeClient, ngram: NgramModel, kenlm_model: Any, context: list[str], word: str
) -> None:
    dist = ngram.next_token_log_probs(_ids(ngram.vocab, context))
    with client.complete(NGRAM, k=5) as session:
        if context:
            session.type(" ".join(context) + " ")
        for prefix in _prefixes(word):
            got = session.suggest(prefix)
            assert_top_k(got, _by_word(ngram.vocab, dist, prefix), 5)
            assert_top_k(got, _kenlm_by_word(kenlm_model, ngram.vocab, context, prefix), 5)
        assert session.suggest(word[:1], k=K_LIMIT) == sorted(
            session.suggest(word[:1], k=K_LIMIT), key=lambda c: -c.log_prob
        )


@pytest.mark.parametrize(("context", "word"), CASES)
def test_neural_answers_are_the_brute_force_top_k_and_equal_a_rescore(
    client: LmServeClient, lstm: OnnxBackend, context: list[str], word: str
) -> None:
    dist = lstm.next_token_log_probs(_ids(lstm.vocab, context))
    base = client.score(LSTM, [" ".join(context)], eos=False)[0].log_prob if context else 0.0
    with client.complete(LSTM, k=4) as session:
        if context:
            session.type(" ".join(context) + " ")
        for prefix in _prefixes(word):
            got = session.suggest(prefix)
            assert_top_k(got, _by_word(lstm.vocab, dist, prefix), 4)
            texts = [" ".join([*context, c.word]) for c in got]
            rescored = [s.log_prob - base for s in client.score(LSTM, texts, eos=False)]
            np.testing.assert_allclose([c.log_prob for c in got], rescored, atol=1e-4)


def test_the_partial_word_is_normalised_and_specials_are_never_offered(
    client: LmServeClient, ngram: NgramModel
) -> None:
    specials = {"<s>", "</s>", "<unk>"}
    with client.complete(NGRAM, k=K_LIMIT) as session:
        assert session.suggest("GO") == session.suggest("go")
        assert all(c.word.startswith("go") for c in session.suggest("GO"))
        assert specials.isdisjoint(c.word for c in session.suggest(""))
        assert session.suggest("<") == []
        session.type("and god said ")
        assert specials.isdisjoint(c.word for c in session.suggest(""))


# -- the session ---------------------------------------------------------------------------------


def _stream(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub, requests: Sequence[pb.CompleteRequest]
) -> list[pb.CompleteResponse]:
    """Sends all `requests` on one stream without waiting, returns every answer."""
    return list(stub.Complete(iter(requests), timeout=30))


def _expected(ngram: NgramModel, context: Sequence[str], prefix: str) -> dict[str, float]:
    return _by_word(ngram.vocab, ngram.next_token_log_probs(_ids(ngram.vocab, context)), prefix)


def _completions(response: pb.CompleteResponse) -> list[Completion]:
    return [Completion(c.word, c.log_prob) for c in response.completions]


def test_rollback_and_reset(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub, ngram: NgramModel
) -> None:
    first = pb.CompleteRequest(model=NGRAM, append_text="In the Beginning God", k=3, sequence=1)
    [answer] = _stream(stub, [first])
    assert list(answer.appended_tokens) == ["in", "the", "beginning", "god"]
    assert answer.context_tokens == 4 and answer.session_id and answer.model == NGRAM
    session = answer.session_id
    later = [
        pb.CompleteRequest(session_id=session, model=NGRAM, rollback_tokens=2, k=3, sequence=2),
        pb.CompleteRequest(rollback_tokens=1, partial_word="t", k=3, sequence=3),
        pb.CompleteRequest(reset=True, append_text="and", partial_word="g", k=3, sequence=4),
    ]
    answers = []
    for request in later:  # one message a stream: each is answered, none skipped
        [response] = _stream(stub, [request] if request.model else [_continue(session, request)])
        answers.append(response)
    assert [a.context_tokens for a in answers] == [2, 1, 1]
    assert_top_k(_completions(answers[0]), _expected(ngram, ["in", "the"], ""), 3)
    assert_top_k(_completions(answers[1]), _expected(ngram, ["in"], "t"), 3)
    assert_top_k(_completions(answers[2]), _expected(ngram, ["and"], "g"), 3)


def _continue(session: str, request: pb.CompleteRequest) -> pb.CompleteRequest:
    """`request` as a new stream's first message for `session`."""
    opening = pb.CompleteRequest()
    opening.CopyFrom(request)
    opening.session_id, opening.model = session, NGRAM
    return opening


def test_sequence_is_echoed_and_only_the_newest_waiting_message_is_answered(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub, ngram: NgramModel
) -> None:
    requests = [pb.CompleteRequest(model=NGRAM, append_text="and", k=3, sequence=10)]
    requests += [
        pb.CompleteRequest(append_text=w, partial_word="l", k=3, sequence=11 + i)
        for i, w in enumerate(["god", "said", "let", "there", "be"])
    ]
    answers = _stream(stub, requests)
    assert [a.sequence for a in answers] == [r.sequence for r in requests]
    assert not answers[-1].skipped
    assert_top_k(
        _completions(answers[-1]), _expected(ngram, "and god said let there be".split(), "l"), 3
    )
    for a in answers[:-1]:
        assert a.skipped or len(a.completions) == 3
        if a.skipped:
            assert not a.completions
    assert [t for a in answers for t in a.appended_tokens] == "and god said let there be".split()
    assert [a.context_tokens for a in answers] == [1, 2, 3, 4, 5, 6]


def test_the_session_outlives_its_stream(client: LmServeClient, ngram: NgramModel) -> None:
    with client.complete(NGRAM, k=3) as session:
        session.type("and god said let ")
        session_id = session.session_id
    with client.complete(NGRAM, k=3, session_id=session_id) as again:
        got = again.suggest("th")
        assert again.session_id == session_id
    assert_top_k(got, _expected(ngram, ["and", "god", "said", "let"], "th"), 3)


def test_a_resent_context_is_reused_and_a_changed_one_rebuilt(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub, ngram: NgramModel
) -> None:
    [a] = _stream(stub, [pb.CompleteRequest(model=NGRAM, append_text="and god", k=3, sequence=1)])
    same = pb.TokenList(tokens=["and", "god"])
    [b] = _stream(
        stub,
        [pb.CompleteRequest(model=NGRAM, session_id=a.session_id, context=same, k=3, sequence=2)],
    )
    assert not b.rebuilt and b.context_tokens == 2
    other = pb.TokenList(tokens=["the", "lord"])
    [c] = _stream(
        stub,
        [pb.CompleteRequest(model=NGRAM, session_id=a.session_id, context=other, k=3, sequence=3)],
    )
    assert c.rebuilt and c.context_tokens == 2
    assert_top_k(_completions(c), _expected(ngram, ["the", "lord"], ""), 3)


# -- bad input -----------------------------------------------------------------------------------

INVALID, NOT_FOUND = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND
# case -> (message, sent on the session's stream?, accepted codes, the field named)
BAD: dict[str, tuple[pb.CompleteRequest, bool, set[grpc.StatusCode], str]] = {
    "no model": (pb.CompleteRequest(partial_word="g", k=3), False, {INVALID}, "model"),
    "unknown model": (pb.CompleteRequest(model="no-such-model", k=3), False, {NOT_FOUND}, "model"),
    "k zero": (pb.CompleteRequest(model=NGRAM, k=0), True, {INVALID}, "k"),
    "k negative": (pb.CompleteRequest(model=NGRAM, k=-1), True, {INVALID}, "k"),
    "k over the limit": (pb.CompleteRequest(model=NGRAM, k=K_LIMIT + 1), True, {INVALID}, "k"),
    "rollback beyond the context": (
        pb.CompleteRequest(model=NGRAM, rollback_tokens=3, k=3),
        True,
        {INVALID},
        "rollback_tokens",
    ),
    "too long text": (
        pb.CompleteRequest(model=NGRAM, append_text=" ".join(["god"] * (MAX_TOKENS + 1)), k=3),
        True,
        {INVALID},
        "append_text",
    ),
    "a session of another model": (
        pb.CompleteRequest(model=LSTM, k=3),
        True,
        {INVALID, NOT_FOUND},
        "session_id",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_ends_the_stream_naming_the_field_and_the_session_lives_on(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub, ngram: NgramModel, case: str
) -> None:
    [start] = _stream(stub, [pb.CompleteRequest(model=NGRAM, append_text="and god", k=3)])
    session = start.session_id
    bad, on_session, codes, field = BAD[case]
    request = pb.CompleteRequest()
    request.CopyFrom(bad)
    if on_session:
        request.session_id = session
    with pytest.raises(grpc.RpcError) as err:
        _stream(stub, [request])
    assert err.value.code() in codes
    assert field in err.value.details()
    # The session is still there, unchanged, from a new stream.
    [after] = _stream(
        stub, [pb.CompleteRequest(model=NGRAM, session_id=session, partial_word="s", k=3)]
    )
    assert after.session_id == session and after.context_tokens == 2
    assert_top_k(_completions(after), _expected(ngram, ["and", "god"], "s"), 3)


def test_an_error_after_good_messages_keeps_their_answers(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub,
) -> None:
    answers: list[pb.CompleteResponse] = []
    requests = [
        pb.CompleteRequest(model=NGRAM, append_text="and", k=3, sequence=1),
        pb.CompleteRequest(rollback_tokens=5, k=3, sequence=2),
    ]
    outgoing: queue.SimpleQueue[Any] = queue.SimpleQueue()
    call = stub.Complete(iter(outgoing.get, None), timeout=30)
    outgoing.put(requests[0])
    answers.append(next(call))
    outgoing.put(requests[1])
    with pytest.raises(grpc.RpcError) as err:
        answers.append(next(call))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "rollback_tokens" in err.value.details()
    assert len(answers) == 1 and answers[0].context_tokens == 1


# -- the client library over real servers --------------------------------------------------------


def test_the_client_session_types_backspaces_and_accepts(
    client: LmServeClient, ngram: NgramModel
) -> None:
    with client.complete(NGRAM, k=3) as session:
        assert_top_k(session.type("And God sa"), _expected(ngram, ["and", "god"], "sa"), 3)
        assert session.context == ("and", "god") and session.partial == "sa"
        assert_top_k(session.backspace(3), _expected(ngram, ["and"], "god"), 3)
        assert session.context == ("and",)
        assert_top_k(session.accept("god"), _expected(ngram, ["and", "god"], ""), 3)
        assert_top_k(session.reset(), _expected(ngram, [], ""), 3)


def _serve(repository: Path, port: int) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LMSERVE_")}
    env["LMSERVE_METRICS_ENABLED"] = "false"
    command = [sys.executable, "-m", "lmserve.server.cli", "serve", "--host", "127.0.0.1"]
    command += ["--port", str(port), "--model-repository", str(repository)]
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _wait_serving(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    with LmServeClient(f"127.0.0.1:{port}") as probe:
        while time.monotonic() < deadline:
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            try:
                if probe.health(NGRAM, timeout=1).serving:
                    return
            except Exception:
                time.sleep(0.2)
    pytest.fail("the server did not start serving")


def test_a_session_survives_its_server_process_being_replaced(
    tmp_path: Path, shared_data: Path, ngram: NgramModel
) -> None:
    from socket import socket

    repository = tmp_path / "models"
    repository.mkdir()
    write_model_folder(
        ngram,
        repository / NGRAM,
        name=NGRAM,
        tokenizer=TokenizerSpec.model_validate({"lowercase": True, "pattern": KJV_PATTERN}),
        provenance=Provenance(trained_by="tests"),
    )
    with socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    first = _serve(repository, port)
    second: subprocess.Popen[bytes] | None = None
    try:
        _wait_serving(port, first)
        # cache_weight 0 (sent again on the new stream): the base model's exact answers.
        opened = {"k": 3, "cache_weight": 0.0}
        with (
            LmServeClient(f"127.0.0.1:{port}") as client,
            client.complete(NGRAM, **opened) as session,
        ):
            before = session.type("and god said let there be li")
            first.kill()
            first.wait(timeout=10)
            second = _serve(repository, port)
            _wait_serving(port, second)
            after = session.suggest("li")  # the old stream is dead: resumed on `second`
            assert after == before
            assert session.context == ("and", "god", "said", "let", "there", "be")
            assert_top_k(after, _expected(ngram, session.context, "li"), 3)
            assert_top_k(session.type("g"), _expected(ngram, session.context, "lig"), 3)
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait(timeout=10)
