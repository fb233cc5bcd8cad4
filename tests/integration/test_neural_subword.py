"""Character and BPE models, trained and exported by `lmserve train-rnn --export`, served.

Each model trains for one tiny epoch (hidden size 8) through `lmserve.server.cli.main`, then a
real server scores with it: per-token scores equal the PyTorch model's, per-word perplexity
divides the same log-probability by words + `</s>`s, and the character vocabulary's escapes
(the space is written `\\s` in vocab.txt) come back as the characters they stand for.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import shlex
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest
import yaml
from neural_folders import eager_token_log_probs
from prometheus_client import CollectorRegistry

from lmserve.export.rnn.folder import load_checkpoint
from lmserve.export.rnn.model import RecurrentLM
from lmserve.export.trainers.loop import BEST_CHECKPOINT
from lmserve.server.cli import main
from lmserve.server.front.process.app import BackgroundServer, start_background_server
from lmserve.server.manifest import ModelManifest, read_manifest, sha256_of, write_manifest
from lmserve.server.registry.repository import load_entry
from lmserve.server.settings import load_settings
from lmserve.server.text.bpe import BpeCodec
from lmserve.server.text.char import CharCodec
from lmserve.v1 import lm_service_pb2 as pb
from lmserve.v1 import lm_service_pb2_grpc

TRAIN = [
    "in the beginning god created the heaven and the earth",
    "and the earth was without form and void",
    "and darkness was upon the face of the deep",
    "and the spirit of god moved upon the face of the waters",
    "and god said let there be light and there was light",
    "and god saw the light that it was good",
    "and god divided the light from the darkness",
    "and god called the light day and the darkness he called night",
] * 3
VALID = [
    "and the evening and the morning were the first day",
    "and god said let there be a firmament in the midst of the waters",
]
# Irregular spacing on purpose: the models read the words joined by single spaces.
TEXTS = ["in  the\tbeginning god", "let there be light", ""]
PIECE_MARKS = ("</w>", "\u0120", "\u2581")  # BPE end-of-word suffix, byte-level and metaspace
Stub = lm_service_pb2_grpc.LanguageModelServiceStub


@dataclass(frozen=True)
class Trained:
    name: str
    model: RecurrentLM
    codec: CharCodec | BpeCodec
    argv: list[str]

    def ids(self, text: str) -> list[int]:
        return [int(i) for i in self.codec.encode_texts([text]).ids]

    def codec_texts(self) -> set[str]:
        """Each vocabulary entry decoded on its own (a piece without its end-of-word mark)."""
        return {self.codec.decode([i]) for i in range(len(self.codec.vocab))}

    def token_log_probs(self, text: str) -> list[float]:
        vocab = self.codec.vocab
        return eager_token_log_probs(
            self.model, self.ids(text), bos_id=vocab.bos_id, eos_id=vocab.eos_id
        )


def _train(root: Path, work: Path, tokenizer: str, *extra: str) -> Trained:
    name = f"{tokenizer}-gru"
    argv = [
        "train-rnn", str(work / "train.txt"), str(work / name), "--heldout",
        str(work / "valid.txt"), "--tokenizer", tokenizer, "--cell", "gru",
        "--embedding-size", "8", "--hidden-size", "8", "--dropout", "0", "--epochs", "1",
        "--batch-size", "8", "--bptt", "32", "--threads", "1", "--seed", "3", "--no-progress",
        "--export", str(root / name), *extra,
    ]  # fmt: skip
    assert main(argv) == 0
    model = load_checkpoint(work / name / BEST_CHECKPOINT).model
    folder = root / name
    codec: CharCodec | BpeCodec
    if tokenizer == "char":
        codec = CharCodec.from_vocab_file(folder / "vocab.txt")
    else:
        codec = BpeCodec.from_file(folder / "tokenizer.json")
    return Trained(name, model, codec, argv)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("subword-models")


@pytest.fixture(scope="module")
def trained(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Trained]:
    work = tmp_path_factory.mktemp("subword-training")
    (work / "train.txt").write_text("\n".join(TRAIN) + "\n")
    (work / "valid.txt").write_text("\n".join(VALID) + "\n")
    models = {
        "char": _train(repository, work, "char"),
        "bpe": _train(repository, work, "bpe", "--bpe-vocab-size", "60"),
    }
    _broken_copies(repository)
    return models


def _broken_copies(root: Path) -> None:
    """Hand-broken copies of the exported folders (checksums refreshed: only the content fails)."""

    def copy(source: str, name: str, file_name: str, edit: str) -> None:
        shutil.copytree(root / source, root / name)
        path = root / name / file_name
        lines = path.read_text(encoding="utf-8").split("\n")
        if edit == "swap":
            lines[3], lines[4] = lines[4], lines[3]
        else:
            lines[3] = edit
        path.write_text("\n".join(lines), encoding="utf-8")
        manifest = yaml.safe_load((root / name / "model.yaml").read_text())
        manifest["name"] = name
        manifest["files"]["vocab"]["sha256"] = sha256_of(path)
        (root / name / "model.yaml").write_text(yaml.safe_dump(manifest))

    copy("bpe-gru", "bpe-vocab-mismatch", "vocab.txt", "swap")
    copy("char-gru", "char-bad-escape", "vocab.txt", "\\q")
    # Mixtures: of character models (served, over the components' characters), of BPE models
    # (refused: the mixture has no tokenizer.json to cut its texts with).
    for name, tokenizer, component in (
        ("char-mix", {"kind": "character"}, "char-gru"),
        ("bpe-mix", {"kind": "bpe", "file": "tokenizer"}, "bpe-gru"),
    ):
        (root / name).mkdir()
        write_manifest(
            root / name,
            ModelManifest.model_validate(
                {
                    "name": name,
                    "kind": "interpolated",
                    "format": "interpolation",
                    "files": {},
                    "tokenizer": tokenizer,
                    "architecture": {"components": [{"model": component, "weight": 1.0}]},
                }
            ),
        )
    # A character n-gram model needs its vocab.txt (train-ngram --tokenizer char writes it):
    # the codec's ids must be the ARPA's, which the loader checks.
    (root / "char-ngram").mkdir()
    (root / "char-ngram" / "model.arpa").write_text(
        "\\data\\\nngram 1=4\n\n\\1-grams:\n-1.0\t<unk>\n-99\t<s>\n-0.5\t</s>\n-0.5\ta\n\n\\end\\\n"
    )
    write_manifest(
        root / "char-ngram",
        ModelManifest.model_validate(
            {
                "name": "char-ngram",
                "kind": "ngram",
                "format": "arpa",
                "files": {"arpa": {"path": "model.arpa"}},
                "tokenizer": {"kind": "character"},
            }
        ),
    )


@pytest.fixture(scope="module")
def server(repository: Path, trained: dict[str, Trained]) -> Iterator[BackgroundServer]:
    settings = load_settings(
        {
            "model_repository": repository,
            "host": "127.0.0.1",
            "port": 0,
            "metrics_enabled": False,
            "max_chunk_tokens": 16,  # the character texts run over several chunks
        }
    )
    running = start_background_server(settings, registry=CollectorRegistry())
    yield running
    running.stop(grace=1.0)


@pytest.fixture(scope="module")
def stub(server: BackgroundServer) -> Iterator[Stub]:
    with grpc.insecure_channel(server.address) as channel:
        yield lm_service_pb2_grpc.LanguageModelServiceStub(channel)


def _score(stub: Stub, model: str, texts: list[str]) -> list[pb.TextScore]:
    response = stub.Score(pb.ScoreRequest(model=model, texts=texts, return_tokens=True))
    return list(response.results)


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_served_scores_equal_the_pytorch_model(
    stub: Stub, trained: dict[str, Trained], kind: str
) -> None:
    model = trained[kind]
    results = _score(stub, model.name, TEXTS)
    for text, result in zip(TEXTS, results, strict=True):
        expected = model.token_log_probs(text)
        ids = model.ids(text)
        np.testing.assert_allclose(list(result.details.log_probs), expected, atol=1e-4)
        assert result.log_prob == pytest.approx(sum(expected), abs=1e-4)
        assert result.token_count == len(ids) + 1  # the model's tokens, not words
        assert list(result.details.token_ids) == [*ids, model.codec.vocab.eos_id]
        # The details give each token's text (characters; for BPE what each piece adds, never
        # the piece with its `</w>`), which spell the text out again.
        tokens = list(result.details.tokens)
        assert tokens[-1] == "</s>" and len(tokens) == len(ids) + 1
        assert "".join(tokens[:-1]) == " ".join(text.split())
        if kind == "char":
            assert tokens[:-1] == [model.codec.vocab.words[i] for i in ids]
        else:
            assert not any(mark in t for t in tokens for mark in PIECE_MARKS)
    info = stub.GetModel(pb.GetModelRequest(model=model.name)).model
    assert info.state == pb.MODEL_STATE_READY and info.vocab_size == len(model.codec.vocab)
    kinds = {"char": pb.TOKENIZER_KIND_CHARACTER, "bpe": pb.TOKENIZER_KIND_BPE}
    assert info.tokenizer.kind == kinds[kind]


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_perplexity_is_per_word(
    stub: Stub, repository: Path, trained: dict[str, Trained], kind: str
) -> None:
    model = trained[kind]
    stats = stub.Perplexity(pb.PerplexityRequest(model=model.name, texts=TEXTS)).stats
    log_prob = sum(sum(model.token_log_probs(t)) for t in TEXTS)
    tokens = sum(len(model.ids(t)) + 1 for t in TEXTS)
    words = sum(len(t.split()) for t in TEXTS) + len(TEXTS)  # every word and one </s> a line
    assert (stats.token_count, stats.word_count, stats.text_count) == (tokens, words, 3)
    assert stats.log_prob == pytest.approx(log_prob, abs=1e-4)
    assert stats.perplexity_per_word == pytest.approx(math.exp(-log_prob / words), rel=1e-5)
    assert stats.perplexity == pytest.approx(math.exp(-log_prob / tokens), rel=1e-5)

    # Streamed in two parts, the same; and on the held-out text, training's own per-word figure.
    def corpus(batches: list[list[str]]) -> pb.PerplexityStats:
        messages = [pb.CorpusPerplexityRequest(model=model.name, texts=b) for b in batches]
        return stub.CorpusPerplexity(iter(messages)).stats

    streamed = corpus([TEXTS[:1], TEXTS[1:]])
    assert streamed.word_count == words
    assert streamed.perplexity_per_word == pytest.approx(stats.perplexity_per_word, rel=1e-9)
    manifest = read_manifest(repository / model.name)
    assert corpus([VALID]).perplexity_per_word == pytest.approx(
        manifest.provenance.metrics["valid_perplexity"], rel=1e-4
    )


def test_lmserve_ppl_reports_the_per_word_figure(
    server: BackgroundServer,
    stub: Stub,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    trained: dict[str, Trained],
) -> None:
    corpus = tmp_path / "valid.txt"
    corpus.write_text("\n".join(VALID) + "\n")
    stats = stub.Perplexity(pb.PerplexityRequest(model="bpe-gru", texts=VALID)).stats
    argv = ["ppl", "--target", server.address, "--model", "bpe-gru", str(corpus)]
    assert main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["word_count"], data["token_count"]) == (stats.word_count, stats.token_count)
    assert data["perplexity_per_word"] == pytest.approx(stats.perplexity_per_word)
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"perplexity per word:        {stats.perplexity_per_word:.4f}" in out
    assert f"words: {stats.word_count}" in out


def test_character_vocabulary_is_unescaped_end_to_end(
    server: BackgroundServer, stub: Stub, repository: Path, trained: dict[str, Trained]
) -> None:
    lines = (repository / "char-gru" / "vocab.txt").read_text(encoding="utf-8").split("\n")
    assert "\\s" in lines and " " not in lines  # the file escapes the space...
    space_id = lines.index("\\s")
    # The front's vocabulary (read without the weights) and the model's, loaded here, agree.
    front_vocab = server.running.repository.ready("char-gru").vocab
    backend = load_entry(repository / "char-gru").backend
    assert backend is not None and backend.vocab.words[space_id] == " "
    assert front_vocab is not None and front_vocab.words == backend.vocab.words
    assert backend.vocab.words == trained["char"].codec.vocab.words
    [result] = _score(stub, "char-gru", ["be light"])
    assert list(result.details.tokens)[2] == " "  # ...the server shows the character
    assert list(result.details.token_ids)[2] == space_id
    [unknown] = _score(stub, "char-gru", ["light?"])  # "?" is in no training text
    assert unknown.oov_count == 1 and list(unknown.details.tokens)[-2:] == ["<unk>", "</s>"]
    assert list(unknown.details.oov) == [False] * 5 + [True, False]


def test_a_mixture_of_character_models_scores_as_its_component(stub: Stub) -> None:
    [mixed] = _score(stub, "char-mix", TEXTS[:1])
    [alone] = _score(stub, "char-gru", TEXTS[:1])
    np.testing.assert_allclose(list(mixed.details.log_probs), list(alone.details.log_probs))
    assert list(mixed.details.tokens) == list(alone.details.tokens)


def test_the_manifest_records_the_command_that_ran(
    repository: Path, trained: dict[str, Trained]
) -> None:
    for model in trained.values():
        manifest = read_manifest(repository / model.name)
        assert manifest.provenance.trained_by == "lmserve " + shlex.join(model.argv)
        assert manifest.tokenizer.kind.value in ("character", "bpe")


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        ("bpe-vocab-mismatch", "vocab.txt: token 3 is"),
        ("char-bad-escape", "vocab.txt: character vocabulary: bad escape '\\\\q'"),
        ("bpe-mix", "a bpe tokenizer is not served with kind 'interpolated'"),
        ("char-ngram", "manifest lists no file 'vocab'"),
    ],
)
def test_inconsistent_or_unservable_models_fail_alone(stub: Stub, model: str, reason: str) -> None:
    info = stub.GetModel(pb.GetModelRequest(model=model)).model
    assert info.state == pb.MODEL_STATE_FAILED
    assert reason in info.load_error
    with pytest.raises(grpc.RpcError) as caught:
        stub.Score(pb.ScoreRequest(model=model, texts=["the"]))
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_generated_text_is_the_codecs_decoding_of_the_generated_tokens(
    stub: Stub, trained: dict[str, Trained], kind: str
) -> None:
    """Streamed pieces and the final text read as the tokenizer writes (characters joined, BPE
    pieces merged into words), not as space-joined token strings."""
    model = trained[kind]
    request = pb.GenerateRequest(
        model=model.name,
        prompt="and god",
        sampling=pb.SamplingParams(temperature=1.0, seed=7),
        stopping=pb.StoppingCriteria(max_new_tokens=12, ignore_eos=True),
    )
    ids, pieces, final = [], [], None
    for message in stub.Generate(request, timeout=30):
        for token in message.tokens:
            ids.append(token.token_id)
            pieces.append(token.text)
        if message.HasField("finished"):
            final = message.finished
    assert final is not None and len(ids) == 12
    expected = model.codec.decode(ids)
    assert final.text == "".join(pieces) == expected

    beam = stub.BeamSearch(
        pb.BeamSearchRequest(model=model.name, prompt="and god", beam_width=2, max_length=6),
        timeout=30,
    )
    best = beam.hypotheses[0]
    eos = model.codec.vocab.eos_id
    assert best.text == model.codec.decode([i for i in best.token_ids if i != eos])


def _cli_output(argv: list[str]) -> str:
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert main(argv) == 0, argv
    return buffer.getvalue()


def test_no_raw_bpe_pieces_in_any_cli_output(
    server: BackgroundServer, trained: dict[str, Trained]
) -> None:
    """score (per-token), generate (tokens, alternatives), beam search and complete on a BPE
    model: every piece the user sees is text, never a subword with its end-of-word mark."""
    model = trained["bpe"]
    base = ["--target", server.address, "--model", model.name]
    prompt = ["--prompt", "and god", "--seed", "1", "--max-new-tokens", "12"]
    outputs = {
        "score": _cli_output(["score", *base, "--tokens", "in the beginning god"]),
        "score --json": _cli_output(["score", *base, "--tokens", "--json", "in the beginning god"]),
        "generate": _cli_output(["generate", *base, *prompt]),
        "generate --json": _cli_output(
            ["generate", *base, *prompt, "--json", "--logprobs", "--top-logprobs", "5"]
        ),
        "beam": _cli_output(["generate", *base, *prompt, "--beam", "3", "--n-best", "3", "--json"]),
        "complete": _cli_output(["complete", *base, "--type", "and go", "--json"]),
    }
    for name, output in outputs.items():
        assert output.strip(), name
        for mark in PIECE_MARKS:
            assert mark not in output, f"{name} shows {mark!r}:\n{output}"
    # The probe is not vacuous: the vocabulary has pieces with the mark, and the outputs carry
    # per-token texts and alternatives.
    assert any(w.endswith("</w>") for w in model.codec.vocab.words)
    [scored] = [json.loads(line) for line in outputs["score --json"].splitlines()]
    texts = [t["token"] for t in scored["tokens"]]
    assert "".join(texts[:-1]) == "in the beginning god" and texts[-1] == "</s>"
    [sample] = [json.loads(line) for line in outputs["generate --json"].splitlines()]
    assert len(sample["tokens"][0]["top_logprobs"]) == 5
    alternatives = {a["text"] for t in sample["tokens"] for a in t["top_logprobs"]}
    assert alternatives and alternatives <= {*model.codec_texts(), "</s>", "<unk>", "<s>"}
