"""The transformer in float16 on ONNX Runtime's CUDA provider: lmserve's engine against ONNX
Runtime CUDA alone on the same graph (issue #38, item 5). Needs onnxruntime-gpu and a GPU.

    python bench/bench_gpu.py [--layers 12] [--width 768] [--heads 12] [--runs 5]

The model: a GPT-2 checkpoint (`bench_transformer.gpt2_checkpoint`: byte-level BPE of 8,000
tokens trained on the KJV training text, seeded random weights), imported by `lmserve
import-hf` (float32; ONNX Runtime's transformer optimizer and the parity check as always), then
`lmserve quantize --quantize float16` (the float16 converter; its cost measured on the KJV test
lines by the loader and scorer, here on the GPU, and recorded in the manifest).

Per run, on the float16 folder, lmserve's engine in this process (no gRPC: the comparison is
the engine's own overhead over the graph it runs) against the graph run by one ONNX Runtime
CUDA session with nothing around it:
- score: the first 512 KJV test lines in batches of 32: lmserve's `Scorer.score_texts` (tokenize,
  one pass, log-softmax and gather on the host, per-token details) against the same padded
  batches through `session.run` (logits to the host); tokens/s counts scored positions;
- generate: greedy, 16 streams x 64 new tokens after each stream's first 6 words: lmserve's
  stepper (`KvStepper`: prefill, then one step per token, its cache bound on the device between
  steps, argmax on the host) against a raw I/O-binding loop over the same graph (presents bound
  as the next call's pasts on the device, logits to the host, argmax there);
- generate, cache through the host: the same lmserve loop with the device binding off (what
  every step cost before: the cache copied to the host and back each token).
Ratios are lmserve's tokens/s over the raw session's in the same run, medians of the per-run
ratios. Prints one JSON object; writes it to $OUT/gpu.json when OUT is set, else
bench/results/gpu.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from bench_transformer import gpt2_checkpoint  # noqa: E402

KJV_TEST = BENCH.parent / "export/lmserve/export/corpora/kjv/test.txt"
BATCH = 32
LINES = 512
STREAMS = 16
NEW_TOKENS = 64


def _lines() -> list[str]:
    lines = [line for line in KJV_TEST.read_text(encoding="utf-8").splitlines() if line]
    return lines[:LINES]


def build(work: Path, layers: int, width: int, heads: int) -> tuple[Path, dict[str, Any]]:
    from lmserve.server.cli import main as lmserve
    from lmserve.server.manifest import read_manifest

    checkpoint = gpt2_checkpoint(
        work / "checkpoint",
        layers=layers,
        width=width,
        heads=heads,
        positions=1024,
        corpus=KJV_TEST.with_name("train.txt"),  # the shipped corpus: no ../shared needed
    )
    started = time.monotonic()
    assert lmserve(["import-hf", str(checkpoint), str(work / "float32")]) == 0
    assert lmserve(["quantize", str(work / "float32"), str(work / "float16"), "--quantize",
                    "float16", "--held-out", str(KJV_TEST)]) == 0  # fmt: skip
    q = read_manifest(work / "float16").quantization
    assert q is not None
    return work / "float16", {
        "build_seconds": round(time.monotonic() - started, 1),
        "quantization": q.model_dump(mode="json"),
    }


def _loaded(folder: Path) -> Any:
    from lmserve.server.families.family import LoadContext
    from lmserve.server.families.loading import load_model
    from lmserve.server.manifest import read_manifest

    return load_model(folder, read_manifest(folder), LoadContext())


class RawSession:
    """The graph in one ONNX Runtime CUDA session, driven with nothing around it."""

    def __init__(self, graph: Path, layers: int, kv_heads: int, head_dim: int, device: str) -> None:
        import onnxruntime as ort  # type: ignore[import-untyped]

        providers = ["CUDAExecutionProvider"] if device == "cuda" else []
        self.session = ort.InferenceSession(
            str(graph), ort.SessionOptions(), providers=[*providers, "CPUExecutionProvider"]
        )
        self.device = device
        self.layers, self.kv_heads, self.head_dim = layers, kv_heads, head_dim
        self.pasts = [f"past_key_values.{i}.{k}" for i in range(layers) for k in ("key", "value")]
        self.presents = [f"present.{i}.{k}" for i in range(layers) for k in ("key", "value")]
        self.positions = "position_ids" in {i.name for i in self.session.get_inputs()}

    def _empty(self, batch: int) -> np.ndarray:
        return np.zeros((batch, self.kv_heads, 0, self.head_dim), dtype=np.float16)

    def score(self, batches: list[tuple[np.ndarray, np.ndarray]]) -> None:
        for ids, mask in batches:
            feed = {"input_ids": ids, "attention_mask": mask}
            if self.positions:
                feed["position_ids"] = np.broadcast_to(np.arange(ids.shape[1]), ids.shape).copy()
            empty = self._empty(ids.shape[0])
            feed.update(dict.fromkeys(self.pasts, empty))
            self.session.run(["logits"], feed)

    def generate(self, prompts: np.ndarray, new_tokens: int) -> np.ndarray:
        """Greedy, equal-length prompts (the bench's are cut to one length), cache on the
        device between calls."""
        batch, width = prompts.shape
        ids = prompts
        past: list[Any] = [self._empty(batch)] * (2 * self.layers)
        out = np.zeros((batch, new_tokens), dtype=np.int64)
        read = 0
        for t in range(new_tokens):
            binding = self.session.io_binding()
            binding.bind_cpu_input("input_ids", np.ascontiguousarray(ids))
            binding.bind_cpu_input(
                "attention_mask", np.ones((batch, read + ids.shape[1]), dtype=np.int64)
            )
            if self.positions:
                positions = np.arange(read, read + ids.shape[1], dtype=np.int64)
                binding.bind_cpu_input("position_ids", np.broadcast_to(positions, ids.shape).copy())
            for name, value in zip(self.pasts, past, strict=True):
                if isinstance(value, np.ndarray):
                    binding.bind_cpu_input(name, value)
                else:
                    binding.bind_ortvalue_input(name, value)
            binding.bind_output("logits", "cpu")
            for name in self.presents:
                binding.bind_output(name, self.device)
            self.session.run_with_iobinding(binding)
            logits, *past = binding.get_outputs()
            read += ids.shape[1]
            nxt = logits.numpy()[:, -1, :].argmax(axis=-1)
            out[:, t] = nxt
            ids = nxt[:, None].astype(np.int64)
        return out


def _padded(batch: Any) -> tuple[np.ndarray, np.ndarray]:
    """The ids and mask a Score pass of these texts reads (`<s>` before, right-padded)."""
    lengths = np.diff(batch.offsets) + 1
    ids = np.zeros((batch.batch_size, int(lengths.max())), dtype=np.int64)
    mask = np.zeros_like(ids)
    for i in range(batch.batch_size):
        row = batch.ids[batch.offsets[i] : batch.offsets[i + 1]]
        ids[i, : len(row) + 1] = [0, *row.tolist()]
        mask[i, : len(row) + 1] = 1
    return ids, mask


def lmserve_generate(stepper: Any, prompts: np.ndarray, new_tokens: int) -> np.ndarray:
    log_probs, state = stepper.prefill([row.tolist() for row in prompts], bos=False)
    out = np.zeros((prompts.shape[0], new_tokens), dtype=np.int64)
    for t in range(new_tokens):
        nxt = np.asarray(log_probs).argmax(axis=-1)
        out[:, t] = nxt
        if t + 1 < new_tokens:
            log_probs, state = stepper.step(nxt, state)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--work", type=Path, help="build folder (default: a temporary one)")
    parser.add_argument(
        "--cpu", action="store_true", help="a dry run of the script on the CPU (no GPU here)"
    )
    args = parser.parse_args()

    import onnxruntime as ort

    device = "cpu" if args.cpu else "cuda"
    if device == "cuda" and "CUDAExecutionProvider" not in ort.get_available_providers():
        raise SystemExit("bench_gpu: onnxruntime-gpu sees no CUDA device")
    from lmserve.server.decoding.scoring import ScoreOptions, Scorer
    from lmserve.server.families.catalog import make_stepper

    work = args.work or Path(tempfile.mkdtemp(prefix="lmserve-gpu-"))
    folder, built = build(work, args.layers, args.width, args.heads)
    parts = _loaded(folder)
    backend = parts.backend
    assert backend.binds_cache == (device == "cuda"), "not on the CUDA provider"
    cache = backend.cache
    raw = RawSession(folder / "model.onnx", cache.layers, cache.kv_heads, cache.head_dim, device)
    scorer = Scorer(backend, parts.codec)
    stepper = make_stepper(backend)

    lines = _lines()
    chunks = [lines[i : i + BATCH] for i in range(0, len(lines), BATCH)]
    encoded = [parts.codec.encode_texts(chunk) for chunk in chunks]
    raw_batches = [_padded(batch) for batch in encoded]
    scored_tokens = int(sum(int(np.diff(b.offsets).sum()) + b.batch_size for b in encoded))
    first = [parts.codec.encode_texts([" ".join(line.split()[:6])]) for line in lines[:STREAMS]]
    width = min(int(np.diff(b.offsets)[0]) for b in first)
    prompts = np.asarray([b.ids[:width] for b in first], dtype=np.int64)

    def timed(fn: Any) -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    rows: dict[str, list[float]] = {
        k: [] for k in ("score_lmserve", "score_raw", "gen_lmserve", "gen_raw", "gen_host")
    }
    agree: list[bool] = []
    # Warm-up: CUDA kernels chosen, memory arenas grown.
    raw.score(raw_batches[:2])
    lmserve_generate(stepper, prompts, 4)
    raw.generate(prompts, 4)
    for _ in range(args.runs):
        rows["score_raw"].append(scored_tokens / timed(lambda: raw.score(raw_batches)))
        rows["score_lmserve"].append(
            scored_tokens
            / timed(lambda: [scorer.score_texts(c, ScoreOptions(), details=True) for c in chunks])
        )
        made: dict[str, np.ndarray] = {}

        def run_raw(into: dict[str, np.ndarray] = made) -> None:
            into["raw"] = raw.generate(prompts, NEW_TOKENS)

        def run_ours(into: dict[str, np.ndarray] = made) -> None:
            into["ours"] = lmserve_generate(stepper, prompts, NEW_TOKENS)

        rows["gen_raw"].append(STREAMS * NEW_TOKENS / timed(run_raw))
        rows["gen_lmserve"].append(STREAMS * NEW_TOKENS / timed(run_ours))
        bound = backend.binds_cache
        backend.binds_cache = False
        rows["gen_host"].append(
            STREAMS * NEW_TOKENS / timed(lambda: lmserve_generate(stepper, prompts, NEW_TOKENS))
        )
        backend.binds_cache = bound
        agree.append(bool((made["raw"] == made["ours"]).all()))

    def ratio(ours: str, theirs: str) -> float:
        return statistics.median(a / b for a, b in zip(rows[ours], rows[theirs], strict=True))

    result = {
        "bench": "gpu",
        "device": ort.get_device(),
        "onnxruntime": ort.__version__,
        "model": {"layers": args.layers, "width": args.width, "heads": args.heads},
        **built,
        "runs": args.runs,
        "tokens_per_second": {k: round(statistics.median(v), 1) for k, v in rows.items()},
        "score_ratio": round(ratio("score_lmserve", "score_raw"), 3),
        "generate_ratio": round(ratio("gen_lmserve", "gen_raw"), 3),
        "device_cache_gain": round(ratio("gen_lmserve", "gen_host"), 3),
        "greedy_tokens_agree": agree,
    }
    text = json.dumps(result, indent=2)
    print(text)
    out = Path(os.environ["OUT"]) / "gpu.json" if os.environ.get("OUT") else None
    (out or BENCH / "results" / "gpu.json").write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
