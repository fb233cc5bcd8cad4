"""`lmserve import-arpa` and `lmserve serve` as a user runs them: a subprocess, SIGTERM to stop."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
import yaml

from lmserve.server.cli import main
from lmserve.v1 import lm_service_pb2 as pb
from lmserve.v1 import lm_service_pb2_grpc


@pytest.fixture(scope="module")
def imported_repository(tmp_path_factory: pytest.TempPathFactory, shared_data: Path) -> Path:
    root = tmp_path_factory.mktemp("served")
    arpa = shared_data / "kenlm-tests" / "test.arpa"
    code = main(
        ["import-arpa", str(arpa), str(root / "small"), "--name", "imported", "--lowercase"]
    )
    assert code == 0
    quantized = ["import-arpa", str(arpa), str(root / "small-q8"), "--name", "imported-q8"]
    assert main([*quantized, "--lowercase", "--quantize"]) == 0
    return root


def test_import_arpa_writes_a_verified_model_folder(imported_repository: Path) -> None:
    manifest = yaml.safe_load((imported_repository / "small" / "model.yaml").read_text())
    assert manifest["name"] == "imported"
    assert manifest["kind"] == "ngram" and manifest["format"] == "ngram_binary"
    assert manifest["tokenizer"]["lowercase"] is True
    assert len(manifest["files"]["model"]["sha256"]) == 64


def test_import_arpa_rejects_a_bad_pattern(tmp_path: Path, shared_data: Path) -> None:
    arpa = shared_data / "kenlm-tests" / "test.arpa"
    assert main(["import-arpa", str(arpa), str(tmp_path / "m"), "--token-pattern", "("]) == 2


def _import(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "lmserve.server.cli", "import-arpa", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def test_import_arpa_reports_progress_and_replaces_only_its_files(
    tmp_path: Path, shared_data: Path
) -> None:
    arpa = shared_data / "kjv" / "kenlm" / "kjv.3gram.arpa"
    folder = tmp_path / "kjv3"
    folder.mkdir()
    (folder / "notes.txt").write_text("kept")
    done = _import(str(arpa), str(folder))
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert re.fullmatch(r"read [\d,]+ of [\d,]+ n-grams \(100%\), [\d.]+ M/s, 0 s left", lines[-2])
    assert lines[-1].startswith("built the model: order 3")
    assert (folder / "notes.txt").read_text() == "kept"  # a folder's other files stay
    assert {p.name for p in tmp_path.iterdir()} == {"kjv3"}  # no staging folder left


def test_a_truncated_arpa_names_its_line_and_leaves_no_folder(
    tmp_path: Path, shared_data: Path
) -> None:
    text = (shared_data / "kjv" / "kenlm" / "kjv.3gram.arpa").read_bytes()
    cut = tmp_path / "cut.arpa"
    cut.write_bytes(text[: len(text) // 2])  # ends inside the 2- or 3-grams
    done = _import(str(cut), str(tmp_path / "model"))
    assert done.returncode == 1
    [message] = [line for line in done.stderr.splitlines() if line.startswith("lmserve")]
    assert re.search(r"cut\.arpa: line \d+: ", message), message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cut.arpa"]


def _wait_for_port(process: subprocess.Popen[str], deadline: float) -> int:
    assert process.stderr is not None
    seen = []
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            break
        seen.append(line)
        match = re.search(r"serving \S+ on 127\.0\.0\.1:(\d+)", line)
        if match:
            return int(match.group(1))
    process.kill()
    pytest.fail("server did not report its port:\n" + "".join(seen))


def test_serve_answers_and_stops_on_sigterm(imported_repository: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LMSERVE_")}
    env["LMSERVE_PORT"] = "1"  # the --port flag must win over the environment
    env["LMSERVE_MAX_TEXTS_PER_REQUEST"] = "2"  # read from the environment
    command = [sys.executable, "-m", "lmserve.server.cli", "serve", "--host", "127.0.0.1"]
    command += ["--port", "0", "--metrics-port", "0"]
    command += ["--model-repository", str(imported_repository), "--grace-period-seconds", "2"]
    command += ["--shutdown-notice-seconds", "0"]
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    try:
        port = _wait_for_port(process, time.monotonic() + 30)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = lm_service_pb2_grpc.LanguageModelServiceStub(channel)
            result = stub.Score(pb.ScoreRequest(model="imported", texts=["A Little"])).results[0]
            assert result.token_count == 3 and result.oov_count == 0  # lowercased by the model
            # The quantized copy: its stated error bound holds, and GetModel says both layouts.
            exact = stub.GetModel(pb.GetModelRequest(model="imported")).model.ngram_storage
            storage = stub.GetModel(pb.GetModelRequest(model="imported-q8")).model.ngram_storage
            assert (exact.layout, storage.layout) == ("probing", "probing-q8")
            # KenLM's test model has few distinct values an order: quantized without error.
            assert exact.max_token_error == storage.max_token_error == 0.0
            assert list(exact.ngram_counts) == list(storage.ngram_counts) == [37, 47, 11, 6, 4]
            assert storage.bytes < exact.bytes
            near = stub.Score(pb.ScoreRequest(model="imported-q8", texts=["A Little"])).results[0]
            assert near.log_prob == pytest.approx(result.log_prob, abs=1e-6)
            with pytest.raises(grpc.RpcError) as err:
                stub.Score(pb.ScoreRequest(model="imported", texts=["a", "b", "c"]))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_sigterm_never_waits_behind_model_work(tmp_path: Path, repo_root: Path) -> None:
    # Regression: beam searches ran in the default thread pool, so a SIGTERM hung behind them.
    (tmp_path / "kjv-lstm").symlink_to(repo_root / "models" / "kjv-lstm")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LMSERVE_")}
    command = [sys.executable, "-m", "lmserve.server.cli", "serve", "--host", "127.0.0.1"]
    command += ["--port", "0", "--metrics-port", "0", "--model-repository", str(tmp_path)]
    command += ["--grace-period-seconds", "1", "--shutdown-notice-seconds", "0"]
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    try:
        port = _wait_for_port(process, time.monotonic() + 60)
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        stub = lm_service_pb2_grpc.LanguageModelServiceStub(channel)
        beams = [
            stub.BeamSearch.future(
                pb.BeamSearchRequest(
                    model="kjv-lstm",
                    prompt="and god said",
                    beam_width=64,
                    min_length=4000,  # no </s>: minutes of work
                    max_length=4096,
                )
            )
            for _ in range(3)
        ]
        text = " ".join(["and the lord spake unto moses saying"] * 100)
        score = stub.Score.future(pb.ScoreRequest(model="kjv-lstm", texts=[text] * 200))
        time.sleep(1.0)  # the work is running
        assert not score.done(), score.exception()
        assert not any(b.done() for b in beams), [b.exception() for b in beams if b.done()]
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
        assert time.monotonic() - started < 10
        channel.close()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
