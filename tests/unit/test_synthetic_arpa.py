"""bench/synthetic_arpa.py: a tiny model is prefix- and suffix-closed, matches its \\data\\ header,
loads in KenLM, and imports into lmserve with KenLM's scores."""

from __future__ import annotations

import math
from pathlib import Path
from types import ModuleType

import kenlm  # a dev dependency: missing, the tests fail (never skip)
import numpy as np
import pytest
from bench_modules import load_bench_module

from lmserve.server.backends.ngram.model import NgramModel
from lmserve.server.cli import main as server_main
from lmserve.server.families.loading import load_backend
from lmserve.server.manifest import read_manifest
from lmserve.server.text.word import encode_token_lists

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def synthetic() -> ModuleType:
    return load_bench_module("synthetic_arpa.py")


@pytest.fixture(scope="module")
def tiny(synthetic: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("synthetic") / "tiny.arpa"
    spec = synthetic.Spec(ngrams=4000, order=4, vocab=300, seed=3)
    stats: dict = synthetic.generate(spec, out, sentences=60)
    return out, stats


def read_sections(path: Path) -> tuple[dict[int, int], dict[int, dict[tuple[str, ...], list[str]]]]:
    """The header's counts and each order's n-grams -> their other fields."""
    header: dict[int, int] = {}
    grams: dict[int, dict[tuple[str, ...], list[str]]] = {}
    order = 0
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "\\data\\" and lines[-1] == "\\end\\"
    for line in lines[1:-1]:
        if line.startswith("ngram "):
            k, count = line.removeprefix("ngram ").split("=")
            header[int(k)] = int(count)
        elif line.startswith("\\") and line.endswith("-grams:"):
            order = int(line[1:].split("-")[0])
            grams[order] = {}
        elif line:
            fields = line.split("\t")
            words = tuple(fields[1].split(" "))
            assert len(words) == order and words not in grams[order]
            grams[order][words] = [fields[0], *fields[2:]]
    return header, grams


def test_tiny_model_is_closed_and_counted(tiny: tuple[Path, dict]) -> None:
    path, stats = tiny
    header, grams = read_sections(path)
    order = len(header)
    assert order == 4
    assert header == {k: len(grams[k]) for k in grams}
    assert list(header.values()) == stats["counts"]
    assert abs(sum(header.values()) - 4000) <= 40  # within 1% of the target
    assert {"<unk>", "<s>", "</s>"} <= {w[0] for w in grams[1]}
    for k in range(2, order + 1):
        for words in grams[k]:
            assert words[:-1] in grams[k - 1], words  # prefix-closed
            assert words[1:] in grams[k - 1], words  # suffix-closed
    for k, entries in grams.items():
        for fields in entries.values():
            assert float(fields[0]) <= 0.0
            # Backoffs on every n-gram below the highest order, none on the highest.
            assert len(fields) == (2 if k < order else 1)
            if k < order:
                assert float(fields[1]) <= 0.0


def test_seed_reproduces_the_file(synthetic: ModuleType, tiny: tuple[Path, dict]) -> None:
    path, _ = tiny
    again = path.with_name("again.arpa")
    synthetic.generate(synthetic.Spec(ngrams=4000, order=4, vocab=300, seed=3), again)
    assert again.read_bytes() == path.read_bytes()


def test_floats_format_as_printf(synthetic: ModuleType) -> None:
    values = np.array([0.0, -1e-7, -0.5, -1.2345674, -12.3456789, -99.0], dtype=np.float64)
    rows = synthetic.format_floats(values)
    got = [bytes(r[r != 0]).decode() for r in rows]
    assert got == ["0", "0", "-0.500000", "-1.234567", "-12.345679", "-99.000000"]


def test_kenlm_loads_it_and_lmserve_scores_it_the_same(
    tiny: tuple[Path, dict], tmp_path: Path
) -> None:
    path, stats = tiny
    ken = kenlm.Model(str(path))
    assert ken.order == 4
    folder = tmp_path / "tiny"
    assert server_main(["import-arpa", str(path), str(folder)]) == 0
    model = load_backend(folder, read_manifest(folder))
    assert isinstance(model, NgramModel)
    lines = Path(stats["sentences_path"]).read_text(encoding="utf-8").splitlines()
    assert len(lines) == 60
    assert any(w.startswith("oov") for line in lines for w in line.split())
    ours = model.score(encode_token_lists([line.split() for line in lines], model.vocab)).totals
    for line, total in zip(lines, ours, strict=True):
        reference = math.fsum(p for p, _, _ in ken.full_scores(line, bos=True, eos=True))
        assert abs(total - reference * math.log(10)) <= 1e-4, line
