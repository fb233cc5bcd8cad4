"""Hatchling build hook: compiles lmserve's C extension modules with the platform C compiler.

Each extension is one `.c` file (and headers beside it) using only the CPython C-API, so no
build system is needed beyond `cc -O3 -fPIC -shared` with Python's include directory and
extension suffix.

- editable install (`pip install -e .`): the module is compiled in place, next to its source,
  where the editable path finds it (the `.so` files are git-ignored);
- wheel: compiled into a temporary folder and force-included; the wheel is marked
  platform-specific (`pure_python = False`, tag inferred from the interpreter).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

# (module name, source relative to the repository root)
EXTENSIONS = [
    ("lmserve.server.backends.ngram._kernel", "server/lmserve/server/backends/ngram/_kernel.c"),
    (
        "lmserve.server.backends.ngram._arpa_import",
        "server/lmserve/server/backends/ngram/_arpa_import.c",
    ),
    ("lmserve.server.text._wordindex", "server/lmserve/server/text/_wordindex.c"),
    ("lmserve.server.decoding._draw", "server/lmserve/server/decoding/_draw.c"),
    ("lmserve.server.worker.replies._wire", "server/lmserve/server/worker/replies/_wire.c"),
]
# -fno-trapping-math: no code here uses floating-point exceptions, and it lets the compiler turn
# selects into vector blends (the sampling draw's exponential loop vectorises only with it);
# results are unchanged (no reassociation, no fast-math).
CFLAGS = [
    "-O3",
    "-fPIC",
    "-shared",
    "-std=c11",
    "-Wall",
    "-Wextra",
    "-fno-strict-aliasing",
    "-fno-trapping-math",
]


def compile_extension(source: Path, target: Path) -> None:
    """Compiles one C file into the extension module `target`; raises if the compiler fails."""
    cc = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    include = sysconfig.get_paths()["include"]
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    cmd = [*cc[:1], *CFLAGS, f"-I{include}", str(source), "-o", str(tmp)]
    subprocess.run(cmd, check=True)
    os.replace(tmp, target)  # atomic: a running process never sees a half-written file


def ext_suffix() -> str:
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    if not suffix:
        raise RuntimeError("Python reports no EXT_SUFFIX: cannot name the extension modules")
    return str(suffix)


def module_file(module: str) -> str:
    """`a.b._c` -> `a/b/_c<EXT_SUFFIX>` (the path inside the wheel)."""
    return module.replace(".", "/") + ext_suffix()


class CustomBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        root = Path(self.root)
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        if version == "editable":
            for module, source in EXTENSIONS:
                src = root / source
                compile_extension(src, src.with_name(module.rsplit(".", 1)[1] + ext_suffix()))
            return
        self._tmp = tempfile.mkdtemp(prefix="lmserve-ext-")
        for module, source in EXTENSIONS:
            built = Path(self._tmp) / module_file(module)
            compile_extension(root / source, built)
            build_data["force_include"][str(built)] = module_file(module)

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        tmp = getattr(self, "_tmp", None)
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
