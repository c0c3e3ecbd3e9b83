"""How many KV blocks to allocate: from --kv-memory (bytes or a fraction of free RAM) or
--ctx x --max-seqs; a model with sliding-window layers gets a second, small pool for those."""

from __future__ import annotations

import re
from dataclasses import dataclass

from edged.backends.cpu.host_memory import meminfo_bytes

_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "t": 1e12, "tb": 1e12}


def available_memory() -> int:
    """Bytes of RAM the OS reports available (MemAvailable), or 4 GiB if it cannot tell."""
    return meminfo_bytes("MemAvailable")


def parse_memory(spec: str) -> int:
    """'2GiB', '512MB', '1073741824' -> bytes; '0.25' (a fraction in (0, 1]) -> that share of free RAM."""
    s = str(spec).strip().lower()
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*([a-z]*)", s)
    if not m or m.group(2) not in _UNITS:
        raise ValueError(f"cannot parse memory size {spec!r} (examples: 2GiB, 512MB, 0.5)")
    value, unit = float(m.group(1)), m.group(2)
    if not unit and value <= 1.0 and "." in s:
        if value <= 0:
            raise ValueError(f"memory fraction must be in (0, 1], got {spec!r}")
        return int(available_memory() * value)
    return int(value * _UNITS[unit])


