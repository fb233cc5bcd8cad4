"""lm-evaluation-harness's `local-completions` model against the served KenLM-compatible model:
a multiple-choice task and a rolling-loglikelihood (perplexity) task, built from data this test
writes, run through `/v1/completions` (echo, logprobs, max_tokens 0/1, several prompts per
request) with the server's tokenizer endpoints (`tokenizer_backend=remote`). The harness's
figures equal the ones computed here from the model directly (the n-gram engine, = KenLM)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from served import ServerFactory

from lmserve.server.backends.ngram.model import NgramModel
from lmserve.server.front.process.app import BackgroundServer
from lmserve.server.registry.repository import load_entry

# Multiple choice: the context, the choices, the right one's index (KJV-like sentences).
CHOICE_DOCS = [
    ("in the beginning god created the", ["heaven", "house", "mat"], 0),
    ("and god said let there be", ["light", "cat", "sat"], 0),
    ("and the earth was without", ["form", "a", "the"], 0),
    ("and the lord spake unto", ["moses", "heaven", "light"], 0),
    ("the lord is my", ["shepherd", "earth", "said"], 0),
    ("and he said unto", ["them", "form", "light"], 1),
]
TEXTS = [
    "in the beginning god created the heaven and the earth",
    "and god said let there be light and there was light",
    "the lord is my shepherd i shall not want",
]


@pytest.fixture(scope="module")
def kjv3_server(serve: ServerFactory, model_repository: Path) -> Iterator[BackgroundServer]:
    # One model served, so the tokenizer endpoints need no model name (as vLLM's); its own
    # server, stopped when the module ends.
    with serve.private(_only(model_repository, "kjv3")) as server:
        yield server


def _only(root: Path, name: str) -> Path:
    solo = root.parent / f"solo-{name}"
    if not solo.exists():
        solo.mkdir()
        (solo / name).symlink_to(root / name, target_is_directory=True)
    return solo


def _write_tasks(folder: Path) -> None:
    docs = [{"context": c, "choices": ch, "label": label} for c, ch, label in CHOICE_DOCS]
    (folder / "choices.jsonl").write_text("\n".join(json.dumps(d) for d in docs) + "\n")
    (folder / "texts.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in TEXTS) + "\n")
    (folder / "lmserve_choices.yaml").write_text(
        f"""task: lmserve_choices
dataset_path: json
dataset_kwargs:
  data_files:
    test: {folder / "choices.jsonl"}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
target_delimiter: " "
metric_list:
  - metric: acc
"""
    )
    (folder / "lmserve_ppl.yaml").write_text(
        f"""task: lmserve_ppl
dataset_path: json
dataset_kwargs:
  data_files:
    test: {folder / "texts.jsonl"}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
"""
    )


def _direct(model: NgramModel, context: str, continuation: str) -> float:
    """log P(continuation | <s> context), natural log, no </s> (the harness's loglikelihood)."""
    vocab = model.vocab
    ids = [vocab.index.get(w, vocab.unk_id) for w in context.split()]
    total = 0.0
    for word in continuation.split():
        lp = model.next_token_log_probs(ids)
        wid = vocab.index.get(word, vocab.unk_id)
        total += float(lp[wid])
        ids.append(wid)
    return total


def test_the_harness_scores_what_the_model_scores(
    kjv3_server: BackgroundServer, model_repository: Path, tmp_path: Path
) -> None:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    _write_tasks(tmp_path)
    base = f"http://127.0.0.1:{kjv3_server.http_port}/v1/completions"
    results = simple_evaluate(
        model="local-completions",
        model_args=(
            f"base_url={base},model=kjv3,tokenizer_backend=remote,tokenized_requests=True,"
            "num_concurrent=1,max_retries=1,batch_size=4"
        ),
        tasks=["lmserve_choices", "lmserve_ppl"],
        task_manager=TaskManager(include_path=str(tmp_path)),
        log_samples=False,
    )
    assert results is not None
    figures = results["results"]
    # The model itself, loaded here (the server's front holds no weights).
    model = load_entry(model_repository / "kjv3").backend
    assert isinstance(model, NgramModel)
    # Multiple choice: the right choice is the argmax of the model's log-likelihoods.
    correct = 0
    for context, choices, label in CHOICE_DOCS:
        scores = [_direct(model, context, choice) for choice in choices]
        correct += int(max(range(len(choices)), key=scores.__getitem__) == label)
    assert figures["lmserve_choices"]["acc,none"] == pytest.approx(correct / len(CHOICE_DOCS))
    # Rolling loglikelihood: each text from the start, no </s>, words and bytes as the harness
    # counts them.
    total = sum(_direct(model, "", text) for text in TEXTS)
    words = sum(len(t.split()) for t in TEXTS)
    size = sum(len(t.encode()) for t in TEXTS)
    ppl = figures["lmserve_ppl"]
    assert ppl["word_perplexity,none"] == pytest.approx(math.exp(-total / words), rel=1e-6)
    assert ppl["byte_perplexity,none"] == pytest.approx(math.exp(-total / size), rel=1e-6)
    assert ppl["bits_per_byte,none"] == pytest.approx(-total / size / math.log(2), rel=1e-6)
