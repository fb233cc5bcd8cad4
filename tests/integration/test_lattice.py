"""RescoreLattice and RescoreLatticeStream against a real server, checked against brute force.

The reference: every path of a small seeded random lattice enumerated here (`tests/lattices.py`)
and scored alone by the same server's Score (each path's words joined by spaces), then combined
with the request's weights. Lattice rescoring must give the same best path and the same n best
combined scores within 1e-4 nats: exactly with an n-gram model (histories merged at its
minimised state), and with a recurrent model when `max_history` covers the longest path; with a
lower `max_history` the response says `exact: false` whenever it merged, and the test states
how far the scores moved. Lattices built from the committed n-best lists rescore to a WER no
worse than Rerank's of the same lists; bad lattices are refused in one line and the server
answers a good request after.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Sequence
from pathlib import Path

import grpc
import jiwer
import pytest
from lattices import EPSILON, WordLattice, nbest_lattice, random_lattice
from neural_folders import WORDS as TINY_WORDS
from served import ServerFactory

from lmserve.client import LmServeClient, NBestList
from lmserve.client import nbest as nbest_io
from lmserve.server.front.process.app import BackgroundServer
from lmserve.v1 import lm_service_pb2 as pb
from lmserve.v1 import lm_service_pb2_grpc

Stub = lm_service_pb2_grpc.LanguageModelServiceStub
NBEST = Path(__file__).resolve().parents[1] / "data" / "nbest" / "kjv-test.jsonl"
KJV_WORDS = "and the lord god said unto him israel of in moses people zzyzx".split()
TOLERANCE = 1e-4
SLF = pb.LATTICE_FORMAT_HTK_SLF
KALDI = pb.LATTICE_FORMAT_KALDI_TEXT


@pytest.fixture(scope="module")
def lattice_server(
    serve: ServerFactory,
    tmp_path_factory: pytest.TempPathFactory,
    model_repository: Path,
    tiny_lstm: Path,
) -> BackgroundServer:
    """kjv3 (KenLM's KJV 3-gram) and the tiny LSTM, with small lattice limits to test."""
    root = tmp_path_factory.mktemp("lattice-models")
    (root / "kjv3").symlink_to(model_repository / "kjv3", target_is_directory=True)
    (root / "lstm").symlink_to(tiny_lstm, target_is_directory=True)
    return serve(root, max_lattice_nodes=1_000, max_lattice_states=2_000)


@pytest.fixture(scope="module")
def stub(lattice_server: BackgroundServer) -> Iterator[Stub]:
    with grpc.insecure_channel(lattice_server.address) as channel:
        yield Stub(channel)


@pytest.fixture(scope="module")
def client(lattice_server: BackgroundServer) -> Iterator[LmServeClient]:
    with LmServeClient(lattice_server.address, timeout=60) as c:
        yield c


def _reference(
    client: LmServeClient,
    model: str,
    lattice: WordLattice,
    *,
    acoustic_scale: float,
    lm_weight: float,
    old_lm_weight: float,
    penalty: float,
) -> list[tuple[float, tuple[str, ...], tuple[int, ...]]]:
    """Every path scored alone by Score and combined: (combined, words, arcs), best first
    (ties in path order)."""
    paths = list(lattice.paths())
    scores = client.score(model, [" ".join(p.words) for p in paths])
    combined = [
        (
            acoustic_scale * p.acoustic
            + lm_weight * s.log_prob
            + old_lm_weight * p.old_lm
            + penalty * len(p.words),
            p.words,
            p.arcs,
        )
        for p, s in zip(paths, scores, strict=True)
    ]
    return sorted(combined, key=lambda c: -c[0])


def _request(
    model: str, lattices: Sequence[pb.Lattice], **fields: object
) -> pb.RescoreLatticeRequest:
    return pb.RescoreLatticeRequest(model=model, lattices=list(lattices), **fields)  # type: ignore[arg-type]


WEIGHTS = [
    {"acoustic_scale": 1.0, "lm_weight": 1.0, "old_lm_weight": 0.0, "penalty": 0.0},
    {"acoustic_scale": 0.3, "lm_weight": 1.5, "old_lm_weight": -0.5, "penalty": 0.7},
]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("fmt", [SLF, KALDI])
def test_ngram_equals_every_path_scored_alone(
    stub: Stub, client: LmServeClient, seed: int, fmt: int
) -> None:
    rng = random.Random(seed)
    lattice = random_lattice(rng, KJV_WORDS, nodes=rng.randint(5, 9))
    weights = WEIGHTS[seed % 2]
    reference = _reference(client, "kjv3", lattice, **weights)
    text = lattice.slf() if fmt == SLF else lattice.kaldi(f"utt-{seed}")
    nbest = min(5, len(reference))
    request = _request(
        "kjv3",
        [pb.Lattice(id=f"l{seed}", format=fmt, text=text)],  # type: ignore[arg-type]
        acoustic_scale=weights["acoustic_scale"],
        lm_weight=weights["lm_weight"],
        old_lm_weight=weights["old_lm_weight"],
        word_insertion_penalty=weights["penalty"],
        nbest=nbest,
        max_history=1,  # ignored by an n-gram model: its merges are exact
    )
    [answer] = stub.RescoreLattice(request, timeout=60).lattices
    assert answer.id == f"l{seed}"
    assert answer.exact
    assert answer.arcs == len(lattice.arcs) and answer.nodes == lattice.nodes
    assert [p.words for p in answer.paths][0] == list(reference[0][1])
    assert tuple(answer.paths[0].arcs) == reference[0][2]
    for got, (want, words, _) in zip(answer.paths, reference, strict=False):
        assert abs(got.combined_score - want) <= TOLERANCE, (got, want, words)
        assert got.word_count == len(got.words)
    assert len(answer.paths) == nbest
    # Each returned path's own scores add up to its combined score.
    for got in answer.paths:
        total = (
            weights["acoustic_scale"] * got.acoustic_score
            + weights["lm_weight"] * got.lm_log_prob
            + weights["old_lm_weight"] * got.old_lm_score
            + weights["penalty"] * got.word_count
        )
        assert abs(total - got.combined_score) <= 1e-9


@pytest.mark.parametrize("seed", range(4))
def test_lstm_with_max_history_over_the_longest_path_is_exact(
    stub: Stub, client: LmServeClient, seed: int
) -> None:
    rng = random.Random(100 + seed)
    lattice = random_lattice(rng, TINY_WORDS, nodes=rng.randint(5, 8))
    weights = WEIGHTS[seed % 2]
    reference = _reference(client, "lstm", lattice, **weights)
    longest = max(len(p.words) for p in lattice.paths())
    request = _request(
        "lstm",
        [pb.Lattice(format=SLF, text=lattice.slf())],
        acoustic_scale=weights["acoustic_scale"],
        lm_weight=weights["lm_weight"],
        old_lm_weight=weights["old_lm_weight"],
        word_insertion_penalty=weights["penalty"],
        nbest=3,
        max_history=longest,
    )
    [answer] = stub.RescoreLattice(request, timeout=60).lattices
    assert answer.exact
    assert tuple(answer.paths[0].arcs) == reference[0][2]
    for got, (want, _, _) in zip(answer.paths, reference, strict=False):
        assert abs(got.combined_score - want) <= TOLERANCE


def test_lstm_lower_orders_say_inexact_and_how_far(
    stub: Stub, client: LmServeClient, capsys: pytest.CaptureFixture[str]
) -> None:
    """With max_history below the longest path, histories merge: the response says so, and
    every path's score moves from its exact one (the path scored alone) by what is printed
    here, measured over all paths of five lattices."""
    moved: dict[int, list[float]] = {1: [], 2: [], 3: []}
    same_best: dict[int, int] = {1: 0, 2: 0, 3: 0}
    for seed in range(5):
        rng = random.Random(200 + seed)
        lattice = random_lattice(rng, TINY_WORDS, nodes=8)
        reference = _reference(client, "lstm", lattice, **WEIGHTS[0])
        exact_of = {arcs: score for score, _, arcs in reference}
        for order in moved:
            request = _request(
                "lstm",
                [pb.Lattice(format=SLF, text=lattice.slf())],
                max_history=order,
                nbest=len(reference),
            )
            [answer] = stub.RescoreLattice(request, timeout=60).lattices
            assert len(answer.paths) == len(reference)  # every path, each once
            diffs = [abs(p.combined_score - exact_of[tuple(p.arcs)]) for p in answer.paths]
            if max(diffs) > TOLERANCE:
                assert not answer.exact
            moved[order].extend(diffs)
            same_best[order] += tuple(answer.paths[0].arcs) == reference[0][2]
    with capsys.disabled():
        for order, diffs in moved.items():
            print(
                f"\nlattice lstm max_history={order}: paths' scores moved at most "
                f"{max(diffs):.4f} nats (mean {sum(diffs) / len(diffs):.4f}, "
                f"{len(diffs)} paths); same best path in {same_best[order]}/5 lattices"
            )
    assert max(moved[1]) > TOLERANCE  # order 1 really is an approximation on these lattices


def _kjv_lists(count: int = 12) -> list[NBestList]:
    with NBEST.open(encoding="utf-8") as stream:
        return list(nbest_io.read_jsonl(stream, str(NBEST)))[:count]


def test_nbest_union_lattices_wer_no_worse_than_rerank(stub: Stub, client: LmServeClient) -> None:
    lists = _kjv_lists()
    references = [json.loads(line)["reference"] for line in NBEST.read_text().splitlines()]
    references = references[: len(lists)]
    reranked = client.rerank("kjv3", lists, score_weights={"acoustic": 1.0}, lm_weight=1.0)
    rerank_best = [
        lst.hypotheses[r.hypotheses[0].index].text for lst, r in zip(lists, reranked, strict=True)
    ]
    lattices = [
        pb.Lattice(
            id=lst.id,
            format=KALDI,
            text=nbest_lattice(
                [(h.text.split(), h.scores["acoustic"]) for h in lst.hypotheses]
            ).kaldi(lst.id),
        )
        for lst in lists
    ]
    answer = stub.RescoreLattice(_request("kjv3", lattices), timeout=60)
    lattice_best = [lat.paths[0].text for lat in answer.lattices]
    assert [lat.id for lat in answer.lattices] == [lst.id for lst in lists]
    wer_rerank = jiwer.wer(references, rerank_best)
    wer_lattice = jiwer.wer(references, lattice_best)
    print(f"\nWER on {len(lists)} lists: rerank {wer_rerank:.4f}, lattice {wer_lattice:.4f}")
    assert wer_lattice <= wer_rerank + 1e-12
    # Same paths, same scores: the combined scores equal Rerank's best.
    for lat, r in zip(answer.lattices, reranked, strict=True):
        assert abs(lat.paths[0].combined_score - r.hypotheses[0].combined_score) <= TOLERANCE


def test_stream_answers_in_order_and_names_the_bad_request(stub: Stub) -> None:
    rng = random.Random(7)
    good = [
        _request("kjv3", [pb.Lattice(format=SLF, text=random_lattice(rng, KJV_WORDS).slf())])
        for _ in range(3)
    ]
    streamed = list(stub.RescoreLatticeStream(iter(good), timeout=60))
    unary = [stub.RescoreLattice(r, timeout=60) for r in good]
    assert streamed == unary
    bad = [*good[:2], _request("kjv3", [pb.Lattice(format=SLF, text="I=0\nJ=0 S=0 E=5\n")])]
    with pytest.raises(grpc.RpcError) as caught:
        list(stub.RescoreLatticeStream(iter(bad), timeout=60))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details().startswith("requests[2].lattices[0]")


CYCLE = "utt\n0 1 and 0,0\n1 2 the 0,0\n2 1 lord 0,0\n2\n"
BAD = [
    ("cycle", pb.Lattice(format=KALDI, text=CYCLE), "cycle", grpc.StatusCode.INVALID_ARGUMENT),
    (
        "dangling arc",
        pb.Lattice(id="u2", format=SLF, text="I=0\nI=1\nJ=0 S=0 E=1 W=and\nJ=1 S=1 E=9 W=x\n"),
        "E=9",
        grpc.StatusCode.INVALID_ARGUMENT,
    ),
    ("unknown format", pb.Lattice(format=7, text="x"), "format", grpc.StatusCode.INVALID_ARGUMENT),
    ("unspecified format", pb.Lattice(text="x"), "format", grpc.StatusCode.INVALID_ARGUMENT),
    (
        "unparsable line",
        pb.Lattice(id="u5", format=KALDI, text="utt\n0 1 and zero,one\n1\n"),
        "line 2",
        grpc.StatusCode.INVALID_ARGUMENT,
    ),
    (
        "no final",
        pb.Lattice(format=KALDI, text="utt\n0 1 and 0,0\n"),
        "final",
        grpc.StatusCode.INVALID_ARGUMENT,
    ),
    (
        "too many nodes",
        pb.Lattice(
            format=SLF,
            text=WordLattice(1_001, [(n, n + 1, "and", 0.0, 0.0) for n in range(1_000)]).slf(),
        ),
        "more than the limit of 1000",
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    ),
]


@pytest.mark.parametrize(("name", "lattice", "says", "code"), BAD, ids=[b[0] for b in BAD])
def test_bad_lattices_are_refused_in_one_line(
    stub: Stub, name: str, lattice: pb.Lattice, says: str, code: grpc.StatusCode
) -> None:
    good = pb.Lattice(format=SLF, text=random_lattice(random.Random(1), KJV_WORDS).slf())
    with pytest.raises(grpc.RpcError) as caught:
        stub.RescoreLattice(_request("kjv3", [good, lattice]), timeout=30)
    details = caught.value.details()
    assert caught.value.code() == code, details
    assert details.startswith("lattices[1]"), details
    assert says in details and "\n" not in details, details
    if lattice.id:
        assert repr(lattice.id) in details
    # The server is unharmed: a good request is answered after.
    assert stub.RescoreLattice(_request("kjv3", [good]), timeout=30).lattices[0].paths


def test_expansion_past_its_limit_is_resource_exhausted(stub: Stub) -> None:
    """A neural model merging at a high order expands a dense lattice past max_lattice_states."""
    rng = random.Random(5)
    lattice = WordLattice(30)
    for a in range(29):
        for word in rng.sample(TINY_WORDS, 4):
            lattice.arcs.append((a, a + 1, word, -1.0, 0.0))
    request = _request(
        "lstm", [pb.Lattice(id="big", format=SLF, text=lattice.slf())], max_history=10
    )
    with pytest.raises(grpc.RpcError) as caught:
        stub.RescoreLattice(request, timeout=60)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert caught.value.details().startswith("lattices[0] (id 'big')")
    assert "lattice_max_states" in caught.value.details()
    # Merged at 2 tokens it fits, and says it is not exact.
    request.max_history = 2
    [answer] = stub.RescoreLattice(request, timeout=60).lattices
    assert not answer.exact and answer.paths


@pytest.mark.parametrize("fmt", [SLF, KALDI])
def test_rescored_lattice_comes_back_in_its_format(stub: Stub, fmt: int) -> None:
    """The returned lattice reads back (as the format's own reader reads it) with the expanded
    node count and the path's LM scores on its arcs."""
    from lmserve.server.decoding.lattice.formats import LatticeFormat, read_lattice

    lattice = random_lattice(random.Random(11), KJV_WORDS, nodes=6)
    text = lattice.slf() if fmt == SLF else lattice.kaldi("u")
    request = _request("kjv3", [pb.Lattice(format=fmt, text=text)], return_lattice=True)
    [answer] = stub.RescoreLattice(request, timeout=60).lattices
    kind = LatticeFormat.HTK_SLF if fmt == SLF else LatticeFormat.KALDI_TEXT
    graph = read_lattice(kind, answer.lattice)
    order = graph.check()
    assert order
    assert answer.expanded_nodes <= graph.nodes <= answer.expanded_nodes + 1
    # Rescoring the rescored lattice with lm_weight 0 and old_lm_weight 1 gives the same
    # best combined score: its old LM scores are the new ones.
    again = _request(
        "kjv3", [pb.Lattice(format=fmt, text=answer.lattice)], lm_weight=0.0, old_lm_weight=1.0
    )
    [second] = stub.RescoreLattice(again, timeout=60).lattices
    assert abs(second.paths[0].combined_score - answer.paths[0].combined_score) <= TOLERANCE
    assert second.paths[0].words == answer.paths[0].words


def test_kaldi_ids_through_a_symbol_table(stub: Stub) -> None:
    lattice = random_lattice(random.Random(21), KJV_WORDS, nodes=6)
    symbols = {"<eps>": 0, **{w: i + 1 for i, w in enumerate(KJV_WORDS)}}
    words = "\n".join(f"{w} {i}" for w, i in symbols.items())
    by_ids = _request(
        "kjv3", [pb.Lattice(format=KALDI, text=lattice.kaldi("u", symbols))], words=words, nbest=3
    )
    by_words = _request("kjv3", [pb.Lattice(format=KALDI, text=lattice.kaldi("u"))], nbest=3)
    a = stub.RescoreLattice(by_ids, timeout=60).lattices[0]
    b = stub.RescoreLattice(by_words, timeout=60).lattices[0]
    assert [p.words for p in a.paths] == [p.words for p in b.paths]
    assert a.id == "u"  # Kaldi's key when the request gives no id
    assert [p.combined_score for p in a.paths] == [p.combined_score for p in b.paths]
    assert all(EPSILON not in p.words for p in a.paths)


def test_bias_moves_the_path_that_holds_the_phrase(stub: Stub) -> None:
    lattice = WordLattice(
        3, [(0, 1, "and", 0.0, 0.0), (1, 2, "moses", 0.0, 0.0), (1, 2, "the", 0.0, 0.0)]
    )
    plain = _request("kjv3", [pb.Lattice(format=SLF, text=lattice.slf())], nbest=2)
    [before] = stub.RescoreLattice(plain, timeout=30).lattices
    loser = before.paths[1]
    biased = _request(
        "kjv3",
        [pb.Lattice(format=SLF, text=lattice.slf())],
        nbest=2,
        bias=pb.BiasList(phrases=[pb.BiasPhrase(phrase=loser.text, boost=50.0)]),
    )
    [after] = stub.RescoreLattice(biased, timeout=30).lattices
    assert after.paths[0].words == loser.words
    assert after.paths[0].bias == 50.0
    assert abs(after.paths[0].combined_score - (loser.combined_score + 50.0)) <= 1e-9


def test_client_sync_async_and_cli(
    lattice_server: BackgroundServer,
    client: LmServeClient,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import asyncio

    from lmserve.client import AsyncLmServeClient
    from lmserve.client.cli import main
    from lmserve.client.lattices import LatticeText

    lattices = [random_lattice(random.Random(s), KJV_WORDS, nodes=6) for s in (31, 32)]
    texts = [LatticeText(lat.kaldi(f"k{i}"), "kaldi") for i, lat in enumerate(lattices)]
    result = client.rescore_lattice("kjv3", texts, nbest=2, acoustic_scale=0.5)
    assert [lat.id for lat in result.lattices] == ["k0", "k1"]

    async def call() -> list[str]:
        async with AsyncLmServeClient(lattice_server.address, timeout=60) as aclient:
            found = await aclient.rescore_lattice("kjv3", texts, nbest=2, acoustic_scale=0.5)
        return [lat.paths[0].text for lat in found.lattices]

    assert asyncio.run(call()) == [lat.paths[0].text for lat in result.lattices]

    archive = tmp_path / "lats.txt"
    archive.write_text("\n".join(lat.kaldi(f"k{i}") for i, lat in enumerate(lattices)))
    target = ["--target", lattice_server.address, "--model", "kjv3", "--acoustic-scale", "0.5"]
    assert main(["rescore-lattice", str(archive), *target]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"k{i}\t{lat.paths[0].text}" for i, lat in enumerate(result.lattices)]
    assert main(["rescore-lattice", str(archive), *target, "--output", "lattice"]) == 0
    rescored = capsys.readouterr().out
    assert rescored.count("\n\n") == 2  # two lattices in one Kaldi archive