def plan_num_blocks(bytes_per_token: int, block_size: int, *, kv_memory: str | None = None,
                    ctx: int = 4096, max_seqs: int = 16) -> int:
    """Blocks for the KV pool: the memory budget if given, else room for max_seqs x ctx tokens."""
    if kv_memory is not None:
        budget = parse_memory(kv_memory)
        n = budget // (bytes_per_token * block_size)
        if n < 1:
            raise ValueError(f"--kv-memory {kv_memory} holds no {block_size}-token block "
                             f"({bytes_per_token * block_size} bytes each)")
        return int(n)
    if ctx < 1 or max_seqs < 1:
        raise ValueError("ctx and max_seqs must be >= 1")
    return -(-ctx * max_seqs // block_size)


@dataclass(frozen=True)
class KVLayout:
    """How a model's layers split into KV groups (edged.kv.manager): a main group, and for a
    model mixing global and sliding-window layers, a second group for the sliding ones."""

    window: int  # window by which old blocks are freed (0: none, every block is kept)
    bytes_per_token: int  # K and V bytes per token of the main group's layers
    window_bytes_per_token: int = 0  # of the second group's layers (0: no second group)
    kv_type: str = "f32"  # the caches' element type (--kv-type), which the bytes count

    @property
    def two_groups(self) -> bool:
        return self.window_bytes_per_token > 0


def kv_layout(model, free_window_blocks: bool = True, kv_type: str | None = None) -> KVLayout:
    """The model's KV groups: one for a model without sliding-window layers (or with
    free_window_blocks=False), one sliding group when every layer is sliding, else two. Bytes
    are of kv_type (None: the model's own, float32 for a stand-in model without one)."""
    window = getattr(model, "kv_window", 0) if free_window_blocks else 0  # stand-in models have none
    own = getattr(model, "kv_type", None)
    kv_type = kv_type or own or "f32"

    def per_token(**kw):
        return model.kv_bytes_per_token(**kw) if own is None else model.kv_bytes_per_token(kv_type=kv_type, **kw)

    if not window:
        return KVLayout(0, per_token(), kv_type=kv_type)
    full, sliding = per_token(sliding=False), per_token(sliding=True)
    return KVLayout(window, full, sliding, kv_type) if full else KVLayout(window, sliding, kv_type=kv_type)


def window_blocks_needed(window: int, block_size: int, max_batch_tokens: int, max_seqs: int = 1) -> int:
    """Most sliding-window blocks max_seqs running requests hold at once, so a pool this big never
    runs short. Request r computing n_r new tokens keeps positions [C_r - window + 1, C_r + n_r):
    a span of window - 1 + n_r tokens touches at most (window - 2 + n_r) / block_size + 2 blocks,
    and the n_r of one step add up to at most max_batch_tokens."""
    return (max_seqs * (window - 2) + max_batch_tokens) // block_size + 2 * max_seqs


@dataclass(frozen=True)
class KVPlan:
    """Block counts of the KV pools."""

    layout: KVLayout
    block_size: int
    num_blocks: int  # the main group's pool
    window_num_blocks: int | None = None  # the second group's pool (None: one group)

    @property
    def nbytes(self) -> int:
        """Bytes of K and V the pools allocate."""
        return self.block_size * (self.num_blocks * self.layout.bytes_per_token
                                  + (self.window_num_blocks or 0) * self.layout.window_bytes_per_token)

    def describe(self) -> str:
        """'N blocks x bs tokens (X MiB)' for the log, both pools when there are two."""
        bs, lay = self.block_size, self.layout
        kind = "full-attention" if lay.two_groups else "sliding-window" if lay.window else "all"
        text = (f"{lay.kv_type} K/V, {self.num_blocks} blocks x {bs} tokens ({kind} layers, "
                f"{self.num_blocks * bs * lay.bytes_per_token / 2**20:.0f} MiB)")
        if self.window_num_blocks:
            text += (f" + {self.window_num_blocks} blocks (sliding-window layers, window {lay.window}, "
                     f"{self.window_num_blocks * bs * lay.window_bytes_per_token / 2**20:.0f} MiB)")
        return text


def window_pool_blocks(window: int, block_size: int, max_batch_tokens: int, max_seqs: int,
                       num_blocks: int) -> int:
    """The sliding-window pool beside a full-attention pool of num_blocks: room for max_seqs
    running requests, and no more than num_blocks (a request's sliding-window blocks are at some
    of the block indices it holds in the full-attention pool), so short contexts pay no extra."""
    return min(window_blocks_needed(window, block_size, max_batch_tokens, max_seqs), num_blocks)


def plan_kv(model, block_size: int, *, kv_memory: str | None = None, ctx: int = 4096,
            max_seqs: int = 16, max_batch_tokens: int = 512, free_window_blocks: bool = True,
            kv_type: str | None = None) -> KVPlan:
    """The pools for `model`, of kv_type (None: the model's). Sliding-window layers get room for
    max_seqs running requests (window_pool_blocks: they never limit admission); full-attention
    layers get ctx x max_seqs tokens, or what the --kv-memory budget leaves after the
    sliding-window pool."""
    bs = block_size
    lay = kv_layout(model, free_window_blocks, kv_type)
    if not lay.two_groups:  # one pool; when every layer is sliding it need not outgrow the windows
        n = plan_num_blocks(lay.bytes_per_token, bs, kv_memory=kv_memory, ctx=ctx, max_seqs=max_seqs)
        if lay.window:
            n = min(n, window_blocks_needed(lay.window, bs, max_batch_tokens, max_seqs))
        return KVPlan(lay, bs, n)
    if kv_memory is None:
        full = plan_num_blocks(lay.bytes_per_token, bs, ctx=ctx, max_seqs=max_seqs)
        return KVPlan(lay, bs, full, window_pool_blocks(lay.window, bs, max_batch_tokens, max_seqs, full))
    # a budget: the blocks it holds if both pools were the same size bound the window pool, and
    # the full-attention pool takes the rest (so it is never the smaller one)
    equal = plan_num_blocks(lay.bytes_per_token + lay.window_bytes_per_token, bs, kv_memory=kv_memory)
    window_blocks = window_pool_blocks(lay.window, bs, max_batch_tokens, max_seqs, equal)
    left = parse_memory(kv_memory) - window_blocks * bs * lay.window_bytes_per_token
    return KVPlan(lay, bs, left // (bs * lay.bytes_per_token), window_blocks)
