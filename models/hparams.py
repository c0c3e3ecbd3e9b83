"""Hyper-parameters shared by the decoder architectures, read from GGUF metadata through the
typed accessors of `edged.quant.GGUFFile` (each checks the stored value type) and validated as they
are read: a value that is out of range, not finite, or inconsistent with another key or with the
tensors is a ModelError naming the key and the value, never a NaN in the logits later."""

import math
import re
from dataclasses import dataclass, field
from typing import NoReturn

import numpy as np

from edged.models.errors import ModelError

INT_MAX = 2**31 - 1  # token ids, positions and rows are int32 in the kernels
ROPE_ANGLE_MAX = 1e30  # the largest RoPE angle (float32) over the context: far below float32 max
_F32_MAX = float(np.finfo(np.float32).max)
_REQUIRED = object()
_BLOCK_RE = re.compile(r"blk\.(\d+)\.")


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
    # pooling_type (llama.cpp's: 0 none, 1 mean, 2 cls, 3 last, 4 rank); None when absent
    pooling_type: int | None = None
    # YaRN (rope.scaling.type "yarn"): rope.scaling.original_context_length (default the context),
    # rope.scaling.attn_factor, rope.scaling.yarn_beta_fast / yarn_beta_slow (llama.cpp's defaults)
    rope_orig_ctx: int = 0
    rope_attn_factor: float = 1.0
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0

    @property
    def rope_freq_scale(self) -> float:
        """Position multiplier of linear or YaRN RoPE scaling (llama.cpp's freq_scale = 1 / factor)."""
        if self.rope_scaling in ("linear", "yarn") and self.rope_scale_factor > 0:
            return 1.0 / self.rope_scale_factor
        return 1.0

    def yarn_rope(self) -> dict:
        """RopeParams' YaRN fields: ext_factor 1 under yarn (0 otherwise), and attn_factor as
        llama.cpp's context sets it (get_mscale(factor) / (1 + 0.1 ln factor) * rope.scaling.attn_factor,
        so that with the rope op's own 1 + 0.1 ln(1/freq_scale) cos/sin scale by get_mscale(factor))."""
        if self.rope_scaling != "yarn":
            return {}
        f32 = np.float32
        factor = f32(1) / f32(self.rope_freq_scale)
        mscale = f32(1) if factor <= 1 else f32(0.1) * f32(math.log(factor)) + f32(1)
        attn = mscale * (f32(1) / (f32(1) + f32(0.1) * f32(math.log(factor)))) * f32(self.rope_attn_factor)
        return dict(ext_factor=1.0, attn_factor=float(attn), orig_ctx=self.rope_orig_ctx,
                    beta_fast=self.yarn_beta_fast, beta_slow=self.yarn_beta_slow)


# scaling types whose effect is a plain position multiplier or per-frequency divisors (rope_freqs);
# "yarn" (backends/rope.py's ramp-mixed interpolation) where the architecture passes yarn=True
SUPPORTED_ROPE_SCALING = ("none", "linear", "llama3")


# --- validators: read a key and check it; ModelError "<file>: <key> = <value>: <why>" --------------
def fail(path, key: str, value, why: str) -> NoReturn:
    raise ModelError(f"{path}: {key} = {value!r}: {why}")


def _absent(gf, key: str, default) -> bool:
    """An optional key the file does not have: its default is used unchecked."""
    return default is not _REQUIRED and key not in gf


def _finite32(v: float) -> bool:
    """Finite, also once rounded to float32 (what the kernels compute with)."""
    return math.isfinite(v) and abs(v) <= _F32_MAX


def int_range(gf, key: str, lo: int = 1, hi: int = INT_MAX, default=_REQUIRED) -> int:
    """An integer key in [lo, hi]."""
    if _absent(gf, key, default):
        return default
    v = gf.get_int(key)
    if not lo <= v <= hi:
        fail(gf.path, key, v, f"must be in [{lo}, {hi}]")
    return v


def finite_positive(gf, key: str, default=_REQUIRED, zero_means_unset: bool = False) -> float:
    """A float key, finite and > 0 (or exactly 0 where llama.cpp reads 0 as "not set")."""
    if _absent(gf, key, default):
        return default
    v = gf.get_float(key)
    if not (_finite32(v) and (v > 0 or (zero_means_unset and v == 0))):
        fail(gf.path, key, v, "must be finite and >= 0 (0: not set)" if zero_means_unset
             else "must be finite and > 0")
    return v


