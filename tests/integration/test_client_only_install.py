"""lmserve-client alone: its wheel, installed by pip into an empty virtualenv (no system
site-packages) with nothing but what it declares, brings grpcio and protobuf (and grpcio's
typing-extensions) and no numpy, torch, onnxruntime or pydantic; its `lmserve` command lists
only the client's commands and calls a real server (started from this environment, on a real
loopback port) with answers identical to this environment's client.

pip installs the dependencies the ordinary way (this machine's configured index and cache),
pinned by a constraints file to the versions this environment runs, so the test checks the
versions the rest of the suite uses. The installed size of the venv's site-packages is printed
(`pytest -s` shows it) and bounded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from serve_process import ServeProcess

from lmserve.client import LmServeClient

REPO = Path(__file__).resolve().parents[2]
DEPENDENCIES = ("grpcio", "protobuf", "typing-extensions")
ABSENT = ("numpy", "torch", "onnxruntime", "pydantic", "grpc_status", "grpc_health", "yaml")
# The client and its dependencies measured about 24 MB (grpcio's shared library is most of it);
# numpy alone would add about 40 MB, the server's dependencies about 180 MB.
MAX_SITE_PACKAGES_BYTES = 40 * 1024 * 1024
TEXTS = ["in the beginning god created the heaven and the earth", "and god said", "zzz qqq"]


def run(cmd: list[str], cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTHON", "VIRTUAL_ENV", "LMSERVE_"))
    }
    env |= {"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_RETRIES": "2", "PIP_TIMEOUT": "30"}
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{cmd}\n{result.stdout}\n{result.stderr}"
    return result


def installed_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty venv with the lmserve-client wheel and what pip resolves for it."""
    tmp = tmp_path_factory.mktemp("client-only")
    wheels = tmp / "wheels"
    build = ["wheel", "-q", "--no-deps", "-w", str(wheels), str(REPO / "client")]
    run([sys.executable, "-m", "pip", *build], tmp)
    [wheel] = wheels.glob("lmserve_client-*-py3-none-any.whl")
    venv = tmp / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp)
    constraints = tmp / "constraints.txt"
    constraints.write_text("".join(f"{name}=={version(name)}\n" for name in DEPENDENCIES))
    install = ["--python", str(venv / "bin" / "python"), "install", "-q", "--only-binary", ":all:"]
    run([sys.executable, "-m", "pip", *install, "-c", str(constraints), str(wheel)], tmp)
    return venv


def venv_python(venv: Path, code: str) -> str:
    return run([str(venv / "bin" / "python"), "-c", code], venv).stdout


def test_client_installs_with_grpcio_and_protobuf_only(client_venv: Path) -> None:
    code = (
        "import importlib.metadata as m, importlib.util as u, json, lmserve.client, sys\n"
        "print(json.dumps({\n"
        "  'dists': sorted(d.metadata['Name'].lower().replace('_', '-')\n"
        "                  for d in m.distributions()),\n"
        f"  'absent': [n for n in {ABSENT!r} if u.find_spec(n) is None],\n"
        "  'client': lmserve.client.__file__, 'stubs': u.find_spec('lmserve.v1').origin,\n"
        "  'site': [p for p in sys.path if p.endswith('site-packages')],\n"
        "}))\n"
    )
    found = json.loads(venv_python(client_venv, code))
    assert found["dists"] == sorted(["lmserve-client", *DEPENDENCIES])
    assert found["absent"] == list(ABSENT)
    for module in (found["client"], found["stubs"]):
        assert Path(module).is_relative_to(client_venv), module
    [site] = found["site"]
    assert Path(site).is_relative_to(client_venv), "the venv must not see system site-packages"
    for typed in ("client/py.typed", "v1/py.typed", "v1/lm_service_pb2.pyi"):
        assert (Path(site) / "lmserve" / typed).is_file(), typed

    size = installed_bytes(Path(site))
    print(f"\nlmserve-client venv site-packages: {size / 1e6:.1f} MB ({size} bytes)")
    assert size < MAX_SITE_PACKAGES_BYTES


def test_client_command_calls_a_real_server(
    client_venv: Path, model_repository: Path, tmp_path: Path
) -> None:
    lmserve = str(client_venv / "bin" / "lmserve")
    listed = run([lmserve, "--help"], tmp_path).stdout
    assert "LMSERVE_ADDRESS" in listed
    for command in ("score", "ppl", "generate", "health", "models", "rerank", "complete"):
        assert f"\n    {command}" in listed
    for command in ("serve", "train-ngram", "import-arpa"):
        assert f"\n    {command}" not in listed, f"{command} without the server installed"

    with ServeProcess(model_repository) as server:
        health = run([lmserve, "health", "--target", server.address, "--model", "kjv3"], tmp_path)
        assert health.stdout.strip() == "kjv3: SERVING"
        scored = run(
            [lmserve, "score", "--target", server.address, "--model", "kjv3", "--json", *TEXTS],
            tmp_path,
        )
        with LmServeClient(server.address) as client:
            expected = client.score("kjv3", TEXTS)
    records = [json.loads(line) for line in scored.stdout.splitlines()]
    assert [r["text"] for r in records] == TEXTS
    # numpy is absent there: the pure-Python reader gave exactly what this environment reads.
    assert [(r["log_prob"], r["token_count"], r["oov_count"]) for r in records] == [
        (e.log_prob, e.token_count, e.oov_count) for e in expected
    ]
    assert records[2]["oov_count"] == 2
