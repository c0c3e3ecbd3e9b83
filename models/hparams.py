"""Hyper-parameters shared by the decoder architectures, read from GGUF metadata through the
typed accessors of `edged.quant.GGUFFile` (each checks the stored value type)."""

from dataclasses import dataclass, field

from edged.models.errors import ModelError


@dataclass
class HParams:
    """What a decoder-only transformer needs from the metadata (keys `<arch>.<suffix>`)."""

    arch: str
    n_layers: int  # block_count
    n_embd: int  # embedding_length
    n_heads: int  # attention.head_count
    n_kv_heads: int  # attention.head_count_kv (default n_heads)
    head_dim: int  # attention.key_length (default n_embd / n_heads)
    head_dim_v: int  # attention.value_length (default head_dim)
    n_ff: int  # feed_forward_length
    eps: float  # attention.layer_norm_rms_epsilon
    rope_dim: int  # rope.dimension_count (default head_dim): features rotated per head
    rope_base: float  # rope.freq_base
    rope_scaling: str  # rope.scaling.type: "none", "linear", ...
    rope_scale_factor: float  # rope.scaling.factor (1.0 when none)
    context_length: int  # context_length: the training context
    sliding_window: int  # attention.sliding_window (0: none)
    vocab_size: int  # rows of token_embd (checked against vocab_size / tokenizer when present)
    extra: dict = field(default_factory=dict)  # architecture-specific values (e.g. rope_base_swa)

    @property
    def rope_freq_scale(self) -> float:
        """Position multiplier of linear RoPE scaling (llama.cpp's freq_scale = 1 / factor)."""
        if self.rope_scaling == "linear" and self.rope_scale_factor > 0:
            return 1.0 / self.rope_scale_factor
        return 1.0


# scaling types whose effect is a plain position multiplier or per-frequency divisors (rope_freqs)
SUPPORTED_ROPE_SCALING = ("none", "linear", "llama3")


def read_hparams(gf, vocab_size: int) -> HParams:
    """Common hyper-parameters of `gf.architecture`; `vocab_size` from the token_embd tensor.

    Raises ModelError for values that make no sense (zero heads, head count not dividing, ...).
    """
    arch = gf.architecture

    def key(suffix):
        return f"{arch}.{suffix}"

    n_embd = gf.get_int(key("embedding_length"))
    n_heads = gf.get_int(key("attention.head_count"))
    if n_heads <= 0 or n_embd <= 0:
        raise ModelError(f"{gf.path}: {key('attention.head_count')}={n_heads}, "
                         f"{key('embedding_length')}={n_embd}: must be positive")
    n_kv_heads = gf.get_int(key("attention.head_count_kv"), default=n_heads)
    head_dim = gf.get_int(key("attention.key_length"), default=n_embd // n_heads)
    head_dim_v = gf.get_int(key("attention.value_length"), default=head_dim)
    if n_kv_heads <= 0 or n_heads % n_kv_heads:
        raise ModelError(f"{gf.path}: {key('attention.head_count_kv')}={n_kv_heads} must divide "
                         f"{key('attention.head_count')}={n_heads}")
    if head_dim <= 0 or head_dim % 2 or head_dim_v != head_dim:
        raise ModelError(f"{gf.path}: head dims key_length={head_dim}, value_length={head_dim_v}: "
                         "must be equal, even and positive")
    rope_dim = gf.get_int(key("rope.dimension_count"), default=head_dim)
    if rope_dim <= 0 or rope_dim % 2 or rope_dim > head_dim:
        raise ModelError(f"{gf.path}: {key('rope.dimension_count')}={rope_dim}: must be even and "
                         f"at most the head dim {head_dim}")
    scaling = gf.get_str(key("rope.scaling.type"), default="none")
    factor = gf.get_float(key("rope.scaling.factor"), default=0.0)
    legacy_linear = gf.get_float(key("rope.scale_linear"), default=0.0)
    if scaling == "none" and legacy_linear > 0:
        scaling, factor = "linear", legacy_linear  # older converters wrote only this key
    if scaling not in SUPPORTED_ROPE_SCALING:
        raise ModelError(f"{gf.path}: {key('rope.scaling.type')}={scaling!r} is not supported; "
                         f"supported: {', '.join(SUPPORTED_ROPE_SCALING)}")
    n_vocab_meta = gf.get_int(key("vocab_size"), default=vocab_size)
    if n_vocab_meta != vocab_size:
        raise ModelError(f"{gf.path}: {key('vocab_size')}={n_vocab_meta} but token_embd.weight has "
                         f"{vocab_size} rows")
    return HParams(
        arch=arch,
        n_layers=gf.get_int(key("block_count")),
        n_embd=n_embd,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        head_dim_v=head_dim_v,
        n_ff=gf.get_int(key("feed_forward_length")),
        eps=gf.get_float(key("attention.layer_norm_rms_epsilon")),
        rope_dim=rope_dim,
        rope_base=gf.get_float(key("rope.freq_base"), default=10000.0),
        rope_scaling=scaling,
        rope_scale_factor=factor if factor > 0 else 1.0,
        context_length=gf.get_int(key("context_length")),
        sliding_window=gf.get_int(key("attention.sliding_window"), default=0),
        vocab_size=vocab_size,
    )