def in_open_interval(gf, key: str, lo: float, hi: float, default=_REQUIRED) -> float:
    """A float key in the open interval (lo, hi), also after rounding to float32."""
    if _absent(gf, key, default):
        return default
    v = gf.get_float(key)
    if not (lo < v < hi and lo < float(np.float32(v)) < hi):
        fail(gf.path, key, v, f"must be finite and in ({lo:g}, {hi:g})")
    return v


def file_blocks(gf) -> int:
    """1 + the highest N of the file's blk.N.* tensors (0 without any)."""
    ids = [int(m.group(1)) for name in gf.tensors if (m := _BLOCK_RE.match(name))]
    return max(ids) + 1 if ids else 0


def check_rope_angles(path, keys: str, hp: HParams, min_factor: float = 1.0) -> None:
    """The largest RoPE angle, position * freq_scale * base^(-2i/dim) / factor_i over the context,
    must stay far from float32 overflow (sin/cos of inf is NaN). Computed in logs: no overflow here."""
    d = hp.rope_dim
    scale = hp.rope_freq_scale
    if hp.rope_scaling == "yarn":  # YaRN's fastest pairs keep the unscaled frequency
        scale = max(1.0, scale)
    log_rate = math.log(scale) - math.log(min_factor)
    log_rate += max(0.0, -(d - 2) / d * math.log(hp.rope_base))  # base < 1: the last pair is fastest
    if math.log(max(hp.context_length - 1, 1)) + log_rate > math.log(ROPE_ANGLE_MAX):
        raise ModelError(f"{path}: {keys}: RoPE angles over the {hp.context_length}-token context "
                         f"overflow float32 (base {hp.rope_base!r}, freq_scale {hp.rope_freq_scale!r}, "
                         f"smallest factor {min_factor!r})")


def read_yarn(gf, hp: HParams) -> None:
    """The YaRN keys into hp (see HParams); a DeepSeek-style yarn_log_multiplier is refused."""
    def key(suffix):
        return f"{hp.arch}.rope.scaling.{suffix}"

    hp.rope_orig_ctx = int_range(gf, key("original_context_length"), default=hp.context_length)
    hp.rope_attn_factor = finite_positive(gf, key("attn_factor"), default=1.0)
    hp.yarn_beta_fast = finite_positive(gf, key("yarn_beta_fast"), default=32.0)
    hp.yarn_beta_slow = finite_positive(gf, key("yarn_beta_slow"), default=1.0)
    if finite_positive(gf, key("yarn_log_multiplier"), default=0.0, zero_means_unset=True):
        fail(gf.path, key("yarn_log_multiplier"), gf.get_float(key("yarn_log_multiplier")),
             "DeepSeek's YaRN attention scaling is not supported")


