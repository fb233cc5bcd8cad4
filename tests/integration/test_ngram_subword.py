"""Character and BPE n-gram models, trained by `lmserve train-ngram --tokenizer`, served.

The models are trained through `lmserve.server.cli.main` on a tiny corpus; a real server on a
free port serves them. Every served per-token log-probability must equal an independent
brute-force back-off computation over the written ARPA file (`_ArpaReference`, nothing of
lmserve's) and KenLM's own score of the same file; per-word perplexity must relate to the
per-token one through the token and word counts; generated text must be detokenized.
"""

from __future__ import annotations

import gzip
import math
from collections.abc import Iterator
from pathlib import Path

import grpc
import kenlm  # the independent cross-check (a dev dependency)
import numpy as np
import pytest
from served import ServerFactory

from lmserve.server.cli import main
from lmserve.server.front.process.app import BackgroundServer
from lmserve.server.manifest import TokenizerKind, read_manifest, verify_files
from lmserve.server.text.bpe import BpeCodec
from lmserve.server.text.char import CharCodec, escape_token
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
    "and the evening and the morning were the first day",
    "and god said let there be a firmament in the midst of the waters",
]
TEST = ["and god saw the waters", "let there be a day and a night", "the deep was without light"]
# Irregular spacing, an unseen word, an unseen character ("?"), an empty line.
TEXTS = ["in  the\tbeginning god", "and god made the firmament", "was it good?", ""]
Stub = lm_service_pb2_grpc.LanguageModelServiceStub
LN10 = math.log(10.0)


class _ArpaReference:
    """Back-off scoring by definition, straight from the ARPA text:
    log p(w | h) = log p(h w) if `h w` is listed, else backoff(h) + log p(w | h minus its first
    word), with backoff(h) = 0 for an unlisted h; the history is `<s>` and at most N-1 tokens."""

    def __init__(self, path: Path) -> None:
        self.entries: dict[tuple[str, ...], tuple[float, float]] = {}
        self.order = 0
        with gzip.open(path, "rt", encoding="utf-8") as f:
            for line in f:
                fields = line.rstrip("\n").split("\t")
                if len(fields) < 2:
                    continue
                words = tuple(fields[1].split(" "))
                backoff = float(fields[2]) if len(fields) == 3 else 0.0
                self.entries[words] = (float(fields[0]), backoff)
                self.order = max(self.order, len(words))

    def log10_prob(self, history: tuple[str, ...], word: str) -> float:
        if history + (word,) in self.entries:
            return self.entries[history + (word,)][0]
        if not history:
            return self.entries[("<unk>",)][0]
        backoff = self.entries.get(history, (0.0, 0.0))[1]
        return backoff + self.log10_prob(history[1:], word)

    def token_log_probs(self, tokens: list[str]) -> list[float]:
        """Natural-log probabilities of each token and the final `</s>`, after `<s>`."""
        known = [t if (t,) in self.entries else "<unk>" for t in tokens]
        sentence = ["<s>", *known, "</s>"]
        out = []
        for i in range(1, len(sentence)):
            history = tuple(sentence[max(0, i - self.order + 1) : i])
            out.append(self.log10_prob(history, sentence[i]) * LN10)
        return out


def _train(root: Path, work: Path, name: str, *options: str) -> Path:
    # A tiny corpus gives some order no valid discounts: lmplz's fallback, as KenLM would need.
    argv = ["train-ngram", "--name", name, "--test", str(work / "test.txt"),
            "--discount-fallback", *options, str(work / "train.txt"), str(root / name)]  # fmt: skip
    assert main(argv) == 0
    return root / name


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ngram-subword-models")
    work = tmp_path_factory.mktemp("ngram-subword-training")
    (work / "train.txt").write_text("\n".join(TRAIN) + "\n", encoding="utf-8")
    (work / "test.txt").write_text("\n".join(TEST) + "\n", encoding="utf-8")
    # The tokenizer file a neural BPE model would carry, reused as it is.
    BpeCodec.train(TRAIN, vocab_size=70).save(work / "tokenizer.json")
    _train(root, work, "word-3gram", "--order", "3", "--smoothing", "kneser-ney")
    _train(root, work, "char-5gram", "--order", "5", "--tokenizer", "char")
    _train(root, work, "bpe-3gram", "--order", "3", "--tokenizer", "bpe", "--bpe-vocab-size",
           "60", "--smoothing", "kneser-ney")  # fmt: skip
    _train(root, work, "bpe-file-3gram", "--order", "3", "--tokenizer", "bpe", "--bpe-model",
           str(work / "tokenizer.json"))  # fmt: skip
    return root


@pytest.fixture(scope="module")
def server(serve: ServerFactory, repository: Path) -> Iterator[BackgroundServer]:
    # Its own (no other module serves this repository), stopped when the module ends.
    with serve.private(repository) as running:
        yield running


@pytest.fixture(scope="module")
def stub(server: BackgroundServer) -> Iterator[Stub]:
    with grpc.insecure_channel(server.address) as channel:
        yield lm_service_pb2_grpc.LanguageModelServiceStub(channel)


