"""Per-machine choice of the CPU matmul kernels' knobs (issue 17 item 1).

The kernels' fixed constants (rows per prange task, task counts, no prefetch, token pairs in
512-bit vectors, all threads) were measured on one CPU. On a model's first load here, and again
when the CPU, the thread count or the kernel sources change, `ensure` times a few variants of each
kernel on the model's real weight shapes and keeps the fastest per (type, m, k) and size class
(matmul.SIZE_CLASSES: n = 1, gemv n > 1, gemm), and the batch at which the gemv hands over to the
gemm, within a few seconds in all. Every variant only changes how rows are split into tasks, what
is prefetched, how tokens share a vector or how many threads run: never a row's float
operations, so any choice gives the same bits (tested), and gemv and gemm rows are bit-identical
for every type (batch invariance), so the crossover moves no bit either.

The choices are cached as JSON beside the compiled kernels (NUMBA_CACHE_DIR, whose name carries
the kernel source hash), one file per CPU key, and installed with matmul.set_tuned.
EDGED_TUNE=0: every kernel's defaults, nothing read or timed; EDGED_TUNE=force: re-tune at
load; unset: tune what is missing, except inside the test suite (PYTEST_CURRENT_TEST) unless
EDGED_TUNE=1. EDGED_TUNE_BUDGET_S sets the time budget (DEFAULT_BUDGET_S).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import warnings
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType

from edged.quant.tensor import QTensor

FORMAT = 1
DEFAULT_BUDGET_S = 10.0  # once per CPU and model shapes; 3 s left most n = 1 classes untimed (Gemma 3 270M, Xeon)
MARGIN = 0.03  # a variant must beat the default by 3% to replace it: ties and noise keep the default
WIN_SHARE = 2 / 3  # ... and be faster than the default in this share of the rounds (paired, same round)
NOISY = 1.5  # a variant's median sample this far above its fastest: the machine was busy in most rounds
MIN_ROUNDS, MAX_ROUNDS = 3, 15
MAX_TENSORS = 32  # tensors of one shape cycled per sample (gemv classes: copied past the cache, cold_weights.py)
MIN_SAMPLE_S = 2e-4  # a sample repeats its pass over the tensors until it lasts this long
TASK_FACTORS = (1, 4, 16, 64)  # task counts tried: these multiples of the thread count
CROSSOVER_NS = (2, 4, 8, 16, 24, 32)  # batches at which gemv and gemm are compared
GEMM_N = 16  # the gemm class is timed at one 16-token tile through the gemm: a c = 16 decode step
# other processes' CPU time (steal included) while timing, as a share of all CPUs, past which the
# choices are not kept: one such tuning picked threads=1 for two gemm classes and left c = 16
# decode 8% slower until a retune (docs/kernels.md)
SHARED = 0.25
CROSSOVER = "crossover"  # the cache's entry for the gemv's largest n, beside the size classes


class TuningCacheWarning(UserWarning):
    """A tuning cache file that cannot be used (it is ignored and rewritten)."""


@dataclass(frozen=True)
class Variant:
    """One setting of a kernel's run-time knobs, in typed_kernel.DEFAULT_KNOBS order."""

    tasks: int = 0
    prefetch: int = 0
    mode: int = 0
    threads: int = 0  # 0: all of Numba's threads

    @property
    def knobs(self) -> tuple:
        return (self.tasks, self.prefetch, self.mode, self.threads)

    @property
    def label(self) -> str:
        parts = [f"{f}={getattr(self, f)}" for f in ("tasks", "prefetch", "mode", "threads") if getattr(self, f)]
        return ",".join(parts) or "default"


DEFAULT = Variant()


# ------------------------------------------------------------------------------- settings


def setting() -> str:
    """'off', 'force' or 'auto' from EDGED_TUNE (see the module doc)."""
    v = os.environ.get("EDGED_TUNE", "").strip().lower()
    if v in ("0", "off", "false", "no"):
        return "off"
    if v in ("force", "retune"):
        return "force"
    if v in ("1", "on", "true", "yes"):
        return "auto"
    return "off" if "PYTEST_CURRENT_TEST" in os.environ else "auto"


