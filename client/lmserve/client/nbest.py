"""Reading n-best lists from files and writing reranked ones: JSON lines and SRILM's formats.

JSON lines, one list a line (`reference`, the true text, is optional and kept for tuning):

    {"id": "u1", "reference": "...", "hypotheses": [{"text": "...", "scores": {"acoustic": -3}}]}

SRILM (`nbest-format(5)`): one file per utterance (plain or `.gz`), its id the file name without
`.gz`. All three of SRILM's formats are read, chosen by the first line, and every score becomes
natural-log (nats), the scale of the LM's `lm_log_prob`:

    NBestList1.0 header, lines `(score) w1 w2 ...`: `score` is the recognizer's combined
        acoustic+LM score in bytelog -> scores {"recognizer": score * 1024 * ln(1.0001)}
    NBestList2.0 header, lines `(score) w1 ( st: S et: E g: G a: A ) w2 ( ... ) ...`: per-word
        LM (g) and acoustic (a) bytelogs -> {"acoustic": sum(a), "recognizer_lm": sum(g)},
        each * 1024 * ln(1.0001); the combined `score` is dropped (it is their sum)
    no header, lines `ascore lscore nwords w1 w2 ...` (`ngram -rescore`), log10 scores ->
        {"acoustic": ascore * ln(10), "recognizer_lm": lscore * ln(10)}; nwords is not checked
        (SRILM counts no pauses in it)

A bytelog is log base 1.0001 divided by 1024, so ln(p) = bytelog * 1024 * ln(1.0001). The
sentence markers `<s>`, `</s>` and Decipher's pause `-pau-` are dropped from the words, as SRILM
drops them; their scores stay in the sums. Sub-word units of NBestList2.0 (phones, states) are
not supported: every `w ( ... )` pair is read as a word. The recognizer's own LM score has weight
1 unless you give it another (`--weight recognizer_lm=0` replaces it by the served model's).
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any, TextIO

from lmserve.client.rerank_types import (
    NBestHypothesis,
    NBestInputError,
    NBestList,
    RerankedList,
)

BYTELOG_TO_NATS = 1024 * math.log(1.0001)
LOG10_TO_NATS = math.log(10)
# Not words: SRILM's sentence markers and Decipher's pause.
_NON_WORDS = frozenset({"<s>", "</s>", "-pau-"})


# -- reading ----------------------------------------------------------------------------------


def read_jsonl(stream: Iterable[str], source: str = "<stdin>") -> Iterator[NBestList]:
    """The lists of a JSON-lines stream; blank lines are skipped. A bad line raises
    NBestInputError naming `source:line` and the field."""
    for number, line in enumerate(stream, start=1):
        if not line.strip():
            continue
        where = f"{source}:{number}"
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise NBestInputError(where, f"not JSON ({exc.msg} at column {exc.colno})") from None
        yield NBestList.from_dict(data, where)


def open_nbest(path: str | Path) -> TextIO:
    """A text stream of a file, gunzipped when its name ends in `.gz`."""
    path = Path(path)
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open(encoding="utf-8")


def srilm_id(path: str | Path) -> str:
    """An utterance's id from its n-best file: the file name without `.gz`."""
    return Path(path).name.removesuffix(".gz")


def _words(tokens: Iterable[str]) -> str:
    return " ".join(t for t in tokens if t not in _NON_WORDS)