def _codec(folder: Path) -> CharCodec | BpeCodec:
    if (folder / "tokenizer.json").is_file():
        return BpeCodec.from_file(folder / "tokenizer.json")
    return CharCodec.from_vocab_file(folder / "vocab.txt")


def _tokens(codec: CharCodec | BpeCodec, text: str) -> list[str]:
    return [codec.vocab.words[i] for i in codec.encode_texts([text]).ids]


SUBWORD = ["char-5gram", "bpe-3gram", "bpe-file-3gram"]


@pytest.mark.parametrize("name", SUBWORD)
def test_folder_names_its_tokenizer(repository: Path, name: str) -> None:
    folder = repository / name
    manifest = read_manifest(folder)
    verify_files(folder, manifest)  # the tokenizer file is listed with its sha256
    kind = TokenizerKind.CHARACTER if name.startswith("char") else TokenizerKind.BPE
    assert manifest.tokenizer.kind is kind
    assert ("vocab" if kind is TokenizerKind.CHARACTER else "tokenizer") in manifest.files
    # The ARPA's unigrams are the codec's tokens, escaped, in id order (a space is `\s`).
    arpa = gzip.open(folder / "model.arpa.gz", "rt", encoding="utf-8").read()
    unigrams = arpa.split("\\1-grams:\n")[1].split("\n\n")[0].split("\n")
    written = [line.split("\t")[1] for line in unigrams]
    assert written == [escape_token(t) for t in _codec(folder).vocab.words]
    if kind is TokenizerKind.CHARACTER:
        assert "\\s" in written and " " not in written
    # The recorded command line reproduces the tokenizer choice.
    trained_by = manifest.provenance.trained_by or ""
    assert (
        "--tokenizer char" if kind is TokenizerKind.CHARACTER else "--tokenizer bpe"
    ) in trained_by
    assert ("--bpe-model" in trained_by) == (name == "bpe-file-3gram")
    assert ("--bpe-vocab-size 60" in trained_by) == (name == "bpe-3gram")


def test_the_bpe_model_file_is_used_as_given(repository: Path, tmp_path: Path) -> None:
    given = BpeCodec.from_file(repository / "bpe-file-3gram" / "tokenizer.json")
    assert len(given.vocab) == 70  # the file's vocabulary, not --bpe-vocab-size's default
    assert len(_codec(repository / "bpe-3gram").vocab) == 60


@pytest.mark.parametrize("name", SUBWORD)
def test_served_scores_equal_brute_force_and_kenlm(stub: Stub, repository: Path, name: str) -> None:
    folder = repository / name
    codec = _codec(folder)
    reference = _ArpaReference(folder / "model.arpa.gz")
    model = kenlm.Model(str(folder / "model.arpa.gz"))
    response = stub.Score(pb.ScoreRequest(model=name, texts=TEXTS, return_tokens=True))
    for text, result in zip(TEXTS, response.results, strict=True):
        tokens = _tokens(codec, text)
        escaped = [escape_token(t) for t in tokens]
        expected = reference.token_log_probs(escaped)
        served = list(result.details.log_probs)
        np.testing.assert_allclose(served, expected, atol=1e-5, rtol=0)
        from_kenlm = [s[0] * LN10 for s in model.full_scores(" ".join(escaped))]
        np.testing.assert_allclose(served, from_kenlm, atol=1e-5, rtol=0)
        assert result.log_prob == pytest.approx(model.score(" ".join(escaped)) * LN10, abs=1e-4)
        served_tokens = list(result.details.tokens)
        assert served_tokens[-1] == "</s>" and len(served_tokens) == len(tokens) + 1
        if isinstance(codec, BpeCodec):
            # The text each piece adds (never the raw `x</w>`): they join into the decoded text.
            assert not any("</w>" in t for t in served_tokens)
            ids = codec.encode_texts([text]).ids
            assert "".join(served_tokens[:-1]) == codec.decode(ids)
        else:
            # The characters themselves (a space, not `\s`).
            assert served_tokens[:-1] == tokens
        assert result.token_count == len(tokens) + 1
        assert result.oov_count == tokens.count("<unk>")
    # The unseen "?" is an OOV character (an unknown BPE piece) in both tokenizers.
    assert response.results[2].oov_count == 1
    assert list(response.results[2].details.oov)[-2:] == [True, False]