def budget_s() -> float:
    try:
        return max(0.0, float(os.environ.get("EDGED_TUNE_BUDGET_S", DEFAULT_BUDGET_S)))
    except ValueError:
        raise ValueError(f"EDGED_TUNE_BUDGET_S must be a number of seconds, got "
                         f"{os.environ['EDGED_TUNE_BUDGET_S']!r}") from None


def busy() -> str | None:
    """Why timing now would mislead, or None: more runnable processes than CPUs over the last
    minute (a parallel kernel then waits for time slices: 8-16 ms stalls per call were seen, which
    would make one thread look best and stay cached after the load is gone)."""
    try:
        load = os.getloadavg()[0]
    except (OSError, AttributeError):
        return None
    ncpu = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return f"the machine is busy (load {load:.1f} on {ncpu} CPUs)" if load > ncpu else None


def cpu_snapshot() -> tuple[float, float] | None:
    """(CPU seconds every CPU spent busy or stolen, this process's CPU seconds) now, or None where
    /proc/stat cannot be read."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    if len(ticks) < 8:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = ticks
    t = os.times()
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK"), t.user + t.system


def others_share(before, after, seconds: float) -> float:
    """The share of all CPUs that other processes (and the hypervisor) used between two
    cpu_snapshot()s `seconds` apart; 0.0 where either is None."""
    if before is None or after is None or seconds <= 0:
        return 0.0
    others = (after[0] - before[0]) - (after[1] - before[1])
    return max(0.0, others) / (seconds * (os.cpu_count() or 1))  # /proc/stat sums every CPU


def _threads() -> int:
    import numba as nb

    return int(nb.config.NUMBA_NUM_THREADS)


@lru_cache(maxsize=1)
def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "unknown"


def cpu_key() -> str:
    """What the choices depend on: the CPU model (/proc/cpuinfo), LLVM's name for it and a hash of
    its feature flags (a VM may name a CPU generically but not hide its features), the threads."""
    import llvmlite.binding as llvm

    feats = llvm.get_host_cpu_features().flatten()
    fh = hashlib.sha256(feats.encode()).hexdigest()[:12]
    return f"{_cpu_model()} | {llvm.get_host_cpu_name()} | features {fh} | {_threads()} threads"


@lru_cache(maxsize=1)
def kernel_hash() -> str:
    from edged._numba_env import kernel_source_hash

    return kernel_source_hash()


def cache_path(key: str | None = None) -> Path:
    """The cache file of this CPU key, beside the compiled kernels."""
    from edged._numba_env import cache_root

    base = Path(os.environ.get("NUMBA_CACHE_DIR") or cache_root() / "numba")
    tag = hashlib.sha256((key or cpu_key()).encode()).hexdigest()[:12]
    return base / f"kernel-tuning-{tag}.json"


# ------------------------------------------------------------------------------- the cache file


def shape_key(qtype, m: int, k: int) -> str:
    return f"{GGMLQuantizationType(qtype).name} {m}x{k}"


def _parse_shape(s: str):
    """(qtype, m, k) of a shape key; ValueError unless the type has a CPU kernel and m, k > 0."""
    from edged.backends.cpu.matmul import check_supported

    name, dims = s.split(" ")
    m, k = (int(d) for d in dims.split("x"))
    qtype = GGMLQuantizationType[name]
    check_supported(qtype)
    if m <= 0 or k <= 0:
        raise ValueError(f"shape {s!r}")
    return qtype, m, k


def _check_entry(cls: str, e) -> None:
    """ValueError unless e is a valid entry of size class `cls` or the crossover (a choice or a skip)."""
    if not isinstance(e, dict):
        raise ValueError(f"{cls} entry {e!r} is not an object")
    if "skipped" in e:
        return
    if cls == CROSSOVER:
        if type(e["gemv_max_n"]) is not int or e["gemv_max_n"] < 1:
            raise ValueError(f"gemv_max_n {e['gemv_max_n']!r} is not a batch size")
        return
    knobs = e["knobs"]
    if not (isinstance(knobs, list) and len(knobs) == len(DEFAULT.knobs) and all(type(v) is int for v in knobs)):
        raise ValueError(f"knobs {knobs!r} are not {len(DEFAULT.knobs)} integers")
    if knobs[3] < 0:
        raise ValueError(f"threads {knobs[3]!r} is not a count")


def read_cache(path: Path | None = None, key: str | None = None) -> dict | None:
    """The cached {shape key: {size class: entry}} for this CPU key and these kernel sources, or
    None when there is none, or it is for another CPU or other kernels, or it cannot be read (a
    TuningCacheWarning then says why: a corrupt file never stops a load)."""
    from edged.backends.cpu.matmul import SIZE_CLASSES

    path = path or cache_path(key)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        warnings.warn(f"ignoring kernel tuning cache {path}: {e}", TuningCacheWarning, stacklevel=2)
        return None
    try:
        doc = json.loads(raw.decode())  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ValueError(f"format {doc.get('format') if isinstance(doc, dict) else None!r}, not {FORMAT}")
        if doc.get("cpu") != (key or cpu_key()) or doc.get("kernel_hash") != kernel_hash():
            return None  # another CPU or other kernel sources: tune again
        shapes = doc["shapes"]
        if not isinstance(shapes, dict):
            raise ValueError("'shapes' is not an object")
        for s, classes in shapes.items():
            _parse_shape(s)
            if not isinstance(classes, dict) or set(classes) - {*SIZE_CLASSES, CROSSOVER}:
                raise ValueError(f"{s}: size classes {classes!r}")
            for c, e in classes.items():
                _check_entry(c, e)
        return shapes
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        warnings.warn(f"ignoring kernel tuning cache {path}: {type(e).__name__}: {e}", TuningCacheWarning,
                      stacklevel=2)
        return None


def write_cache(shapes: dict, path: Path | None = None, key: str | None = None) -> Path | None:
    """Write the cache atomically (a temporary file renamed over it); None, with a warning, when
    the directory cannot be written."""
    path = path or cache_path(key)
    doc = {"format": FORMAT, "cpu": key or cpu_key(), "kernel_hash": kernel_hash(),
           "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "shapes": shapes}
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(doc, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError as e:
        warnings.warn(f"kernel tuning cache {path} not written: {e}", TuningCacheWarning, stacklevel=2)
        return None
    return path


def install(shapes: dict | None) -> int:
    """Install the cached choices in matmul (size classes without one keep the defaults); returns
    the number of shapes with a non-default choice."""
    from edged.backends.cpu.matmul import SIZE_CLASSES, set_tuned

    table = {}
    for s, classes in (shapes or {}).items():
        per = []
        for c in SIZE_CLASSES:
            e = classes.get(c)
            per.append(tuple(e["knobs"]) if e and "skipped" not in e else DEFAULT.knobs)
        cross = classes.get(CROSSOVER, {}).get("gemv_max_n")
        if any(p != DEFAULT.knobs for p in per) or cross is not None:
            table[_parse_shape(s)] = (*per, cross)
    set_tuned(table)
    return len(table)


# ------------------------------------------------------------------------------- variants and timing


def class_n(qtype, cls: int) -> int | None:
    """The batch a size class is timed at (None: the type has no such class)."""
    from edged.backends.cpu.matmul import gemv_max_n

    max_n = gemv_max_n(qtype)
    if cls == 0:
        return 1
    if cls == 1:
        return min(max_n, 8) if max_n > 1 else None
    return GEMM_N


def _knob_table(qtype) -> dict:
    """The kernel module's KNOBS: {"n1" | "gemv" | "gemm": {knob: values}} (tasks are always tried)."""
    from edged.backends.cpu.matmul import kernels_for

    gv, _ = kernels_for(qtype)
    mod = sys.modules[gv.kernel.py_func.__module__]
    return getattr(mod, "KNOBS", {})


