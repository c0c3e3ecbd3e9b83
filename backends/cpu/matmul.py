"""CPU quantized matmul: one dispatch table from GGUF type to Numba kernels.

Public API
    matmul(w: QTensor, x float32 [n, k], *, qx=None, out=None) -> y float32 [n, m]
        y = x @ W.T where W is w dequantized [m, k]; any n >= 1 (decode n=1, prefill/batches 512+).
        For types whose traits().act_format == "q8_32", x is quantized ONCE per call with
        backends/cpu/act_quant.quantize_activations (or pass qx = quantize_activations(x) to share
        it between several matmuls of the same x, e.g. the q/k/v projections).
    matmuls(ws, x) -> [y float32 [n, m_i]] matmul of each weight, x quantized once for all of them
    check_supported(qtype) -> None        raises ValueError naming the type if no kernel exists
    supported_types() -> tuple            types with kernels, in TYPE_TRAITS order
    kernels_for(qtype, grouped=False)      the two Numba kernels of a type (for inspect_asm, benches)
    for_matmul(w) -> QTensor               w in the layout the CPU backend runs on where its type has
                                           one: grouped rows (legacy_groups.py), row pairs (kquant_pairs.py)
    gemv_max_n(qtype) -> int               the largest n that matmul hands to the type's gemv
    gemv_args(w, n) -> tuple | None        which gemv matmul would call, and with which arguments
    set_tuned(choices) / tuned()           per-shape kernel knobs and gemv/gemm crossover chosen on
                                           this machine (tuning.py)
    matmul_knobs(w, x, knobs, kernel=)     matmul with the given knobs (the tuner's timing call)

Kernel-module contract
    Each kernel module (matmul_float.py, matmul_legacy.py, matmul_kquants.py) exports
    `KERNELS: dict[GGMLQuantizationType, tuple[gemv, gemm]]`, both with the same signature:
      act_format "q8_32":  f(w_rows uint8 [m, row_bytes], xq int8 [n, k], xd float32 [n, k/32],
                             xs int32 [n, k/32], y float32 [n, m]) -> None   (writes every y[t, r])
      act_format "f32":    f(w_rows uint8 [m, row_bytes], x float32 [n, k], y float32 [n, m]) -> None
    All arrays are C-contiguous. gemv is called for n <= the module's GEMV_MAX_N (this module's
    GEMV_MAX_N where it has none), gemm (weight blocks read once per tile of tokens) for larger n;
    both accept any n. Kernels may assume valid shapes: this module checks.
    Both are TypedKernels (typed_kernel.py) over a dispatcher that also takes four run-time knobs
    (tasks, prefetch, mode, threads), all 0 for the kernel's built-in choices; they change how rows
    are split into tasks, what is prefetched, how tokens share a vector and how many threads run,
    never a row's float operations, so every knob setting gives the same bits. `KNOBS` (optional)
    names the values the tuner may try for each kernel besides task and thread counts.

Per-machine tuning (backends/cpu/tuning.py) picks the knobs per (type, m, k) and size class
(n = 1, gemv n > 1, gemm), and the largest n given to the gemv (gemv and gemm give the same bits
for every type: tests/backends/test_batch_invariance.py), and installs them with set_tuned;
matmul then reads them with one dict lookup a call.
"""

import numpy as np

from edged.backends.cpu.act_quant import quantize_activations
from edged.backends.cpu.kquant_pairs import paired, pairs_rows
from edged.quant.tensor import QTensor
from edged.quant.types import TYPE_TRAITS, traits

from edged.backends.cpu import matmul_float, matmul_kquants, matmul_legacy
from edged.backends.cpu import matmul_iqgrid
from edged.backends.cpu import matmul_lowbit
from edged.backends.cpu.typed_kernel import DEFAULT_KNOBS

# n at or below which gemv is used unless the kernel module sets its own: gemv reads each row once
# for all n tokens but costs a full block dot per token, while gemm pays a 16-token tile whatever
# n is; the measured crossover is n = 4 (the legacy types' gemv stays ahead up to 24).
GEMV_MAX_N = 4


def _merge_tables():
    """qtype -> (gemv, gemm), and qtype -> the module's gemv threshold."""
    table, max_n = {}, {}
    for mod in (matmul_float, matmul_legacy, matmul_kquants, matmul_iqgrid, matmul_lowbit):
        for qtype, pair in mod.KERNELS.items():
            if qtype in table:
                raise RuntimeError(f"two kernel modules claim {qtype.name}")
            table[qtype] = pair
            max_n[qtype] = getattr(mod, "GEMV_MAX_N", GEMV_MAX_N)
    return table, max_n