def _number(text: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise NBestInputError(where, f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise NBestInputError(where, f"must be finite, got {text!r}")
    return value


def _bracketed(line: str, where: str) -> tuple[float, list[str]]:
    """`(score) rest...` -> (score, rest split on whitespace)."""
    head, _, rest = line.partition(")")
    if not head.startswith("(") or not _:
        raise NBestInputError(where, "expected a line `(score) w1 w2 ...`")
    return _number(head[1:].strip(), where), rest.split()


def _decipher2(fields: list[str], where: str) -> NBestHypothesis:
    """`w1 ( st: S et: E g: G a: A ) w2 ( ... )`: the words and the summed g and a."""
    words: list[str] = []
    lm = acoustic = 0.0
    i = 0
    while i < len(fields):
        word = fields[i]
        if i + 1 >= len(fields) or fields[i + 1] != "(":
            raise NBestInputError(where, f"word {word!r} has no `( st: et: g: a: )` group")
        try:
            end = fields.index(")", i + 2)
        except ValueError:
            raise NBestInputError(where, f"unclosed group after {word!r}") from None
        group = fields[i + 2 : end]
        marks = dict(zip(group[0::2], group[1::2], strict=False))
        if "g:" not in marks or "a:" not in marks:
            raise NBestInputError(where, f"group after {word!r} lacks g: or a:")
        lm += _number(marks["g:"], where)
        acoustic += _number(marks["a:"], where)
        words.append(word)
        i = end + 1
    scores = {"acoustic": acoustic * BYTELOG_TO_NATS, "recognizer_lm": lm * BYTELOG_TO_NATS}
    return NBestHypothesis(_words(words), scores=scores)


def _srilm_line(line: str, version: str, where: str) -> NBestHypothesis:
    if version == "NBestList1.0":
        score, words = _bracketed(line, where)
        return NBestHypothesis(_words(words), scores={"recognizer": score * BYTELOG_TO_NATS})
    if version == "NBestList2.0":
        _, fields = _bracketed(line, where)
        return _decipher2(fields, where)
    fields = line.split()
    if len(fields) < 3:
        raise NBestInputError(where, "expected a line `ascore lscore nwords w1 w2 ...`")
    acoustic, lm = _number(fields[0], where), _number(fields[1], where)
    _number(fields[2], where)
    scores = {"acoustic": acoustic * LOG10_TO_NATS, "recognizer_lm": lm * LOG10_TO_NATS}
    return NBestHypothesis(_words(fields[3:]), scores=scores)


def read_srilm(stream: IO[str], list_id: str, source: str | None = None) -> NBestList:
    """One utterance's n-best list in any of SRILM's three formats (see the module doc)."""
    source = source or list_id
    lines = [(n, line.strip()) for n, line in enumerate(stream, start=1) if line.strip()]
    version = ""
    if lines and lines[0][1].startswith("NBestList"):
        version = lines[0][1].split()[0]
        if version not in ("NBestList1.0", "NBestList2.0"):
            raise NBestInputError(f"{source}:1", f"unknown n-best format {version!r}")
        lines = lines[1:]
    hypotheses = [_srilm_line(line, version, f"{source}:{n}") for n, line in lines]
    return NBestList(list_id, hypotheses)


def read_srilm_files(paths: Iterable[str | Path]) -> Iterator[NBestList]:
    """One list per file, in the order given."""
    for path in paths:
        with open_nbest(path) as stream:
            yield read_srilm(stream, srilm_id(path), str(path))


def read_file_list(path: str | Path) -> list[str]:
    """The n-best files a list file names, one a line (SRILM's `-nbest-files`), relative names
    taken from the list file's folder."""
    folder = Path(path).parent
    with open(path, encoding="utf-8") as stream:
        return [str(folder / line.strip()) for line in stream if line.strip()]


# -- writing ----------------------------------------------------------------------------------


def reranked_record(nbest: NBestList, reranked: RerankedList) -> dict[str, Any]:
    """A reranked list as JSON: hypotheses best first, each with its text, the request's scores
    and the server's figures."""
    hyps = []
    for r in reranked.hypotheses:
        original = nbest.hypotheses[r.index]
        hyps.append(
            {
                "index": r.index,
                "rank": r.rank,
                "text": original.display(),
                "combined_score": r.combined_score,
                "lm_log_prob": r.lm_log_prob,
                "length": r.length,
                "oov_count": r.oov_count,
                "scores": dict(original.scores),
            }
        )
        if r.bias_phrases:
            hyps[-1]["bias"] = r.bias
            hyps[-1]["bias_phrases"] = list(r.bias_phrases)
    record: dict[str, Any] = {"id": reranked.id, "hypotheses": hyps}
    if nbest.reference is not None:
        record["reference"] = nbest.reference
    return record


def write_jsonl(out: IO[str], nbest: NBestList, reranked: RerankedList) -> None:
    out.write(json.dumps(reranked_record(nbest, reranked), ensure_ascii=False) + "\n")


def best_text(nbest: NBestList, reranked: RerankedList) -> str:
    """The text of the best hypothesis (empty for an empty list)."""
    if not reranked.hypotheses:
        return ""
    return nbest.hypotheses[reranked.hypotheses[0].index].display()


def write_1best(out: IO[str], nbest: NBestList, reranked: RerankedList) -> None:
    """One line: the best hypothesis's text."""
    out.write(best_text(nbest, reranked) + "\n")
