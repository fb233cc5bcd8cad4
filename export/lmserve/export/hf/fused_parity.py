"""The shared-buffer graph (`fused_graph`) against transformers' own forward, read the way the
server reads it (`FusedTransformerBackend` and `SharedKvStepper`): every sample text in one
call from nothing beside the others (right-padded), each text in two chunks through the cache
then a single step, and rows of different lengths stepping together. Refused past
`lmserve.export.parity.PARITY_NATS` (`Parity.require`); the figures fill `Parity`'s fields
(one_pass, two_chunks, and left_padded for the rows of different lengths in one batch).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lmserve.export.hf.parity import Parity
from lmserve.export.parity import log_softmax, max_abs_diff
from lmserve.server.backends.fused_transformer import FusedTransformerBackend
from lmserve.server.backends.shared_kv_stepping import SharedKvStepper
from lmserve.server.backends.transformer import CacheShape
from lmserve.server.text.vocab import Vocabulary


def check_fused_parity(
    model: Any, graph: Path, cache: CacheShape, texts: Sequence[Sequence[int]]
) -> Parity:
    """Differences between the graph at `graph` and `model` (a transformers causal LM)."""
    import onnxruntime as ort  # type: ignore[import-untyped,unused-ignore]

    session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    size = int(model.config.vocab_size)
    words = [f"<{i}>" for i in range(size)]
    vocab = Vocabulary.from_words(words, unk=words[0], bos=words[0], eos=words[0])
    backend = FusedTransformerBackend(session, cache, vocab)
    stepper = SharedKvStepper(backend)
    texts = [list(t) for t in texts if t]
    references = []
    for text in texts:
        with torch.no_grad():
            logits = model(torch.tensor([text], dtype=torch.long)).logits.numpy()
        references.append(log_softmax(logits)[0])

    def diff(got: Any, want: Any) -> float:  # the shapes must agree: no broadcasting
        return max_abs_diff(np.asarray(got), want)

    logits = backend.prompt_pass(texts)
    one_pass = max(
        diff(log_softmax(logits[k : k + 1, : len(t)])[0], references[k])
        for k, t in enumerate(texts)
    )
    two_chunks = 0.0
    for text, ref in zip(texts, references, strict=True):
        if len(text) < 3:
            continue
        cut = len(text) // 2
        lp, state = stepper.prefill([text[:cut]], bos=False)
        two_chunks = max(two_chunks, diff(lp[0], ref[cut - 1]))
        lp, state = stepper.feed([text[cut:-1]], state)  # a chunk after a past
        two_chunks = max(two_chunks, diff(lp[0], ref[-2]))
        lp, state = stepper.step(np.array([text[-1]]), state)
        two_chunks = max(two_chunks, diff(lp[0], ref[-1]))
    # Rows of different lengths stepping together: each row's first half, then steps.
    starts = [max(1, len(t) // 2) for t in texts]
    lp, state = stepper.prefill([t[:s] for t, s in zip(texts, starts, strict=True)], bos=False)
    batched = max(diff(lp[k], references[k][s - 1]) for k, s in enumerate(starts))
    for step in range(min(len(t) - s for t, s in zip(texts, starts, strict=True))):
        tokens = np.array([t[s + step] for t, s in zip(texts, starts, strict=True)])
        lp, state = stepper.step(tokens, state)
        batched = max(
            batched, *(diff(lp[k], references[k][s + step]) for k, s in enumerate(starts))
        )
    return Parity(one_pass, two_chunks, batched)