_KERNELS, _GEMV_MAX_N = _merge_tables()


def supported_types() -> tuple:
    """Types that have a matmul kernel, in TYPE_TRAITS order."""
    return tuple(t for t in TYPE_TRAITS if t in _KERNELS)


def check_supported(qtype) -> None:
    """Raise ValueError (naming the type) unless matmul has a kernel for `qtype`; call at load time."""
    tt = traits(qtype)  # ValueError for types edged does not know at all
    if tt.qtype not in _KERNELS:
        names = ", ".join(t.name for t in supported_types())
        raise ValueError(f"no CPU matmul kernel for tensor type {tt.qtype.name}; supported: {names}")


# kernels over the CPU's own copy of a weight (QTensor.grouped): the legacy types' grouped rows
# (legacy_groups.py), the K-quants' row pairs (kquant_pairs.py)
_GROUPED_KERNELS = {**matmul_legacy.GROUPED_KERNELS, **matmul_kquants.PAIRED_KERNELS}


def kernels_for(qtype, grouped: bool = False):
    """(gemv, gemm) Numba dispatchers for `qtype` (ValueError if unsupported), those over the
    CPU's own layout (grouped rows, row pairs) with grouped=True (KeyError for a type that has none)."""
    check_supported(qtype)
    return (_GROUPED_KERNELS if grouped else _KERNELS)[traits(qtype).qtype]


def gemv_max_n(qtype) -> int:
    """The largest batch that matmul runs through `qtype`'s gemv (ValueError if unsupported)."""
    check_supported(qtype)
    return _GEMV_MAX_N[traits(qtype).qtype]


def _launch(pair):
    """(gemv dispatcher, gemm dispatcher, per size class the default trailing args): the kernels'
    dispatchers called directly with their bound type and knobs (TypedKernel adds a Python call)."""
    gv, gm = pair
    return gv.kernel, gm.kernel, tuple(k.extra + DEFAULT_KNOBS for k in (gv, gv, gm))


# qtype -> (gemv, gemm, default args per size class, takes q8_32 activations, gemv's largest n): one
# dict lookup per call instead of enum conversions and trait lookups (Python time a small decode
# matmul notices)
_DISPATCH = {
    qtype: (*_launch(pair), traits(qtype).act_format == "q8_32", _GEMV_MAX_N[qtype]) for qtype, pair in _KERNELS.items()
}
# the same for weights whose rows are grouped (QTensor.grouped)
_DISPATCH_GROUPED = {qtype: (*_launch(pair), True, _GEMV_MAX_N[qtype]) for qtype, pair in _GROUPED_KERNELS.items()}

# (qtype, m, k, grouped) -> (per size class (n = 1, gemv n > 1, gemm) the kernel's trailing args:
# bound type + knobs; then the gemv's largest n); set by set_tuned, empty (every kernel's defaults) otherwise
_TUNED: dict = {}
_TUNED_SETS = [0]  # set_tuned calls so far (tuned_version)


def for_matmul(w: QTensor, fits=None) -> QTensor:
    """w as the CPU's matmul reads it fastest: a 2-D weight of a legacy type as a grouped copy
    (legacy_groups.py), a K-quant matrix or stack of experts' matrices with an even row count as
    a row-pair copy (kquant_pairs.py), anything else w itself. fits(nbytes) -> bool, where given,
    may refuse the copy (w itself then)."""
    if w.grouped or w.qtype not in _DISPATCH_GROUPED:
        return w
    legacy = w.qtype in matmul_legacy.GROUPED_KERNELS
    if not (len(w.shape) == 2 if legacy else pairs_rows(w)) or (fits is not None and not fits(w.data.nbytes)):
        return w
    return matmul_legacy.grouped(w) if legacy else paired(w)


def fuses_rows(qtype) -> bool:
    """Whether the decoder may concatenate same-typed weights over one input (q|k|v, gate|up) into
    one matrix for this backend: where for_matmul copies that type anyway (grouped rows, row
    pairs), so the concatenation costs no memory beyond that copy."""
    return qtype in _DISPATCH_GROUPED


SIZE_CLASSES = ("n1", "gemv", "gemm")


