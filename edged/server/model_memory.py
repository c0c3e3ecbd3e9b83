"""What loading a model will cost in memory, estimated before loading it: the weights (the file
size: they are mapped or uploaded whole), the KV pools this server's options give it, and a
workspace for one step's activations. `--max-memory` and eviction compare these numbers."""

from __future__ import annotations

from dataclasses import dataclass

from edged.backends.cpu.host_memory import meminfo_bytes
from edged.engine.sizing import parse_memory

# fixed part of the workspace: the engine's sampler and mask buffers, the tokenizer's tables
_WORKSPACE_FIXED = 64 * 2**20


@dataclass(frozen=True)
class MemoryEstimate:
    weights: int
    kv: int
    workspace: int
    draft: int = 0  # --draft's model: its weights, KV pool and workspace

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.workspace + self.draft

    def describe(self) -> str:
        draft = f" + draft model {fmt_bytes(self.draft)}" if self.draft else ""
        return (f"{fmt_bytes(self.total)} (weights {fmt_bytes(self.weights)} + KV {fmt_bytes(self.kv)}"
                f" + workspace {fmt_bytes(self.workspace)}{draft})")


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def workspace_bytes(model, max_batch_tokens: int, max_seqs: int) -> int:
    """float32 activations of one step: the residual stream, attention and FFN intermediates for
    max_batch_tokens tokens, and the logits of max_seqs rows (twice: the sampler copies them)."""
    hp = getattr(model, "hparams", None)
    per_token = 0
    if hp is not None:
        per_token = 4 * (4 * hp.n_embd + 3 * hp.n_heads * hp.head_dim + 3 * hp.n_ff)
    return _WORKSPACE_FIXED + max_batch_tokens * per_token + 2 * 4 * max_seqs * model.vocab_size


def estimate(model, file_bytes: int, kv_plan, config, draft_bytes: int = 0) -> MemoryEstimate:
    """The estimate for `model` (built over the mapped file: nothing is copied) under `config`,
    with draft_bytes for a draft model beside it (draft_model_bytes)."""
    return MemoryEstimate(file_bytes, kv_plan.nbytes,
                          workspace_bytes(model, config.max_batch_tokens, config.max_seqs), draft_bytes)


def draft_model_bytes(draft, file_bytes: int, proposer, max_seqs: int) -> int:
    """A draft model's memory: its file (weights), its proposer's KV pool (spec_draft) and a
    workspace for its widest pass (a catch-up chunk) with a logits row per sequence."""
    from edged.engine.spec_draft import CATCH_UP_CHUNK

    return file_bytes + proposer.kv_bytes + workspace_bytes(draft, CATCH_UP_CHUNK, max_seqs)


def estimate_file(path: str, plan_kv, config) -> MemoryEstimate:
    """Read the GGUF's metadata and build its model over the mapping (no weight is read or
    repacked: under a second for Gemma 3 270M), then drop it. plan_kv(model) -> KVPlan."""
    from edged.models import load_model
    from edged.quant import load_gguf

    with load_gguf(path) as gf:
        model = load_model(gf)
        return estimate(model, gf.file_size, plan_kv(model), config)


def total_memory() -> int:
    """Bytes of RAM (MemTotal), or 4 GiB if it cannot tell."""
    return meminfo_bytes("MemTotal")


def parse_max_memory(spec: str | None) -> int | None:
    """--max-memory: bytes ("8GiB", "512MB", "1073741824") or a fraction of total RAM ("0.5");
    None or "0": no limit."""
    if spec is None:
        return None
    s = str(spec).strip()
    try:
        value = float(s)
    except ValueError:
        value = None
    if value is not None and 0 < value <= 1 and "." in s:
        return int(total_memory() * value)
    if value == 0:
        return None
    try:
        n = parse_memory(s)
    except ValueError as e:
        raise ValueError(f"--max-memory: {e}") from None
    if n < 1:
        raise ValueError(f"--max-memory must be positive, got {spec!r}")
    return n
