"""The documentation site: it builds with --strict (a broken link, or a page missing from the
nav, fails), its generated references list every setting, metric and RPC the code defines, and
the code of the quickstart and the guides runs as written against a real server (Python, a
page's blocks in one namespace as a reader would run them; the lmserve command and curl; Node;
not the Go example: no Go toolchain here; not install commands). Blocks marked `text` are
illustrations with placeholders (another host, your own files)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from served import ServerFactory

from lmserve.server.front.process.app import BackgroundServer
from lmserve.server.settings import Settings

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
FENCE = re.compile(r"```(\w+)\n(.*?)```", re.DOTALL)
GUIDES = [
    "quickstart.md",
    "guides/clients.md",
    "guides/calling.md",
    "guides/rescoring.md",
    "guides/autocomplete.md",
]
# Installing is not part of a guide's run (the tests run in the installed checkout).
NOT_RUN = ("make serve", "pip install")


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(DOCS / "generate.py")], check=True, timeout=120)
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert build.returncode == 0, build.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "settings" / "index.html").is_file()
    settings = (DOCS / "reference" / "settings.md").read_text(encoding="utf-8")
    for name in Settings.model_fields:
        assert f"`LMSERVE_{name.upper()}`" in settings, name
    metrics = (DOCS / "reference" / "metrics.md").read_text(encoding="utf-8")
    for family in ("lmserve_requests_total", "lmserve_http_refused_origins_total"):
        assert f"`{family}`" in metrics
    grpc = (DOCS / "reference" / "grpc.md").read_text(encoding="utf-8")
    for rpc in ("Score", "Generate", "Rerank", "Complete", "CorpusPerplexity"):
        assert f"| `{rpc}` |" in grpc


@pytest.fixture(scope="module")
def server(serve: ServerFactory, shipped_repository: Path) -> BackgroundServer:
    """kjv-5gram trained as `make models` trains it, and the committed kjv-lstm, served."""
    return serve(shipped_repository, http_port=0)


def _blocks(page: str) -> list[tuple[str, str]]:
    return FENCE.findall((DOCS / page).read_text(encoding="utf-8"))


@pytest.mark.parametrize("page", GUIDES)
def test_the_guides_code_runs_as_written(server: BackgroundServer, page: str) -> None:
    grpc_address, http_address = server.address, f"localhost:{server.http_port}"
    ran = 0
    namespace: dict[str, object] = {"__name__": "guide"}
    path = f"{REPO / '.venv' / 'bin'}:{os.environ.get('PATH', '')}"
    for language, code in _blocks(page):
        code = code.replace("localhost:50051", grpc_address).replace("localhost:8080", http_address)
        if language == "python":
            exec(compile(code, page, "exec"), namespace)
        elif language == "sh":
            if any(marker in code for marker in NOT_RUN[1:]):
                continue
            commands = [c for c in code.split("\n\n") if c.strip() and NOT_RUN[0] not in c]
            for command in commands:
                command = command.replace(
                    ".venv/bin/lmserve", str(REPO / ".venv" / "bin" / "lmserve")
                )
                run = subprocess.run(
                    ["bash", "-euo", "pipefail", "-c", command],
                    capture_output=True,
                    text=True,
                    timeout=120,
                    env={**os.environ, "LMSERVE_ADDRESS": grpc_address, "PATH": path},
                    cwd=REPO,
                )
                assert run.returncode == 0, (command, run.stderr[-2000:])
                assert run.stdout.strip(), command
        elif language == "js":
            from node_clients import node_client, run_node_code

            node_client("grpc_web_call.mjs")  # the packages and the generated code
            out = run_node_code(code)
            assert out.strip(), code
        elif language == "go":
            continue  # not run: see the module doc
        else:
            continue
        ran += 1
    assert ran >= 1


def test_the_readme_links_to_pages_that_exist() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\((docs/[^)#]+)", readme)
    assert len(links) >= 10
    for link in links:
        assert (REPO / link).is_file(), link
    assert shutil.which("bash")
