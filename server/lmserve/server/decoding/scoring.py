"""Scoring texts with any backend: texts -> tokens -> ids -> one `backend.score` -> results.

    scorer = Scorer(backend, WordCodec(WordTokenizer(), backend.vocab))  # or CharCodec, BpeCodec
    scored = scorer.score_texts(["the cat sat"], ScoreOptions(), details=False)
    stats = PerplexityAccumulator(); stats.add(scored); stats.result().perplexity_per_word

Perplexity follows KenLM: ppl = exp(-sum / N) with N = tokens + one `</s>` per text (when
end-of-sentence is on); "excluding OOVs" drops the OOV tokens' log-probs and their count.
The per-word figure divides the same sum by the words behind the tokens (as the model's word
tokenizer counts them) plus the `</s>`s, so character, BPE and word models compare; for a word
model both figures are the same. All log-probabilities are natural logs. Nothing here knows
about gRPC.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from lmserve.server.backends.base import (
    BatchScores,
    EncodedBatch,
    FloatArray,
    IdArray,
    LanguageModelBackend,
)
from lmserve.server.backends.segments import segment_sums
from lmserve.server.decoding.detokenize import piece_texts
from lmserve.server.decoding.perplexity import PerplexityAccumulator, PerplexityStats, perplexity
from lmserve.server.decoding.scored import CountArray, ScoredTexts, TokenDetails
from lmserve.server.errors import InvalidArgument
from lmserve.server.text.codec import TextCodec
from lmserve.server.text.vocab import Vocabulary


@dataclass(frozen=True)
class ScoreOptions:
    """Whether texts start from `<s>` and whether `</s>` is scored (both on, as KenLM)."""

    bos: bool = True
    eos: bool = True


@dataclass(frozen=True)
class PreparedScoring:
    """A request's texts encoded and checked, waiting for the backend's scores.

    `run(backend)` is the backend call it needs; `Scorer.finish` makes the results."""

    batch: EncodedBatch
    lengths: CountArray
    words: Sequence[int] | None
    word_lists: Sequence[Sequence[str]] | None
    options: ScoreOptions
    details: bool
    oov_log_probs: bool
    oov_counts: CountArray
    per_token: bool

    @property
    def scored_tokens(self) -> int:
        """Positions the backend scores (`</s>` included when eos is on)."""
        return len(self.batch.ids) + (len(self.lengths) if self.options.eos else 0)

    def for_engine(self) -> PreparedScoring:
        """What the engine needs to score it (the ids and options), without the words that only
        `Scorer.finish` reads: less to carry to an engine worker. (Score's response, which the
        engine builds, takes the whole request.)"""
        if self.words is None and self.word_lists is None:
            return self
        return replace(self, words=None, word_lists=None)

    def from_first_tokens(self, field: str) -> PreparedScoring:
        """Each text read from its own first token instead of `<s>` (a transformer with `bos`
        off: it predicts nothing from an empty context), which is then neither scored nor
        counted. A text with no token has nothing to read from: InvalidArgument names it."""
        empty = np.flatnonzero(self.lengths == 0)
        if len(empty):
            raise InvalidArgument(
                f"{field}[{int(empty[0])}]",
                "is empty: with options.bos false a transformer reads a text's first token as "
                "its context, so each text needs one",
            )
        batch = self.batch.first_as_starts()
        lengths = self.lengths - 1
        oov_counts = _segment_counts(batch)
        words = None if self.words is None else [max(w - 1, 0) for w in self.words]
        return replace(self, batch=batch, lengths=lengths, oov_counts=oov_counts, words=words)

    def run(self, backend: LanguageModelBackend) -> BatchScores:
        """The whole batch in one backend call (the engine cuts it into units instead)."""
        options = self.options
        return backend.score(self.batch, bos=options.bos, eos=options.eos, per_token=self.per_token)


class Scorer:
    """Scores texts with one model and the codec it was trained with (ids must agree)."""

    def __init__(self, backend: LanguageModelBackend | None, codec: TextCodec) -> None:
        """`backend` None: a scorer that prepares and finishes only (a front whose models
        compute in engine workers holds no weights); its scores come from elsewhere."""
        if backend is not None and len(codec.vocab) != len(backend.vocab):
            raise ValueError(
                f"the codec has {len(codec.vocab)} tokens, the model {len(backend.vocab)}"
            )
        self._backend = backend
        self.codec = codec
        # A word model's tokens are words: counts come free, details name the words as sent.
        self._words = codec.tokens_are_words

    @property
    def backend(self) -> LanguageModelBackend:
        """The loaded model (a scorer built without one has none to give)."""
        if self._backend is None:
            raise RuntimeError("this scorer has no model loaded: its model computes elsewhere")
        return self._backend

    @property
    def has_backend(self) -> bool:
        return self._backend is not None

    @property
    def vocab(self) -> Vocabulary:
        """The model's vocabulary (the codec's: the same ids and tokens as the model's)."""
        return self.codec.vocab

    def tokenize(self, texts: Sequence[str]) -> list[list[str]]:
        """The words of each text (word-level models, whose tokens they are)."""
        if not self._words:
            raise ValueError("tokenize() splits into a word model's tokens; this model has pieces")
        return self.codec.split_batch(texts)

    def score_texts(
        self,
        texts: Sequence[str],
        options: ScoreOptions,
        *,
        details: bool = False,
        oov_log_probs: bool = False,
        max_tokens_per_text: int | None = None,
    ) -> ScoredTexts:
        """Tokenizes with the model's codec, then scores in one backend call."""
        prepared = self.prepare_texts(
            texts,
            options,
            details=details,
            oov_log_probs=oov_log_probs,
            max_tokens_per_text=max_tokens_per_text,
        )
        return self.finish(prepared, prepared.run(self.backend))

    def score_token_lists(
        self,
        token_lists: Sequence[Sequence[str]],
        options: ScoreOptions,
        *,
        details: bool = False,
        oov_log_probs: bool = False,
        max_tokens_per_text: int | None = None,
    ) -> ScoredTexts:
        """Scores pre-tokenized texts in one backend call (see `prepare_token_lists`)."""
        prepared = self.prepare_token_lists(
            token_lists,
            options,
            details=details,
            oov_log_probs=oov_log_probs,
            max_tokens_per_text=max_tokens_per_text,
        )
        return self.finish(prepared, prepared.run(self.backend))

    def prepare_texts(
        self,
        texts: Sequence[str],
        options: ScoreOptions,
        *,
        details: bool = False,
        oov_log_probs: bool = False,
        max_tokens_per_text: int | None = None,
    ) -> PreparedScoring:
        """Tokenizes with the model's codec and checks the limits: what the backend needs.

        The backend call itself is left to the caller (the engine queues it in bounded units),
        and `finish` turns its scores into results."""
        if details and self._words:
            # The details name every word as sent: split in Python, where the strings are.
            return self.prepare_token_lists(
                self.tokenize(texts),
                options,
                details=True,
                oov_log_probs=oov_log_probs,
                max_tokens_per_text=max_tokens_per_text,
                field="texts",
            )
        count_words = self.codec.count_words
        return self._prepare(
            self.codec.encode_texts(texts),
            None if self._words else [count_words(t) for t in texts],
            options,
            details=details,
            oov_log_probs=oov_log_probs,
            max_tokens_per_text=max_tokens_per_text,
            field="texts",
        )

    def prepare_token_lists(
        self,
        token_lists: Sequence[Sequence[str]],
        options: ScoreOptions,
        *,
        details: bool = False,
        oov_log_probs: bool = False,
        max_tokens_per_text: int | None = None,
        field: str = "token_lists",
    ) -> PreparedScoring:
        """Encodes pre-tokenized texts and checks the limits.

        `details` adds per-token results; `oov_log_probs` adds each text's OOV log-prob sum
        (needed for perplexity excluding OOVs). Both cost a per-token pass; totals alone do not.
        """
        if self._words:
            words, word_lists = None, token_lists if details else None
        else:  # the model's tokens are pieces of the words given
            words, word_lists = [len(t) for t in token_lists], None
        return self._prepare(
            self.codec.encode_token_lists(token_lists),
            words,
            options,
            details=details,
            word_lists=word_lists,
            oov_log_probs=oov_log_probs,
            max_tokens_per_text=max_tokens_per_text,
            field=field,
        )

    def prepare_ids(
        self,
        id_lists: Sequence[Sequence[int]],
        options: ScoreOptions,
        *,
        details: bool = False,
        oov_log_probs: bool = False,
        max_tokens_per_text: int | None = None,
        field: str = "token_ids",
    ) -> PreparedScoring:
        """Texts given as the model's ids (checked in range by the caller), scored on exactly
        those ids: no tokenizer runs, so nothing is merged, split or added."""
        batch = EncodedBatch.of_ids(id_lists, self.vocab.unk_id)
        return self._prepare(
            batch,
            None,  # no text to count words in: one word per token
            options,
            details=details,
            oov_log_probs=oov_log_probs,
            max_tokens_per_text=max_tokens_per_text,
            field=field,
        )

    def _prepare(
        self,
        batch: EncodedBatch,
        words: Sequence[int] | None,
        options: ScoreOptions,
        *,
        details: bool,
        oov_log_probs: bool,
        max_tokens_per_text: int | None,
        field: str,
        word_lists: Sequence[Sequence[str]] | None = None,
    ) -> PreparedScoring:
        """Checks an encoded batch against the limit and notes what its results need.

        `words` counts each text's words (None: one per token, a word model). With `details`,
        tokens are named by `word_lists` (a word model's words as sent) or by the vocabulary.
        """
        offsets = batch.offsets
        lengths = offsets[1:] - offsets[:-1]  # np.diff, without its Python-level overhead
        limit = max_tokens_per_text
        # Only when the whole batch is longer than the limit can one of its texts be.
        if limit is not None and len(batch.ids) > limit and lengths.max() > limit:
            index = int(np.argmax(lengths > limit))  # the first text over it
            check_token_count(f"{field}[{index}]", int(lengths[index]), limit)
        oov_counts = _segment_counts(batch)
        any_oov = oov_log_probs and bool(oov_counts.any())
        return PreparedScoring(
            batch=batch,
            lengths=lengths,
            words=words,
            word_lists=word_lists,
            options=options,
            details=details,
            oov_log_probs=oov_log_probs,
            oov_counts=oov_counts,
            per_token=details or any_oov,
        )

    def finish(self, prepared: PreparedScoring, scores: BatchScores) -> ScoredTexts:
        """The per-text results of a prepared batch from the backend's scores."""
        # Every numpy call counts here: in a busy server each costs several times what it does
        # in a warm loop, so the totals-only path keeps to the few it needs.
        batch, lengths, options = prepared.batch, prepared.lengths, prepared.options
        token_counts = lengths + 1 if options.eos else lengths
        if prepared.words is None:
            word_counts = token_counts
        else:
            word_counts = np.asarray(prepared.words, dtype=np.int64).reshape(len(lengths))
            if options.eos:
                word_counts = word_counts + 1
        oov_sums: FloatArray | None = None
        if prepared.oov_log_probs:
            oov_sums = np.zeros(batch.batch_size, dtype=np.float64)
        text_details: list[TokenDetails] | None = None
        if prepared.per_token:
            assert scores.token_log_probs is not None and scores.token_offsets is not None
            oov_mask = _scored_mask(batch, options.eos)
            if prepared.oov_log_probs and prepared.oov_counts.any():
                masked = np.where(oov_mask, scores.token_log_probs, 0.0)
                oov_sums = segment_sums(masked, scores.token_offsets)
            if prepared.details:
                text_details = self._details(
                    prepared.word_lists,
                    batch,
                    scores.token_log_probs,
                    scores.token_offsets,
                    scores.ngram_lengths,
                    oov_mask,
                    options.eos,
                )
        return ScoredTexts(
            log_probs=np.asarray(scores.totals, dtype=np.float64),
            token_counts=token_counts.astype(np.int64, copy=False),
            word_counts=word_counts.astype(np.int64, copy=False),
            oov_counts=prepared.oov_counts,
            oov_log_probs=oov_sums,
            details=text_details,
            total_tokens=len(batch.ids) + (len(lengths) if options.eos else 0),
        )

    def _details(
        self,
        word_lists: Sequence[Sequence[str]] | None,
        batch: EncodedBatch,
        log_probs: FloatArray,
        token_offsets: CountArray,
        ngram_lengths: IdArray | None,
        oov_mask: npt.NDArray[np.bool_],
        eos: bool,
    ) -> list[TokenDetails]:
        vocab = self.codec.vocab
        eos_word = vocab.words[vocab.eos_id]
        pieces = self.codec.vocab.words
        result = []
        for i in range(batch.batch_size):
            start, end = int(token_offsets[i]), int(token_offsets[i + 1])
            ids = batch.ids[batch.offsets[i] : batch.offsets[i + 1]]
            if word_lists is not None:
                words = list(word_lists[i])
            else:
                # BPE: the text each piece adds, never the raw piece with its `</w>`.
                texts = piece_texts(self.codec, self.codec.vocab, ids.tolist())
                words = texts if texts is not None else [pieces[j] for j in ids.tolist()]
            if eos:
                ids = np.append(ids, np.int32(vocab.eos_id))
                words.append(eos_word)
            result.append(
                TokenDetails(
                    tokens=words,
                    token_ids=ids.astype(np.int32, copy=False),
                    log_probs=log_probs[start:end],
                    oov=oov_mask[start:end],
                    ngram_lengths=None if ngram_lengths is None else ngram_lengths[start:end],
                )
            )
        return result


