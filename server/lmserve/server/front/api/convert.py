"""Domain objects to protobuf messages (the requests' direction lives in `validation`).

Score's and Generate's responses are built where they are computed (`worker.replies`)."""

from __future__ import annotations

from lmserve.server.decoding.scoring import PerplexityStats
from lmserve.server.errors import ModelLoadError
from lmserve.server.families.catalog import family_of
from lmserve.server.families.family import ModelFamily
from lmserve.server.manifest import ModelManifest, TokenizerKind
from lmserve.server.registry.repository import ModelEntry, ModelState
from lmserve.v1 import lm_service_pb2 as pb

_TOKENIZERS = {
    "word": pb.TOKENIZER_KIND_WORD,
    "character": pb.TOKENIZER_KIND_CHARACTER,
    "bpe": pb.TOKENIZER_KIND_BPE,
    "huggingface": pb.TOKENIZER_KIND_HUGGINGFACE,
}


def model_info(entry: ModelEntry) -> pb.ModelInfo:
    """Everything GetModel reports; a model with an unreadable manifest has only name and error."""
    ready = entry.state is ModelState.READY
    info = pb.ModelInfo(
        name=entry.name,
        state=pb.MODEL_STATE_READY if ready else pb.MODEL_STATE_FAILED,
        load_error=entry.load_error,
    )
    manifest = entry.manifest
    if manifest is None:
        return info
    info.version = manifest.version
    info.description = manifest.description
    family = entry.family or _family(manifest)
    if family is not None:
        # A kind or format the proto does not name yet (a family added beside the built-in
        # ones) is reported UNSPECIFIED; its manifest names it.
        info.kind = family.kinds.get(manifest.kind, pb.MODEL_KIND_UNSPECIFIED)
        info.format = family.formats.get(manifest.format, pb.MODEL_FORMAT_UNSPECIFIED)
        family.describe(manifest, info)
    if manifest.quantization is not None:
        info.quantization.CopyFrom(_quantization(manifest))
    spec = manifest.tokenizer
    rule = f"words matching {spec.pattern}" if spec.pattern else "whitespace-separated words"
    if spec.kind is TokenizerKind.HUGGINGFACE:
        rule = "the checkpoint's tokenizer.json; words are whitespace-separated"
    info.tokenizer.CopyFrom(
        pb.TokenizerInfo(
            kind=_TOKENIZERS[spec.kind.value],
            lowercase=spec.lowercase,
            description=("lowercased, " if spec.lowercase else "") + rule,
        )
    )
    specials = manifest.special_tokens
    vocab = entry.vocab
    index = vocab.index if vocab is not None else {}
    info.special_tokens.CopyFrom(
        pb.SpecialTokens(
            bos=specials.bos,
            eos=specials.eos,
            unk=specials.unk,
            pad=specials.pad or "",
            bos_id=index.get(specials.bos, -1),
            eos_id=index.get(specials.eos, -1),
            unk_id=index.get(specials.unk, -1),
            pad_id=index.get(specials.pad, -1) if specials.pad else -1,
        )
    )
    if vocab is not None:
        info.vocab_size = len(vocab)
    # Every ready model answers every RPC (Complete: word models exactly, piece models by a
    # bounded search); the autocomplete page lists the models that say `complete`.
    info.capabilities.CopyFrom(
        pb.ModelCapabilities(
            score=ready,
            perplexity=ready,
            generate=ready,
            beam_search=ready,
            rerank=ready,
            complete=ready,
            next_token_distribution=ready,
        )
    )
    prov = manifest.provenance
    info.provenance.CopyFrom(
        pb.Provenance(
            training_corpus=prov.training_corpus or "",
            trained_by=prov.trained_by or "",
            created=prov.created or "",
            metrics=prov.metrics,
            source=prov.source or "",
            parity=prov.parity,
        )
    )
    return info


def _family(manifest: ModelManifest) -> ModelFamily | None:
    """The family of a model that failed to load, where its manifest names one."""
    try:
        return family_of(manifest)
    except ModelLoadError:
        return None


def perplexity_stats(stats: PerplexityStats) -> pb.PerplexityStats:
    return pb.PerplexityStats(
        log_prob=stats.log_prob,
        token_count=stats.token_count,
        oov_count=stats.oov_count,
        text_count=stats.text_count,
        perplexity=stats.perplexity,
        log_prob_excluding_oov=stats.log_prob_excluding_oov,
        perplexity_excluding_oov=stats.perplexity_excluding_oov,
        word_count=stats.word_count,
        perplexity_per_word=stats.perplexity_per_word,
    )


__all__ = ["model_info", "perplexity_stats"]


def _quantization(manifest: ModelManifest) -> pb.Quantization:
    """The manifest's quantization block, as recorded at export (any family's graphs)."""
    q = manifest.quantization
    assert q is not None
    return pb.Quantization(
        method=q.method,
        weights=q.weights,
        ops=q.ops,
        nodes=q.nodes,
        max_token_error=q.max_token_error,
        max_token_error_bound=q.max_token_error_bound,
        float_perplexity=q.float_perplexity,
        perplexity=q.perplexity,
        perplexity_change=q.perplexity_change,
        held_out=q.held_out,
        held_out_tokens=q.held_out_tokens,
        float_bytes=q.float_bytes,
        bytes=q.bytes,
    )
