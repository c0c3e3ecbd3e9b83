"""Backend choice and hybrid CPU/GPU layer placement (`--backend`, `--gpu-layers`).

plan() decides, before anything is allocated on the device, which backend runs and how many
layers go to the GPU (the first N, as llama.cpp's -ngl; the output projection joins them when N
covers every layer); apply() uploads those layers' weights. The CUDA modules are imported only
when the cuda backend is chosen.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

log = logging.getLogger("edged.offload")

BACKENDS = ("auto", "cpu", "cuda")
SAFETY_MARGIN_BYTES = 512 * 2**20  # CUDA context, allocator slack, kernels' own buffers


class OffloadError(ValueError):
    """The requested backend or layer split cannot run here (raised at start, with the numbers)."""


@dataclass
class Placement:
    backend: str  # "cpu" or "cuda"
    gpu_layers: int  # the first gpu_layers layers run on the GPU
    output_on_gpu: bool
    summary: str  # one line for the log

    def describe(self) -> str:
        return self.summary


def parse_gpu_layers(spec) -> int | None:
    """'auto' (or None) -> None; 'N' -> N >= 0 (ValueError otherwise)."""
    if spec is None or str(spec).strip().lower() == "auto":
        return None
    try:
        n = int(str(spec).strip())
    except ValueError:
        raise ValueError(f"--gpu-layers must be a number of layers or 'auto', got {spec!r}") from None
    if n < 0:
        raise ValueError(f"--gpu-layers must be >= 0, got {n}")
    return n


def workspace_bytes(model, batch_tokens: int) -> int:
    """Device bytes one step's activations may take (float32 intermediates and logits rows)."""
    hp = model.hparams
    per_token = 4 * (3 * hp.n_ff + 6 * hp.n_embd + 4 * hp.n_heads * hp.head_dim)
    return batch_tokens * per_token + 64 * model.vocab_size * 4


def plan(model, backend: str = "auto", gpu_layers=None, *, kv_tokens=4096,
         batch_tokens: int = 512, probe=None) -> Placement:
    """Choose the backend and the GPU layer count for `model` holding KV for `kv_tokens` tokens:
    an int for every layer, or (full, window) when sliding-window layers have their own, smaller
    pool (window None: one pool for all).

    gpu_layers: None/'auto' = as many as fit in free device memory after their KV slabs, the step
    workspace and a safety margin; an int >= n_layers = every layer and the output projection.
    Raises OffloadError when cuda is asked for without a usable device or N layers do not fit.
    """
    if backend not in BACKENDS:
        raise OffloadError(f"--backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    want = parse_gpu_layers(gpu_layers)
    n_layers = model.n_layers
    if backend == "cpu":
        return Placement("cpu", 0, False, "backend cpu")
    from edged.backends.cuda.probe import simulator_enabled

    if backend == "auto" and probe is None and simulator_enabled():  # never import the simulator unasked
        return Placement("cpu", 0, False, "backend cpu (the CUDA simulator is only used when asked for)")
    if probe is None:
        from edged.backends.cuda.probe import probe
    dev = probe()
    if backend == "auto" and (not dev.usable or dev.simulated):
        why = dev.reason if not dev.usable else "the CUDA simulator is only used when asked for"
        log.info("backend auto: cpu (%s)", why)
        return Placement("cpu", 0, False, f"backend cpu ({why})")
    if not dev.usable:
        raise OffloadError(f"--backend cuda: {dev.reason}")
    full_tokens, window_tokens = kv_tokens if isinstance(kv_tokens, tuple) else (kv_tokens, None)
    layer_token_bytes = model.kv_bytes_per_token() // n_layers  # every layer has the same K/V shape
    layer_cost = [model.layer_bytes(i) + layer_token_bytes * (
        window_tokens if window_tokens is not None and model.layer_window(i) else full_tokens)
        for i in range(n_layers)]
    kv_desc = f"{full_tokens}" if window_tokens is None else f"{full_tokens} (sliding layers: {window_tokens})"
    out_cost = model.output_bytes()
    budget = dev.free_bytes - SAFETY_MARGIN_BYTES - workspace_bytes(model, batch_tokens)
    if want is None:  # auto: the first layers that fit, then the output projection if all did
        n, used = 0, 0
        while n < n_layers and used + layer_cost[n] <= budget:
            used += layer_cost[n]
            n += 1
        out = n == n_layers and used + out_cost <= budget
    else:
        n = min(want, n_layers)
        out = want >= n_layers
        used = sum(layer_cost[:n]) + (out_cost if out else 0)
        if used > budget:
            raise OffloadError(
                f"--gpu-layers {want}: {n} layers{' + output' if out else ''} need "
                f"{used / 2**20:.1f} MiB (weights + KV for {kv_desc} tokens), but only "
                f"{max(budget, 0) / 2**20:.1f} MiB of {dev.free_bytes / 2**20:.1f} MiB free remain after "
                f"the {SAFETY_MARGIN_BYTES // 2**20} MiB margin and the step workspace; lower "
                f"--gpu-layers, --ctx/--max-seqs or --kv-memory")
    summary = (f"backend cuda on {dev.describe()}: {n}/{n_layers} layers"
               f"{' + output' if out else ''} on the GPU ({used / 2**20:.0f} MiB incl. KV for "
               f"{kv_desc} tokens), the rest on the CPU")
    log.info("%s", summary)
    return Placement("cuda", n, out, summary)


def apply(model, placement: Placement) -> None:
    """Place the model's layers as planned (uploads weights; allocate KV afterwards)."""
    if placement.backend == "cpu" or (placement.gpu_layers == 0 and not placement.output_on_gpu):
        return
    from edged.backends.cuda import ops as cuda_ops

    host = model.host_ops
    layer_ops = [cuda_ops if i < placement.gpu_layers else host for i in range(model.n_layers)]
    model.place(layer_ops, cuda_ops if placement.output_on_gpu else host)
