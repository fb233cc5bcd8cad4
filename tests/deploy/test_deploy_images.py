"""The Dockerfiles: every COPY source is in the repository and in the build context, the build
stage has what the wheel build needs, the runtime stage is non-root and compiler-free; the
compose file validates against the compose specification and its pieces fit together."""

from __future__ import annotations

import ast
import fnmatch
import json
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_files import DEPLOY, PENDING_SETTINGS, REPO, load_documents

from lmserve.server.settings import Settings

DOCKERFILES = [DEPLOY / "Dockerfile", DEPLOY / "Dockerfile.gpu"]
COMPOSE = DEPLOY / "docker-compose.yaml"
KJV = "export/lmserve/export/corpora/kjv"


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def args(self, keyword: str) -> list[str]:
        return [rest for kw, rest in self.instructions if kw == keyword]


def parse_dockerfile(path: Path) -> tuple[dict[str, str], list[Stage]]:
    """The global ARG defaults and the stages (instructions with continuations joined)."""
    text = re.sub(r"\\\n", " ", path.read_text(encoding="utf-8"))
    lines = [ln.strip() for ln in text.splitlines()]
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in lines:
        if not line or line.startswith("#"):
            continue
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            words = rest.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            base = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], words[0])
            stages.append(Stage(base, name))
        elif not stages:
            assert keyword == "ARG", f"{path.name}: {keyword} before FROM"
            key, _, value = rest.partition("=")
            args[key] = value
        else:
            stages[-1].instructions.append((keyword, rest))
    return args, stages


def copy_sources(stage: Stage) -> list[str]:
    sources = []
    for rest in stage.args("COPY"):
        words = shlex.split(rest)
        if any(w.startswith("--from") for w in words):
            continue
        sources += [w for w in words[:-1] if not w.startswith("--")]
    return sources


def tracked_files() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    return [p for p in out.split("\0") if p]


