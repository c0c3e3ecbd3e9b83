"""Backend choice and hybrid CPU/GPU layer placement (`--backend`, `--gpu-layers`).

plan() decides, before anything is allocated on the device, which backend runs and how many
layers go to the GPU (the first N, as llama.cpp's -ngl; the output projection joins them when N
covers every layer); apply() uploads those layers' weights. The CUDA modules are imported only
when the cuda backend is chosen.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from edged.models.decoder import layer_matrices, unsupported_matrix

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


def _device_ops(device_ops):
    """The GPU's backend ops: `device_ops` when given (tests), else the CUDA backend (imported here)."""
    if device_ops is None:
        from edged.backends.cuda import ops as device_ops
    return device_ops


def _type_checker(device_ops):
    """What answers check_supported(qtype) for the device: `device_ops` when given (tests), else
    the CUDA backend's type table (no numba.cuda import)."""
    if device_ops is None:
        from edged.backends.cuda import types as device_ops
    return device_ops


def host_only_from(model, device_ops) -> tuple[int, str]:
    """(i, why): layers i and after stay on the host because layer i is a mixture-of-experts layer
    and the device backend lacks ops it needs (models/moe.py REQUIRED_OPS), or layer i holds a
    tensor type the device has no matmul kernel for; (n_layers, "") if neither."""
    layers = getattr(model, "layers", ())
    moe = [i for i, lw in enumerate(layers) if getattr(lw, "moe", None) is not None]
    if moe:  # the device's ops are imported only for a MoE model
        from edged.models.moe import missing_ops

        lack = missing_ops(_device_ops(device_ops))
        if not lack:
            moe = []
    checker = _type_checker(device_ops)
    for i, lw in enumerate(layers):
        if moe and i == moe[0]:
            return i, (f"the {len(moe)} mixture-of-experts layers stay on the CPU (the GPU backend has no "
                       f"{', '.join(lack)})")
        why = unsupported_matrix(checker, layer_matrices(lw))
        if why:
            return i, f"layers {i} and after stay on the CPU ({why})"
    return model.n_layers, ""


def plan(model, backend: str = "auto", gpu_layers=None, *, kv_tokens=4096,
         batch_tokens: int = 512, probe=None, device_ops=None) -> Placement:
    """Choose the backend and the GPU layer count for `model` holding KV for `kv_tokens` tokens:
    an int for every layer, or (full, window) when sliding-window layers have their own, smaller
    pool (window None: one pool for all).

    gpu_layers: None/'auto' = as many as fit in free device memory after their KV slabs, the step
    workspace and a safety margin; an int >= n_layers = every layer and the output projection.
    Raises OffloadError when cuda is asked for without a usable device or N layers do not fit.
    Mixture-of-experts layers the device backend cannot run (device_ops: the CUDA ops unless
    given), and layers holding a tensor type it has no kernel for, stay on the host with every
    layer after them (a hybrid split, said in the summary); the output projection still joins the
    GPU when the layers before them fit (auto) or N >= n_layers, and its type has a kernel.
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
    limit, host_why = host_only_from(model, device_ops)  # layers limit.. stay on the host
    out_ok = not unsupported_matrix(_type_checker(device_ops), [(model.output.name, model.output)])
    if not out_ok:
        host_why = "; ".join(filter(None, (host_why, "the output projection stays on the CPU (no CUDA kernel for its type)")))
    if want is None:  # auto: the first layers that fit, then the output projection if all did
        n, used = 0, 0
        while n < limit and used + layer_cost[n] <= budget:
            used += layer_cost[n]
            n += 1
        out = out_ok and n == limit and used + out_cost <= budget
    else:
        n = min(want, limit)
        out = out_ok and want >= n_layers
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
               f"{kv_desc} tokens), the rest on the CPU{'; ' + host_why if host_why else ''}")
    log.info("%s", summary)
    return Placement("cuda", n, out, summary)


def apply(model, placement: Placement, device_ops=None) -> None:
    """Place the model's layers as planned (uploads weights; allocate KV afterwards); device_ops:
    the GPU's backend (the CUDA ops unless given)."""
    if placement.backend == "cpu" or (placement.gpu_layers == 0 and not placement.output_on_gpu):
        return
    cuda_ops = _device_ops(device_ops)
    host = model.host_ops
    layer_ops = [cuda_ops if i < placement.gpu_layers else host for i in range(model.n_layers)]
    model.place(layer_ops, cuda_ops if placement.output_on_gpu else host)
