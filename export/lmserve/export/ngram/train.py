"""The `train-ngram` pipeline: text -> counts -> smoothed back-off model -> ARPA -> model folder.

The tokens counted are words, characters or BPE pieces (`tokens.CorpusTokenizer`); a character
or BPE model's folder also holds its tokenizer (`vocab.txt`, escaped, or `tokenizer.json`), named
by the manifest, so the server cuts texts exactly as training did.

Each phase is timed (`TrainResult.timings`, seconds) and followed by the process's peak RSS so
far (`TrainResult.peak_rss_mb`), so the benchmark and the manifest can report where the time
and the memory go. The corpus is read block by block into int32 ids (`corpus_stream`) and
counted within `memory` bytes (`counting`), spilling sorted runs to `temp_dir` only when the
corpus does not fit; the counts and model are dropped before the serving engine is built.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from lmserve.export.ngram.arpa_writer import write_arpa
from lmserve.export.ngram.corpus_stream import read_corpus
from lmserve.export.ngram.counting import IN_MEMORY_BYTES_PER_TOKEN, NgramCounts, count_store
from lmserve.export.ngram.memory import DEFAULT_MEMORY, parse_memory
from lmserve.export.ngram.progress import Progress
from lmserve.export.ngram.smoothing import (
    BackoffModel,
    smooth_add_k,
    smooth_interpolated,
    smooth_kneser_ney,
    smooth_mle,
)
from lmserve.export.ngram.smoothing.kneser_ney import KENLM_FALLBACK
from lmserve.export.ngram.tokens import CorpusTokenizer, make_tokenizer, read_lines
from lmserve.export.ngram.vocab import EncodedCorpus, encode_corpus

if TYPE_CHECKING:
    from lmserve.server.manifest import TokenizerSpec


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
    # Only model.lmbin and the manifest: the ARPA the binary is built from is written to a
    # temporary folder (`temp_dir`) and removed, and the manifest lists no `arpa` file.
    binary_only: bool = False
    gzip: bool = True
    tokenizer: str = "word"
    bpe_vocab_size: int = 8000
    bpe_model: Path | None = None
    discount_fallback: bool = False
    memory: str = DEFAULT_MEMORY
    temp_dir: Path | None = None
    progress: bool = False

    @property
    def model_name(self) -> str:
        return self.name or self.model_dir.resolve().name


@dataclass
class TrainResult:
    arpa_path: Path | None  # None with binary_only: the ARPA was a temporary file
    vocab_size: int
    ngram_counts: list[int]
    timings: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    parameters: dict[str, list[float]] = field(default_factory=dict)
    peak_rss_mb: dict[str, float] = field(default_factory=dict)


def peak_rss_mb() -> float:
    """The process's peak resident memory so far, MB (ru_maxrss: KB on Linux, bytes on macOS;
    0 where the platform has no `resource` module)."""
    try:
        import resource
    except ImportError:
        return 0.0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


class _Timer:
    def __init__(self) -> None:
        self.timings: dict[str, float] = {}
        self.peaks: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        yield
        self.timings[name] = time.perf_counter() - start
        self.peaks[name.removesuffix("_seconds")] = round(peak_rss_mb(), 1)


TOKENIZER_FILES = {"char": ("vocab", "vocab.txt"), "bpe": ("tokenizer", "tokenizer.json")}


def _tokenizer(config: TrainConfig) -> CorpusTokenizer:
    if config.tokenizer == "bpe" and (config.min_count != 1 or config.top_n is not None):
        raise ValueError("--min-count and --top-n choose words or characters, not BPE pieces")
    if config.tokenizer != "bpe" and config.bpe_model is not None:
        raise ValueError("--bpe-model needs --tokenizer bpe")
    needs_text = config.tokenizer == "char" or (
        config.tokenizer == "bpe" and config.bpe_model is None
    )
    return make_tokenizer(
        config.tokenizer,
        read_lines(config.corpus) if needs_text else [],
        lowercase=config.lowercase,
        pattern=config.token_pattern,
        min_count=config.min_count,
        top_n=config.top_n,
        bpe_vocab_size=config.bpe_vocab_size,
        bpe_model=config.bpe_model,
    )


def _write_tokenizer(tokens: CorpusTokenizer, folder: Path) -> dict[str, Path]:
    """A character or BPE model's tokenizer file(s) in the folder, by manifest key."""
    from lmserve.server.text.bpe import BpeCodec

    codec = tokens.codec
    if codec is None:
        return {}
    if isinstance(codec, BpeCodec):
        key, name = TOKENIZER_FILES["bpe"]
        codec.save(folder / name)
    else:
        key, name = TOKENIZER_FILES["char"]
        codec.save_vocab(folder / name)
    return {key: folder / name}


def _tokenizer_spec(config: TrainConfig, tokens: CorpusTokenizer) -> TokenizerSpec:
    from lmserve.server.manifest import TokenizerSpec

    file = "tokenizer" if config.tokenizer == "bpe" else None
    return TokenizerSpec(
        kind=tokens.kind, lowercase=config.lowercase, pattern=config.token_pattern, file=file
    )