def size_class(qtype, n: int, max_n: int | None = None) -> int:
    """Index in SIZE_CLASSES of a matmul of n tokens: n = 1, other gemv batches (n <= max_n, by
    default the type's gemv_max_n), gemm."""
    return 0 if n == 1 else (1 if n <= (max_n or gemv_max_n(qtype)) else 2)


def takes_q8(qtype) -> bool:
    """Whether `qtype`'s kernels take quantize_activations' q8_32 activations (False: float, or a
    type without a kernel, which matmul names)."""
    plan = _DISPATCH.get(qtype)
    return plan is not None and plan[3]


def set_tuned(choices: dict) -> None:
    """Install tuned choices: {(qtype, m, k): (knobs_n1, knobs_gemv, knobs_gemm[, gemv_max_n])},
    knobs (tasks, prefetch, mode, threads) as typed_kernel.DEFAULT_KNOBS, gemv_max_n the largest
    n for the gemv (left out or None: the type's default); {} restores every kernel's defaults."""
    table = {}
    for (qtype, m, k), entry in choices.items():
        check_supported(qtype)
        nc = len(SIZE_CLASSES)
        classes, max_n = entry[:nc], (entry[nc] if len(entry) > nc else None)
        if (len(classes) != len(SIZE_CLASSES) or len(entry) > len(SIZE_CLASSES) + 1
                or any(len(kn) != len(DEFAULT_KNOBS) for kn in classes) or (max_n is not None and max_n < 1)):
            raise ValueError(f"tuned {qtype.name} [{m}, {k}]: {entry!r} is not {len(SIZE_CLASSES)} size classes "
                             f"of {len(DEFAULT_KNOBS)} knobs and an optional gemv_max_n >= 1")
        qt = traits(qtype).qtype
        for grouped in (False, True) if qt in _DISPATCH_GROUPED else (False,):
            gv, gm = kernels_for(qtype, grouped)
            table[(qt, int(m), int(k), grouped)] = (
                *(kern.extra + tuple(int(v) for v in knobs) for kern, knobs in zip((gv, gv, gm), classes)),
                int(max_n) if max_n is not None else gemv_max_n(qtype))
    _TUNED.clear()
    _TUNED.update(table)
    _TUNED_SETS[0] += 1


def tuned_version() -> int:
    """A number that changes whenever set_tuned installs choices (for callers that keep
    gemv_args' answers)."""
    return _TUNED_SETS[0]


def tuned() -> dict:
    """The installed choices, as set_tuned takes them (gemv_max_n always given)."""
    nk = len(DEFAULT_KNOBS)
    return {key[:3]: (*(args[-nk:] for args in entry[:-1]), entry[-1]) for key, entry in _TUNED.items() if not key[3]}


