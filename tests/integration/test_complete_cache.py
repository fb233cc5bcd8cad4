"""Adaptive Complete sessions against a real server: the session's own words, mixed in.

Every answer is checked against a brute-force reference of the same mixture, computed here from
scratch: the base model's whole next-word distribution (the n-gram backend in-process, or the
ONNX LSTM backend), and the cache's unigram and bigram counts recounted from the session's
sentences, its context and its user words, for every word that starts with the prefix. The
contract: the cache follows typing, rollback and reset; user words outside the vocabulary are
offered; a session rebuilt from its fields on another server answers the same words.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from pathlib import Path

import grpc
import numpy as np
import pytest
from cache_reference import cache_reference
from served import ServerFactory

from lmserve.client import Completion, LmServeClient
from lmserve.server.backends.base import LanguageModelBackend
from lmserve.server.backends.ngram.model import NgramModel
from lmserve.server.backends.onnx import OnnxBackend, OnnxOptions
from lmserve.server.front.process.app import BackgroundServer
from lmserve.server.manifest import read_manifest
from lmserve.v1 import lm_service_pb2 as pb
from lmserve.v1 import lm_service_pb2_grpc

REPO_ROOT = Path(__file__).resolve().parents[2]
LSTM_FOLDER = REPO_ROOT / "models" / "kjv-lstm"
NGRAM, LSTM = "kjv3", "kjv-lstm"
WEIGHT, USER_COUNT, HISTORY_WORDS = 0.2, 1.0, 12
SENTENCES = [
    "and nebuchadnezzar the king of babylon came",
    "and nebuchadnezzar spake unto daniel",
    "then zorblax said unto nebuchadnezzar",
]
USER_WORDS = ["zorblax", "zorbaz", "daniel"]


SETTINGS: dict[str, object] = {
    "complete_cache_weight": WEIGHT,
    "complete_user_word_count": USER_COUNT,
    "complete_cache_history_words": HISTORY_WORDS,
}


@pytest.fixture(scope="module")
def server(serve: ServerFactory, kjv_repository: Path) -> BackgroundServer:
    return serve(kjv_repository, **SETTINGS)


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
def lstm() -> OnnxBackend:
    return OnnxBackend.load(LSTM_FOLDER, read_manifest(LSTM_FOLDER), OnnxOptions())


# -- the reference -------------------------------------------------------------------------------


def _kept(history: list[list[str]]) -> list[list[str]]:
    """The finished sentences the cache keeps: the newest whose words fit HISTORY_WORDS (at
    least the newest one)."""
    kept: list[list[str]] = []
    total = 0
    for sentence in reversed(history):
        if kept and total + len(sentence) > HISTORY_WORDS:
            break
        kept.insert(0, sentence)
        total += len(sentence)
    return kept


def reference(
    base: LanguageModelBackend,
    history: list[list[str]],
    context: list[str],
    user_words: Sequence[str],
    prefix: str,
    weight: float = WEIGHT,
) -> dict[str, float]:
    """log P(word | context) under the mixture, for every word that starts with `prefix`."""
    vocab = base.vocab
    ids = [vocab.index.get(w, vocab.unk_id) for w in context]
    log_probs = base.next_token_log_probs(ids)
    specials = {vocab.bos_id, vocab.eos_id, vocab.unk_id, vocab.pad_id}
    users = set(user_words)
    p_cache = cache_reference(_kept(history), context, users, USER_COUNT)
    counted = {w for s in [*_kept(history), context] for w in s}
    adapts = weight > 0 and bool(counted or users)  # an empty cache leaves the model alone
    words = {w for i, w in enumerate(vocab.words) if i not in specials} | counted | users
    out = {}
    for word in words:
        if not word.startswith(prefix):
            continue
        i = vocab.index.get(word)
        p_base = math.exp(float(log_probs[i])) if i is not None and i not in specials else 0.0
        p = (1 - weight) * p_base + weight * p_cache(word) if adapts else p_base
        if p > 0:
            out[word] = math.log(p)
    return out


def assert_top_k(got: Sequence[Completion], expected: dict[str, float], k: int) -> None:
    """`got` is k distinct words of the reference with its log-probs, the k best, best first."""
    assert len(got) == min(k, len(expected))
    assert len({c.word for c in got}) == len(got)
    for c in got:
        assert c.word in expected, c.word
        assert c.log_prob == pytest.approx(expected[c.word], abs=1e-6), c.word
    best = sorted(expected.values(), reverse=True)[:k]
    np.testing.assert_allclose([c.log_prob for c in got], best, atol=1e-6)


# -- exact answers -------------------------------------------------------------------------------


@pytest.mark.parametrize("model", [NGRAM, LSTM])
def test_answers_are_the_brute_force_mixture_as_the_session_grows(
    client: LmServeClient, ngram: NgramModel, lstm: OnnxBackend, model: str
) -> None:
    base: LanguageModelBackend = ngram if model == NGRAM else lstm
    history: list[list[str]] = []
    with client.complete(model, k=8, user_words=USER_WORDS) as session:
        for sentence in SENTENCES:
            words = sentence.split()
            for i, word in enumerate(words):
                for prefix in ("", word[:1], word[:2]):
                    got = session.suggest(prefix)
                    expected = reference(base, history, words[:i], USER_WORDS, prefix)
                    assert_top_k(got, expected, 8)
                session.accept(word)
            session.reset()
            history.append(words)
        assert [list(s) for s in session.history] == history


def test_the_cache_follows_rollback(client: LmServeClient, ngram: NgramModel) -> None:
    with client.complete(NGRAM, k=6) as session:
        session.type("and babylon babylon came unto babylon ")
        session.backspace(len("babylon ") + 1)  # "babylon" rolled back, "unt" is the partial
        assert session.context == ("and", "babylon", "babylon", "came")
        got = session.suggest("b")
        assert_top_k(got, reference(ngram, [], list(session.context), [], "b"), 6)
        session.backspace(len("came unt") + 1)
        assert_top_k(session.suggest("b"), reference(ngram, [], ["and", "babylon"], [], "b"), 6)


def test_user_words_outside_the_vocabulary_are_offered(client: LmServeClient) -> None:
    with client.complete(NGRAM, k=3, user_words=["Zorblax"]) as session:
        [found] = session.suggest("zorb")  # the tokenizer lowercases user words too
        assert found.word == "zorblax"
        assert found.log_prob == pytest.approx(math.log(WEIGHT))  # the cache's only word
    with client.complete(NGRAM, k=3, user_words=["zorblax"], cache_weight=0.0) as session:
        assert session.suggest("zorb") == []


def test_a_repeated_rare_word_is_offered_the_second_time(client: LmServeClient) -> None:
    with client.complete(NGRAM, k=3, cache_weight=0.0) as plain:
        plain.type("and nebuchadnezzar came ")
        plain.reset()
        assert "nebuchadnezzar" not in [c.word for c in plain.suggest("n")]
    with client.complete(NGRAM, k=3) as adaptive:
        adaptive.type("and nebuchadnezzar came ")
        adaptive.reset()
        assert "nebuchadnezzar" in [c.word for c in adaptive.suggest("n")]


def test_a_session_rebuilt_on_another_server_answers_the_same_words(
    client: LmServeClient, serve: ServerFactory, kjv_repository: Path
) -> None:
    with client.complete(LSTM, k=10, user_words=USER_WORDS, cache_weight=0.3) as session:
        for sentence in SENTENCES[:2]:
            session.type(sentence + " ")
            session.reset()
        session.type("then zorblax said unto ne")
        held = session.suggest("ne")
        history, context = session.history, session.context
    other = serve.private(kjv_repository, **SETTINGS)
    try:
        request = pb.CompleteRequest(
            model=LSTM,
            partial_word="ne",
            k=10,
            context=pb.TokenList(tokens=context),
            history=pb.SessionHistory(sentences=[pb.TokenList(tokens=s) for s in history]),
            user_words=pb.TokenList(tokens=USER_WORDS),
            cache_weight=0.3,
        )
        with grpc.insecure_channel(other.address) as channel:
            stub = lm_service_pb2_grpc.LanguageModelServiceStub(channel)
            [answer] = list(stub.Complete(iter([request]), timeout=30))
    finally:
        other.stop(grace=1.0)
    assert answer.rebuilt
    rebuilt = [Completion(c.word, c.log_prob) for c in answer.completions]
    assert [c.word for c in rebuilt] == [c.word for c in held]
    np.testing.assert_allclose(
        [c.log_prob for c in rebuilt], [c.log_prob for c in held], rtol=0, atol=1e-5
    )


# -- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "path"),
    [
        ({"user_words": pb.TokenList(tokens=["daniel", "new york"])}, "user_words.tokens[1]"),
        ({"user_words": pb.TokenList(tokens=["!!!"])}, "user_words.tokens[0]"),
        ({"cache_weight": 1.0}, "cache_weight"),
        ({"cache_weight": -0.1}, "cache_weight"),
        ({"cache_weight": math.nan}, "cache_weight"),
        (
            {"history": pb.SessionHistory(sentences=[pb.TokenList(tokens=["a", ""])])},
            "history.sentences[0].tokens[1]",
        ),
    ],
)
def test_bad_adaptation_fields_are_refused_naming_the_field(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub, fields: dict[str, object], path: str
) -> None:
    request = pb.CompleteRequest(model=NGRAM, k=3, **fields)  # type: ignore[arg-type]
    with pytest.raises(grpc.RpcError) as info:
        list(stub.Complete(iter([request]), timeout=30))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (info.value.details() or "").startswith(path), info.value.details()


def test_cli_complete_offers_user_words(
    server: BackgroundServer, capsys: pytest.CaptureFixture[str]
) -> None:
    from lmserve.server.cli import main

    argv = ["complete", "--target", server.address, "--model", NGRAM, "--json"]
    assert main([*argv, "--user-words", "zorblax,zorbaz", "--type", "zorb"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {c["word"] for c in records[-1]["completions"]} == {"zorblax", "zorbaz"}
    assert main([*argv, "--type", "and zorblax came\nzorb"]) == 0  # a newline ends a sentence
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [c["word"] for c in records[-1]["completions"]][:1] == ["zorblax"]


def test_a_long_document_answers_the_brute_force_mixture(
    client: LmServeClient, ngram: NgramModel, shared_data: Path
) -> None:
    """Many cache words (the cache's own top k is pre-selected) and the history bound."""
    verses = (shared_data / "kjv" / "test.txt").read_text(encoding="utf-8").splitlines()[:12]
    history: list[list[str]] = []
    with client.complete(NGRAM, k=2) as session:
        for verse in verses[:-1]:
            session.type(verse + " ")
            session.reset()
            history.append(verse.split())
        context = verses[-1].split()[:3]
        session.type(" ".join(context) + " ")
        for prefix in ("", "a", "th", "w"):
            expected = reference(ngram, history, context, [], prefix)
            assert_top_k(session.suggest(prefix), expected, 2)