def read_hparams(gf, vocab_size: int, yarn: bool = False) -> HParams:
    """Common hyper-parameters of `gf.architecture`; `vocab_size` from the token_embd tensor;
    `yarn`: the architecture builds its RoPE with HParams.yarn_rope (else YaRN files are refused).

    Raises ModelError naming the key and value for values that make no sense (see module docstring).
    """
    arch, path = gf.architecture, gf.path

    def key(suffix):
        return f"{arch}.{suffix}"

    n_embd = int_range(gf, key("embedding_length"))
    n_heads = int_range(gf, key("attention.head_count"))
    n_kv_heads = int_range(gf, key("attention.head_count_kv"), hi=n_heads, default=n_heads)
    if n_heads % n_kv_heads:
        fail(path, key("attention.head_count_kv"), n_kv_heads,
             f"must divide {key('attention.head_count')} = {n_heads}")
    if key("attention.key_length") in gf:
        head_dim = int_range(gf, key("attention.key_length"))
    elif n_embd % n_heads:
        fail(path, key("embedding_length"), n_embd, f"must be a multiple of {key('attention.head_count')} "
             f"= {n_heads} when {key('attention.key_length')} is absent")
    else:
        head_dim = n_embd // n_heads
    if head_dim % 2:
        fail(path, key("attention.key_length"), head_dim, "the head dim must be even (RoPE pairs)")
    head_dim_v = int_range(gf, key("attention.value_length"), default=head_dim)
    if head_dim_v != head_dim:
        fail(path, key("attention.value_length"), head_dim_v,
             f"must equal the key head dim {key('attention.key_length')} = {head_dim}")
    rope_dim = int_range(gf, key("rope.dimension_count"), hi=head_dim, default=head_dim)
    if rope_dim % 2:
        fail(path, key("rope.dimension_count"), rope_dim, f"must be even and at most the head dim {head_dim}")
    n_layers = int_range(gf, key("block_count"))
    if n_layers != file_blocks(gf):
        fail(path, key("block_count"), n_layers, f"the file has tensors of {file_blocks(gf)} blocks")
    scaling = gf.get_str(key("rope.scaling.type"), default="none")
    factor = finite_positive(gf, key("rope.scaling.factor"), default=0.0, zero_means_unset=True)
    legacy_linear = finite_positive(gf, key("rope.scale_linear"), default=0.0, zero_means_unset=True)
    if scaling == "none" and legacy_linear > 0:
        scaling, factor = "linear", legacy_linear  # older converters wrote only this key
    supported = (*SUPPORTED_ROPE_SCALING, "yarn") if yarn else SUPPORTED_ROPE_SCALING
    if scaling not in supported:
        raise ModelError(f"{path}: {key('rope.scaling.type')}={scaling!r} is not supported; "
                         f"supported: {', '.join(supported)}")
    n_vocab_meta = int_range(gf, key("vocab_size"), default=vocab_size)
    if n_vocab_meta != vocab_size:
        fail(path, key("vocab_size"), n_vocab_meta, f"token_embd.weight has {vocab_size} rows")
    hp = HParams(
        arch=arch,
        n_layers=n_layers,
        n_embd=n_embd,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        head_dim_v=head_dim_v,
        n_ff=int_range(gf, key("feed_forward_length")),
        eps=in_open_interval(gf, key("attention.layer_norm_rms_epsilon"), 0.0, 1.0),
        rope_dim=rope_dim,
        rope_base=finite_positive(gf, key("rope.freq_base"), default=10000.0),
        rope_scaling=scaling,
        rope_scale_factor=factor if factor > 0 else 1.0,
        context_length=int_range(gf, key("context_length")),
        sliding_window=int_range(gf, key("attention.sliding_window"), lo=0, default=0),  # 0: none
        vocab_size=vocab_size,
        pooling_type=int_range(gf, key("pooling_type"), lo=0, hi=4, default=None),
    )
    if scaling == "yarn":
        read_yarn(gf, hp)
    check_rope_angles(path, f"{key('rope.freq_base')}, {key('rope.scaling.factor')}", hp)
    return hp


@dataclass
class ExpertHParams:
    """Mixture-of-experts sizes (keys <arch>.expert_*), read by read_expert_hparams."""

    n_expert: int  # expert_count
    n_expert_used: int  # expert_used_count: experts each token is routed to
    n_ff_exp: int  # expert_feed_forward_length (absent: feed_forward_length / expert_used_count, as llama.cpp)
    weights_scale: float = 1.0  # expert_weights_scale (absent or 0: no scaling)


def read_expert_hparams(gf, hp: HParams) -> ExpertHParams:
    """The expert counts of a MoE file, validated (ModelError naming the key); also kept in
    hp.extra["experts"]. The tensor shapes they imply are checked when the experts are loaded."""
    arch, path = gf.architecture, gf.path
    n_expert = int_range(gf, f"{arch}.expert_count")
    used_key = f"{arch}.expert_used_count"
    n_used = gf.get_int(used_key)
    if not 1 <= n_used <= n_expert:
        fail(path, used_key, n_used, f"must be in [1, {arch}.expert_count = {n_expert}]")
    n_ff_exp = int_range(gf, f"{arch}.expert_feed_forward_length", default=None)
    if n_ff_exp is None:
        n_ff_exp = hp.n_ff // n_used
        if n_ff_exp < 1:
            fail(path, f"{arch}.feed_forward_length", hp.n_ff, f"{arch}.expert_feed_forward_length is absent "
                 f"and feed_forward_length / expert_used_count ({n_used}) is 0")
    scale = finite_positive(gf, f"{arch}.expert_weights_scale", default=0.0, zero_means_unset=True)
    ex = ExpertHParams(n_expert, n_used, n_ff_exp, scale if scale > 0 else 1.0)
    hp.extra["experts"] = ex
    return ex
