"""Hypothesis strategies for requests of every RPC, and one call that returns its status code.

    @given(call=rpc_calls())
    def test(call): assert send(stub, call) in ALLOWED

Used by tests/integration/test_fuzz_rpcs.py (a few hundred examples) and bench/fuzz_rpcs.py
(ten thousand). Values are what a careless or hostile client sends: empty, huge, negative,
NaN and infinities, unknown enum numbers, any unicode, models that do not exist or failed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
from hypothesis import strategies as st

from lmserve.v1 import lm_service_pb2 as pb
from lmserve.v1 import lm_service_pb2_grpc

# Every status a request may get; INTERNAL and UNKNOWN are bugs.
ALLOWED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNIMPLEMENTED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.UNAVAILABLE,
}
READY = ["test", "test-arpa", "kjv3"]
FAILED = ["bad-checksum", "neural"]

INT32 = st.one_of(
    st.integers(-3, 20),
    st.sampled_from([-(2**31), 2**31 - 1, 1000, 100_000]),
    st.integers(-(2**31), 2**31 - 1),
)
SMALL = st.one_of(st.integers(-3, 8), st.sampled_from([-(2**31), 2**31 - 1, 65, 4097]))
UINT64 = st.one_of(st.integers(0, 10), st.integers(0, 2**64 - 1))
FLOATS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1.0, -1.0, 0.5, 1e308, -1e308, 5e-324]),
)
ENUMS = st.one_of(st.integers(0, 4), st.integers(-(2**31), 2**31 - 1))
# Any unicode a client can send (protobuf refuses to encode lone surrogates).
CHARS = st.characters(blacklist_categories=("Cs",))
WORDS = st.sampled_from(["a", "little", "the", "lord", "<s>", "</s>", "<unk>", "", " ", "\x00"])
TEXT = st.one_of(
    st.lists(WORDS, max_size=8).map(" ".join),
    st.text(CHARS, max_size=40),
    st.sampled_from(["", "🙂" * 30, "\n\t\r", "a\x00b", "\u202e\ufeff"]),
    st.integers(1000, 5000).map(lambda n: "a " * n),
)
# Mostly models that serve (so requests get past the name), often ones that do not.
MODEL = st.sampled_from([*READY * 3, "failed", "odd", "huge", "any"]).flatmap(
    lambda kind: {
        "failed": st.sampled_from(FAILED),
        "odd": st.sampled_from(["", "nope", "test ", "TEST", "../test", "test/x"]),
        "huge": st.integers(16_000, 20_000).map(lambda n: "x" * n),
        "any": st.text(CHARS, max_size=20),
    }.get(kind, st.just(kind))
)
# Sane values, so that generation and completion get past validation often enough to run.
SANE_INT = st.integers(0, 6)
SANE_FLOAT = st.floats(0.05, 2.0)
UNIT = st.floats(0.05, 1.0)


def _knob(draw: st.DrawFn, wild: bool, sane: Any, crazy: Any) -> Any:
    """A sane value in sane requests (absent half the time), anything in wild ones."""
    if wild:
        return draw(crazy)
    return draw(_opt(sane))


TOKENS = st.lists(st.one_of(WORDS, st.text(CHARS, max_size=10)), max_size=6)


@dataclass(frozen=True)
class Call:
    """One RPC and its request(s): a message, or a list of messages for client streams."""

    rpc: str
    request: Any

    def __repr__(self) -> str:
        return f"Call({self.rpc}, {str(self.request)[:300]!r})"


def _opt(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), strategy)


def _set(message: Any, **fields: Any) -> Any:
    for name, value in fields.items():
        if value is not None:
            setattr(message, name, value)
    return message


@st.composite
def score_options(draw: st.DrawFn) -> pb.ScoreOptions | None:
    if draw(st.booleans()):
        return None
    return _set(pb.ScoreOptions(), bos=draw(_opt(st.booleans())), eos=draw(_opt(st.booleans())))


@st.composite
def texts_or_tokens(draw: st.DrawFn) -> dict[str, Any]:
    texts = draw(st.lists(TEXT, max_size=4))
    lists = draw(st.lists(TOKENS, max_size=3)) if draw(st.booleans()) else []
    return {"texts": texts, "token_lists": [pb.TokenList(tokens=t) for t in lists]}


@st.composite
def score_request(draw: st.DrawFn) -> pb.ScoreRequest:
    request = pb.ScoreRequest(
        model=draw(MODEL), return_tokens=draw(st.booleans()), **draw(texts_or_tokens())
    )
    if (options := draw(score_options())) is not None:
        request.options.CopyFrom(options)
    return request


@st.composite
def perplexity_request(draw: st.DrawFn) -> pb.PerplexityRequest:
    request = pb.PerplexityRequest(model=draw(MODEL), **draw(texts_or_tokens()))
    if (options := draw(score_options())) is not None:
        request.options.CopyFrom(options)
    return request


@st.composite
def corpus_request(draw: st.DrawFn) -> pb.CorpusPerplexityRequest:
    return pb.CorpusPerplexityRequest(model=draw(MODEL), **draw(texts_or_tokens()))


@st.composite
def generate_request(draw: st.DrawFn) -> pb.GenerateRequest:
    wild = draw(st.booleans())
    sampling = _set(
        pb.SamplingParams(),
        temperature=_knob(draw, wild, SANE_FLOAT, _opt(FLOATS)),
        top_k=_knob(draw, wild, SANE_INT, _opt(INT32)),
        top_p=_knob(draw, wild, UNIT, _opt(FLOATS)),
        min_p=_knob(draw, wild, st.floats(0.0, 0.5), _opt(FLOATS)),
        typical_p=_knob(draw, wild, UNIT, _opt(FLOATS)),
        repetition_penalty=_knob(draw, wild, SANE_FLOAT, _opt(FLOATS)),
        presence_penalty=_knob(draw, wild, st.floats(-2, 2), _opt(FLOATS)),
        frequency_penalty=_knob(draw, wild, st.floats(-2, 2), _opt(FLOATS)),
        no_repeat_ngram_size=_knob(draw, wild, SANE_INT, _opt(INT32)),
        seed=draw(_opt(UINT64)),
    )
    stopping = pb.StoppingCriteria(
        max_new_tokens=draw(SMALL) if wild else draw(st.integers(1, 8)),
        min_new_tokens=draw(SMALL) if wild else draw(st.integers(0, 3)),
        stop=draw(st.lists(TEXT, max_size=3)),
        stop_token_ids=draw(st.lists(INT32 if wild else SANE_INT, max_size=3)),
        ignore_eos=draw(st.booleans()),
    )
    return pb.GenerateRequest(
        model=draw(MODEL),
        prompt=draw(TEXT),
        prompt_token_ids=draw(st.lists(INT32 if wild else SANE_INT, max_size=4)),
        sampling=sampling,
        stopping=stopping,
        n=draw(SMALL if wild else st.integers(0, 3)),
        logprobs=draw(st.booleans()),
        top_logprobs=draw(SMALL if wild else st.integers(0, 3)),
        stream_interval=draw(SMALL if wild else st.integers(0, 3)),
    )


@st.composite
def beam_request(draw: st.DrawFn) -> pb.BeamSearchRequest:
    wild = draw(st.booleans())
    small = SMALL if wild else st.integers(0, 4)
    return pb.BeamSearchRequest(
        model=draw(MODEL),
        prompt=draw(TEXT),
        prompt_token_ids=draw(st.lists(INT32 if wild else SANE_INT, max_size=4)),
        beam_width=draw(small),
        num_return=draw(small),
        length_penalty=draw(ENUMS if wild else st.integers(0, 3)),
        length_penalty_alpha=draw(FLOATS if wild else st.floats(0, 2)),
        min_length=draw(small),
        max_length=draw(SMALL if wild else st.integers(1, 8)),
        early_stopping=draw(st.booleans()),
        no_repeat_ngram_size=draw(small),
        stop_token_ids=draw(st.lists(INT32 if wild else SANE_INT, max_size=3)),
    )


@st.composite
def hypothesis(draw: st.DrawFn, wild: bool = True) -> pb.Hypothesis:
    values = FLOATS if wild else st.floats(-100, 100)
    keys = st.text(CHARS, max_size=8) if wild else st.sampled_from(["am", "tm"])
    message = pb.Hypothesis(scores=draw(st.dictionaries(keys, values, max_size=3)))
    choice = draw(st.integers(0, 3) if wild else st.integers(0, 1))
    if choice in (0, 2):
        message.text = draw(TEXT)
    if choice in (1, 2):
        message.tokens.CopyFrom(pb.TokenList(tokens=draw(TOKENS)))
    return message


@st.composite
def rerank_request(draw: st.DrawFn) -> pb.RerankRequest:
    wild = draw(st.booleans())
    lists = draw(
        st.lists(
            st.builds(
                pb.NBestList,
                id=st.text(CHARS, max_size=8),
                hypotheses=st.lists(hypothesis(wild), min_size=int(not wild), max_size=4),
            ),
            min_size=int(not wild),
            max_size=3,
        )
    )
    numbers = FLOATS if wild else st.floats(-10, 10)
    request = pb.RerankRequest(
        model=draw(MODEL),
        lists=lists,
        score_weights=draw(st.dictionaries(st.text(CHARS, max_size=8), numbers, max_size=3)),
        length_bonus=draw(numbers),
        length_unit=draw(ENUMS if wild else st.integers(0, 3)),
    )
    if (weight := draw(_opt(numbers))) is not None:
        request.lm_weight = weight
    if (options := draw(score_options())) is not None:
        request.options.CopyFrom(options)
    return request


@st.composite
def complete_request(draw: st.DrawFn) -> pb.CompleteRequest:
    request = pb.CompleteRequest(
        session_id=draw(
            st.sampled_from(["", "", "", "s1", "test/s2", "kjv3/s3", "x" * 300, "other/s"])
        ),
        model=draw(MODEL),
        append_text=draw(TEXT) if draw(st.booleans()) else "",
        append_tokens=draw(TOKENS) if draw(st.integers(0, 3)) == 0 else [],
        rollback_tokens=draw(st.one_of(SMALL, st.integers(0, 2))),
        partial_word=draw(st.one_of(TEXT, st.sampled_from(["", "l", "th"]))),
        k=draw(st.one_of(SMALL, st.integers(1, 5))),
        reset=draw(st.booleans()),
        sequence=draw(UINT64),
    )
    if draw(st.booleans()):
        request.context.CopyFrom(pb.TokenList(tokens=draw(TOKENS)))
    return request


# A small well-formed lattice of each format (words the fuzz models know), and broken ones.
_GOOD_SLF = "I=0\nI=1\nI=2\nJ=0 S=0 E=1 W=the a=-1 l=-2\nJ=1 S=1 E=2 W=lord a=-3\n"
_GOOD_KALDI = "u\n0 1 the 2,1\n0 1 a 1,2\n1 2 lord 0,0\n2\n"
LATTICE_TEXT = st.one_of(
    st.sampled_from([_GOOD_SLF, _GOOD_KALDI, "", "u\n0 1 a 0,0\n1 0 b 0,0\n1\n", "I=-1\n"]),
    TEXT,
    st.lists(
        st.sampled_from(["I=0", "J=0 S=0 E=1", "0 1 a 0,0", "1", "base=0", "\n"]), max_size=6
    ).map("\n".join),
)


@st.composite
def lattice_request(draw: st.DrawFn) -> pb.RescoreLatticeRequest:
    wild = draw(st.booleans())
    numbers = FLOATS if wild else st.floats(-10, 10)
    lattices = draw(
        st.lists(
            st.builds(
                pb.Lattice,
                id=st.text(CHARS, max_size=8),
                format=ENUMS if wild else st.integers(1, 2),
                text=LATTICE_TEXT,
            ),
            min_size=int(not wild),
            max_size=3,
        )
    )
    request = pb.RescoreLatticeRequest(
        model=draw(MODEL),
        lattices=lattices,
        words=draw(st.sampled_from(["", "the 1\nlord 2\na 3\n", "bad line"])),
        old_lm_weight=draw(numbers),
        word_insertion_penalty=draw(numbers),
        return_lattice=draw(st.booleans()),
    )
    for name in ("acoustic_scale", "lm_weight", "beam"):
        if (value := draw(_opt(numbers))) is not None:
            setattr(request, name, value)
    for name in ("nbest", "max_history"):
        if (count := draw(_opt(SMALL))) is not None:
            setattr(request, name, count)
    if (options := draw(score_options())) is not None:
        request.options.CopyFrom(options)
    return request


def _stream(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[list[Any]]:
    return st.lists(strategy, max_size=3)


def rpc_calls() -> st.SearchStrategy[Call]:
    """A call of any RPC with generated request(s)."""
    by_rpc: dict[str, st.SearchStrategy[Any]] = {
        "Score": score_request(),
        "ScoreStream": _stream(score_request()),
        "Perplexity": perplexity_request(),
        "CorpusPerplexity": _stream(corpus_request()),
        "Generate": generate_request(),
        "BeamSearch": beam_request(),
        "Rerank": rerank_request(),
        "RerankStream": _stream(rerank_request()),
        "RescoreLattice": lattice_request(),
        "RescoreLatticeStream": _stream(lattice_request()),
        "Complete": _stream(complete_request()),
        "GetModel": st.builds(pb.GetModelRequest, model=MODEL),
    }
    return st.one_of(
        [strategy.map(lambda r, rpc=rpc: Call(rpc, r)) for rpc, strategy in by_rpc.items()]
    )


def send(
    stub: lm_service_pb2_grpc.LanguageModelServiceStub, call: Call, timeout: float = 10.0
) -> grpc.StatusCode:
    """Makes the call, reads every answer, and returns its status code."""
    method = getattr(stub, call.rpc)
    request = iter(call.request) if isinstance(call.request, list) else call.request
    try:
        answer = method(request, timeout=timeout)
        if isinstance(answer, Iterator):
            for _ in answer:
                pass
    except grpc.RpcError as exc:
        code: grpc.StatusCode = exc.code()
        return code
    return grpc.StatusCode.OK
