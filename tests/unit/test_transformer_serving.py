"""The transformer's serving parts on their own: the key/value-cache stepper against one pass of
the graph, the context window's rules, admission by cache bytes, the checkpoint's tokenizer as a
codec, the leading-space word boundary, and folders and checkpoints that cannot be served."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hf_models import POSITIONS, checkpoint

from lmserve.export.hf.importer import export_checkpoint
from lmserve.server.backends.kv_stepping import KvStepper
from lmserve.server.backends.positions import Positions
from lmserve.server.backends.transformer import TransformerBackend
from lmserve.server.cli import main
from lmserve.server.decoding.params import GenerateParams, StoppingParams
from lmserve.server.errors import InvalidArgument, ManifestError, RequestTooLarge
from lmserve.server.families.catalog import make_stepper, read_model_manifest
from lmserve.server.manifest import read_manifest
from lmserve.server.registry.repository import ModelState, load_entry
from lmserve.server.settings import GenerationLimits
from lmserve.server.text.pretrained import PretrainedCodec
from lmserve.server.worker.generation.admission import Admission
from lmserve.server.worker.generation.context_window import ContextWindow
from lmserve.server.worker.generation.sequence import GenerationRequest, GenerationStream


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("served")
    out = {}
    for build in ("gpt2", "llama"):
        out[build] = root / f"tiny-{build}"
        # optimum's layout: these tests read KvStepper's states (test_shared_kv_stepping
        # reads the shared-buffer graph's)
        export_checkpoint(checkpoint(root / f"ck-{build}", build), out[build], shared_cache=False)
    return out


@pytest.fixture(scope="module")
def backend(folders: dict[str, Path]) -> TransformerBackend:
    entry = load_entry(folders["llama"])
    assert entry.state is ModelState.READY, entry.load_error
    assert entry.scorer is not None and isinstance(entry.scorer.backend, TransformerBackend)
    return entry.scorer.backend


def _one_pass(backend: TransformerBackend, ids: list[int]) -> np.ndarray:
    """The log-probs after the last of `ids`, read alone in one pass (the reference)."""
    return np.asarray(backend.next_token_log_probs(ids, bos=False))


def test_the_stepper_equals_one_pass_whatever_the_rows_lengths(backend: TransformerBackend) -> None:
    stepper = make_stepper(backend)
    assert isinstance(stepper, KvStepper)
    bos = backend.vocab.bos_id
    prompts = [[5, 6, 7, 8, 9, 10], [11], [12, 13, 14]]
    lp, state = stepper.prefill(prompts)
    histories = [[bos, *p] for p in prompts]
    for step in range(4):
        for row, history in enumerate(histories):
            np.testing.assert_allclose(lp[row], _one_pass(backend, history), atol=1e-4)
        tokens = [20 + step, 30 + step, 40 + step]
        lp, state = stepper.step(np.array(tokens), state)
        for history, token in zip(histories, tokens, strict=True):
            history.append(token)
    assert state.lengths.tolist() == [len(h) for h in histories]
    assert state.width == max(len(h) for h in histories)
    # Reordered, duplicated and merged rows keep stepping as themselves.
    reordered = stepper.select(state, [2, 0, 0])
    lp2, _ = stepper.step(np.array([50, 51, 52]), reordered)
    for row, (source, token) in enumerate(((2, 50), (0, 51), (0, 52))):
        np.testing.assert_allclose(
            lp2[row], _one_pass(backend, [*histories[source], token]), atol=1e-4
        )
    merged = stepper.merge(list(reversed(stepper.split(state))))
    assert merged.lengths.tolist() == [len(h) for h in reversed(histories)]
    lp3, _ = stepper.feed([[60], [61, 62], [63]], merged)  # chunks of different lengths
    expected = [[*histories[2], 60], [*histories[1], 61, 62], [*histories[0], 63]]
    for row, history in enumerate(expected):
        np.testing.assert_allclose(lp3[row], _one_pass(backend, history), atol=1e-4)


def test_select_drops_padding_no_row_needs(backend: TransformerBackend) -> None:
    stepper = KvStepper(backend)
    _, state = stepper.prefill([[5] * 20, [6]])
    short = stepper.select(state, [1])
    assert short.width == 2 and short.past[0].shape[2] == 2
    assert short.nbytes == 2 * backend.cache.bytes_per_position()


def test_the_stepper_refuses_a_position_past_the_model(backend: TransformerBackend) -> None:
    stepper = KvStepper(backend, max_chunk_tokens=16)
    _, state = stepper.prefill([[5] * (POSITIONS - 1)])
    assert state.lengths.tolist() == [POSITIONS]
    with pytest.raises(InvalidArgument, match="max_positions"):
        stepper.step(np.array([7]), state)


def _request(prompt: int, new: int, n: int = 1) -> GenerationRequest:
    params = GenerateParams(StoppingParams(max_new_tokens=new, min_new_tokens=min(new, 3)), n=n)
    return GenerationRequest(list(range(prompt)), params)


def test_the_window_lowers_max_new_tokens_to_the_positions_left() -> None:
    window = ContextWindow(Positions(10), bytes_per_position=8, max_cache_bytes=1000)
    fitted = window.fit(_request(4, 50).params, 4)
    # <s> + 4 prompt tokens read, 5 positions left, the last drawn token needs none.
    assert fitted.stopping.max_new_tokens == 6
    assert window.fit(_request(4, 3).params, 4).stopping.max_new_tokens == 3
    assert window.new_tokens_room(9) == 1
    with pytest.raises(InvalidArgument, match="11 positions, the model has 10"):
        window.new_tokens_room(10)
    assert ContextWindow().fit(_request(4, 50).params, 4).stopping.max_new_tokens == 50


def test_admission_counts_cache_bytes_and_refuses_what_never_fits() -> None:
    window = ContextWindow(Positions(100), bytes_per_position=10, max_cache_bytes=1000)
    admission = Admission("m", GenerationLimits(), window=window)
    small = GenerationStream(_request(9, 40), 1)  # (1 + 9 + 40) x 10 = 500 bytes
    assert small.request.cache_bytes(window, 1) == 500
    admission.offer(small, occupied=0)
    assert admission.take(occupied=1, cache_bytes=600) == []  # 500 more would pass 1000
    assert admission.take(occupied=1, cache_bytes=500) == [small]
    with pytest.raises(RequestTooLarge, match="key/value cache"):
        admission.offer(GenerationStream(_request(9, 40, n=3), 3), occupied=0)
    idle = GenerationStream(_request(9, 40), 1)
    admission.offer(idle, occupied=0)
    assert admission.take(occupied=0, cache_bytes=0) == [idle]


def test_the_pretrained_codec_encodes_whole_texts_and_counts_whitespace_words(
    folders: dict[str, Path],
) -> None:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folders["gpt2"] / "tokenizer.json"))
    codec = PretrainedCodec(tokenizer, bos="<|endoftext|>", eos="<|endoftext|>", vocab_size=320)
    text = "And God said,  Let there be light"
    batch = codec.encode_texts([text, ""])
    assert batch.ids.tolist() == tokenizer.encode(text).ids
    assert batch.offsets.tolist() == [0, len(batch.ids), len(batch.ids)]
    assert not batch.oov.any()
    assert codec.decode(batch.ids.tolist()) == text
    assert codec.count_words(text) == 7
    assert len(codec.vocab) == 320  # padded to the model's output size
    assert codec.vocab.words[310] == "<|lmserve-unused-310|>"
    assert codec.vocab.bos_id == codec.vocab.eos_id == tokenizer.token_to_id("<|endoftext|>")


def test_the_leading_space_view_opens_continues_and_closes_words(folders: dict[str, Path]) -> None:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folders["gpt2"] / "tokenizer.json"))
    codec = PretrainedCodec(tokenizer, bos="<|endoftext|>", eos="<|endoftext|>")
    pieces = codec.piece_vocabulary()
    assert pieces is not None and pieces.opens is not None and pieces.closes is not None
    space_god = tokenizer.token_to_id("ĠGod")
    god = tokenizer.token_to_id("God")
    assert pieces.opens[space_god] and pieces.texts[space_god] == "God"
    assert pieces.continues[god] and not pieces.opens[god]
    lp = np.log(np.full(len(codec.vocab), 1.0 / len(codec.vocab)))
    first = pieces.word_view(lp, first=True, text_start=False)
    assert first[space_god] == lp[space_god] and first[god] == -np.inf
    assert pieces.word_view(lp, first=True, text_start=True)[god] == lp[god]
    later = pieces.word_view(lp, first=False, text_start=False)
    closing = int(pieces.closes.sum())
    assert later[pieces.boundary_id] == pytest.approx(np.log(closing / len(codec.vocab)))
    assert later[space_god] == -np.inf


def test_an_optimum_folder_without_bos_or_eos_is_refused_naming_them(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    folder = tmp_path / "optimum"
    folder.mkdir()
    for name in ("model.onnx", "tokenizer.json"):
        shutil.copyfile(folders["gpt2"] / name, folder / name)
    config = json.loads((folders["gpt2"] / "config.json").read_text())
    config.pop("bos_token_id"), config.pop("eos_token_id")
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ManifestError, match="bos_token_id or eos_token_id"):
        read_model_manifest(folder)
    entry = load_entry(folder)
    assert entry.state is ModelState.FAILED
    assert "bos_token_id" in (entry.load_error or "")


def test_an_optimum_folder_is_read_as_a_transformer(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    folder = tmp_path / "opt-llama"
    folder.mkdir()
    for name in ("model.onnx", "tokenizer.json", "config.json"):
        shutil.copyfile(folders["llama"] / name, folder / name)
    manifest = read_model_manifest(folder)
    assert (manifest.name, manifest.kind, manifest.tokenizer.kind.value) == (
        "opt-llama",
        "transformer",
        "huggingface",
    )
    assert (manifest.special_tokens.bos, manifest.special_tokens.eos) == ("<s>", "</s>")
    assert manifest.architecture["kv_heads"] == 2


def test_a_graph_with_a_missing_cache_input_is_refused(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    folder = tmp_path / "broken"
    shutil.copytree(folders["gpt2"], folder)
    config = json.loads((folder / "config.json").read_text())
    config["n_layer"] = 3  # the graph has two layers' past
    (folder / "config.json").write_text(json.dumps(config))
    manifest = folder / "model.yaml"
    manifest.write_text(
        "\n".join(line for line in manifest.read_text().splitlines() if "sha256" not in line)
    )
    entry = load_entry(folder)
    assert entry.state is ModelState.FAILED
    assert "past_key_values.2.key" in (entry.load_error or "")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("tokenizer", "tokenizer.json is missing"),
        ("architecture", "is not supported; supported: GPT2LMHeadModel, LlamaForCausalLM"),
    ],
)
def test_import_hf_refuses_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: str, message: str
) -> None:
    folder = checkpoint(tmp_path / "ck", "gpt2")
    capsys.readouterr()  # transformers' progress bars while saving
    if change == "tokenizer":
        (folder / "tokenizer.json").unlink()
    else:
        config: dict[str, Any] = json.loads((folder / "config.json").read_text())
        config["architectures"] = ["BertForMaskedLM"]
        (folder / "config.json").write_text(json.dumps(config))
    assert main(["import-hf", str(folder), str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("import-hf: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_a_complete_session_counts_its_cache_bytes(backend: TransformerBackend) -> None:
    from lmserve.server.worker.autocomplete.completer import _state_bytes

    stepper = KvStepper(backend)
    _, state = stepper.prefill([[5, 6, 7]])
    assert _state_bytes(state) == state.nbytes == 4 * backend.cache.bytes_per_position()


def test_truncate_goes_back_without_a_model_call(backend: TransformerBackend) -> None:
    stepper = KvStepper(backend)
    bos = backend.vocab.bos_id
    _, state = stepper.prefill([[5, 6, 7, 8], [9, 10]])
    back = stepper.truncate(state, 2)
    assert back.lengths.tolist() == [3, 1]
    lp, _ = stepper.step(np.array([11, 12]), back)
    np.testing.assert_allclose(lp[0], _one_pass(backend, [bos, 5, 6, 11]), atol=1e-4)
    np.testing.assert_allclose(lp[1], _one_pass(backend, [bos, 12]), atol=1e-4)
    with pytest.raises(ValueError, match="cannot go back 4"):
        stepper.truncate(state, 4)  # the second row has read <s> and two tokens


def test_import_hf_replaces_only_a_model_folder(
    folders: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = checkpoint(tmp_path / "ck", "gpt2")
    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    assert main(["import-hf", str(source), str(other)]) == 1
    assert main(["import-hf", str(source), str(other), "--overwrite"]) == 1
    assert "is not a model folder" in capsys.readouterr().err
    assert (other / "keep.txt").read_text() == "mine"
    model = tmp_path / "model"
    shutil.copytree(folders["gpt2"], model)
    assert main(["import-hf", str(source), str(model), "--overwrite"]) == 0
    assert read_manifest(model).name == "model"


def test_only_a_cache_stepper_goes_back_by_truncating(backend: TransformerBackend) -> None:
    from lmserve.server.backends.stepping import ContextStepper, TruncatingStepper

    assert isinstance(KvStepper(backend), TruncatingStepper)
    assert not isinstance(ContextStepper(backend), TruncatingStepper)
