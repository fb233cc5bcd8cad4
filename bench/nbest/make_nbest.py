"""ASR-style n-best lists from held-out KJV sentences, for testing and tuning reranking.

Deterministic for a seed (Python's `random.Random`, whose sequences are stable across versions
for the calls used here). The noise model, per sentence of the chosen split (5-16 words):

* **Hypotheses**: 10-50 per list (uniform). With probability 0.8 the true sentence is one of
  them; the others are distinct corrupted copies of it, each with 1 + Geometric(0.5) errors
  (at most 4), every error one of
  - substitution (70%) of a word by a *confusable* word of the training vocabulary: one edit
    away (`hath`/`hast`, `the`/`thee`), two edits away with the same first three letters and a
    length within one (`their`/`there`), or sharing its first or last four letters with a length
    within two (`rejoice`/`rejoiced`, `nation`/`nations`); a word with no confusable gets a
    deletion instead,
  - deletion (15%) of a word (never the last one left),
  - insertion (15%) of one of the 30 most frequent training words at a random position.
* **Acoustic score** (natural-log-like, "acoustic" in `scores`): `-A * e + N(0, SIGMA^2)` with
  `e` the hypothesis's word edit distance to the truth, A = 1.5 and SIGMA = 3. The noise is
  larger than the penalty of one error, so the acoustic score prefers the truth only weakly:
  acoustic-only WER is well above the oracle WER, and an LM has something to fix.
* Hypotheses are listed by acoustic score, best first (as a recognizer writes them), scores
  rounded to 1e-3. Each line: `{"id", "reference", "hypotheses": [{"text", "scores"}]}`.

    .venv/bin/python bench/nbest/make_nbest.py --split test --lists 150 --seed 1 \
        --output tests/data/nbest/kjv-test.jsonl

prints the set's acoustic-only and oracle WER (jiwer) as JSON.
"""

from __future__ import annotations

import argparse
import json
import random
from collections import Counter
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
CORPUS = REPO_ROOT / "export" / "lmserve" / "export" / "corpora" / "kjv"
TRUTH_IN_LIST = 0.8
MIN_HYPOTHESES, MAX_HYPOTHESES = 10, 50
MIN_WORDS, MAX_WORDS = 5, 16
ERROR_PENALTY = 1.5  # A
NOISE = 3.0  # SIGMA
MAX_ERRORS = 4
FUNCTION_WORDS = 30
_LETTERS = "abcdefghijklmnopqrstuvwxyz'"


def edit_distance(a: Sequence[str], b: Sequence[str]) -> int:
    """Levenshtein distance of two sequences (words or letters)."""
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, start=1):
        current = [i]
        for j, y in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
        previous = current
    return previous[-1]


class Confusions:
    """Words of the training vocabulary an ASR system might hear instead of a given word."""

    def __init__(self, counts: Counter[str]) -> None:
        self.vocab = frozenset(counts)
        self.common = [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))][
            :FUNCTION_WORDS
        ]
        self._by_prefix: dict[str, list[str]] = {}
        self._by_suffix: dict[str, list[str]] = {}
        self._by_start: dict[str, list[str]] = {}
        for word in sorted(self.vocab):
            self._by_start.setdefault(word[:3], []).append(word)
            if len(word) >= 4:
                self._by_prefix.setdefault(word[:4], []).append(word)
                self._by_suffix.setdefault(word[-4:], []).append(word)
        self.of = lru_cache(maxsize=None)(self._confusable)

    def _one_edit(self, word: str) -> set[str]:
        splits = [(word[:i], word[i:]) for i in range(len(word) + 1)]
        edits = {a + b[1:] for a, b in splits if b}
        edits |= {a + b[1] + b[0] + b[2:] for a, b in splits if len(b) > 1}
        edits |= {a + c + b[1:] for a, b in splits if b for c in _LETTERS}
        edits |= {a + c + b for a, b in splits for c in _LETTERS}
        return edits & self.vocab

    def _confusable(self, word: str) -> tuple[str, ...]:
        found = self._one_edit(word)
        for w in self._by_start.get(word[:3], []):
            if abs(len(w) - len(word)) <= 1 and edit_distance(w, word) <= 2:
                found.add(w)
        if len(word) >= 4:
            for w in self._by_prefix.get(word[:4], []) + self._by_suffix.get(word[-4:], []):
                if abs(len(w) - len(word)) <= 2:
                    found.add(w)
        found.discard(word)
        return tuple(sorted(found))


