"""The image's install steps, outside Docker: `pip wheel --no-deps ./client .` builds the
lmserve-client wheel and compiles the server's C extensions into the server wheel; those two
wheels alone (`--no-index --no-deps`) install into a clean virtualenv whose `lmserve` command
(the client's console script) finds the server's commands through their entry points, whose
modules (the extensions included) come from the wheels, and where no file belongs to both.

The virtualenv sees this environment's site-packages for the dependencies (a `.pth` line, which
adds the folder without running its own `.pth` files, so the editable install of the checkout
stays out): the test needs no package index for them. The wheel build itself gets hatchling
the way every build of the project does (pip's build isolation, from the configured index)."""

from __future__ import annotations

import os
import site
import subprocess
import sys
import zipfile
from pathlib import Path

from deploy_files import REPO
from test_deploy_images import make_train_args

EXTENSIONS = [
    "lmserve.server.backends.ngram._kernel",
    "lmserve.server.text._wordindex",
    "lmserve.server.decoding._draw",
    "lmserve.server.worker.replies._wire",
]


def run(cmd: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env |= {"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_RETRIES": "1", "PIP_TIMEOUT": "15"}
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{cmd}\n{result.stdout}\n{result.stderr}"
    return result


def wheel_files(wheel: Path) -> list[str]:
    """The files a wheel installs (its own .dist-info left out)."""
    with zipfile.ZipFile(wheel) as archive:
        return [n for n in archive.namelist() if ".dist-info/" not in n]


def test_wheel_installs_alone_and_serves_its_command(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    build = ["wheel", "-q", "--no-deps", "-w", str(wheels), str(REPO / "client"), str(REPO)]
    run([sys.executable, "-m", "pip", *build], tmp_path)
    [wheel] = wheels.glob("lmserve-*.whl")
    [client_wheel] = wheels.glob("lmserve_client-*.whl")
    assert "-py3-none-any" not in wheel.name, "the wheel must be platform-specific (C extensions)"
    assert client_wheel.name.endswith("-py3-none-any.whl"), "the client is pure Python"
    assert not set(wheel_files(wheel)) & set(wheel_files(client_wheel)), "a file in both wheels"
    page = {f"lmserve/server/front/api/http/static/{n}" for n in ("index.html", "autocomplete.js")}
    assert page <= set(wheel_files(wheel)), "the autocomplete page is not in the wheel"

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path)
    python = venv / "bin" / "python"
    install = ["--python", str(python), "install", "-q", "--no-index", "--no-deps"]
    run([sys.executable, "-m", "pip", *install, str(client_wheel), str(wheel)], tmp_path)
    purelib = run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        tmp_path,
    ).stdout.strip()
    dependencies = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (Path(purelib) / "zz_dependencies.pth").write_text("\n".join(dependencies) + "\n")

    code = (
        "import importlib, lmserve.server.front.process.app, lmserve.client\n"
        f"for name in {EXTENSIONS!r} + ['lmserve.server.front.process.app', 'lmserve.client']:\n"
        "    print(importlib.import_module(name).__file__)\n"
    )
    files = run([str(python), "-c", code], tmp_path).stdout.split()
    assert len(files) == len(EXTENSIONS) + 2
    for file in files:
        assert Path(file).is_relative_to(venv), f"{file} is not from the installed wheel"
    assert all(f.endswith(".so") for f in files[: len(EXTENSIONS)])

    lmserve = venv / "bin" / "lmserve"
    listed = run([str(lmserve), "--help"], tmp_path).stdout
    for command in ("serve", "train-ngram", "import-arpa", "score", "health"):
        assert f"\n    {command}" in listed, f"{command} missing from lmserve --help"
    assert "--model-repository" in run([str(lmserve), "serve", "--help"], tmp_path).stdout

    # The image's build stage trains kjv-5gram with the installed package (`make models`' flags):
    # the same here on the small test split, and without torch.
    args = [str(REPO / a) if a.startswith("export/") else a for a in make_train_args()]
    args[-1] = args[-1].replace("train.txt", "test.txt")
    out = tmp_path / "models" / "kjv-5gram"
    code = (
        "import sys\n"
        "from lmserve.server.cli import main\n"
        f"rc = main({['train-ngram', *args, str(out)]!r})\n"
        "assert 'torch' not in sys.modules, 'train-ngram imported torch'\n"
        "sys.exit(rc)\n"
    )
    run([str(python), "-c", code], tmp_path)
    assert {p.name for p in out.iterdir()} >= {"model.yaml", "model.lmbin"}
