"""Kernel benchmark: CPU matmul of every supported type at n = 1 and n = 16 against the memory
bandwidth and numpy's BLAS, measured in the same run (`edged bench --kernels`).

For each type: the default model's largest tensor of that type, or a synthesized random tensor
(edged.quant.synth) of the model's largest layer-matrix shape for types the file lacks. Times are
medians of `repeat` runs of the public `matmul` (activation quantization included).

Each tensor is timed twice: "hot", the same weights every call (a small tensor then sits in cache),
and "as in a forward pass", cycling through copies whose total exceeds twice the last-level cache,
so every call reads its weights from DRAM as a decode step does (the model's weights are far
larger than the cache, and each tensor is read once per step).

Before timing, the kernels' per-machine choices (backends/cpu/tuning.py) are made for the model's
shapes and the benchmark's tensors (read from the cache, or timed when missing or with `retune`);
the report lists each choice with the alternatives it beat, and the forward-pass figures of the
default knobs beside the tuned ones.
"""

import time
from dataclasses import asdict, dataclass

import numba as nb
import numpy as np

from edged.backends.cpu.cold_weights import dram_copies
from edged.quant.types import SUPPORTED_TYPES

N_BATCH = 16
DEFAULT_BW_BYTES = 1 << 30  # streaming buffer: far larger than the 32 MiB L3
@nb.njit(nogil=True, cache=True, fastmath=True)
def _chunk_sum(a):
    s = np.uint64(0)
    for i in range(a.shape[0]):
        s += a[i]
    return s


@nb.njit(parallel=True, nogil=True, cache=True)
def _stream_sum(chunks):
    """Sum of a uint64 buffer viewed as [n_chunks, chunk]: a pure streaming read, chunks over threads."""
    part = np.zeros(chunks.shape[0], np.uint64)
    for c in nb.prange(chunks.shape[0]):
        part[c] = _chunk_sum(chunks[c])
    return part.sum()


CLOCKS = {
    "wall": time.perf_counter,
    # process CPU time: a busy shared machine inflates it far less than wall time; with
    # NUMBA_NUM_THREADS=1 it is the kernel's own cost (with more threads it also counts spinning)
    "cpu": time.process_time,
}


def _median_time(fn, repeat: int, clock: str = "wall") -> float:
    """Median seconds per call over `repeat` samples; each sample loops enough calls to last ~2 ms."""
    return _median_times([fn], repeat, clock)[0]


def _median_times(fns, repeat: int, clock: str = "wall") -> list:
    """_median_time of each of fns, their samples taken in turn (a, b, a, b, ...): a ratio of two
    figures then compares calls made under the same machine conditions, not seconds apart."""
    now = CLOCKS[clock]
    inners = []
    for fn in fns:
        t0 = now()
        fn()  # warm-up: JIT, page faults, caches as in steady state
        inners.append(max(1, min(1000, int(2e-3 / max(now() - t0, 1e-7)))))
    times = [[] for _ in fns]
    for _ in range(repeat):
        for fn, inner, out in zip(fns, inners, times):
            fn()  # one call first: another function's data may have left the cache
            t0 = now()
            for _ in range(inner):
                fn()
            out.append((now() - t0) / inner)
    return [float(np.median(t)) for t in times]


