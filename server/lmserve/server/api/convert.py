"""Domain objects to protobuf messages (the requests' direction lives in `validation`).

Score's and Generate's responses are built where they are computed (`worker.replies`)."""

from __future__ import annotations

from lmserve.server.decoding.scoring import PerplexityStats
from lmserve.server.manifest import ModelFormat, ModelKind, TokenizerKind
from lmserve.server.registry.repository import ModelEntry, ModelState
from lmserve.v1 import lm_service_pb2 as pb

_KINDS = {
    ModelKind.NGRAM: pb.MODEL_KIND_NGRAM,
    ModelKind.RNN: pb.MODEL_KIND_RNN,
    ModelKind.LSTM: pb.MODEL_KIND_LSTM,
    ModelKind.GRU: pb.MODEL_KIND_GRU,
    ModelKind.INTERPOLATED: pb.MODEL_KIND_INTERPOLATED,
    ModelKind.FFNN: pb.MODEL_KIND_FFNN,
    ModelKind.TRANSFORMER: pb.MODEL_KIND_TRANSFORMER,
}
_FORMATS = {
    ModelFormat.ARPA: pb.MODEL_FORMAT_ARPA,
    ModelFormat.NGRAM_BINARY: pb.MODEL_FORMAT_NGRAM_BINARY,
    ModelFormat.ONNX: pb.MODEL_FORMAT_ONNX,
    ModelFormat.TORCHSCRIPT: pb.MODEL_FORMAT_TORCHSCRIPT,
    ModelFormat.INTERPOLATION: pb.MODEL_FORMAT_INTERPOLATION,
}
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
    info.kind = _KINDS[manifest.kind]
    info.format = _FORMATS[manifest.format]
    info.description = manifest.description
    arch = manifest.architecture
    info.order = manifest.ngram.order if manifest.ngram else int(arch.get("order", 0))
    storage = manifest.ngram.storage if manifest.ngram else None
    if storage is not None:
        info.ngram_storage.CopyFrom(
            pb.NgramStorage(
                layout=storage.layout,
                ngram_counts=storage.counts,
                bytes=storage.bytes,
                bytes_per_ngram=storage.bytes_per_ngram,
                max_prob_error=storage.max_prob_error,
                max_backoff_error=storage.max_backoff_error,
                max_token_error=storage.max_token_error,
            )
        )
    info.num_layers = int(arch.get("num_layers", 0))
    info.hidden_size = int(arch.get("hidden_size", 0))
    info.embedding_size = int(arch.get("embedding_size", 0))
    if manifest.kind is ModelKind.TRANSFORMER:
        info.transformer.CopyFrom(
            pb.TransformerInfo(
                architecture=str(arch.get("architecture", "")),
                max_positions=int(arch.get("max_positions", 0)),
                num_layers=int(arch.get("num_layers", 0)),
                kv_heads=int(arch.get("kv_heads", 0)),
                head_dim=int(arch.get("head_dim", 0)),
                cache_bytes_per_position=int(arch.get("cache_bytes_per_position", 0)),
            )
        )
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
        order = getattr(entry.backend, "order", None)
        if isinstance(order, int) and not info.order:
            info.order = order
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