def matmul(w: QTensor, x: np.ndarray, *, qx=None, out: np.ndarray | None = None) -> np.ndarray:
    """y float32 [n, m] = x @ W.T for a GGUF weight w [m, k] and float32 activations x [n, k].

    qx: optional (xq, xd, xs) = quantize_activations(x), reused instead of quantizing again.
    out: optional float32 C-contiguous [n, m] buffer to write into (returned).
    """
    if not isinstance(w, QTensor):
        raise TypeError(f"matmul weight must be a QTensor, got {type(w).__name__}")
    if len(w.shape) != 2:
        raise ValueError(f"matmul weight {w.name!r} must be 2-D, got shape {w.shape}")
    plan = (_DISPATCH_GROUPED if w.grouped else _DISPATCH).get(w.qtype)
    if plan is None:
        check_supported(w.qtype)  # raises, naming the type
    gemv, gemm, defaults, q8, max_n = plan
    m, k = w.shape
    if type(x) is not np.ndarray:
        x = np.asarray(x)
    if x.dtype != np.float32:
        raise ValueError(f"matmul activations must be float32, got {x.dtype}")
    if x.ndim != 2 or x.shape[1] != k:
        raise ValueError(f"matmul {w.name!r} [{m}, {k}] needs x of shape [n, {k}], got {x.shape}")
    n = x.shape[0]
    if out is None:
        out = np.empty((n, m), dtype=np.float32)  # [n, m]
    elif out.shape != (n, m) or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"out must be C-contiguous float32 [{n}, {m}], got {out.dtype} {out.shape}")
    if n == 0:
        return out
    tuned = _TUNED.get((w.qtype, m, k, w.grouped)) if _TUNED else None
    if tuned is not None:
        max_n = tuned[3]
    cls = 0 if n == 1 else (1 if n <= max_n else 2)
    kern = gemv if cls < 2 else gemm
    args = (defaults if tuned is None else tuned)[cls]  # the bound type, then the knobs
    rows = w.rows()  # uint8 [m, row_bytes]
    if q8:
        if qx is None:
            qx = quantize_activations(x)
        xq, xd, xs = qx
        if xq.shape != (n, k) or xd.shape != (n, k // 32) or xs.shape != (n, k // 32):
            raise ValueError(f"qx shapes {xq.shape}, {xd.shape}, {xs.shape} do not match x {x.shape}")
        kern(rows, xq, xd, xs, out, *args)
    else:
        kern(rows, x if x.flags.c_contiguous else np.ascontiguousarray(x), out, *args)
    return out


# the legacy types' gemv dispatchers (one per type and layout) in a fixed order: the index
# gemv_args gives them, which attn_step's compiled switch calls by
LEGACY_GEMVS = tuple(table[qt][0].kernel for qt in matmul_legacy.KIND
                     for table in (matmul_legacy.KERNELS, matmul_legacy.GROUPED_KERNELS))
_LEGACY_INDEX = {id(g): i for i, g in enumerate(LEGACY_GEMVS)}


def gemv_args(w: QTensor, n: int) -> tuple | None:
    """How matmul(w, x [n, k]) calls its gemv, as 7 ints (family, sub, paired, tasks, prefetch,
    mode, threads), tuned knobs included: family 0 is matmul_kquants.gemv_kquant (sub its kind),
    1 the legacy types' gemv LEGACY_GEMVS[sub]. None where matmul would call another kernel
    (another type, or n past the gemv's batch). A compiled call that runs that gemv with these
    gives matmul's bits."""
    if len(w.shape) != 2:
        return None
    plan = (_DISPATCH_GROUPED if w.grouped else _DISPATCH).get(w.qtype)
    if plan is None:
        return None
    m, k = w.shape
    tuned = _TUNED.get((w.qtype, m, k, w.grouped)) if _TUNED else None
    max_n = plan[4] if tuned is None else tuned[3]
    if not 1 <= n <= max_n:
        return None
    args = (plan[2] if tuned is None else tuned)[0 if n == 1 else 1]
    if plan[0] is matmul_kquants.gemv_kquant:
        return (0, *args)  # (kind, paired, 4 knobs)
    legacy = _LEGACY_INDEX.get(id(plan[0]))
    return None if legacy is None else (1, legacy, 0, *args)  # args: the 4 knobs


def matmuls(ws, x: np.ndarray) -> list:
    """[matmul(w, x) for w in ws] with x quantized once for every weight that takes q8_32
    activations: a layer's q, k and v (or gate and up) of different types share one quantization."""
    q8 = [isinstance(w, QTensor) and takes_q8(w.qtype) for w in ws]
    qx = None
    # a width that matches every q8 weight's k is a multiple of 32; else each matmul names what is wrong
    if sum(q8) > 1 and isinstance(x, np.ndarray) and x.dtype == np.float32 and x.ndim == 2 \
            and all(w.shape[-1] == x.shape[1] for w, q in zip(ws, q8) if q):
        qx = quantize_activations(x)
    return [matmul(w, x, qx=qx if q else None) for w, q in zip(ws, q8)]


def matmul_knobs(w: QTensor, x: np.ndarray, knobs, *, kernel: str | None = None, qx=None, out=None) -> np.ndarray:
    """matmul(w, x) through `kernel` ("gemv" or "gemm"; None: the one the type's default gemv_max_n
    picks), run with `knobs` (tasks, prefetch, mode, threads) instead of the installed choice: the
    tuner times variants so, and tests check that each gives the same bits. Inputs are not checked."""
    n = x.shape[0]
    m, k = w.shape
    gemv, gemm, defaults, q8, max_n = (_DISPATCH_GROUPED if w.grouped else _DISPATCH)[traits(w.qtype).qtype]
    cls = 0 if n == 1 else (1 if n <= max_n else 2)
    if kernel is not None:
        cls = 2 if kernel == "gemm" else min(cls, 1)
    if out is None:
        out = np.empty((n, m), dtype=np.float32)  # [n, m]
    args = defaults[cls][: -len(DEFAULT_KNOBS)] + tuple(knobs)
    kern = gemv if cls < 2 else gemm
    if q8:
        kern(w.rows(), *(qx if qx is not None else quantize_activations(x)), out, *args)
    else:
        kern(w.rows(), np.ascontiguousarray(x), out, *args)
    return out