def test_perplexity_per_word_and_per_token(stub: Stub, repository: Path) -> None:
    words = sum(len(t.split()) for t in TEXTS) + len(TEXTS)  # every word and one </s> a line
    word = stub.Perplexity(pb.PerplexityRequest(model="word-3gram", texts=TEXTS)).stats
    assert word.word_count == word.token_count == words
    assert word.perplexity_per_word == pytest.approx(word.perplexity, rel=1e-12)

    char = stub.Perplexity(pb.PerplexityRequest(model="char-5gram", texts=TEXTS)).stats
    codec = _codec(repository / "char-5gram")
    characters = sum(len(" ".join(t.split())) + 1 for t in TEXTS)  # spaces and </s> included
    assert (char.token_count, char.word_count) == (characters, words)
    assert char.perplexity == pytest.approx(math.exp(-char.log_prob / characters), rel=1e-9)
    # Same log-probability, other denominator: ppl_word = ppl_token ** (tokens / words).
    by_tokens = math.exp(math.log(char.perplexity) * char.token_count / char.word_count)
    assert char.perplexity_per_word == pytest.approx(by_tokens, rel=1e-9)
    assert char.perplexity_per_word > char.perplexity  # a word is several characters
    assert len(codec.vocab) < 40

    for name in SUBWORD:  # the manifest's test figure is the server's per-word perplexity
        stream = [pb.CorpusPerplexityRequest(model=name, texts=TEST[:1]),
                  pb.CorpusPerplexityRequest(model=name, texts=TEST[1:])]  # fmt: skip
        stats = stub.CorpusPerplexity(iter(stream)).stats
        metrics = read_manifest(repository / name).provenance.metrics
        assert stats.word_count == metrics["test_words"]
        assert stats.token_count == metrics["test_tokens"]
        assert stats.perplexity_per_word == pytest.approx(metrics["test_perplexity"], rel=1e-6)
        assert stats.perplexity == pytest.approx(metrics["test_token_perplexity"], rel=1e-6)


@pytest.mark.parametrize("name", ["char-5gram", "bpe-3gram"])
def test_generated_text_is_detokenized(stub: Stub, repository: Path, name: str) -> None:
    codec = _codec(repository / name)
    request = pb.GenerateRequest(
        model=name,
        prompt="and god",
        sampling=pb.SamplingParams(temperature=1.0, seed=11),
        stopping=pb.StoppingCriteria(max_new_tokens=15, ignore_eos=True),
    )
    ids, pieces, final = [], [], None
    for message in stub.Generate(request, timeout=30):
        for token in message.tokens:
            ids.append(token.token_id)
            pieces.append(token.text)
        if message.HasField("finished"):
            final = message.finished
    assert final is not None and len(ids) == 15
    assert final.text == "".join(pieces) == codec.decode(ids)
    assert "</w>" not in final.text and "\\s" not in final.text

    beam = stub.BeamSearch(
        pb.BeamSearchRequest(model=name, prompt="and god", beam_width=3, max_length=8),
        timeout=30,
    )
    eos = codec.vocab.eos_id
    for hypothesis in beam.hypotheses:
        assert hypothesis.text == codec.decode([i for i in hypothesis.token_ids if i != eos])
        assert "</w>" not in hypothesis.text


@pytest.mark.parametrize("name", ["char-5gram", "bpe-3gram"])
def test_complete_and_rerank_speak_words(stub: Stub, name: str) -> None:
    [answer] = stub.Complete(
        iter([pb.CompleteRequest(model=name, append_text="and god", partial_word="s", k=3)]),
        timeout=30,
    )
    if name.startswith("char"):  # the committed words end with their space
        assert list(answer.appended_tokens) == [*"and god", " "]
    words = [c.word for c in answer.completions]
    assert words and all(w.startswith("s") and "</w>" not in w and " " not in w for w in words)
    assert [c.log_prob for c in answer.completions] == sorted(
        (c.log_prob for c in answer.completions), reverse=True
    )
    assert "said" in words or "saw" in words  # what the corpus says after "and god s"

    texts = ["and god said let there be light", "light be there let said god and"]
    hypotheses = [pb.Hypothesis(text=t) for t in texts]
    request = pb.RerankRequest(model=name, lists=[pb.NBestList(id="x", hypotheses=hypotheses)])
    [ranked] = stub.Rerank(request).lists
    scores = stub.Score(pb.ScoreRequest(model=name, texts=texts)).results
    by_index = {h.index: h for h in ranked.hypotheses}
    for i, score in enumerate(scores):
        assert by_index[i].lm_log_prob == pytest.approx(score.log_prob, abs=1e-9)
    assert ranked.hypotheses[0].index == 0  # the corpus order wins


@pytest.mark.parametrize("name", ["char-5gram", "bpe-3gram"])
def test_piece_models_bias_on_words_and_refuse_user_words(stub: Stub, name: str) -> None:
    """Biasing matches words whatever the tokens; user words need a word-level model."""
    bias = pb.BiasList(phrases=[pb.BiasPhrase(phrase="God said", boost=2.5)])
    texts = ["and god said let there be light", "and god saw the light"]
    results = stub.Score(pb.ScoreRequest(model=name, texts=texts, bias=bias)).results
    assert [r.bias for r in results] == [2.5, 0.0]
    assert results[0].biased_log_prob == pytest.approx(results[0].log_prob + 2.5)
    request = pb.CompleteRequest(model=name, k=3, user_words=pb.TokenList(tokens=["zorblax"]))
    with pytest.raises(grpc.RpcError) as info:
        list(stub.Complete(iter([request]), timeout=30))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (info.value.details() or "").startswith("user_words")