def variants(qtype, m: int, cls: int, threads: int | None = None) -> list[Variant]:
    """The default, then one knob changed at a time: task counts (multiples of the threads, at most
    m / 2), the kernel module's prefetch and mode values (mode for n > 1, where it groups tokens,
    and at n = 1 only from the module's "n1" table), fewer threads."""
    threads = threads or _threads()
    knobs = _knob_table(qtype)
    table = knobs.get("gemm" if cls == 2 else "gemv", {})
    out = [DEFAULT]
    for t in sorted({min(max(1, m // 2), f * threads) for f in TASK_FACTORS}):
        out.append(Variant(tasks=t))
    out += [Variant(prefetch=v) for v in table.get("prefetch", ())]
    if cls > 0:
        out += [Variant(mode=v) for v in table.get("mode", ())]
    else:  # at n = 1 only where the module names one (matmul_float: one-row tiles)
        out += [Variant(mode=v) for v in knobs.get("n1", {}).get("mode", ())]
    out += [Variant(threads=t) for t in sorted({1, threads // 2}) if 0 < t < threads and (t > 1 or threads <= 8)]
    return list(dict.fromkeys(out))


def _sampler(tensors: list, n: int, kernel: str | None = None, seed: int = 0):
    """(sample, first): sample(v) -> seconds of one pass of matmul_knobs over the tensors through
    `kernel` (None: the default's; repeated to MIN_SAMPLE_S), first: one such sample of the default."""
    from edged.backends.cpu.act_quant import quantize_activations
    from edged.backends.cpu.cold_weights import dram_copies
    from edged.backends.cpu.matmul import gemv_max_n, matmul_knobs
    from edged.quant.types import traits

    w0 = tensors[0]
    m, k = w0.shape
    gemm = kernel == "gemm" or (kernel is None and n > gemv_max_n(w0.qtype))
    if not gemm or n <= GEMM_N:  # decode reads each weight from DRAM: a shape whose tensors fit the cache gets copies
        tensors = dram_copies(tensors)
    x = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32)  # [n, k]
    qx = quantize_activations(x) if traits(w0.qtype).act_format == "q8_32" else None
    out = np.empty((n, m), np.float32)  # [n, m]
    reps = [1]
    warm = set()

    def one_pass(v):
        for w in tensors:
            matmul_knobs(w, x, v.knobs, kernel=kernel, qx=qx, out=out)

    def sample(v):
        if v not in warm:  # a variant's first pass pays once for compiling or first touches: untimed
            one_pass(v)
            warm.add(v)
        t0 = time.perf_counter()
        for _ in range(reps[0]):
            one_pass(v)
        return (time.perf_counter() - t0) / reps[0]

    first = sample(DEFAULT)  # after sample's untimed first pass: compiles outside any budget
    reps[0] = max(1, min(100, int(MIN_SAMPLE_S / max(first, 1e-7))))
    return sample, first


def sample_rounds(sample, vs: list, budget: float) -> dict:
    """{variant: [seconds]}: rounds of one sample each, in a rotating order (the machine's state
    drifts), at least MIN_ROUNDS, more while the budget lasts (at most MAX_ROUNDS)."""
    times = {v: [] for v in vs}
    t0 = time.perf_counter()
    for r in range(MAX_ROUNDS):
        if r >= MIN_ROUNDS and time.perf_counter() - t0 > budget:
            break
        for i in range(len(vs)):
            v = vs[(i + r) % len(vs)]
            times[v].append(sample(v))
    return times


def _noisy(samples) -> bool:
    """The median, not the slowest: one spike (a moment of another process, a page fault storm)
    does not void a class, and the paired per-round ratios of _beats already discount it."""
    return float(np.median(samples)) > NOISY * min(samples)


def _beats(a: list, b: list) -> tuple[float, bool]:
    """(median over rounds of a / b, whether a beats b): samples paired by round, so a drift of
    the machine between rounds cancels; a beats b when that median is MARGIN below 1 and a was
    the faster in WIN_SHARE of the rounds (one lucky round does not decide)."""
    ratios = [x / y for x, y in zip(a, b)]
    share = sum(r < 1.0 for r in ratios) / len(ratios)
    rel = float(np.median(ratios))
    return rel, rel < 1 - MARGIN and share >= WIN_SHARE


def _relative(rounds: dict) -> dict:
    """{variant: (time relative to the default, beats the default)} from sample_rounds' rounds."""
    return {v: _beats(t, rounds[DEFAULT]) for v, t in rounds.items()}


def _pick(rel: dict) -> Variant:
    wins = [v for v, (_, beats) in rel.items() if beats]
    return min(wins, key=lambda v: rel[v][0]) if wins else DEFAULT


def _combined(rel: dict) -> Variant | None:
    """The winners of each knob joined, when at least two knobs each beat the default."""
    fields = {}
    for f in ("tasks", "prefetch", "mode", "threads"):
        cands = [v for v in rel if getattr(v, f) and rel[v][1]]
        if cands:
            fields[f] = getattr(min(cands, key=lambda v: rel[v][0]), f)
    return Variant(**fields) if len(fields) >= 2 else None


def tune_class(sample, vs: list, budget: float) -> dict:
    """The cache entry of one size class of one shape: the choice and every variant's median ms.
    The default stays when its samples or the winner's spread past NOISY ("noisy": true)."""
    rounds = sample_rounds(sample, vs, budget * 0.8)
    med = {v: float(np.median(t)) for v, t in rounds.items()}
    rel = _relative(rounds)
    choice = _pick(rel)
    combo = _combined(rel)
    if combo is not None and combo not in rel:
        extra = sample_rounds(sample, [DEFAULT, combo], budget * 0.2)  # paired with the default again
        rel[combo] = _beats(extra[combo], extra[DEFAULT])
        med[combo] = float(np.median(extra[combo]))
        choice = _pick(rel)
    noisy = _noisy(rounds[DEFAULT]) or (choice in rounds and _noisy(rounds[choice]))
    entry = {"choice": DEFAULT.label if noisy else choice.label, "knobs": list((DEFAULT if noisy else choice).knobs),
             "ms": {v.label: round(t * 1e3, 4) for v, t in med.items()}}
    return {**entry, "noisy": True} if noisy else entry


# ------------------------------------------------------------------------------- entry points


def group_tensors(tensors) -> dict:
    """{(qtype, m, k): [QTensor, ...]} of the 2-D matrices (3-D expert stacks as their slabs) that
    have a CPU kernel, at most MAX_TENSORS each."""
    from edged.backends.cpu.matmul import supported_types

    ok = set(supported_types())
    groups: dict = {}
    for w in tensors:
        if not isinstance(w, QTensor) or w.qtype not in ok:
            continue
        for s in (w.slabs() if len(w.shape) == 3 else (w,) if len(w.shape) == 2 else ()):
            g = groups.setdefault((s.qtype, *s.shape), [])
            if len(g) < MAX_TENSORS:
                g.append(s)
    return groups


def _parts(qtype) -> list:
    """Indices of what is tuned per shape: the size classes the type has (SIZE_CLASSES), then
    len(SIZE_CLASSES) for the crossover where gemv and gemm are different kernels."""
    from edged.backends.cpu.matmul import SIZE_CLASSES, kernels_for

    gv, gm = kernels_for(qtype)
    out = [c for c in range(len(SIZE_CLASSES)) if class_n(qtype, c) is not None]
    return out + ([len(SIZE_CLASSES)] if gv.kernel is not gm.kernel else [])


def _part_name(c: int) -> str:
    from edged.backends.cpu.matmul import SIZE_CLASSES

    return SIZE_CLASSES[c] if c < len(SIZE_CLASSES) else CROSSOVER


def ensure(tensors, *, retune: bool | None = None, tune: bool = True, budget: float | None = None,
           log=None) -> dict:
    """Install the tuned choices for `tensors` (QTensors: a model's matrices): read the cache, time
    what it lacks (everything with `retune`, or EDGED_TUNE=force) within `budget` seconds, write it
    back; tune=False only installs what the cache holds. Returns {"mode", "path", "tuned": ["shape
    class" timed now], "shapes": the cache, "seconds", and "deferred" (why nothing was timed) or
    "busy" (timed anyway)}. EDGED_TUNE=0 (and the test suite, unless asked) installs the defaults
    and reads nothing; retune=True times anyway. While the machine is busy (busy()) nothing is
    timed unless retune or EDGED_TUNE=force: a later load tunes. Where other processes used more
    than SHARED of the CPUs while timing (others_share), what was timed is dropped, not cached
    ("deferred"), unless retune or EDGED_TUNE=force ("busy").

    Budget: what three rounds of fits is timed, n = 1 classes of every shape first (decode matters
    most), then gemv, gemm and the crossover, the largest first within each; the rest is recorded
    as skipped (defaults) until a retune."""
    from edged.backends.cpu.matmul import set_tuned

    setting_now = setting()
    if retune is None:
        retune = setting_now == "force"
    if setting_now == "off" and not retune:
        set_tuned({})
        return {"mode": "off", "path": None, "tuned": [], "shapes": {}, "seconds": 0.0}
    key = cpu_key()
    path = cache_path(key)
    shapes = {} if retune else (read_cache(path, key) or {})
    out = {"mode": "retune" if retune else setting_now, "path": str(path), "tuned": [], "shapes": shapes,
           "seconds": 0.0}
    groups = group_tensors(tensors) if tune else {}
    todo = sorted((c, g) for g in groups for c in _parts(g[0]) if _part_name(c) not in shapes.get(shape_key(*g), {}))
    why = busy() if todo else None
    if why and not retune and setting_now != "force":  # time them at a quieter load
        out["deferred"] = f"{why}: {len(todo)} shape classes keep the defaults for now"
        todo = []
    elif why:
        out["busy"] = why
    if todo:
        t0, snap = time.perf_counter(), cpu_snapshot()
        _tune_all(todo, groups, shapes, budget_s() if budget is None else budget, log)
        out["seconds"] = time.perf_counter() - t0
        shared = others_share(snap, cpu_snapshot(), out["seconds"])
        if shared > SHARED and not retune and setting_now != "force":  # drop what was timed now
            for c, g in todo:
                classes = shapes.get(shape_key(*g), {})
                classes.pop(_part_name(c), None)
                if not classes:
                    shapes.pop(shape_key(*g), None)
            out["deferred"] = (f"other processes used {shared:.0%} of the CPUs while timing: {len(todo)} shape "
                               f"classes keep the defaults for now")
        else:
            if shared > SHARED:
                out["busy"] = f"other processes used {shared:.0%} of the CPUs while timing"
            out["tuned"] = [f"{shape_key(*g)} {_part_name(c)}" for c, g in todo]
            write_cache(shapes, path, key)
    install(shapes)
    return out


def _tune_all(todo, groups, shapes, budget, log) -> None:
    """Time the (part, shape) pairs of todo into shapes (see ensure's budget). Each is priced
    first: one untimed pass compiles a kernel not yet compiled, one timed pass of the default
    gives the cost of three rounds."""
    from edged.backends.cpu.matmul import gemv_max_n

    plans, n1_s = [], {}  # plans: (part, shape, cost s, run(budget) -> entry, or None: skipped)
    for c, g in todo:
        ws = groups[g]
        if _part_name(c) != CROSSOVER:
            n = class_n(g[0], c)
            vs = variants(g[0], g[1], c)
            sample, first = _sampler(ws, n, "gemm" if c == 2 else None)
            if c == 0:
                n1_s[g] = first
            plans.append((c, g, max(first, MIN_SAMPLE_S) * len(vs) * MIN_ROUNDS,
                          lambda b, sample=sample, vs=vs, n=n: {"n": n, **tune_class(sample, vs, b)}))
            continue
        cached = shapes.get(shape_key(*g), {}).get("n1", {}).get("ms", {}).get("default")
        n1 = n1_s.get(g, cached * 1e-3 if cached else None)
        if n1 is None:
            n1 = _sampler(ws, 1)[1]
        # a lower bound first (a batch of n costs at least n / 4 single tokens), then the real price
        low = 2 * n1 * sum(max(1.0, n / 4) for n in CROSSOVER_NS) * MIN_ROUNDS
        if low > budget:
            plans.append((c, g, low, None))
            continue
        samplers = {n: (_sampler(ws, n, "gemv"), _sampler(ws, n, "gemm")) for n in CROSSOVER_NS}
        cost = sum(max(a[1], MIN_SAMPLE_S) + max(b[1], MIN_SAMPLE_S) for a, b in samplers.values()) * MIN_ROUNDS
        plans.append((c, g, cost, lambda b, s=samplers, d=gemv_max_n(g[0]), g=g:
                      tune_crossover(s, d, b, _tuned_variants(shapes.get(shape_key(*g), {})))))
    plans.sort(key=lambda p: (p[0], -p[2]))
    left, chosen = budget, []
    for c, g, cost, run in plans:
        if run is not None and cost <= left:
            chosen.append((c, g, cost, run))
            left -= cost
        else:
            shapes.setdefault(shape_key(*g), {})[_part_name(c)] = {"skipped": "budget", "min_ms": round(cost * 1e3, 3)}
    spare = max(0.0, left) / max(1, len(chosen))  # shared out for more rounds
    for c, g, cost, run in chosen:
        entry = run(cost + spare)
        shapes.setdefault(shape_key(*g), {})[_part_name(c)] = entry
        if log is not None:
            log(f"tuned {shape_key(*g)} {_part_name(c)}: {entry.get('choice', entry.get('gemv_max_n'))}")


def _tuned_variants(entries: dict) -> tuple:
    """(gemv, gemm) Variants a shape's tuned size classes chose (DEFAULT where one was not tuned):
    the crossover compares the kernels as they will run, not at their built-in knobs."""
    def chosen(cls):
        e = entries.get(cls)
        return Variant(*e["knobs"]) if isinstance(e, dict) and "knobs" in e else DEFAULT

    return chosen("gemv"), chosen("gemm")


def tune_crossover(samplers: dict, default_max_n: int, budget: float, variants: tuple = (DEFAULT, DEFAULT)) -> dict:
    """The crossover entry: {"gemv_max_n", "ms"}. samplers: {n: ((gemv sample, _), (gemm sample, _))},
    run with variants (gemv, gemm). Each n keeps its default kernel (gemv up to default_max_n)
    unless the other beats it (_beats); gemv_max_n is the last n of the run of gemv batches from
    the smallest (1: gemm from n = 2)."""
    runs = [(n, kern, smp[0], v) for n, pair in sorted(samplers.items())
            for kern, smp, v in zip(("gemv", "gemm"), pair, variants)]
    rounds = sample_rounds(lambda r: r[2](r[3]), runs, budget)
    ms = {f"{kern} n={n}": round(float(np.median(t)) * 1e3, 4) for (n, kern, _, _), t in rounds.items()}
    if any(_noisy(t) for t in rounds.values()):
        return {"gemv_max_n": default_max_n, "ms": ms, "noisy": True}
    times = {(n, kern): t for (n, kern, _, _), t in rounds.items()}
    max_n = 1
    for n in sorted(samplers):
        gv, gm = times[(n, "gemv")], times[(n, "gemm")]
        if _beats(gm, gv)[1] if n <= default_max_n else not _beats(gv, gm)[1]:
            break
        max_n = n
    return {"gemv_max_n": max_n, "ms": ms}


def for_model(model, *, tune: bool = True, log=None) -> dict:
    """ensure() for a loaded model's matrices (model.matrices(placed=True): every weight the
    forward multiplies by, as it runs them); with tune=False only the cached choices are installed."""
    mats = [w for _, w in getattr(model, "matrices", lambda placed: ())(placed=True)]
    return ensure(mats, tune=tune, log=log)
