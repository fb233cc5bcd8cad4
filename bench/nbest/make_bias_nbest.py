"""N-best lists for contextual biasing: held-out KJV sentences holding rare words (names
mostly), where the acoustic score prefers a near miss of the rare word.

Deterministic for a seed. Per list, on top of `make_nbest`'s noise model (same confusions,
same acoustic score `-1.5 * errors + N(0, 3^2)`):

* the sentence holds at least one *rare word*: at least 4 letters and seen at most
  `RARE_COUNT` times in the training text (an unseen one included), as names and rare terms
  are to a recognizer;
* the truth is always in the list, and for each rare word a *near miss* is added: the sentence
  with that word replaced by a confusable training word (`make_nbest.Confusions`: one or two
  letters away, or sharing its first or last four letters), or, where none exists, by the word
  with one letter dropped; plus one with every rare word replaced. Each near miss scores
  acoustically above the truth by U(0.5, 2.5): the recognizer nearly got the name, and prefers
  the wrong spelling.

`bias_list(records, split_words, rng)` is the phrase list a caller would send: every rare word
of the set's sentences, plus as many rare words of the same split that the set does not hold
(the contact list names people who did not speak).
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

from nbest.make_nbest import CORPUS, MAX_WORDS, MIN_WORDS, Confusions, _nbest

RARE_COUNT = 3
MIN_RARE_LETTERS = 4


def rare_words(words: list[str], counts: Counter[str]) -> list[str]:
    return [w for w in words if len(w) >= MIN_RARE_LETTERS and counts[w] <= RARE_COUNT]


def _near_miss(word: str, confusions: Confusions, rng: random.Random) -> str:
    options = [w for w in confusions.of(word) if w != word]
    if options:
        return rng.choice(options)
    position = rng.randrange(1, len(word))
    return word[:position] + word[position + 1 :]


def generate(split: str, lists: int, seed: int, corpus: Path = CORPUS) -> list[dict[str, Any]]:
    counts = Counter((corpus / "train.txt").read_text(encoding="utf-8").split())
    confusions = Confusions(counts)
    lines = (corpus / f"{split}.txt").read_text(encoding="utf-8").splitlines()
    eligible = [
        i
        for i, line in enumerate(lines)
        if MIN_WORDS <= len(line.split()) <= MAX_WORDS and rare_words(line.split(), counts)
    ]
    rng = random.Random(seed)
    chosen = sorted(rng.sample(eligible, min(lists, len(eligible))))
    records = []
    for i in chosen:
        reference = lines[i]
        words = reference.split()
        record = _nbest(f"{split}-bias-{i:04d}", reference, rng, confusions)
        hypotheses = record["hypotheses"]
        texts = {h["text"] for h in hypotheses}
        truth = next((h for h in hypotheses if h["text"] == reference), None)
        if truth is None:  # the truth is always in a biasing list
            truth = {"text": reference, "scores": {"acoustic": round(rng.gauss(0.0, 3.0), 3)}}
            hypotheses.append(truth)
            texts.add(reference)
        truth_score = truth["scores"]["acoustic"]
        rare = [j for j, w in enumerate(words) if w in set(rare_words(words, counts))]
        variants = [[j] for j in rare] + ([rare] if len(rare) > 1 else [])
        for positions in variants:
            missed = list(words)
            for j in positions:
                missed[j] = _near_miss(words[j], confusions, rng)
            text = " ".join(missed)
            if text in texts:
                continue
            texts.add(text)
            score = round(truth_score + rng.uniform(0.5, 2.5), 3)
            hypotheses.append({"text": text, "scores": {"acoustic": score}})
        hypotheses.sort(key=lambda h: -h["scores"]["acoustic"])
        records.append(record)
    return records


def bias_list(
    records: list[dict[str, Any]], split: str, seed: int, corpus: Path = CORPUS
) -> list[str]:
    """The set's rare words plus as many rare words of the split it does not hold, sorted."""
    counts = Counter((corpus / "train.txt").read_text(encoding="utf-8").split())
    held = {w for r in records for w in rare_words(r["reference"].split(), counts)}
    text = (corpus / f"{split}.txt").read_text(encoding="utf-8").split()
    others = sorted({w for w in rare_words(text, counts)} - held)
    rng = random.Random(seed)
    distractors = rng.sample(others, min(len(held), len(others)))
    return sorted(held | set(distractors))