def check_token_count(field: str, count: int, limit: int, *, holds: str = "has") -> None:
    """The per-text token limit (`max_tokens_per_text`), the one check every request field is
    held to: InvalidArgument `<field>: has N tokens, more than the limit of L` when over it.
    `holds` words what is counted when it is not the field itself ("the context would hold").

    >>> check_token_count("texts[1]", 5, 4)
    Traceback (most recent call last):
    lmserve.server.errors.InvalidArgument: texts[1]: has 5 tokens, more than the limit of 4
    """
    if count > limit:
        raise InvalidArgument(field, f"{holds} {count} tokens, more than the limit of {limit}")


def _segment_counts(batch: EncodedBatch) -> CountArray:
    """OOV tokens per text: the encoder's count when it made one, else from the OOV flags.

    OOVs are few, so the flags are read at their positions (each one's text by binary search
    over the offsets) rather than by a cumulative sum over every token."""
    if batch.oov_counts is not None:
        return batch.oov_counts
    n_texts = batch.batch_size
    positions = np.flatnonzero(batch.oov)
    if not len(positions):
        return np.zeros(n_texts, dtype=np.int64)
    texts = np.searchsorted(batch.offsets, positions, side="right") - 1
    result: CountArray = np.bincount(texts, minlength=n_texts).astype(np.int64, copy=False)
    return result


def _scored_mask(batch: EncodedBatch, eos: bool) -> npt.NDArray[np.bool_]:
    """The OOV flags aligned with the scored tokens (a False `</s>` after each text with eos)."""
    if not eos:
        return batch.oov
    return np.insert(batch.oov, batch.offsets[1:], False)


__all__ = [
    "PerplexityAccumulator",
    "PerplexityStats",
    "PreparedScoring",
    "ScoreOptions",
    "ScoredTexts",
    "Scorer",
    "TokenDetails",
    "check_token_count",
    "perplexity",
]