def measure_bandwidth(nbytes: int = DEFAULT_BW_BYTES, repeat: int = 5, clock: str = "wall") -> float:
    """Streaming read bandwidth in GB/s (parallel Numba sum over an nbytes buffer, median)."""
    buf = np.ones((64, nbytes // 512), np.uint64)  # [64 chunks, ...]; written once: pages resident
    t = _median_time(lambda: _stream_sum(buf), repeat, clock)
    return buf.nbytes / t / 1e9


@dataclass
class KernelRow:
    """One type's figures; times in ms, rates in GB/s of weight bytes."""

    qtype: str
    tensor: str  # tensor name in the model, or "synthetic"
    shape: tuple
    mbytes: float
    ms_n1: float | None = None
    gbs_n1: float | None = None
    ms_n16: float | None = None
    gbs_n16: float | None = None
    blas_ms_n16: float | None = None
    bw_frac_n1: float | None = None  # gbs_n1 / streaming bandwidth
    cols_ratio: float | None = None  # token-columns/s at n=16 over n=1
    blas_ratio: float | None = None  # BLAS time / our time at n=16 (> 1: we are faster)
    # as in a forward pass: weights streamed from DRAM (see dram_copies)
    ms_n1_dram: float | None = None
    bw_frac_n1_dram: float | None = None
    ms_n16_dram: float | None = None
    cols_ratio_dram: float | None = None
    # the tuned variant at n = 1 / n = 16 and, where it is not the default, the default's fwd ms
    tuned_n1: str = "default"
    tuned_n16: str = "default"
    ms_n1_dram_default: float | None = None
    ms_n16_dram_default: float | None = None
    note: str = ""


def pick_tensors(model_path=None):
    """{qtype: (QTensor, source)} for every supported type: the model's largest 2-D tensor of that
    type, else a synthesized one shaped like the model's largest layer matrix."""
    from edged.quant import load_gguf
    from edged.quant.synth import random_qtensor

    real, layer_shape = {}, None
    if model_path is not None:
        gf = load_gguf(model_path)
        for t in gf.tensors.values():
            if len(t.shape) != 2:
                continue
            best = real.get(t.qtype)
            if best is None or t.data.nbytes > best.data.nbytes:
                real[t.qtype] = t
            if "blk." in t.name and (layer_shape is None or t.shape[0] * t.shape[1] > layer_shape[0] * layer_shape[1]):
                layer_shape = t.shape
    rows, cols = layer_shape or (2048, 640)
    out = {}
    for qtype in SUPPORTED_TYPES:
        if qtype in real:
            out[qtype] = (real[qtype], real[qtype].name)
        else:
            out[qtype] = (random_qtensor(qtype, rows, cols, seed=int(qtype)), "synthetic")
    return out


def bench_tensor(w, source, bandwidth, repeat=5, clock="wall", dram: bool = True,
                 cache_bytes: int | None = None) -> KernelRow:
    """Our figures for one tensor (see KernelRow; the BLAS columns come from bench_blas); with
    `dram`, also the forward-pass figures over copies larger than the cache."""
    import sys

    import edged.backends.cpu.matmul  # noqa: F401
    mm = sys.modules["edged.backends.cpu.matmul"]  # the package re-exports `matmul` over the module name
    m, k = w.shape
    row = KernelRow(w.qtype.name, source, tuple(w.shape), w.data.nbytes / 1e6)
    try:
        mm.check_supported(w.qtype)
    except ValueError as e:
        row.note = f"skipped: {e}"
        return row
    w = mm.for_matmul(w)  # in the layout the forward runs it (grouped rows for the legacy types)
    rng = np.random.default_rng(0)
    x1 = rng.standard_normal((1, k)).astype(np.float32)
    x16 = rng.standard_normal((N_BATCH, k)).astype(np.float32)
    y1 = np.empty((1, m), np.float32)
    y16 = np.empty((N_BATCH, m), np.float32)
    t1, t16 = _median_times([lambda: mm.matmul(w, x1, out=y1), lambda: mm.matmul(w, x16, out=y16)], repeat, clock)
    nbytes = w.data.nbytes
    row.ms_n1, row.gbs_n1 = t1 * 1e3, nbytes / t1 / 1e9
    row.ms_n16, row.gbs_n16 = t16 * 1e3, nbytes / t16 / 1e9
    row.bw_frac_n1 = row.gbs_n1 / bandwidth
    row.cols_ratio = (N_BATCH / t16) / (1 / t1)
    row.tuned_n1, row.tuned_n16 = (_tuned_label(w, n) for n in (1, N_BATCH))
    if dram:
        copies = dram_copies(w, cache_bytes)
        turn = [0]

        def call(x, y):
            c = copies[turn[0] % len(copies)]
            turn[0] += 1
            mm.matmul(c, x, out=y)

        # the default knobs beside the tuned ones, where tuning chose others (interleaved samples)
        from edged.backends.cpu.typed_kernel import DEFAULT_KNOBS

        def call_default(x, y):
            c = copies[turn[0] % len(copies)]
            turn[0] += 1
            mm.matmul_knobs(c, x, DEFAULT_KNOBS, out=y)

        fns = [lambda: call(x1, y1), lambda: call(x16, y16)]
        fns += [lambda: call_default(x1, y1)] if row.tuned_n1 != "default" else []
        fns += [lambda: call_default(x16, y16)] if row.tuned_n16 != "default" else []
        times = _median_times(fns, repeat, clock)
        d1, d16 = times[:2]
        rest = iter(times[2:])
        row.ms_n1_dram_default = next(rest) * 1e3 if row.tuned_n1 != "default" else None
        row.ms_n16_dram_default = next(rest) * 1e3 if row.tuned_n16 != "default" else None
        row.ms_n1_dram, row.ms_n16_dram = d1 * 1e3, d16 * 1e3
        row.bw_frac_n1_dram = nbytes / d1 / 1e9 / bandwidth
        row.cols_ratio_dram = N_BATCH * d1 / d16
        del copies
    return row


def _tuned_label(w, n: int) -> str:
    """The installed tuning choice for w at batch n as a variant label ("default" when it is the
    defaults' kernel and knobs; the kernel named when the tuned crossover changed it)."""
    import sys

    from edged.backends.cpu.tuning import Variant

    mm = sys.modules["edged.backends.cpu.matmul"]
    choice = mm.tuned().get((w.qtype, *w.shape))
    if choice is None:
        return "default"
    cls = mm.size_class(w.qtype, n, choice[3])  # the tuned crossover decides gemv or gemm
    label = Variant(*choice[cls]).label
    if (cls == 2) != (mm.size_class(w.qtype, n) == 2):
        label = ("gemm" if cls == 2 else "gemv") + ("" if label == "default" else " " + label)
    return label


def tune(model_path, tensors: dict, retune: bool = False, budget: float | None = None, log=print) -> dict:
    """backends/cpu/tuning.ensure over the model's matrices and the benchmark's tensors; logs one
    line per shape and size class: the choice and each alternative's time relative to the default."""
    from edged.backends.cpu import tuning
    from edged.quant import load_gguf

    model = [t for t in load_gguf(model_path).tensors.values() if len(t.shape) in (2, 3)] if model_path else []
    mats = model + [w for w, _ in tensors.values()]
    # the model's own shapes first, each call with the whole budget: synthetic tensors only show a type
    reports = [tuning.ensure(part, retune=retune or None, budget=budget) for part in (model, mats) if part]
    report = reports[-1]
    if report["mode"] == "off":
        log("kernel tuning off (EDGED_TUNE=0): every kernel's defaults")
        return report
    timed = sum(len(r["tuned"]) for r in reports)
    log(f"kernel tuning ({tuning.cpu_key()}): {timed} shape classes timed now in "
        f"{sum(r['seconds'] for r in reports):.1f} s, the rest from {report['path']}")
    for r in reports:
        for note in (r.get("deferred"), r.get("busy") and f"timed although {r['busy']}: other processes' time is in"):
            if note:
                log(f"kernel tuning: {note}")
    log(format_tuning(report["shapes"], {tuning.shape_key(*g) for g in tuning.group_tensors(mats)}))
    return report


def format_tuning(shapes: dict, keys) -> str:
    """One line per shape and size class of `keys`: the choice, the default's ms and every variant's
    time over the default's (< 1: faster); for the crossover the gemv's largest n and gemm's time
    over gemv's at each n compared."""
    lines = [f"{'shape':<22} {'class':<9} {'n':>3} {'chosen':<22} {'default ms':>10}  alternatives (time / default)"]
    for key in sorted(k for k in keys if k in shapes):
        for cls, e in shapes[key].items():
            n = e.get("n", "")
            if "skipped" in e:
                lines.append(f"{key:<22} {cls:<9} {n:>3} {'default (skipped: ' + e['skipped'] + ')':<22}")
            elif "gemv_max_n" in e:
                ms = e["ms"]
                ns = sorted({int(lab.split("=")[1]) for lab in ms})
                alts = " ".join(f"n={m} {ms[f'gemm n={m}'] / ms[f'gemv n={m}']:.2f}" for m in ns)
                lines.append(f"{key:<22} {cls:<9} {'':>3} {'gemv up to n=' + str(e['gemv_max_n']):<22} {'':>10}  "
                             f"gemm / gemv: {alts}")
            else:
                base = e["ms"].get("default")
                alts = " ".join(f"{lab} {t / base:.2f}" for lab, t in e["ms"].items() if lab != "default" and base)
                lines.append(f"{key:<22} {cls:<9} {n:>3} {e['choice']:<22} {_f(base, '10.4f')}  {alts}")
    return "\n".join(lines)


def bench_blas(w, row: KernelRow, repeat=5, clock="wall") -> None:
    """numpy BLAS x16 @ W_f32.T on the dequantized weights; fills row.blas_ms_n16 / blas_ratio."""
    from edged.quant.dequant import dequantize

    m, k = w.shape
    x16 = np.random.default_rng(0).standard_normal((N_BATCH, k)).astype(np.float32)
    wf = np.ascontiguousarray(dequantize(w), dtype=np.float32).reshape(m, k)  # [m, k]
    tb = _median_time(lambda: x16 @ wf.T, repeat, clock)
    row.blas_ms_n16 = tb * 1e3
    if row.ms_n16:
        row.blas_ratio = row.blas_ms_n16 / row.ms_n16


def run(model_path=None, repeat: int = 5, bw_bytes: int = DEFAULT_BW_BYTES, blas: bool = True, log=print,
        clock: str = "wall", retune: bool = False, tune_budget: float | None = None) -> dict:
    """The whole benchmark: {"bandwidth_gbs", "threads", "repeat", "clock", "tuning": the cache's
    shapes, "rows": [KernelRow as dict]}. retune: time every tuning variant again."""
    tensors = pick_tensors(model_path)
    tuning = tune(model_path, tensors, retune, tune_budget, log)
    bandwidth = measure_bandwidth(bw_bytes, repeat, clock)
    log(f"streaming read bandwidth: {bandwidth:.1f} GB/s ({bw_bytes >> 20} MiB buffer); "
        f"{nb.get_num_threads()} threads; {clock} clock; median of {repeat} runs")
    log(HEADER)
    # all our kernels first, then all BLAS runs: OpenBLAS threads keep spinning after a call and
    # would steal the 2 cores from the next Numba kernel (and Numba's omp threads from BLAS)
    rows = [bench_tensor(w, source, bandwidth, repeat, clock) for w, source in tensors.values()]
    if blas:
        for (w, _), r in zip(tensors.values(), rows):
            if not r.note:
                bench_blas(w, r, repeat, clock)
    for r in rows:
        log(format_row(r))
    log(FOOTNOTE)
    log(format_tuned_rows(rows))
    return {"bandwidth_gbs": bandwidth, "threads": nb.get_num_threads(), "repeat": repeat, "clock": clock,
            "tuning": tuning["shapes"], "rows": [asdict(r) for r in rows]}


def format_tuned_rows(rows) -> str:
    """Tuned vs default knobs per type, as in a forward pass (fwd ms; '=' where tuning kept the default)."""
    lines = [f"{'type':<7} {'shape':>13} | {'n=1 tuned':<22} {'default':>8} {'tuned':>8} {'x':>5} | "
             f"{'n=16 tuned':<22} {'default':>8} {'tuned':>8} {'x':>5}"]
    for r in rows:
        if r.note or r.ms_n1_dram is None:
            continue
        cells = []
        for lab, d, t in ((r.tuned_n1, r.ms_n1_dram_default, r.ms_n1_dram),
                          (r.tuned_n16, r.ms_n16_dram_default, r.ms_n16_dram)):
            if d is None:
                cells.append(f"{lab:<22} {'=':>8} {t:8.3f} {'':>5}")
            else:
                cells.append(f"{lab:<22} {d:8.3f} {t:8.3f} {d / t:5.2f}")
        lines.append(f"{r.qtype:<7} {'x'.join(map(str, r.shape)):>13} | " + " | ".join(cells))
    lines.append("x: default time over tuned (> 1: the tuned variant is faster), fwd ms as above")
    return "\n".join(lines)


HEADER = (
    f"{'type':<7} {'tensor':<22} {'shape':>13} {'MB':>7} | {'n=1 ms':>8} {'GB/s':>6} {'%bw':>5} | "
    f"{'n=16 ms':>8} {'GB/s':>6} {'cols x':>6} | {'BLAS ms':>8} {'BLAS/us':>7} | "
    f"{'fwd n=1':>7} {'%bw':>5} {'n=16':>7} {'cols x':>6}"
)


FOOTNOTE = ("%bw: n=1 GB/s over the streaming bandwidth; cols x: token-columns/s at n=16 over n=1; "
            "BLAS/us: numpy x @ W_f32.T time over ours at n=16 (>1: we are faster); fwd: the same "
            "as in a forward pass, weights read from DRAM (copies cycled past the last-level cache), ms")


def _f(v, fmt):
    return format(v, fmt) if v is not None else "-"


def format_row(r: KernelRow) -> str:
    if r.note:
        return f"{r.qtype:<7} {r.tensor[:22]:<22} {'x'.join(map(str, r.shape)):>13} {r.mbytes:7.2f} | {r.note}"
    return (
        f"{r.qtype:<7} {r.tensor[:22]:<22} {'x'.join(map(str, r.shape)):>13} {r.mbytes:7.2f} | "
        f"{_f(r.ms_n1, '8.3f')} {_f(r.gbs_n1, '6.1f')} {_f(r.bw_frac_n1 and 100 * r.bw_frac_n1, '5.0f')} | "
        f"{_f(r.ms_n16, '8.3f')} {_f(r.gbs_n16, '6.1f')} {_f(r.cols_ratio, '6.1f')} | "
        f"{_f(r.blas_ms_n16, '8.3f')} {_f(r.blas_ratio, '7.2f')} | "
        f"{_f(r.ms_n1_dram, '7.3f')} {_f(r.bw_frac_n1_dram and 100 * r.bw_frac_n1_dram, '5.0f')} "
        f"{_f(r.ms_n16_dram, '7.3f')} {_f(r.cols_ratio_dram, '6.1f')}"
    )


def format_table(result: dict) -> str:
    """The printed report: bandwidth line, header, one line per type."""
    lines = [
        f"streaming read bandwidth: {result['bandwidth_gbs']:.1f} GB/s; {result['threads']} threads; "
        f"{result.get('clock', 'wall')} clock; median of {result['repeat']} runs",
        HEADER,
    ]
    rows = [KernelRow(**{**r, "shape": tuple(r["shape"])}) for r in result["rows"]]
    lines += [format_row(r) for r in rows]
    lines += [FOOTNOTE, format_tuned_rows(rows)]
    return "\n".join(lines)
