"""The documentation's bring-your-own-model example (docs/models/your-own-model.md) runs as
written, and the folder it writes is served: its Score equals the example module's own
log-probabilities."""

from __future__ import annotations

import re
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
from served import ServerFactory

from lmserve.v1 import lm_service_pb2 as pb
from lmserve.v1 import lm_service_pb2_grpc

PAGE = Path("docs") / "models" / "your-own-model.md"


def _example(page: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    assert len(blocks) == 1, "the page shows one Python example"
    return blocks[0]


def test_the_readme_example_writes_a_served_folder(
    repo_root: Path,
    serve: ServerFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = _example((repo_root / PAGE).read_text(encoding="utf-8"))
    monkeypatch.chdir(tmp_path)
    scope: dict[str, object] = {"__name__": "readme_example"}
    exec(compile(code, str(PAGE), "exec"), scope)
    printed = float(capsys.readouterr().out.strip().splitlines()[-1])
    assert 0 <= printed <= 1e-4
    model, words = scope["model"], scope["words"]
    assert isinstance(model, torch.nn.Module) and isinstance(words, list)
    with (
        serve.private(tmp_path / "models") as server,
        grpc.insecure_channel(server.address) as channel,
    ):
        stub = lm_service_pb2_grpc.LanguageModelServiceStub(channel)
        text = "in the beginning god created the heaven and the earth"
        request = pb.ScoreRequest(model="tiny-lstm", texts=[text], return_tokens=True)
        [result] = stub.Score(request).results
    ids = [words.index(w) for w in text.split()]
    with torch.no_grad():
        zeros = torch.zeros(1, 2, 32)
        logits = model(torch.tensor([[1, *ids]]), zeros, zeros)[0][0]
    lp = torch.log_softmax(logits.double(), dim=-1).numpy()
    expected = [lp[t, w] for t, w in enumerate([*ids, 2])]
    np.testing.assert_allclose(list(result.details.log_probs), expected, atol=1e-4)