def smooth(counts: NgramCounts, config: TrainConfig, heldout: EncodedCorpus | None) -> BackoffModel:
    method = config.smoothing
    if method == "mle":
        return smooth_mle(counts)
    if method == "add-k":
        return smooth_add_k(counts, config.add_k)
    if method == "interpolated":
        return smooth_interpolated(counts, heldout)
    if method in ("kneser-ney", "modified-kneser-ney"):
        fallback = KENLM_FALLBACK if config.discount_fallback else None
        return smooth_kneser_ney(
            counts, modified=method == "modified-kneser-ney", discount_fallback=fallback
        )
    raise ValueError(f"unknown smoothing method {method!r}")


def train(config: TrainConfig, command_line: Sequence[str] = ()) -> TrainResult:
    """Runs the whole pipeline and returns what it wrote and measured."""
    from lmserve.export.ngram.evaluate import perplexity
    from lmserve.server.backends.ngram.folder import write_model_folder
    from lmserve.server.backends.ngram.model import NgramModel
    from lmserve.server.manifest import Provenance

    if config.arpa_only and config.binary_only:
        raise ValueError("--arpa-only and --binary-only exclude each other")
    if config.smoothing == "interpolated" and config.heldout is None:
        raise ValueError("--smoothing interpolated needs --heldout to tune its weights")
    timer = _Timer()
    progress = Progress(enabled=config.progress)
    memory = parse_memory(config.memory)
    with timer.phase("tokenizer_seconds"):
        tokens = _tokenizer(config)
    # Spilled corpus ids and sorted runs, when the corpus does not fit `memory`.
    with tempfile.TemporaryDirectory(prefix="lmserve-train-", dir=config.temp_dir) as scratch:
        with timer.phase("read_seconds"):
            words, store = read_corpus(
                tokens,
                config.corpus,
                vocabulary=tokens.vocabulary(),
                min_count=config.min_count,
                top_n=config.top_n,
                memory_tokens=memory // IN_MEMORY_BYTES_PER_TOKEN,
                temp_dir=Path(scratch),
                progress=progress,
            )
            evaluated = {
                prefix: read_lines(path)
                for prefix, path in (("valid", config.heldout), ("test", config.test))
                if path is not None
            }
            split = {prefix: tokens.split(lines) for prefix, lines in evaluated.items()}
            heldout_sentences = split.get("valid")
        with timer.phase("count_seconds"):
            counts = count_store(store, config.order, len(words), memory=memory,
                                 temp_dir=Path(scratch), progress=progress)  # fmt: skip
        del store
    ngram_counts = [len(t) for t in counts.orders]
    with timer.phase("smooth_seconds"):
        index = {w: i for i, w in enumerate(words)}
        heldout = encode_corpus(heldout_sentences, index) if heldout_sentences else None
        model = smooth(counts, config, heldout)
    del counts, heldout
    config.model_dir.mkdir(parents=True, exist_ok=True)
    arpa_name = "model.arpa.gz" if config.gzip else "model.arpa"
    with ExitStack() as stack:
        # binary_only: the ARPA is only the engine's input, written outside the model folder.
        arpa_dir = (
            Path(stack.enter_context(
                tempfile.TemporaryDirectory(prefix="lmserve-arpa-", dir=config.temp_dir)
            ))
            if config.binary_only
            else config.model_dir
        )  # fmt: skip
        arpa_path = arpa_dir / arpa_name
        with timer.phase("write_arpa_seconds"):
            write_arpa(model, tokens.arpa_names(words), arpa_path, progress)
        parameters = model.info
        del model  # the tables go before the engine is built from the ARPA
        with timer.phase("build_seconds"):
            engine = NgramModel.from_arpa(arpa_path)
            if tokens.codec is not None:  # the ARPA's escaped words -> the tokens themselves
                engine.adopt_vocabulary(tokens.codec.vocab)
    train_seconds = sum(timer.timings.values())
    metrics: dict[str, float] = {"train_seconds": round(train_seconds, 3)}
    with timer.phase("evaluate_seconds"):
        for prefix, lines in evaluated.items():
            if lines:
                measured = perplexity(engine, split[prefix], tokens.count_words(lines))
                metrics.update(measured.as_metrics(prefix, per_word=tokens.codec is not None))
    result = TrainResult(
        arpa_path=None if config.binary_only else arpa_path,
        vocab_size=len(words),
        ngram_counts=ngram_counts,
        timings=timer.timings,
        metrics=metrics,
        parameters=parameters,
        peak_rss_mb=timer.peaks,
    )
    if not config.arpa_only:
        if config.binary_only:  # an earlier run's copy would not match the new binary
            for stale in ("model.arpa.gz", "model.arpa"):
                (config.model_dir / stale).unlink(missing_ok=True)
        with timer.phase("write_folder_seconds"):
            write_model_folder(
                engine,
                config.model_dir,
                name=config.model_name,
                tokenizer=_tokenizer_spec(config, tokens),
                tokenizer_files=_write_tokenizer(tokens, config.model_dir),
                provenance=Provenance(
                    training_corpus=str(config.corpus),
                    trained_by=" ".join(["lmserve", "train-ngram", *command_line]),
                    created=datetime.now(UTC).isoformat(timespec="seconds"),
                    metrics=metrics,
                ),
                smoothing=config.smoothing,
                arpa_source=None if config.binary_only else arpa_path,
            )
    return result
