"""Fuzzes every RPC with generated requests (tests/fuzz_requests.py) against a real server on the
integration tests' small n-gram models, and prints a JSON summary of the statuses.

    .venv/bin/python bench/fuzz_rpcs.py [--examples 10000] [--seed 0]

Any INTERNAL or UNKNOWN is a bug: the summary lists the first few such calls, and the exit
status is 1. The CI test (tests/integration/test_fuzz_rpcs.py) runs a few hundred of these.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

import grpc
import yaml
from common import REPO_ROOT, SHARED_DATA
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, seed, settings
from prometheus_client import CollectorRegistry

sys.path.insert(0, str(REPO_ROOT / "tests"))
from fuzz_requests import (  # type: ignore[import-not-found]  # noqa: E402  (tests/, not typed here)
    ALLOWED,
    Call,
    rpc_calls,
    send,
)

from lmserve.server.backends.ngram.folder import write_model_folder  # noqa: E402
from lmserve.server.backends.ngram.model import NgramModel  # noqa: E402
from lmserve.server.front.process.app import start_background_server  # noqa: E402
from lmserve.server.manifest import Provenance, TokenizerSpec  # noqa: E402
from lmserve.server.settings import load_settings  # noqa: E402
from lmserve.v1 import lm_service_pb2_grpc  # noqa: E402


def build_repository(root: Path) -> None:
    """test, test-arpa, kjv3 serve; bad-checksum and neural fail (as in the integration tests)."""
    kenlm = SHARED_DATA / "kenlm-tests"

    def ngram(arpa: Path, name: str, **tokenizer: object) -> None:
        write_model_folder(
            NgramModel.from_arpa(arpa),
            root / name,
            name=name,
            tokenizer=TokenizerSpec.model_validate(tokenizer),
            provenance=Provenance(),
            arpa_source=arpa if name == "test" else None,
        )

    ngram(kenlm / "test.arpa", "test")
    ngram(SHARED_DATA / "kjv" / "kenlm" / "kjv.3gram.arpa", "kjv3", lowercase=True)
    (root / "test-arpa").mkdir()
    (root / "test-arpa" / "model.arpa").write_bytes((kenlm / "test.arpa").read_bytes())
    (root / "test-arpa" / "model.yaml").write_text(
        "name: test-arpa\nkind: ngram\nformat: arpa\nfiles: {arpa: {path: model.arpa}}\n"
    )
    bad = yaml.safe_load((root / "test" / "model.yaml").read_text())
    (root / "bad-checksum").mkdir()
    (root / "bad-checksum" / "model.lmbin").write_bytes(
        (root / "test" / "model.lmbin").read_bytes()
    )
    bad.update(name="bad-checksum", files={"model": {"path": "model.lmbin", "sha256": "0" * 64}})
    (root / "bad-checksum" / "model.yaml").write_text(yaml.safe_dump(bad))
    (root / "neural").mkdir()
    (root / "neural" / "model.onnx").write_bytes(b"not really onnx")
    (root / "neural" / "model.yaml").write_text(
        "name: neural\nkind: lstm\nformat: onnx\nfiles: {model: {path: model.onnx}}\n"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.CRITICAL)
    statuses: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    bugs: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        build_repository(Path(tmp))
        overrides = {
            "model_repository": Path(tmp),
            "host": "127.0.0.1",
            "port": 0,
            "metrics_enabled": False,
        }
        server = start_background_server(load_settings(overrides), registry=CollectorRegistry())
        started = time.perf_counter()
        try:
            with grpc.insecure_channel(server.address) as channel:
                stub = lm_service_pb2_grpc.LanguageModelServiceStub(channel)

                @seed(args.seed)
                @settings(
                    max_examples=args.examples,
                    database=None,
                    deadline=None,
                    suppress_health_check=list(HealthCheck),
                )
                @given(call=rpc_calls())
                def fuzz(call: Call) -> None:
                    code = send(stub, call)
                    statuses[call.rpc][code.name] += 1
                    if code not in ALLOWED and len(bugs) < 10:
                        bugs.append(f"{code.name}: {call!r}")

                fuzz()
                health = health_pb2_grpc.HealthStub(channel)
                check = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
                serving = check.status == health_pb2.HealthCheckResponse.SERVING
        finally:
            server.stop(grace=1.0)
    total: collections.Counter[str] = collections.Counter()
    for counts in statuses.values():
        total.update(counts)
    summary = {
        "name": "fuzz_rpcs",
        "examples": sum(total.values()),
        "seconds": round(time.perf_counter() - started, 1),
        "statuses": dict(total.most_common()),
        "by_rpc": {rpc: dict(counts.most_common()) for rpc, counts in sorted(statuses.items())},
        "serving_after": serving,
        "bugs": bugs,
    }
    print(json.dumps(summary, indent=1))
    return 0 if serving and not bugs else 1


if __name__ == "__main__":
    sys.exit(main())
