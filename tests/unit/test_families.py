"""The family catalog: every kind has exactly one home, and the refusals name what is served."""

from __future__ import annotations

import pytest

from lmserve.server.errors import ModelLoadError
from lmserve.server.families.catalog import families, family_of, load_families, register
from lmserve.server.families.ngram import NgramFamily
from lmserve.server.manifest import FileEntry, ModelFormat, ModelKind, ModelManifest
from lmserve.v1 import lm_service_pb2 as pb


def _manifest(kind: str, format: str) -> ModelManifest:
    return ModelManifest(
        name="m", kind=kind, format=format, files={"model": FileEntry(path="model.bin")}
    )


def test_every_built_in_kind_has_exactly_one_family() -> None:
    owners = {kind: [f.name for f in families() if kind in f.kinds] for kind in ModelKind}
    assert all(len(names) == 1 for names in owners.values()), owners


def test_every_kind_the_proto_names_is_reported_by_a_family() -> None:
    reported = {value for f in families() for value in f.kinds.values()}
    named = {v for n, v in pb.ModelKind.items() if n != "MODEL_KIND_UNSPECIFIED"}
    assert named <= reported
    formats = {value for f in families() for value in f.formats.values()}
    assert {v for n, v in pb.ModelFormat.items() if n != "MODEL_FORMAT_UNSPECIFIED"} <= formats


def test_a_family_is_found_by_kind_and_checks_the_format() -> None:
    assert family_of(_manifest("lstm", "torchscript")).name == "recurrent"
    assert family_of(_manifest("ngram", "arpa")).name == "ngram"
    with pytest.raises(ModelLoadError, match="format 'arpa' for kind 'lstm'.*loads onnx"):
        family_of(_manifest("lstm", ModelFormat.ARPA))
    with pytest.raises(ModelLoadError, match="kind 'mamba' is not served"):
        family_of(_manifest("mamba", "onnx"))


def test_a_kind_already_served_cannot_be_claimed_again() -> None:
    class Impostor(NgramFamily):
        name = "impostor"

    register(NgramFamily())  # the same family again: nothing happens
    assert sum(isinstance(f, NgramFamily) for f in families()) == 1
    with pytest.raises(ValueError, match="kind 'ngram' is served by the 'ngram' family"):
        register(Impostor())


def test_a_family_setting_that_names_no_family_is_refused() -> None:
    with pytest.raises(ValueError, match="is not a ModelFamily"):
        load_families(["lmserve.server.families.catalog:families"])
    with pytest.raises(ValueError, match="cannot be imported"):
        load_families(["lmserve.server.families.catalog:NOTHING"])