def _corrupt(words: list[str], rng: random.Random, confusions: Confusions) -> list[str]:
    errors = 1
    while errors < MAX_ERRORS and rng.random() < 0.5:
        errors += 1
    out = list(words)
    for _ in range(errors):
        kind = rng.random()
        position = rng.randrange(len(out))
        if kind < 0.70:
            options = confusions.of(out[position])
            if options:
                out[position] = rng.choice(options)
                continue
            kind = 0.75  # nothing confusable: delete instead
        if kind < 0.85:
            if len(out) > 1:
                del out[position]
        else:
            out.insert(rng.randrange(len(out) + 1), rng.choice(confusions.common))
    return out


def _nbest(
    list_id: str, reference: str, rng: random.Random, confusions: Confusions
) -> dict[str, Any]:
    words = reference.split()
    wanted = rng.randint(MIN_HYPOTHESES, MAX_HYPOTHESES)
    texts: list[str] = [reference] if rng.random() < TRUTH_IN_LIST else []
    seen = {reference}
    for _attempt in range(wanted * 20):
        if len(texts) >= wanted:
            break
        text = " ".join(_corrupt(words, rng, confusions))
        if text not in seen:
            seen.add(text)
            texts.append(text)
    scored = [
        (round(-ERROR_PENALTY * edit_distance(t.split(), words) + rng.gauss(0.0, NOISE), 3), t)
        for t in texts
    ]
    scored.sort(key=lambda st: -st[0])  # stable: equal scores keep generation order
    return {
        "id": list_id,
        "reference": reference,
        "hypotheses": [{"text": t, "scores": {"acoustic": s}} for s, t in scored],
    }


def generate(split: str, lists: int, seed: int, corpus: Path = CORPUS) -> list[dict[str, Any]]:
    """`lists` n-best lists from sentences of `corpus/<split>.txt`, confusions from train."""
    counts = Counter((corpus / "train.txt").read_text(encoding="utf-8").split())
    confusions = Confusions(counts)
    lines = (corpus / f"{split}.txt").read_text(encoding="utf-8").splitlines()
    eligible = [i for i, line in enumerate(lines) if MIN_WORDS <= len(line.split()) <= MAX_WORDS]
    rng = random.Random(seed)
    chosen = sorted(rng.sample(eligible, min(lists, len(eligible))))
    return [_nbest(f"{split}-{i:04d}", lines[i], rng, confusions) for i in chosen]


def to_jsonl(records: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Acoustic-only WER (each list's first hypothesis), oracle WER (each list's hypothesis
    closest to the reference) and the share of lists holding the truth."""
    import jiwer

    refs = [r["reference"] for r in records]
    first = [r["hypotheses"][0]["text"] for r in records]
    oracle = [
        min(
            (h["text"] for h in r["hypotheses"]),
            key=lambda t: edit_distance(t.split(), r["reference"].split()),
        )
        for r in records
    ]
    return {
        "lists": len(records),
        "hypotheses": sum(len(r["hypotheses"]) for r in records),
        "truth_in_list": sum(r["reference"] in oracle for r in records) / len(records),
        "acoustic_only_wer": jiwer.wer(refs, first),
        "oracle_wer": jiwer.wer(refs, oracle),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--split", default="test", choices=("train", "valid", "test"))
    parser.add_argument("--lists", type=int, default=150)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args()
    records = generate(args.split, args.lists, args.seed, args.corpus)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(to_jsonl(records), encoding="utf-8")
    print(json.dumps({"output": str(args.output), "seed": args.seed, **summary(records)}))


if __name__ == "__main__":
    main()
