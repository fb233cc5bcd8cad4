"""Where each model's engine worker can be reached, for the other fronts (`fronts: N`).

    directory = WorkerDirectory.create()            # the first front: a private folder
    spec.listen_address = directory.new_address("kjv-lstm")   # a Linux abstract socket name
    directory.publish("kjv-lstm", address)           # once that worker is READY
    WorkerDirectory(path).address("kjv-lstm")        # another front, when it (re)connects

The first front starts and supervises the workers; each worker listens on an abstract Unix
socket (nothing on disk, gone with the process) whose name the first front writes into one
small file per model in a private folder (mode 0700), replaced atomically when a worker is
restarted or a reload starts a new one. The other fronts read it whenever they connect.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from pathlib import Path


class WorkerDirectory:
    """One folder of `<model>.address` files (see the module doc)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._names = itertools.count(1)

    @classmethod
    def create(cls) -> WorkerDirectory:
        return cls(Path(tempfile.mkdtemp(prefix="lmserve-workers-")))

    def new_address(self, model: str) -> str:
        """A fresh abstract socket name for a worker of `model` (unique per launch)."""
        return f"\0lmserve-{os.getpid()}-{next(self._names)}-{model}"

    def publish(self, model: str, address: str) -> None:
        (self.path / f"{model}.failed").unlink(missing_ok=True)
        target = self.path / f"{model}.address"
        staging = target.with_suffix(".partial")
        staging.write_bytes(address.encode("utf-8", "surrogateescape"))
        os.replace(staging, target)

    def publish_failure(self, model: str, reason: str) -> None:
        """The model's worker could not load it: the other fronts show it failed."""
        target = self.path / f"{model}.failed"
        staging = target.with_suffix(".partial")
        staging.write_text(reason, encoding="utf-8")
        os.replace(staging, target)

    def failure(self, model: str) -> str | None:
        try:
            return (self.path / f"{model}.failed").read_text(encoding="utf-8")
        except OSError:
            return None

    def address(self, model: str) -> str | None:
        """The model's worker's address now, or None before its first worker was READY."""
        try:
            return (self.path / f"{model}.address").read_bytes().decode("utf-8", "surrogateescape")
        except OSError:
            return None

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
