"""lmserve beside CTranslate2 on one GPT-2 checkpoint, in one run, interleaved (issue #38, item 1).

    python bench/bench_peers.py [--quick] [--layers 6] [--width 512] [--heads 8] [--runs 3]

The checkpoint: a transformers GPT-2 (`--layers`, `--width`, `--heads`, 512 positions) over a
byte-level BPE of 8,000 tokens trained with `tokenizers` on the KJV training text, with seeded
random weights (speed does not depend on them; the log-prob agreement is between engines, not
against text). It is built once into bench/results/cache/peers-gpt2-<L>x<W>x<H>/ and taken to
- lmserve float32 and int8: `lmserve import-hf` (the shared-buffer GroupQueryAttention graph;
  its parity figures recorded) and `lmserve import-hf --quantize int8` (its measured cost
  recorded), both served by one real `lmserve serve` (own process, engine workers, ONNX Runtime
  with 2 intra-op threads) from a temporary model repository, called over gRPC (grpc.aio,
  `--callers` concurrent callers for Score; engines `lmserve` and `lmserve_int8`);
- CTranslate2: `TransformersConverter` with quantization float32 and int8, each a
  `ctranslate2.Generator` in this process (`inter_threads=1`, `intra_threads=2`).

Every run measures each figure for the four engines in turn (the order rotates run by run):
- score: the first 512 KJV test lines in batches of 32, per-token log-probs (`<|endoftext|>`
  before, scored after, as lmserve's Score does): Score with `return_tokens` from the callers
  against `Generator.score_batch`; tokens/s counts scored positions; both tokenize (the server
  for lmserve, `tokenizers` here for CTranslate2);
- generate: greedy, 1, 16 and 64 streams x 64 new tokens (EOS ignored), each stream's prompt the
  first 6 words of a test line: concurrent Generate streams against one `generate_batch` of all
  prompts (`include_prompt_in_result=False`, `min_length` = `max_length`); tokens/s over the wall
  time to the last token;
- step: the wall time of one cached step of a single stream whose step reads 32 and 480
  positions: the folder's stepper's `step` in this process (the raw step the server runs: graph,
  mask, log-softmax; no gRPC), against CTranslate2's `generate_batch` of 1 + 8 tokens minus that
  of 1 token after the same prompt, over 8 (the steps read 32..39 positions there);
- CPU: beside each throughput, CPU seconds per token: lmserve's server (front and engine
  workers, psutil) and, apart, this process's (the gRPC callers); CTranslate2's is this
  process's (`process_time`);
- agreement: the largest per-token difference between lmserve's log-probs and CTranslate2's
  (float32 and int8), and lmserve int8's against CTranslate2 int8's and lmserve float32's, over
  the scored lines, with the token ids checked to be the same, and the greedy continuations that
  agree over all their tokens at 16 streams.

Ratios are lmserve's speed over CTranslate2's in the same run (tokens/s over tokens/s, a step's
ms inverted), medians of the per-run ratios: above 1 lmserve is faster. lmserve float32 is
compared with both CTranslate2 folders, lmserve int8 with CTranslate2 int8. Prints one JSON object
on stdout and writes it to bench/results/peers.json (peers-quick.json with `--quick`).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench_transformer import _load, gpt2_checkpoint
from common import BENCH_DIR, CACHE_DIR, QUICK_ENV, REPO_ROOT, log, quick, record
from run_all import machine
from server_process import ServerProcess

CORPUS = REPO_ROOT / "export" / "lmserve" / "export" / "corpora" / "kjv"
ENDOFTEXT = "<|endoftext|>"
THREADS = 2
POSITIONS = 512
BATCH = 32
STREAMS = (1, 16, 64)
CONTEXTS = (32, 480)
STEP_TOKENS = 8  # CTranslate2's step: generating 1 + STEP_TOKENS tokens against 1, over this
PROMPT_WORDS = 6
ENGINES = ("lmserve", "lmserve_int8", "ct2_float32", "ct2_int8")
LMSERVE = ("lmserve", "lmserve_int8")  # served by the same server, over gRPC
# (ours, peer): speed ratios; the first two keep their old summary keys (lmserve_vs_<peer>).
RATIOS = (
    ("lmserve", "ct2_float32"),
    ("lmserve", "ct2_int8"),
    ("lmserve_int8", "ct2_int8"),
)
# (ours, reference): log-prob and greedy agreement.
AGREEMENT = (
    ("lmserve", "ct2_float32"),
    ("lmserve", "ct2_int8"),
    ("lmserve_int8", "ct2_int8"),
    ("lmserve_int8", "lmserve"),
)


@dataclass(frozen=True)
class Sizes:
    layers: int
    width: int
    heads: int
    sentences: int
    new_tokens: int
    runs: int

    @property
    def name(self) -> str:
        return f"peers-gpt2-{self.layers}x{self.width}x{self.heads}"


@dataclass(frozen=True)
class Built:
    checkpoint: Path
    lmserve: dict[str, Path]  # engine -> folder: "lmserve" (float32), "lmserve_int8"
    ct2: dict[str, Path]
    seconds: dict[str, float]


def _current(folder: Path, int8: bool) -> bool:
    """Whether `folder` is an import-hf folder as this script wants it: the shared-buffer graph
    (what import-hf writes for GPT-2 now; an older cache held optimum's layout), quantized to
    int8 when `int8`."""
    from lmserve.server.manifest import read_manifest

    if not (folder / "model.yaml").is_file():
        return False
    manifest = read_manifest(folder)
    shared = manifest.architecture.get("kv_cache") == "shared_buffer"
    quantized = manifest.quantization is not None and manifest.quantization.weights == "int8"
    return shared and quantized == int8


def _import_hf(checkpoint: Path, folder: Path, int8: bool) -> None:
    """`lmserve import-hf CHECKPOINT FOLDER [--quantize int8]` in a child process."""
    quantize = ["--quantize", "int8"] if int8 else []
    log(f"lmserve import-hf {checkpoint} {folder} {' '.join(quantize)}".rstrip())
    shutil.rmtree(folder, ignore_errors=True)
    command = [sys.executable, "-m", "lmserve.server.cli", "import-hf", str(checkpoint)]
    command += [str(folder), *quantize]
    subprocess.run(command, cwd=REPO_ROOT, check=True, stdout=sys.stderr)


def build(sizes: Sizes, rebuild: bool) -> Built:
    """The checkpoint, lmserve's two folders (`lmserve import-hf`, float32 and `--quantize
    int8`) and CTranslate2's two, each built once under bench/results/cache/<name>/."""
    base = CACHE_DIR / sizes.name
    if rebuild and base.exists():
        shutil.rmtree(base)
    checkpoint = base / "checkpoint"
    seconds: dict[str, float] = {}
    if not (checkpoint / "tokenizer.json").is_file():
        log(f"building {sizes.name}: tokenizer on KJV train, seeded random weights")
        start = time.perf_counter()
        shutil.rmtree(base, ignore_errors=True)  # what was built from another checkpoint
        gpt2_checkpoint(
            checkpoint,
            layers=sizes.layers,
            width=sizes.width,
            heads=sizes.heads,
            positions=POSITIONS,
            corpus=CORPUS / "train.txt",
        )
        seconds["checkpoint"] = time.perf_counter() - start
    lmserve = {"lmserve": base / sizes.name, "lmserve_int8": base / f"{sizes.name}-int8"}
    for engine, folder in lmserve.items():
        int8 = engine == "lmserve_int8"
        if not _current(folder, int8):
            start = time.perf_counter()
            _import_hf(checkpoint, folder, int8)
            seconds[f"{engine}_import"] = time.perf_counter() - start
    ct2 = {}
    for quantization in ("float32", "int8"):
        out = base / f"ct2-{quantization}"
        if not (out / "model.bin").is_file():
            from ctranslate2.converters import TransformersConverter

            log(f"CTranslate2 conversion, {quantization}")
            start = time.perf_counter()
            converter = TransformersConverter(str(checkpoint), load_as_float16=False)
            converter.convert(str(out), quantization=quantization, force=True)
            seconds[f"ct2_convert_{quantization}"] = time.perf_counter() - start
        ct2[f"ct2_{quantization}"] = out
    return Built(checkpoint, lmserve, ct2, seconds)


@dataclass
class Measured:
    """One engine's answer to one measurement: wall and CPU seconds, what it produced."""

    seconds: float
    tokens: int
    cpu: float
    client_cpu: float = 0.0
    output: Any = None


class Ct2Engine:
    """A `ctranslate2.Generator` in this process, tokenizing with the checkpoint's tokenizer."""

    def __init__(self, folder: Path, tokenizer: Tokens) -> None:
        import ctranslate2

        self.generator = ctranslate2.Generator(
            str(folder), device="cpu", inter_threads=1, intra_threads=THREADS
        )
        self.tokenizer = tokenizer

    def _timed(self, call: Callable[[], tuple[int, Any]]) -> Measured:
        cpu, start = time.process_time(), time.perf_counter()
        tokens, output = call()
        return Measured(time.perf_counter() - start, tokens, time.process_time() - cpu, 0, output)

    def score(self, batches: Sequence[Sequence[str]]) -> Measured:
        def run() -> tuple[int, Any]:
            rows: list[tuple[list[int], list[float]]] = []
            for batch in batches:
                encoded = self.tokenizer.encode_batch(list(batch), add_special_tokens=False)
                pieces = [[ENDOFTEXT, *e.tokens, ENDOFTEXT] for e in encoded]
                for e, result in zip(encoded, self.generator.score_batch(pieces), strict=True):
                    rows.append(([*e.ids, 0], list(result.log_probs)))
            return sum(len(lp) for _, lp in rows), rows

        return self._timed(run)

    def generate(self, prompts: Sequence[str], new_tokens: int) -> Measured:
        def run() -> tuple[int, Any]:
            encoded = self.tokenizer.encode_batch(list(prompts), add_special_tokens=False)
            results = self.generator.generate_batch(
                [[ENDOFTEXT, *e.tokens] for e in encoded],
                max_length=new_tokens,
                min_length=new_tokens,
                include_prompt_in_result=False,
                beam_size=1,
                sampling_topk=1,
            )
            ids = [list(r.sequences_ids[0]) for r in results]
            self.tokenizer.decode_batch(ids)  # the text a caller wants, as lmserve sends it
            return sum(len(i) for i in ids), ids

        return self._timed(run)

    def step_seconds(self, context: int, repeats: int) -> float:
        """One cached step reading `context`..`context` + STEP_TOKENS - 1 positions: a prompt
        of `context` - 1 tokens, 1 + STEP_TOKENS new tokens against 1, the difference over
        STEP_TOKENS; medians of `repeats` alternated calls."""
        prompt = [[ENDOFTEXT, *self.tokenizer.id_to_token_list(context - 2)]]

        def once(new: int) -> float:
            start = time.perf_counter()
            self.generator.generate_batch(
                prompt, max_length=new, min_length=new, include_prompt_in_result=False
            )
            return time.perf_counter() - start

        once(1 + STEP_TOKENS)
        short, long = [], []
        for _ in range(repeats):
            short.append(once(1))
            long.append(once(1 + STEP_TOKENS))
        return (statistics.median(long) - statistics.median(short)) / STEP_TOKENS


class Tokens:
    """The checkpoint's tokenizer, plus a fixed run of real token pieces for step prompts."""

    def __init__(self, checkpoint: Path, text: str) -> None:
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
        self.filler = self.tokenizer.encode(text, add_special_tokens=False)

    def encode_batch(self, texts: list[str], add_special_tokens: bool) -> Any:
        return self.tokenizer.encode_batch(texts, add_special_tokens=add_special_tokens)

    def decode_batch(self, ids: list[list[int]]) -> Any:
        return self.tokenizer.decode_batch(ids)

    def id_list(self, count: int) -> list[int]:
        if count > len(self.filler.ids):
            raise ValueError(f"step prompts need {count} tokens of text")
        return list(self.filler.ids[:count])

    def id_to_token_list(self, count: int) -> list[str]:
        return list(self.filler.tokens[:count])


class LmserveEngine:
    """gRPC callers of a running `lmserve serve` (grpc.aio in one event loop), and the raw
    cached step in this process."""

    def __init__(
        self, server: ServerProcess, model: str, folder: Path, tokens: Tokens, callers: int
    ) -> None:
        from lmserve.client import AsyncLmServeClient

        self.server = server
        self.callers = callers
        self.model = model
        self.folder = folder
        self.tokens = tokens
        self.runner = asyncio.Runner()

        async def connect() -> AsyncLmServeClient:  # the channel belongs to the runner's loop
            return AsyncLmServeClient(server.target, timeout=600)

        self.client = self.runner.run(connect())
        self._stepper: Any = None

    def close(self) -> None:
        self.runner.run(self.client.close())
        self.runner.close()

    def _timed(self, call: Callable[[], Any]) -> Measured:
        server_cpu, cpu = self.server.cpu_seconds(), time.process_time()
        start = time.perf_counter()
        tokens, output = self.runner.run(call())
        seconds = time.perf_counter() - start
        return Measured(
            seconds,
            tokens,
            self.server.cpu_seconds() - server_cpu,
            time.process_time() - cpu,
            output,
        )

    def score(self, batches: Sequence[Sequence[str]]) -> Measured:
        async def run() -> tuple[int, Any]:
            answers: list[Any] = [None] * len(batches)
            pending = iter(range(len(batches)))

            async def caller() -> None:
                for i in pending:
                    answers[i] = await self.client.score(
                        self.model, list(batches[i]), return_tokens=True
                    )

            await asyncio.gather(*(caller() for _ in range(self.callers)))
            rows = [
                ([t.token_id for t in text.tokens], [t.log_prob for t in text.tokens])
                for answer in answers
                for text in answer
            ]
            return sum(len(lp) for _, lp in rows), rows

        return self._timed(run)

    def generate(self, prompts: Sequence[str], new_tokens: int) -> Measured:
        from lmserve.client import GeneratedToken

        async def one(prompt: str) -> list[int]:
            ids = []
            async for event in self.client.generate(
                self.model, prompt, max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True
            ):
                if isinstance(event, GeneratedToken):
                    ids.append(event.token_id)
            return ids

        async def run() -> tuple[int, Any]:
            ids = await asyncio.gather(*(one(p) for p in prompts))
            return sum(len(i) for i in ids), ids

        return self._timed(run)

    def step_seconds(self, context: int, repeats: int) -> float:
        """The folder's stepper's `step` of one stream whose step reads `context` positions
        (`<s>` and `context` - 2 prompt tokens cached), inputs ready: the median of `repeats`
        blocks of 16 steps."""
        import numpy as np

        from lmserve.server.families.catalog import make_stepper

        if self._stepper is None:  # the folder's own stepper (KvStepper or SharedKvStepper)
            self._stepper = make_stepper(_load(self.folder).backend)
        stepper = self._stepper
        _, state = stepper.prefill([self.tokens.id_list(context - 2)])
        token = np.array([self.tokens.id_list(1)[0]])
        steps = 16
        stepper.step(token, state)
        blocks = []
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(steps):
                stepper.step(token, state)
            blocks.append((time.perf_counter() - start) / steps)
        return statistics.median(blocks)


def _lines(count: int) -> list[str]:
    lines = (CORPUS / "test.txt").read_text(encoding="utf-8").splitlines()
    return [line for line in lines if line.strip()][:count]


def _max_diff(
    reference: list[tuple[list[int], list[float]]], other: list[tuple[list[int], list[float]]]
) -> tuple[float, int]:
    """The largest per-token log-prob difference and the positions compared; the token ids
    must be the same (both engines tokenized the same texts)."""
    worst, positions = 0.0, 0
    for (ids_a, lp_a), (ids_b, lp_b) in zip(reference, other, strict=True):
        if ids_a != ids_b:
            raise SystemExit(f"the engines tokenized a line differently: {ids_a} != {ids_b}")
        for a, b in zip(lp_a, lp_b, strict=True):
            worst = max(worst, abs(a - b))
        positions += len(lp_a)
    return worst, positions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny model, one short run")
    parser.add_argument("--layers", type=int, default=None, help="6 (2 with --quick)")
    parser.add_argument("--width", type=int, default=None, help="512 (128 with --quick)")
    parser.add_argument("--heads", type=int, default=None, help="8 (4 with --quick)")
    parser.add_argument("--runs", type=int, default=None, help="3 (1 with --quick)")
    parser.add_argument("--callers", type=int, default=4, help="lmserve's concurrent Score callers")
    parser.add_argument("--rebuild", action="store_true", help="rebuild the cached models")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.quick:
        os.environ[QUICK_ENV] = "1"
    small = quick()
    sizes = Sizes(
        layers=args.layers or (2 if small else 6),
        width=args.width or (128 if small else 512),
        heads=args.heads or (4 if small else 8),
        sentences=64 if small else 512,
        new_tokens=16 if small else 64,
        runs=args.runs or (1 if small else 3),
    )
    out = args.out or BENCH_DIR / "results" / ("peers-quick.json" if small else "peers.json")
    started = time.perf_counter()
    try:
        import ctranslate2
    except ImportError:
        raise SystemExit("ctranslate2 is missing: pip install -e '.[bench]'") from None

    built = build(sizes, args.rebuild)
    lines = _lines(sizes.sentences)
    batches = [lines[i : i + BATCH] for i in range(0, len(lines), BATCH)]
    prompts = [" ".join(line.split()[:PROMPT_WORDS]) for line in lines]
    tokens = Tokens(built.checkpoint, " ".join(_lines(200)))
    ct2 = {name: Ct2Engine(folder, tokens) for name, folder in built.ct2.items()}
    step_repeats = 3 if small else 7

    runs: dict[tuple[str, str], list[float]] = {}  # (figure, engine) -> per run
    cpu: dict[tuple[str, str], list[float]] = {}  # ms per token; "<lmserve engine>_client" too
    outputs: dict[tuple[str, str], Any] = {}  # the last run's

    def note(figure: str, engine: str, measured: Measured) -> None:
        rate = measured.tokens / measured.seconds
        runs.setdefault((figure, engine), []).append(rate)
        cpu.setdefault((figure, engine), []).append(1000 * measured.cpu / measured.tokens)
        if engine in LMSERVE:
            client = 1000 * measured.client_cpu / measured.tokens
            cpu.setdefault((figure, f"{engine}_client"), []).append(client)
        outputs[figure, engine] = measured.output
        per_token = cpu[figure, engine][-1]
        log(f"  {figure} {engine}: {rate:,.0f} tokens/s, CPU {per_token:.3f} ms a token")

    os.environ["LMSERVE_ONNX_INTRA_OP_THREADS"] = str(THREADS)  # the server's and the stepper's
    with tempfile.TemporaryDirectory(prefix="lmserve-peers-") as repository:
        for folder in built.lmserve.values():  # both folders, one server
            (Path(repository) / folder.name).symlink_to(folder.resolve())
        with ServerProcess(Path(repository)) as server:
            lm = {
                engine: LmserveEngine(server, folder.name, folder, tokens, args.callers)
                for engine, folder in built.lmserve.items()
            }
            try:
                engines: dict[str, LmserveEngine | Ct2Engine] = {**lm, **ct2}
                log("warm-up")
                for name in ENGINES:
                    engines[name].score(batches[:2])
                    for streams in STREAMS:
                        engines[name].generate(prompts[:streams], 4)
                for run in range(sizes.runs):
                    turn = run % len(ENGINES)
                    order = ENGINES[turn:] + ENGINES[:turn]
                    log(f"run {run + 1}/{sizes.runs}, in turn: {', '.join(order)}")
                    for name in order:
                        note("score", name, engines[name].score(batches))
                    for streams in STREAMS:
                        for name in order:
                            measured = engines[name].generate(prompts[:streams], sizes.new_tokens)
                            note(f"generate_{streams}streams", name, measured)
                    for context in CONTEXTS:
                        for name in order:
                            ms = 1000 * engines[name].step_seconds(context, step_repeats)
                            runs.setdefault((f"step_ctx{context}", name), []).append(ms)
                            log(f"  step at {context} positions, {name}: {ms:.3f} ms")
            finally:
                for served in lm.values():
                    served.close()

    scored = outputs["score", "lmserve"]
    setup = {
        "checkpoint": "GPT-2 from transformers, random weights (torch seed 0)",
        "layers": sizes.layers,
        "width": sizes.width,
        "heads": sizes.heads,
        "positions": POSITIONS,
        "vocab": tokens.tokenizer.get_vocab_size(),
        "threads_each": THREADS,
        "lmserve_score_callers": args.callers,
        "score_sentences": len(lines),
        "score_batch": BATCH,
        "score_tokens": sum(len(lp) for _, lp in scored),
        "generate_streams": list(STREAMS),
        "generate_new_tokens": sizes.new_tokens,
        "step_contexts": list(CONTEXTS),
        "runs": sizes.runs,
        "ctranslate2": ctranslate2.__version__,
    }
    records: list[dict[str, Any]] = []
    summary: dict[str, dict[str, float]] = {}
    for (figure, engine), values in runs.items():
        unit = "ms" if figure.startswith("step_") else "tokens/s"
        extra: dict[str, Any] = {"engine": engine}
        if (figure, engine) in cpu:
            extra["cpu_ms_per_token"] = statistics.median(cpu[figure, engine])
        if (figure, f"{engine}_client") in cpu:
            extra["client_cpu_ms_per_token"] = statistics.median(cpu[figure, f"{engine}_client"])
        records.append(record(f"peers_{figure}_{engine}", unit, values, **extra))
        summary.setdefault(figure, {})[engine] = statistics.median(values)
        if "cpu_ms_per_token" in extra:
            summary.setdefault(f"{figure}_cpu_ms_per_token", {})[engine] = extra["cpu_ms_per_token"]
    for figure in [f for f in summary if not f.endswith("_cpu_ms_per_token")]:
        for ours_name, peer in RATIOS:
            ours, theirs = runs[figure, ours_name], runs[figure, peer]
            if figure.startswith("step_"):  # ms: our speed is the peer's time over our own
                ratios = [b / a for a, b in zip(ours, theirs, strict=True)]
            else:
                ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
            name = f"peers_{figure}_{ours_name}_vs_{peer}"
            meaning = f"{ours_name}'s speed over the peer's"
            records.append(record(name, "ratio", ratios, note=meaning))
            summary[figure][f"{ours_name}_vs_{peer}"] = statistics.median(ratios)
    agreement: dict[str, float] = {}
    for ours_name, peer in AGREEMENT:
        prefix = "" if ours_name == "lmserve" else f"{ours_name}_"  # lmserve's keys as before
        worst, positions = _max_diff(outputs["score", ours_name], outputs["score", peer])
        name = f"peers_logprob_max_abs_diff_{ours_name}_vs_{peer}"
        records.append(record(name, "nats", [worst], positions=positions))
        agreement[f"{prefix}logprob_max_abs_diff_nats_vs_{peer}"] = worst
        ours = outputs["generate_16streams", ours_name]
        theirs = outputs["generate_16streams", peer]
        same = sum(a == b for a, b in zip(ours, theirs, strict=True)) / len(ours)
        name = f"peers_greedy_same_streams_{ours_name}_vs_{peer}"
        records.append(record(name, "fraction", [same], streams=len(ours)))
        agreement[f"{prefix}greedy_16streams_identical_vs_{peer}"] = same
    from lmserve.server.manifest import read_manifest

    parity = read_manifest(built.lmserve["lmserve"]).provenance.parity
    quantization = read_manifest(built.lmserve["lmserve_int8"]).quantization
    assert quantization is not None  # _current checked it
    report = {
        "name": "peers",
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "quick": small,
        "seconds": round(time.perf_counter() - started, 1),
        "build_seconds": {k: round(v, 1) for k, v in built.seconds.items()},
        "machine": machine(),
        "setup": setup,
        "lmserve_import_parity_nats": parity,
        "lmserve_int8_quantization": quantization.model_dump(mode="json"),
        "summary": summary,
        "agreement": agreement,
        "records": records,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    log(f"wrote {out}")
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
