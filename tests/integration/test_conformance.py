"""Every client surface on every model family: one repository holding a model of each family,
served once by a real server, and the same request asked through every surface, which must
give the same figures (within 1e-5 nats unless said).

Families (the models below): a word n-gram and a BPE n-gram trained by `lmserve train-ngram` on
a slice of the KJV corpus, our own LSTM (`export-rnn`'s writer), a brought ONNX model (`lmserve
import-onnx`) and a brought TorchScript model (`export_module`), GPT-2 and Llama imported by
`import-hf` and the library, a folder optimum wrote, and a mixture (`interpolated`) of the two
word models. The brought and transformer folders are the session's (tests/integration/
conftest.py: the brought-model and transformer modules serve the same ones).

Surfaces: the Python client over gRPC (Score, Perplexity, Generate, BeamSearch, Rerank,
Complete), Connect JSON over HTTP, OpenAI `/v1/completions` (echo with a text prompt and with a
token-id prompt; seeded and greedy generation), `/tokenize` + `/detokenize`, and the
autocomplete WebSocket `/ws/complete`.

The rules where families legitimately differ are written here, not skipped:
- the first id of a token-id prompt (vLLM's rule, docs/guides/http.md): a leading start id is
  the start (null log-prob); else a model read from `<s>` (n-gram, recurrent, mixture) scores
  the first id given `<s>`, and a transformer reads it as context (null log-prob);
- `/tokenize` then `/detokenize` gives the text back as the model reads it: lowercased and cut
  by the KJV token pattern (punctuation dropped) on the KJV word models, split at spaces on the
  brought word models, each word outside a word vocabulary as `<unk>` (Score's `oov`); on the
  BPE n-gram each character outside its alphabet (the lowercase letters of its KJV slice) as
  `<unk>`, a word ending in one losing its end of word (joined to the next: the ids carry no
  boundary there); the text exactly on the byte-level transformers.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import string
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from http_calls import call, stream_call
from integration_data import KJV_PATTERN
from neural_folders import tiny_model, write_onnx_folder
from served import ServerFactory
from websockets.sync.client import connect

from lmserve.client import GeneratedToken, GenerationFinished, LmServeClient, TextScore
from lmserve.server.cli import main
from lmserve.server.front.process.app import BackgroundServer
from lmserve.server.manifest import ModelManifest, write_manifest
from lmserve.v1 import lm_service_pb2 as pb

CORPUS = Path(__file__).resolve().parents[2] / "export/lmserve/export/corpora/kjv"
OPTIMUM = Path(__file__).resolve().parents[1] / "data" / "optimum"
ATOL = 1e-5


@dataclass(frozen=True)
class Family:
    model: str
    # Reads only the ids it is given: no `<s>` before a token-id prompt that does not start
    # with it (vLLM's rule for its first id).
    transformer: bool = False
    # A word vocabulary (an unknown word is one `<unk>`), and how a text is cut into words.
    words: str | None = None  # "kjv" (lowercased, KJV_PATTERN) or "spaces"
    # Subwords over an alphabet (the characters its training text had): every other character
    # is one `<unk>`. None: byte-level, every text is spelt.
    alphabet: str | None = None


FAMILIES = [
    Family("word-ngram", words="kjv"),
    Family("bpe-ngram", alphabet=string.ascii_lowercase),
    Family("lstm", words="kjv"),
    Family("gru-onnx", words="spaces"),  # brought: an ONNX file through `import-onnx`
    Family("tiny-lstm-ts", words="spaces"),  # brought: TorchScript through `export_module`
    Family("tiny-gpt2", transformer=True),
    Family("tiny-llama", transformer=True),
    Family("optimum-gpt2", transformer=True),
    Family("mixture", words="kjv"),
]
by_family = pytest.mark.parametrize("family", FAMILIES, ids=[f.model for f in FAMILIES])

TEXTS = ["And God said, let there be light", "the dog ran to the house of god"]
PROMPT = "and god said"
SEED = 7
NEW_TOKENS = 5


# -- the repository: one model of each family, each built once -------------------------------


def _train_ngrams(root: Path, repo: Path) -> None:
    lines = (CORPUS / "train.txt").read_text(encoding="utf-8").splitlines()[:300]
    train = root / "train.txt"
    train.write_text("\n".join(lines) + "\n", encoding="utf-8")
    common = ["--order", "3", "--discount-fallback"]
    argv = ["train-ngram", *common, "--lowercase", "--token-pattern", KJV_PATTERN]
    assert main([*argv, str(train), str(repo / "word-ngram")]) == 0
    argv = ["train-ngram", *common, "--tokenizer", "bpe", "--bpe-vocab-size", "200"]
    assert main([*argv, str(train), str(repo / "bpe-ngram")]) == 0


@pytest.fixture(scope="module")
def repository(
    tmp_path_factory: pytest.TempPathFactory,
    brought_folders: dict[str, Path],
    hf_folders: dict[str, Path],
) -> Path:
    root = tmp_path_factory.mktemp("conformance")
    repo = root / "models"
    _train_ngrams(root, repo)
    # The brought models and the imported checkpoints: the session's folders (the brought and
    # transformer modules serve them too), linked.
    for folder in [*brought_folders.values(), *hf_folders.values()]:
        (repo / folder.name).symlink_to(folder, target_is_directory=True)
    # Our LSTM reads text as the word n-gram does, so that the two mix.
    kjv_words = {"lowercase": True, "pattern": KJV_PATTERN}
    write_onnx_folder(tiny_model("lstm"), _lstm_vocab(), repo / "lstm", name="lstm",
                      tokenizer=kjv_words)  # fmt: skip
    shutil.copytree(OPTIMUM / "gpt2", repo / "optimum-gpt2")  # as optimum wrote it
    (repo / "mixture").mkdir()
    components = [{"model": "word-ngram", "weight": 0.6}, {"model": "lstm", "weight": 0.4}]
    manifest = {
        "name": "mixture",
        "kind": "interpolated",
        "format": "interpolation",
        "files": {},
        "tokenizer": {"kind": "word", **kjv_words},
        "architecture": {"components": components},
    }
    write_manifest(repo / "mixture", ModelManifest.model_validate(manifest))
    return repo


def _lstm_vocab() -> list[str]:
    words = "and god said let there be light the dog ran to house of in a".split()
    return ["<unk>", "<s>", "</s>", *words]


@pytest.fixture(scope="module")
def server(serve: ServerFactory, repository: Path) -> Iterator[BackgroundServer]:
    # Its own (no other module serves this repository), stopped when the module ends.
    with serve.private(repository, complete_cache_weight=0.0) as running:  # models' own words
        yield running


@pytest.fixture(scope="module")
def client(server: BackgroundServer) -> Iterator[LmServeClient]:
    with LmServeClient(server.address, timeout=60) as c:
        for family in FAMILIES:  # every model loaded, none failing
            info = c.get_model(family.model)
            assert info.state == "ready", (family.model, info.load_error)
        yield c


# -- calls ------------------------------------------------------------------------------------


def _port(server: BackgroundServer) -> int:
    assert server.http_port is not None
    return server.http_port


def _post(server: BackgroundServer, path: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        f"http://127.0.0.1:{_port(server)}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)


def _echo(server: BackgroundServer, model: str, prompt: str | list[int]) -> list[float | None]:
    """/v1's echoed log-probs of `prompt`; each position's top alternative (one greedy step of
    the prefix) is at least as likely as the token there, and is it when it names it."""
    body = {"model": model, "prompt": prompt, "max_tokens": 0, "echo": True, "logprobs": 1}
    logprobs = _post(server, "/v1/completions", body)["choices"][0]["logprobs"]
    token_logprobs: list[float | None] = logprobs["token_logprobs"]
    tops = logprobs["top_logprobs"]
    assert len(tops) == len(token_logprobs) == len(logprobs["tokens"])
    for token, lp, top in zip(logprobs["tokens"], token_logprobs, tops, strict=True):
        if lp is None:
            continue
        [(best, best_lp)] = top.items()
        assert best_lp >= lp - ATOL, (token, lp, top)
        if best == token:
            assert abs(best_lp - lp) <= ATOL, (token, lp, top)
    return token_logprobs


def _close(got: Sequence[float | None], expected: Sequence[float | None], what: str) -> None:
    assert len(got) == len(expected), (what, got, expected)
    for i, (a, b) in enumerate(zip(got, expected, strict=True)):
        if a is None or b is None:
            assert a is None and b is None, (what, i, got, expected)
        else:
            assert abs(a - b) <= ATOL, (what, i, a, b)


def _scores(client: LmServeClient, model: str, *, eos: bool = True) -> list[TextScore]:
    return client.score(model, TEXTS, eos=eos, return_tokens=True)


def _token_log_probs(result: TextScore) -> list[float]:
    assert result.tokens is not None
    return [t.log_prob for t in result.tokens]


def _token_ids(result: TextScore) -> list[int]:
    assert result.tokens is not None
    return [t.token_id for t in result.tokens]


# -- scoring ----------------------------------------------------------------------------------


@by_family
def test_score_is_the_same_on_every_surface(
    family: Family, client: LmServeClient, server: BackgroundServer
) -> None:
    """Score's per-token log-probs over gRPC = Connect JSON = /v1 echo of the text = /v1 echo of
    the text's ids (with and without a leading start id) = /tokenize's ids."""
    model = family.model
    with_eos = _scores(client, model)
    scored = _scores(client, model, eos=False)
    connect = call(
        _port(server),
        "Score",
        {"model": model, "texts": TEXTS, "returnTokens": True, "options": {"eos": False}},
    )
    bos = client.get_model(model).special_tokens.bos_id
    for i, (text, result) in enumerate(zip(TEXTS, scored, strict=True)):
        lps, ids = _token_log_probs(result), _token_ids(result)
        assert len(lps) >= 3, (text, lps)
        # `</s>` adds a last token and changes none before it.
        _close(_token_log_probs(with_eos[i])[:-1], lps, "score with </s>")
        assert (
            abs(with_eos[i].log_prob - result.log_prob - _token_log_probs(with_eos[i])[-1]) < ATOL
        )
        assert abs(sum(lps) - result.log_prob) < ATOL
        details = connect["results"][i]["details"]
        assert details["tokenIds"] == ids
        _close(details["logProbs"], lps, "connect")
        _close(_echo(server, model, text), lps, "/v1 echo text")
        assert _post(server, "/tokenize", {"model": model, "prompt": text})["tokens"] == ids
        # A token-id prompt, as vLLM reads one.
        _close(_echo(server, model, [bos, *ids]), [None, *lps], "/v1 echo <s> + ids")
        echoed = _echo(server, model, ids)
        if family.transformer:  # the first id is the context
            # (the Python client's score takes texts and token strings, not ids: the stub)
            request = pb.ScoreRequest(
                model=model,
                token_ids=[pb.TokenIds(ids=ids)],
                options=pb.ScoreOptions(bos=False, eos=False),
                return_tokens=True,
            )
            [no_start] = client.stub.Score(request).results
            assert list(no_start.details.token_ids) == ids[1:]
            _close(echoed, [None, *no_start.details.log_probs], "/v1 echo ids (transformer)")
        else:  # read from <s>, as a text is
            _close(echoed, lps, "/v1 echo ids")


@by_family
def test_perplexity_is_scores_exponent(
    family: Family, client: LmServeClient, server: BackgroundServer
) -> None:
    scores = _scores(client, family.model)
    total = sum(s.log_prob for s in scores)
    count = sum(s.token_count for s in scores)
    assert count == sum(len(_token_ids(s)) for s in scores)
    stats = client.perplexity(family.model, TEXTS)
    assert stats.token_count == count and stats.text_count == len(TEXTS)
    assert stats.log_prob == pytest.approx(total, abs=ATOL)
    assert stats.perplexity == pytest.approx(math.exp(-total / count), rel=1e-6)
    connect = call(_port(server), "Perplexity", {"model": family.model, "texts": TEXTS})
    assert connect["stats"]["perplexity"] == pytest.approx(stats.perplexity, rel=1e-9)
    assert int(connect["stats"]["tokenCount"]) == count


@by_family
def test_rerank_lm_log_prob_is_scores_total(
    family: Family, client: LmServeClient, server: BackgroundServer
) -> None:
    scores = _scores(client, family.model)
    hypotheses = [{"text": t, "scores": {"am": -float(i)}} for i, t in enumerate(TEXTS)]
    [ranked] = client.rerank(family.model, [{"id": "u", "hypotheses": hypotheses}])
    got = {h.index: h.lm_log_prob for h in ranked.hypotheses}
    assert sorted(got) == list(range(len(TEXTS)))
    for i, score in enumerate(scores):
        assert got[i] == pytest.approx(score.log_prob, abs=ATOL), i
    connect = call(
        _port(server),
        "Rerank",
        {"model": family.model, "lists": [{"id": "u", "hypotheses": hypotheses}]},
    )
    over_http = {h.get("index", 0): h["lmLogProb"] for h in connect["lists"][0]["hypotheses"]}
    assert over_http == pytest.approx(got, abs=1e-9)


# -- generation -------------------------------------------------------------------------------


def _client_generation(
    client: LmServeClient, model: str, sampling: dict[str, Any], prompt: str | list[int] = PROMPT
) -> tuple[list[GeneratedToken], GenerationFinished]:
    tokens: list[GeneratedToken] = []
    finished: list[GenerationFinished] = []
    for event in client.generate(model, prompt, max_new_tokens=NEW_TOKENS, **sampling):
        (tokens if isinstance(event, GeneratedToken) else finished).append(event)  # type: ignore[arg-type]
    assert len(finished) == 1
    return tokens, finished[0]


def _connect_generation(
    server: BackgroundServer, model: str, sampling: dict[str, Any]
) -> list[dict[str, Any]]:
    request = {
        "model": model,
        "prompt": PROMPT,
        "sampling": sampling,
        "stopping": {"maxNewTokens": NEW_TOKENS},
        "logprobs": True,
    }
    status, messages, end = stream_call(_port(server), "Generate", [request])
    assert status == 200 and not end.get("error"), (status, end)
    return [t for m in messages for t in m.get("tokens", [])]


@by_family
@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "seeded"])
def test_generate_is_the_same_on_every_surface(
    family: Family, temperature: float, client: LmServeClient, server: BackgroundServer
) -> None:
    """The same tokens through the client, Connect and /v1 for the same seed (or greedy), and
    their log-probs are Score's of the prompt's ids followed by them."""
    model = family.model
    sampling = {"temperature": temperature, "seed": SEED}
    tokens, finished = _client_generation(client, model, {**sampling, "logprobs": True})
    assert tokens, finished
    ids = [t.token_id for t in tokens]
    connect = _connect_generation(server, model, sampling)
    assert [t["tokenId"] for t in connect] == ids
    _close([t["logProb"] for t in connect], [t.log_prob for t in tokens], "connect")
    body = {"model": model, "prompt": PROMPT, "max_tokens": NEW_TOKENS, "logprobs": 1}
    v1 = _post(server, "/v1/completions", {**body, "temperature": temperature, "seed": SEED})
    [choice] = v1["choices"]
    eos = client.get_model(model).special_tokens.eos_id
    shown = [t for t in tokens if t.token_id != eos]  # /v1 shows no `</s>`
    assert choice["logprobs"]["tokens"] == [t.text for t in shown]
    _close(choice["logprobs"]["token_logprobs"], [t.log_prob for t in shown], "/v1")
    assert choice["text"] == finished.text
    # The generated tokens' log-probs are the model's: Score of the prompt's ids and them.
    prompt_ids = _post(server, "/tokenize", {"model": model, "prompt": PROMPT})["tokens"]
    ended = ids[-1] == eos
    read = prompt_ids + (ids[:-1] if ended else ids)
    request = pb.ScoreRequest(
        model=model,
        token_ids=[pb.TokenIds(ids=read)],
        options=pb.ScoreOptions(eos=ended),
        return_tokens=True,
    )
    [scored] = client.stub.Score(request).results
    _close([t.log_prob for t in tokens], scored.details.log_probs[len(prompt_ids) :], "score")
    # A prompt of the text's ids (Generate's prompt_token_ids, a /v1 token-id prompt): with its
    # leading start id, read as the text is; without, the same on a model read from <s>, while
    # a transformer reads the first id as context (the client and /v1 still agree).
    bos = client.get_model(model).special_tokens.bos_id
    for id_prompt in ([bos, *prompt_ids], prompt_ids):
        with_logprobs = {**sampling, "logprobs": True}
        from_ids, _ = _client_generation(client, model, with_logprobs, prompt=id_prompt)
        v1_ids = _post(server, "/v1/completions", {**body, **sampling, "prompt": id_prompt})
        assert v1_ids["choices"][0]["logprobs"]["tokens"] == [
            t.text for t in from_ids if t.token_id != eos
        ]
        if id_prompt[0] == bos or not family.transformer:
            assert [t.token_id for t in from_ids] == ids, id_prompt
            _close([t.log_prob for t in from_ids], [t.log_prob for t in tokens], "ids")


@by_family
def test_beam_search_log_prob_is_scores(
    family: Family, client: LmServeClient, server: BackgroundServer
) -> None:
    model = family.model
    hypotheses = client.beam_search(model, PROMPT, beam_width=3, max_length=4, num_return=2)
    assert hypotheses
    connect = call(
        _port(server),
        "BeamSearch",
        {"model": model, "prompt": PROMPT, "beamWidth": 3, "maxLength": 4, "numReturn": 2},
    )
    assert [h["tokenIds"] for h in connect["hypotheses"]] == [list(h.token_ids) for h in hypotheses]
    assert [h["logProb"] for h in connect["hypotheses"]] == pytest.approx(
        [h.log_prob for h in hypotheses], abs=1e-9
    )
    eos = client.get_model(model).special_tokens.eos_id
    prompt_ids = _post(server, "/tokenize", {"model": model, "prompt": PROMPT})["tokens"]
    for best in hypotheses:
        ids = list(best.token_ids)
        ended = bool(ids) and ids[-1] == eos
        request = pb.ScoreRequest(
            model=model,
            token_ids=[pb.TokenIds(ids=prompt_ids + (ids[:-1] if ended else ids))],
            options=pb.ScoreOptions(eos=ended),
            return_tokens=True,
        )
        [scored] = client.stub.Score(request).results
        total = sum(scored.details.log_probs[len(prompt_ids) :])
        assert best.log_prob == pytest.approx(total, abs=ATOL), (ids, best.finish_reason)


# -- autocomplete and the tokenizer endpoints --------------------------------------------------


@by_family
def test_complete_over_grpc_is_the_websocket(
    family: Family, client: LmServeClient, server: BackgroundServer
) -> None:
    model = family.model
    with client.complete(model, k=3) as session:
        over_grpc = [session.type("and god "), session.type("s"), session.type("aid ")]
    messages: list[dict[str, Any]] = [
        {"model": model, "k": 3, "appendText": "and god ", "partialWord": ""},
        {"k": 3, "partialWord": "s"},
        {"k": 3, "appendText": "said ", "partialWord": ""},
    ]
    url = f"ws://127.0.0.1:{_port(server)}/ws/complete"
    with connect(url, proxy=None) as ws:
        over_socket = []
        for i, message in enumerate(messages):
            ws.send(json.dumps({**message, "sequence": i + 1}))
            over_socket.append(json.loads(ws.recv(timeout=30)))
    for grpc_answer, socket_answer in zip(over_grpc, over_socket, strict=True):
        assert grpc_answer, socket_answer  # every answer offers words
        got = [(c["word"], c["logProb"]) for c in socket_answer["completions"]]
        assert [w for w, _ in got] == [c.word for c in grpc_answer]
        assert [p for _, p in got] == pytest.approx([c.log_prob for c in grpc_answer], abs=1e-9)
    assert all(c.word.startswith("s") for c in over_grpc[1])
    if family.words:  # a word is one token: its log-prob is Score's of it after the context
        word = over_grpc[0][0]
        [scored] = client.score(model, [f"and god {word.word}"], eos=False, return_tokens=True)
        assert word.log_prob == pytest.approx(_token_log_probs(scored)[-1], abs=ATOL)


def _as_read(family: Family, text: str, oov: Sequence[bool]) -> str:
    """The text as the family reads it (see the module's docstring)."""
    if family.alphabet is not None:
        # Each character outside the alphabet is `<unk>`, and a word ending in one loses its
        # end of word (`x</w>`): the next word is joined to it ("said, let" -> "said<unk>let").
        spelt = ""
        for word in text.split():
            spelt += "".join(c if c in family.alphabet else "<unk>" for c in word)
            spelt += " " if word[-1] in family.alphabet else ""
        return spelt.rstrip(" ")
    if family.words is None:
        return text
    words = re.findall(KJV_PATTERN, text.lower()) if family.words == "kjv" else text.split()
    assert len(words) == len(oov)
    return " ".join("<unk>" if unknown else w for w, unknown in zip(words, oov, strict=True))


@by_family
def test_tokenize_then_detokenize_gives_the_text_back(
    family: Family, client: LmServeClient, server: BackgroundServer
) -> None:
    model = family.model
    specials = client.get_model(model).special_tokens
    with urllib.request.urlopen(
        f"http://127.0.0.1:{_port(server)}/tokenizer_info?model={model}", timeout=60
    ) as response:
        info = json.load(response)
    assert (info["bos_token"], info["eos_token"]) == (specials.bos, specials.eos)
    for text, result in zip(TEXTS, _scores(client, model, eos=False), strict=True):
        tokenized = _post(server, "/tokenize", {"model": model, "prompt": text})
        assert tokenized["tokens"] == _token_ids(result)
        assert tokenized["max_model_len"] >= len(tokenized["tokens"])
        back = _post(server, "/detokenize", {"model": model, "tokens": tokenized["tokens"]})
        assert result.tokens is not None
        assert back["prompt"] == _as_read(family, text, [t.oov for t in result.tokens])
