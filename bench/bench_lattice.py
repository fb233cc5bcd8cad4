"""Lattice rescoring beside Rerank of the same hypotheses: time per lattice, arcs/s, WER.

    python bench/bench_lattice.py [--lists 150] [--runs 5] [--models kjv-5gram,kjv-lstm]

The lattices are the shipped n-best test lists (tests/data/nbest/kjv-test.jsonl) as word graphs:
each list's union as a prefix tree of its hypotheses' words, each hypothesis's end linked to the
final node by an epsilon arc with its acoustic score (`tests/lattices.py: nbest_lattice`), so the
lattice's paths are exactly the list's hypotheses with their acoustic scores. Per model, through
one server (`lmserve serve` on the shipped models), in the same run: RescoreLattice of every
lattice in one request (Kaldi text format, acoustic_scale 1, lm_weight 1, the server's default
max_history 4) and Rerank of every list in one request (score_weights acoustic 1, lm_weight 1),
each timed `--runs` times after a warm-up; medians reported. Figures: seconds per lattice /
list, lattice arcs per second, hypotheses per second, the expanded graph's size, the share of
lattices rescored exactly, the model's computed tokens, and each one's WER against the
references.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import grpc
from common import DEFAULT_MODELS, REPO_ROOT, emit, linked_repository, log, quick, record
from server_process import ServerProcess

sys.path.insert(0, str(REPO_ROOT / "tests"))
from lattices import nbest_lattice  # type: ignore[import-not-found]  # noqa: E402  (in tests/)

NBEST = REPO_ROOT / "tests" / "data" / "nbest" / "kjv-test.jsonl"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lists", type=int, default=150)
    parser.add_argument("--runs", type=int, default=3 if quick() else 5)
    parser.add_argument("--models", default="kjv-5gram,kjv-lstm")
    args = parser.parse_args()

    import jiwer

    from lmserve.v1 import lm_service_pb2 as pb
    from lmserve.v1 import lm_service_pb2_grpc

    lists = [json.loads(line) for line in NBEST.read_text(encoding="utf-8").splitlines()]
    lists = lists[: args.lists]
    references = [entry["reference"] for entry in lists]
    graphs = [
        nbest_lattice([(h["text"].split(), h["scores"]["acoustic"]) for h in entry["hypotheses"]])
        for entry in lists
    ]
    arcs = sum(len(g.arcs) for g in graphs)
    hypotheses = sum(len(entry["hypotheses"]) for entry in lists)
    lattice_request = [
        pb.Lattice(id=entry["id"], format=pb.LATTICE_FORMAT_KALDI_TEXT, text=g.kaldi(entry["id"]))
        for entry, g in zip(lists, graphs, strict=True)
    ]
    rerank_lists = [
        pb.NBestList(
            id=entry["id"],
            hypotheses=[
                pb.Hypothesis(text=h["text"], scores={"acoustic": h["scores"]["acoustic"]})
                for h in entry["hypotheses"]
            ],
        )
        for entry in lists
    ]
    models = args.models.split(",")
    repository = linked_repository("lattice", *(DEFAULT_MODELS / m for m in models))
    log(f"{len(lists)} lists, {hypotheses} hypotheses; lattices with {arcs} arcs")
    with ServerProcess(repository) as server, grpc.insecure_channel(server.target) as channel:
        stub = lm_service_pb2_grpc.LanguageModelServiceStub(channel)
        for model in models:
            lattice_call = pb.RescoreLatticeRequest(model=model, lattices=lattice_request)
            # Histories merged at the server's default order (4), and at 64 (longer than every
            # hypothesis: exact for a neural model too; an n-gram model ignores it).
            deep_call = pb.RescoreLatticeRequest(
                model=model, lattices=lattice_request, max_history=64
            )
            rerank_call = pb.RerankRequest(
                model=model, lists=rerank_lists, score_weights={"acoustic": 1.0}
            )
            lattice = stub.RescoreLattice(lattice_call, timeout=600)  # warm-up
            rerank = stub.Rerank(rerank_call, timeout=600)
            deep = stub.RescoreLattice(deep_call, timeout=600)
            timings: dict[str, list[float]] = {"lattice": [], "rerank": [], "deep": []}
            for _ in range(args.runs):  # interleaved, so all see the same machine
                start = time.perf_counter()
                lattice = stub.RescoreLattice(lattice_call, timeout=600)
                timings["lattice"].append(time.perf_counter() - start)
                start = time.perf_counter()
                deep = stub.RescoreLattice(deep_call, timeout=600)
                timings["deep"].append(time.perf_counter() - start)
                start = time.perf_counter()
                rerank = stub.Rerank(rerank_call, timeout=600)
                timings["rerank"].append(time.perf_counter() - start)
            lattice_best = [lat.paths[0].text for lat in lattice.lattices]
            rerank_best = [
                entry["hypotheses"][ranked.hypotheses[0].index]["text"]
                for entry, ranked in zip(lists, rerank.lists, strict=True)
            ]
            common = {
                "model": model,
                "lists": len(lists),
                "hypotheses": hypotheses,
                "lattice_arcs": arcs,
            }
            emit(
                record(
                    f"lattice_{model}_seconds_per_lattice",
                    "s",
                    [t / len(lists) for t in timings["lattice"]],
                    **common,
                    expanded_nodes=sum(lat.expanded_nodes for lat in lattice.lattices),
                    expanded_arcs=sum(lat.expanded_arcs for lat in lattice.lattices),
                    exact_share=statistics.mean(lat.exact for lat in lattice.lattices),
                    computed_tokens=lattice.computed_tokens,
                    wer=jiwer.wer(references, lattice_best),
                )
            )
            emit(
                record(
                    f"lattice_{model}_arcs_per_s",
                    "arcs/s",
                    [arcs / t for t in timings["lattice"]],
                    **common,
                )
            )
            emit(
                record(
                    f"lattice_{model}_max_history_64_seconds_per_lattice",
                    "s",
                    [t / len(lists) for t in timings["deep"]],
                    **common,
                    expanded_nodes=sum(lat.expanded_nodes for lat in deep.lattices),
                    exact_share=statistics.mean(lat.exact for lat in deep.lattices),
                    computed_tokens=deep.computed_tokens,
                    wer=jiwer.wer(references, [lat.paths[0].text for lat in deep.lattices]),
                )
            )
            emit(
                record(
                    f"rerank_{model}_seconds_per_list",
                    "s",
                    [t / len(lists) for t in timings["rerank"]],
                    **common,
                    computed_tokens=rerank.computed_tokens,
                    wer=jiwer.wer(references, rerank_best),
                )
            )
            emit(
                record(
                    f"rerank_{model}_hypotheses_per_s",
                    "hypotheses/s",
                    [hypotheses / t for t in timings["rerank"]],
                    **common,
                )
            )


if __name__ == "__main__":
    main()
