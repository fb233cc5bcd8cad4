"""The `train-ngram` pipeline: text -> counts -> smoothed back-off model -> ARPA -> model folder.

Each phase is timed (`TrainResult.timings`, seconds) so the benchmark and the manifest can
report where the time goes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from lmserve.export.ngram.arpa_writer import write_arpa
from lmserve.export.ngram.counting import NgramCounts, count_ngrams
from lmserve.export.ngram.smoothing import (
    BackoffModel,
    smooth_add_k,
    smooth_interpolated,
    smooth_kneser_ney,
    smooth_mle,
)
from lmserve.export.ngram.vocab import EncodedCorpus, encode_corpus, select_vocabulary
from lmserve.server.text.word import WordTokenizer


@dataclass(frozen=True)
class TrainConfig:
    corpus: Path
    model_dir: Path
    order: int
    smoothing: str
    name: str | None = None
    add_k: float = 1.0
    heldout: Path | None = None
    test: Path | None = None
    min_count: int = 1
    top_n: int | None = None
    lowercase: bool = False
    token_pattern: str | None = None
    arpa_only: bool = False
    gzip: bool = True

    @property
    def model_name(self) -> str:
        return self.name or self.model_dir.resolve().name


@dataclass
class TrainResult:
    arpa_path: Path
    vocab_size: int
    ngram_counts: list[int]
    timings: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    parameters: dict[str, list[float]] = field(default_factory=dict)


class _Timer:
    def __init__(self) -> None:
        self.timings: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        yield
        self.timings[name] = time.perf_counter() - start


def read_sentences(path: Path, tokenizer: WordTokenizer) -> list[list[str]]:
    """One sentence per line, as KenLM reads text: a line with no words is still a sentence
    (`<s> </s>`), so every line contributes one `</s>`."""
    return tokenizer.split_batch(path.read_text(encoding="utf-8").splitlines())


def smooth(counts: NgramCounts, config: TrainConfig, heldout: EncodedCorpus | None) -> BackoffModel:
    method = config.smoothing
    if method == "mle":
        return smooth_mle(counts)
    if method == "add-k":
        return smooth_add_k(counts, config.add_k)
    if method == "interpolated":
        return smooth_interpolated(counts, heldout)
    if method in ("kneser-ney", "modified-kneser-ney"):
        return smooth_kneser_ney(counts, modified=method == "modified-kneser-ney")
    raise ValueError(f"unknown smoothing method {method!r}")


def train(config: TrainConfig, command_line: Sequence[str] = ()) -> TrainResult:
    """Runs the whole pipeline and returns what it wrote and measured."""
    from lmserve.export.ngram.evaluate import perplexity
    from lmserve.server.backends.ngram import NgramModel, write_model_folder
    from lmserve.server.manifest import Provenance, TokenizerSpec

    if config.smoothing == "interpolated" and config.heldout is None:
        raise ValueError("--smoothing interpolated needs --heldout to tune its weights")
    timer = _Timer()
    tokenizer = WordTokenizer(lowercase=config.lowercase, pattern=config.token_pattern)
    with timer.phase("read_seconds"):
        sentences = read_sentences(config.corpus, tokenizer)
        heldout_sentences = read_sentences(config.heldout, tokenizer) if config.heldout else None
        test_sentences = read_sentences(config.test, tokenizer) if config.test else None
    with timer.phase("count_seconds"):
        words = select_vocabulary(sentences, min_count=config.min_count, top_n=config.top_n)
        index = {w: i for i, w in enumerate(words)}
        corpus = encode_corpus(sentences, index)
        counts = count_ngrams(corpus, config.order, len(words))
    with timer.phase("smooth_seconds"):
        heldout = encode_corpus(heldout_sentences, index) if heldout_sentences else None
        model = smooth(counts, config, heldout)
    config.model_dir.mkdir(parents=True, exist_ok=True)
    arpa_path = config.model_dir / ("model.arpa.gz" if config.gzip else "model.arpa")
    with timer.phase("write_arpa_seconds"):
        write_arpa(model, words, arpa_path)
    with timer.phase("build_seconds"):
        engine = NgramModel.from_arpa(arpa_path)
    train_seconds = sum(timer.timings.values())
    metrics: dict[str, float] = {"train_seconds": round(train_seconds, 3)}
    with timer.phase("evaluate_seconds"):
        for prefix, texts in (("valid", heldout_sentences), ("test", test_sentences)):
            if texts:
                metrics.update(perplexity(engine, texts).as_metrics(prefix))
    result = TrainResult(
        arpa_path=arpa_path,
        vocab_size=len(words),
        ngram_counts=[len(t) for t in counts.orders],
        timings=timer.timings,
        metrics=metrics,
        parameters=model.info,
    )
    if not config.arpa_only:
        with timer.phase("write_folder_seconds"):
            write_model_folder(
                engine,
                config.model_dir,
                name=config.model_name,
                tokenizer=TokenizerSpec(lowercase=config.lowercase, pattern=config.token_pattern),
                provenance=Provenance(
                    training_corpus=str(config.corpus),
                    trained_by=" ".join(["lmserve", "train-ngram", *command_line]),
                    created=datetime.now(UTC).isoformat(timespec="seconds"),
                    metrics=metrics,
                ),
                smoothing=config.smoothing,
                arpa_source=arpa_path,
            )
    return result
