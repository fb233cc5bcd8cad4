"""Fuse's engine side: streams stepped together equal each stepped alone, exact top k, the
table's checks, and the states released however a stream ends."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from neural_folders import VOCAB, tiny_model, write_onnx_folder

from lmserve.server.backends.onnx import OnnxOptions
from lmserve.server.backends.positions import Positions
from lmserve.server.backends.stepping import Stepper
from lmserve.server.errors import InvalidArgument, Overloaded
from lmserve.server.families.catalog import make_stepper
from lmserve.server.families.family import LoadContext
from lmserve.server.families.loading import load_backend
from lmserve.server.manifest import read_manifest
from lmserve.server.settings import FusionSettings
from lmserve.server.shared.fusion import FuseStep
from lmserve.server.worker.fusion.answers import top_k
from lmserve.server.worker.fusion.sessions import Fuser


@pytest.fixture(scope="module")
def stepper(tmp_path_factory: pytest.TempPathFactory) -> Stepper:
    folder = tmp_path_factory.mktemp("fusion") / "lstm"
    write_onnx_folder(tiny_model("lstm", seed=5), VOCAB, folder, name="lstm")
    return make_stepper(load_backend(folder, read_manifest(folder), LoadContext(OnnxOptions())))


def test_top_k_is_the_sorted_row_with_ties_broken_by_id() -> None:
    rows = np.log(np.array([[0.1, 0.3, 0.1, 0.3, 0.1, 0.1]], dtype=np.float32))
    ids, lps = top_k(rows, 3)
    assert ids.tolist() == [[1, 3, 0]]  # 0.3, 0.3, then the lowest id of the 0.1s
    assert lps[0].tolist() == pytest.approx(rows[0, [1, 3, 0]].tolist())
    rng = np.random.default_rng(0)
    many = np.round(rng.normal(size=(5, 50)), 1).astype(np.float32)  # many ties
    for k in (1, 7, 50):
        ids, _ = top_k(many, k)
        expected = [np.lexsort((np.arange(50), -row))[:k].tolist() for row in many]
        assert ids.tolist() == expected


def _fuser(stepper: Stepper, **limits: int) -> Fuser:
    return Fuser("lstm", stepper, FusionSettings(**limits), Positions(None))


def _paths(seed: int, count: int, length: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, len(VOCAB), size=length).tolist() for _ in range(count)]


async def _walk(fuser: Fuser, key: int, path: list[int]) -> list[float]:
    """Extends the root token by token (each parent dropped as its child arrives): the token
    log-probs Fuse gives along `path`."""
    await fuser.apply(key, FuseStep(opens=True))
    out = []
    for i, token in enumerate(path):
        answer = await fuser.apply(
            key, FuseStep(ids=[i + 1], parents=[i], tokens=[token], drop=[i])
        )
        out.append(float(answer.token_log_probs[0]))
    fuser.close_session(key)
    return out


def test_streams_stepped_together_equal_each_alone_and_share_calls(stepper: Stepper) -> None:
    paths = _paths(1, 6, 5)

    async def alone() -> list[list[float]]:
        fuser = _fuser(stepper)
        try:
            return [await _walk(fuser, k, p) for k, p in enumerate(paths)]
        finally:
            fuser.close()

    async def together() -> tuple[list[list[float]], int, int]:
        fuser = _fuser(stepper)
        try:
            got = await asyncio.gather(*(_walk(fuser, k, p) for k, p in enumerate(paths)))
            return list(got), fuser.steps.calls, fuser.live
        finally:
            fuser.close()

    expected = asyncio.run(alone())
    got, calls, live = asyncio.run(together())
    for a, b in zip(got, expected, strict=True):
        assert a == pytest.approx(b, abs=1e-5)
    # 6 streams x (1 root + 5 steps) alone would be 36 calls; together far fewer.
    assert calls < 6 * 6 / 2
    assert live == 0  # every stream closed: nothing held
    # The reference: the stepper fed each whole path from <s>.
    for path, lps in zip(paths, got, strict=True):
        out, _ = stepper.prefill([[]])
        ref = [float(out[0, path[0]])]
        for i in range(1, len(path)):
            out, _ = stepper.prefill([path[:i]])
            ref.append(float(out[0, path[i]]))
        assert lps == pytest.approx(ref, abs=1e-5)


def test_children_of_one_parent_and_drops_keep_the_others(stepper: Stepper) -> None:
    async def main() -> None:
        fuser = _fuser(stepper)
        try:
            root = await fuser.apply(1, FuseStep(opens=True, query=[0], candidates=[3, 4, 5]))
            kids = await fuser.apply(1, FuseStep(ids=[7, 8, 9], parents=[0] * 3, tokens=[3, 4, 5]))
            assert kids.token_log_probs.tolist() == pytest.approx(
                root.candidate_log_probs[0].tolist(), abs=1e-6
            )
            # Dropping the parent keeps its children; the children answer again unchanged.
            again = await fuser.apply(1, FuseStep(drop=[0, 8], query=[9, 7], candidates=[6]))
            assert again.live == 2 and again.ids == [9, 7]
            assert again.token_log_probs.tolist() == pytest.approx(
                [kids.token_log_probs[2], kids.token_log_probs[0]]
            )
            with pytest.raises(InvalidArgument, match=r"^query\[0\]: 8 is not a live"):
                await fuser.apply(1, FuseStep(query=[8]))
        finally:
            fuser.close()

    asyncio.run(main())


def test_the_bounds_and_a_closed_stream_release_their_hypotheses(stepper: Stepper) -> None:
    async def main() -> None:
        fuser = _fuser(stepper, fuse_max_hypotheses=10, fuse_max_live_hypotheses=15)
        try:
            await fuser.apply(1, FuseStep(opens=True, ids=list(range(1, 9)), parents=[0] * 8,
                                          tokens=[3] * 8))  # fmt: skip
            assert fuser.live == 9
            with pytest.raises(Overloaded, match="fuse_max_hypotheses"):
                await fuser.apply(1, FuseStep(ids=[20, 21], parents=[1, 1], tokens=[3, 3]))
            with pytest.raises(Overloaded, match="fuse_max_live_hypotheses"):
                await fuser.apply(2, FuseStep(opens=True, ids=list(range(1, 7)), parents=[0] * 6,
                                              tokens=[3] * 6))  # fmt: skip
            fuser.close_session(2)
            fuser.close_session(1)
            assert fuser.live == 0 and fuser.sessions == 0
            # A stream closed while its step runs: nothing of it stays.
            task = asyncio.ensure_future(
                fuser.apply(3, FuseStep(opens=True, ids=[1, 2], parents=[0, 0], tokens=[3, 4]))
            )
            await asyncio.sleep(0)
            fuser.close_session(3)
            with pytest.raises(Exception, match="closed"):
                await task
            assert fuser.live == 0
        finally:
            fuser.close()

    asyncio.run(main())