def dockerignored(path: str) -> bool:
    """Whether .dockerignore keeps `path` out of the build context (patterns without `!`)."""
    patterns = [
        ln.strip().lstrip("/")
        for ln in (REPO / ".dockerignore").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    assert not any(p.startswith("!") for p in patterns), "extend dockerignored() for exceptions"
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        if pattern.startswith("**/"):
            tail = pattern[3:]
            if any(fnmatch.fnmatchcase(part, tail) for part in parts):
                return True
            if any(fnmatch.fnmatchcase("/".join(parts[i:]), tail) for i in range(len(parts))):
                return True
        elif any(fnmatch.fnmatchcase(prefix, pattern) for prefix in prefixes):
            return True
    return False


def test_dockerignore_matcher() -> None:
    assert dockerignored(".venv/bin/python")
    assert dockerignored(
        "server/lmserve/server/worker/replies/_wire.cpython-311-x86_64-linux-gnu.so"
    )
    assert dockerignored("models/kjv-5gram/model.lmbin")
    assert not dockerignored("models/kjv-lstm/score.onnx")
    assert not dockerignored("server/lmserve/server/worker/replies/_wire.c")


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_copy_sources_are_tracked_and_in_the_build_context(path: Path) -> None:
    tracked = tracked_files()
    _, stages = parse_dockerfile(path)
    sources = [s for stage in stages for s in copy_sources(stage)]
    assert sources
    for source in sources:
        under = [f for f in tracked if f == source or f.startswith(source.rstrip("/") + "/")]
        assert under, f"{path.name}: COPY {source}: not in the repository (git ls-files)"
        ignored = [f for f in under if dockerignored(f)]
        assert not ignored, f"{path.name}: COPY {source}: .dockerignore drops {ignored[:3]}"


def extension_sources() -> list[str]:
    tree = ast.parse((REPO / "hatch_build.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "EXTENSIONS":
            return [source for _, source in ast.literal_eval(node.value)]
    raise AssertionError("hatch_build.py has no EXTENSIONS")


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_build_stage_has_what_the_wheel_build_needs(path: Path) -> None:
    _, stages = parse_dockerfile(path)
    build = stages[0]
    copied = set(copy_sources(build))
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    needed = {"pyproject.toml", "hatch_build.py", project["project"]["readme"]}
    needed |= {
        p.split("/")[0] for p in project["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    }
    copied_top = {c.rstrip("/").split("/")[0] for c in copied}
    assert needed - copied_top == set()
    for source in extension_sources():
        assert source.split("/")[0] in copied_top, source
    runs = " ".join(build.args("RUN"))
    assert "gcc" in runs and "pip wheel --no-deps" in runs
    # The server wheel depends on lmserve-client: both are built, and pip finds the client's.
    assert re.search(r"pip wheel --no-deps --wheel-dir /wheels \./client \.(\s|$)", runs), runs
    assert "--find-links /wheels" in runs
    client = tomllib.loads((REPO / "client" / "pyproject.toml").read_text())
    assert f"{client['project']['name']}==" in " ".join(project["project"]["dependencies"])
    assert (REPO / "client" / client["project"]["readme"]).is_file()


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_runtime_stage_is_non_root_without_compiler_or_torch(path: Path) -> None:
    args, stages = parse_dockerfile(path)
    final = stages[-1]
    assert final.name is None and stages[0].base == final.base
    assert final.args("USER") == ["10001:10001"]
    assert "10001" in " ".join(final.args("RUN"))  # the user exists (useradd)
    assert set(" ".join(final.args("EXPOSE")).split()) == {"50051", "8080", "9090"}
    assert final.args("HEALTHCHECK") == []
    assert json.loads(final.args("ENTRYPOINT")[0]) == ["lmserve", "serve"]
    runs = " ".join(final.args("RUN"))
    assert not re.search(r"\b(gcc|cc|build-essential|python3-dev|pip)\b", runs), runs
    text = path.read_text()
    assert "torch" not in re.sub(r"#.*", "", text).replace("onnxruntime", "")
    extra = "[gpu]" if path.name.endswith(".gpu") else "[onnx]"
    assert extra in " ".join(stages[0].args("RUN"))
    env = " ".join(final.args("ENV"))
    assert "LMSERVE_HOST=[::]" in env
    for name in re.findall(r"\bLMSERVE_(\w+)=", env):
        assert name.lower() in Settings.model_fields or name.lower() in PENDING_SETTINGS, name


def test_base_images_are_pinned() -> None:
    cpu, _ = parse_dockerfile(DOCKERFILES[0])
    gpu, _ = parse_dockerfile(DOCKERFILES[1])
    assert re.fullmatch(
        r"python:3\.11\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?", cpu["PYTHON_IMAGE"]
    )
    assert re.fullmatch(
        r"nvidia/cuda:\d+\.\d+\.\d+-cudnn-runtime-ubuntu\d+\.\d+(@sha256:[0-9a-f]{64})?",
        gpu["CUDA_IMAGE"],
    )


def make_train_args() -> list[str]:
    text = re.sub(r"\\\n", " ", (REPO / "Makefile").read_text())
    [line] = [ln for ln in text.splitlines() if "train-ngram" in ln]
    words = shlex.split(line.replace("$(KJV)", KJV))
    return words[words.index("train-ngram") + 1 : -1]  # without the output folder


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_image_models_are_the_default_repository(path: Path) -> None:
    """kjv-5gram is trained as `make models` trains it, without its ARPA copy (--binary-only:
    the same model.lmbin, which check_image.py compares with the repository's); every model an
    interpolation names is in the image."""
    _, stages = parse_dockerfile(path)
    [run] = [r for r in stages[0].args("RUN") if "train-ngram" in r]
    words = shlex.split(run)
    args = words[words.index("train-ngram") + 1 : -1]
    assert "--binary-only" in args and "--binary-only" not in make_train_args()
    assert [a for a in args if a != "--binary-only"] == make_train_args()
    models = {Path(words[-1]).name}
    models |= {Path(s).name for s in copy_sources(stages[0]) if s.startswith("models/")}
    for name in sorted(models - {"kjv-5gram"}):
        manifest = yaml.safe_load((REPO / "models" / name / "model.yaml").read_text())
        for component in manifest.get("architecture", {}).get("components", []):
            assert component["model"] in models, f"{name} needs {component['model']}"
    assert {"kjv-5gram", "kjv-lstm"} <= models


def compose() -> dict[str, Any]:
    [doc] = load_documents(COMPOSE)
    return doc


def run_check_jsonschema(path: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec"]
    return subprocess.run([*cmd, str(path)], capture_output=True, text=True, timeout=60)


def test_compose_validates_against_the_compose_spec(tmp_path: Path) -> None:
    result = run_check_jsonschema(COMPOSE)
    assert result.returncode == 0, result.stdout + result.stderr
    bad = tmp_path / "docker-compose.yaml"
    bad.write_text(COMPOSE.read_text().replace("stop_grace_period:", "stop_grace_periods:"))
    assert run_check_jsonschema(bad).returncode == 1


def test_compose_pieces_fit_together() -> None:
    services = compose()["services"]
    assert set(services) == {"lmserve", "prometheus", "grafana"}
    build = services["lmserve"]["build"]
    assert (DEPLOY / build["context"] / build["dockerfile"]).is_file()
    for name, service in services.items():
        if "image" in service and "build" not in service:
            assert re.search(r":v?\d+\.\d+\.\d+$", service["image"]), f"{name}: pin the tag"
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), f"{name}: {source}"
    environment = services["lmserve"]["environment"]
    for key in environment:
        name = key.removeprefix("LMSERVE_").lower()
        assert name in Settings.model_fields or name in PENDING_SETTINGS, key
    assert environment["LMSERVE_LOG_FORMAT"] == "json"
    # The healthcheck asks the plaintext health port the service sets (it works with TLS on).
    check = " ".join(services["lmserve"]["healthcheck"]["test"])
    assert f"localhost:{environment['LMSERVE_HEALTH_PORT']}'" in check

    mounts = {
        v.split(":")[1]: v.split(":")[0] for v in services["prometheus"]["volumes"] if ":" in v
    }
    prometheus = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    for rule_file in prometheus["rule_files"]:
        assert mounts[rule_file] == "./prometheus/alerts.yml"
    [job] = [j for j in prometheus["scrape_configs"] if j["job_name"] == "lmserve"]
    assert job["static_configs"][0]["targets"] == ["lmserve:9090"]

    grafana = {v.split(":")[1]: v.split(":")[0] for v in services["grafana"]["volumes"]}
    assert grafana["/etc/grafana/provisioning"] == "./grafana/provisioning"
    provisioning = DEPLOY / "grafana" / "provisioning"
    [datasource] = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())[
        "datasources"
    ]
    assert datasource["url"] == "http://prometheus:9090" and datasource["type"] == "prometheus"
    [provider] = yaml.safe_load((provisioning / "dashboards" / "lmserve.yml").read_text())[
        "providers"
    ]
    dashboard_dir = provider["options"]["path"]
    assert grafana[f"{dashboard_dir}/lmserve.json"] == "./grafana/lmserve.json"
