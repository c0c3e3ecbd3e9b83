"""Per-machine kernel tuning (backends/cpu/tuning.py): every variant gives the same bits, and the
cache of choices is written, re-read, keyed by the CPU and ignored when corrupt."""

import json
import os
import warnings

import numba as nb
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from edged.backends.cpu import matmul as _  # noqa: F401  (edged configures numba before its import)
from edged.backends.cpu import tuning
from edged.backends.cpu.matmul import (
    SIZE_CLASSES, gemv_max_n, matmul, matmul_knobs, set_tuned, supported_types, tuned,
)
from tests.helpers.qdata import random_qtensor

# the knobs are run-time arguments: a kernel that embedded a pointer (numba's own set_num_threads
# does) could not be cached and would compile at every start
pytestmark = pytest.mark.filterwarnings("error:Cannot cache compiled function")


def _extremes(m):
    """Knob values past the tuner's: one task, a task per row, a prefetch far past the tensor."""
    return [tuning.Variant(tasks=1), tuning.Variant(tasks=m), tuning.Variant(prefetch=1 << 20),
            tuning.Variant(tasks=3, prefetch=64, mode=1, threads=1)]


@pytest.mark.parametrize("qtype", supported_types(), ids=lambda t: t.name)
def test_every_variant_gives_the_same_bits(qtype):
    """The key property: whichever variant the tuner picks, every output bit is the default's, in
    every size class (n = 1, a gemv batch, a gemm batch); m odd (a last row alone, partial tasks)."""
    m, k = 37, 256
    w = random_qtensor(qtype, m, k, seed=5)
    threads = nb.get_num_threads()
    for cls in range(len(SIZE_CLASSES)):
        n = tuning.class_n(qtype, cls)
        if n is None:
            continue
        kernel = "gemm" if cls == 2 else None
        for n in (n, n + 1, 2 * n + 1) if cls == 2 else (n,):  # gemm: one tile, then partial tiles
            x = np.random.default_rng(n).standard_normal((n, k)).astype(np.float32)
            want = matmul(w, x)
            vs = tuning.variants(qtype, m, cls, threads=2) + _extremes(m)
            assert len(vs) >= 4
            for v in vs:
                got = matmul_knobs(w, x, v.knobs, kernel=kernel)
                np.testing.assert_array_equal(got, want, err_msg=f"{qtype.name} n={n} {v.label}")
                assert nb.get_num_threads() == threads, f"{qtype.name} {v.label} left the thread count changed"


def test_installed_choice_is_used_and_cleared():
    """matmul reads the installed knobs (a kernel that ignored them would not care, so check the
    table round-trips and the output does not move)."""
    w = random_qtensor(T.Q4_K, 16, 256, seed=1)
    x = np.random.default_rng(0).standard_normal((1, 256)).astype(np.float32)
    want = matmul(w, x)
    choice = {(T.Q4_K, 16, 256): ((2, 1024, 0, 1), (0, 0, 0, 0), (4, 0, 0, 0))}
    try:
        set_tuned(choice)
        assert tuned() == {(T.Q4_K, 16, 256): (*choice[(T.Q4_K, 16, 256)], gemv_max_n(T.Q4_K))}
        np.testing.assert_array_equal(matmul(w, x), want)
    finally:
        set_tuned({})
    assert tuned() == {}


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("EDGED_TUNE", "1")  # the suite skips tuning unless a test asks
    monkeypatch.setattr(tuning, "MIN_ROUNDS", 1)
    monkeypatch.setattr(tuning, "MAX_ROUNDS", 1)
    monkeypatch.setattr(tuning, "busy", lambda: None)  # the test machine may be busy
    monkeypatch.setattr(tuning, "others_share", lambda *a: 0.0)  # ... and other tests run beside this one
    yield tmp_path
    set_tuned({})


def _tensors():
    return [random_qtensor(T.Q8_0, 24, 64, seed=s) for s in range(2)] + [random_qtensor(T.Q4_K, 8, 256, seed=3)]


def test_cache_written_then_reread(cache_dir, monkeypatch):
    first = tuning.ensure(_tensors(), budget=5.0)
    path = tuning.cache_path()
    assert first["path"] == str(path) and path.parent == cache_dir and path.exists()
    doc = json.loads(path.read_text())
    assert doc["cpu"] == tuning.cpu_key() and doc["kernel_hash"] == tuning.kernel_hash()
    assert set(doc["shapes"]) == {"Q8_0 24x64", "Q4_K 8x256"}
    assert set(doc["shapes"]["Q8_0 24x64"]) == {*SIZE_CLASSES, "crossover"}
    entry = doc["shapes"]["Q8_0 24x64"]["n1"]
    assert entry["n"] == 1 and "default" in entry["ms"] and entry["choice"] in entry["ms"]
    cross = doc["shapes"]["Q8_0 24x64"]["crossover"]
    assert cross["gemv_max_n"] >= 1 and "gemm n=16" in cross["ms"]
    assert len(first["tuned"]) == 8
    # a second load reads the file and times nothing
    monkeypatch.setattr(tuning, "_sampler", lambda *a: pytest.fail("re-timed a cached shape"))
    again = tuning.ensure(_tensors(), budget=5.0)
    assert again["tuned"] == [] and again["shapes"] == doc["shapes"]


def test_chosen_knobs_are_installed(cache_dir):
    """A cache entry with a non-default choice reaches matmul's table."""
    key = tuning.cpu_key()
    shapes = {"Q8_0 24x64": {"n1": {"n": 1, "choice": "tasks=2,threads=1", "knobs": [2, 0, 0, 1], "ms": {}}}}
    tuning.write_cache(shapes, key=key)
    tuning.ensure(_tensors()[:1], tune=False)
    assert tuned() == {(T.Q8_0, 24, 64): ((2, 0, 0, 1), (0, 0, 0, 0), (0, 0, 0, 0), gemv_max_n(T.Q8_0))}


def test_changed_cpu_key_retunes(cache_dir, monkeypatch):
    tuning.ensure(_tensors()[:1], budget=5.0)
    old = tuning.cache_path()
    monkeypatch.setattr(tuning, "cpu_key", lambda: "another CPU | x | features 0 | 2 threads")
    assert tuning.read_cache() is None  # nothing for this CPU yet
    out = tuning.ensure(_tensors()[:1], budget=5.0)
    assert len(out["tuned"]) == 4 and tuning.cache_path() != old and old.exists()
    # a file whose contents name another CPU is not used either
    tuning.cache_path().write_text(old.read_text())
    assert tuning.read_cache() is None


@pytest.mark.parametrize("text", ["{not json", '{"format": 1, "cpu": "%s", "kernel_hash": "%s", "shapes": []}',
                                  '{"format": 1, "cpu": "%s", "kernel_hash": "%s", '
                                  '"shapes": {"Q8_0 24x64": {"n1": {"knobs": [1, 0, 0, "x"]}}}}',
                                  '{"format": 1, "cpu": "%s", "kernel_hash": "%s", "shapes": {"Q8_1 24x64": {}}}'],
                         ids=["not-json", "shapes-a-list", "bad-knobs", "type-without-kernel"])
def test_corrupt_cache_is_ignored_with_a_warning(cache_dir, text):
    if "%s" in text:
        text = text % (tuning.cpu_key(), tuning.kernel_hash())
    tuning.cache_path().write_bytes(text.encode() if text != "{not json" else b"\xff\xfe{not json")
    with pytest.warns(tuning.TuningCacheWarning, match="ignoring kernel tuning cache"):
        out = tuning.ensure(_tensors()[:1], budget=5.0)
    assert len(out["tuned"]) == 4  # re-tuned, and the file rewritten valid
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tuning.read_cache() is not None


def test_installed_crossover_routes_batches(monkeypatch):
    """gemv_max_n of a tuned shape decides which kernel a batch runs (recorded through the table)."""
    import sys

    mm = sys.modules["edged.backends.cpu.matmul"]
    gemv, gemm, defaults, q8, max_n = mm._DISPATCH[T.Q8_0]
    ran = []
    monkeypatch.setitem(mm._DISPATCH, T.Q8_0, (lambda *a: (ran.append("gemv"), gemv(*a)),
                                               lambda *a: (ran.append("gemm"), gemm(*a)), defaults, q8, max_n))
    w = random_qtensor(T.Q8_0, 8, 64, seed=2)
    x = np.random.default_rng(1).standard_normal((3, 64)).astype(np.float32)
    want = matmul(w, x)
    try:
        set_tuned({(T.Q8_0, 8, 64): ((0, 0, 0, 0),) * 3 + (2,)})
        np.testing.assert_array_equal(matmul(w, x), want)  # n = 3 > 2: gemm now, the same bits
        matmul(w, x[:2])
    finally:
        set_tuned({})
    assert ran == ["gemv", "gemm", "gemv"]


def test_crossover_keeps_each_default_unless_clearly_beaten():
    """gemv costs n, gemm 10 (fake samples): up to the default (4) gemv stays; above it gemv must
    win by the margin (8 < 9.7 does, 16 does not), so the gemv's largest n becomes 8."""
    samplers = {n: ((lambda v, n=n: float(n), None), (lambda v: 10.0, None)) for n in tuning.CROSSOVER_NS}
    entry = tuning.tune_crossover(samplers, 4, budget=0.0)
    assert entry["gemv_max_n"] == 8 and entry["ms"]["gemm n=2"] == 10000.0
    slow_gemv = {n: ((lambda v: 10.0, None), (lambda v: 9.9, None)) for n in tuning.CROSSOVER_NS}
    assert tuning.tune_crossover(slow_gemv, 24, budget=0.0)["gemv_max_n"] == 24  # within the margin: defaults kept
    fast_gemm = {n: ((lambda v: 10.0, None), (lambda v: 5.0, None)) for n in tuning.CROSSOVER_NS}
    assert tuning.tune_crossover(fast_gemm, 24, budget=0.0)["gemv_max_n"] == 1


def test_crossover_compares_the_tuned_kernels():
    """The gemm at its tuned knobs beats the gemv that its built-in ones would lose to: the
    crossover runs each kernel with the variant its size class chose (_tuned_variants)."""
    tuned_gemm = tuning.Variant(tasks=8, prefetch=4096)
    samplers = {n: ((lambda v: 10.0, None), (lambda v: 5.0 if v == tuned_gemm else 12.0, None))
                for n in tuning.CROSSOVER_NS}
    assert tuning.tune_crossover(samplers, 24, budget=0.0)["gemv_max_n"] == 32  # at the defaults: gemv throughout
    entries = {"gemv": {"choice": "default", "knobs": [0, 0, 0, 0]}, "gemm": {"choice": "x", "knobs": [8, 4096, 0, 0]},
               "n1": {"skipped": "budget"}}
    variants = tuning._tuned_variants(entries)
    assert variants == (tuning.DEFAULT, tuned_gemm)
    assert tuning.tune_crossover(samplers, 24, budget=0.0, variants=variants)["gemv_max_n"] == 1
    assert tuning._tuned_variants({"gemm": {"skipped": "budget"}}) == (tuning.DEFAULT, tuning.DEFAULT)


def test_tune_off_gives_the_defaults(cache_dir, monkeypatch):
    set_tuned({(T.Q8_0, 24, 64): ((2, 0, 0, 0),) * 3})
    assert tuned()
    monkeypatch.setenv("EDGED_TUNE", "0")
    monkeypatch.setattr(tuning, "_sampler", lambda *a: pytest.fail("timed with EDGED_TUNE=0"))
    out = tuning.ensure(_tensors())
    assert out["mode"] == "off" and tuned() == {} and not tuning.cache_path().exists()
    monkeypatch.delenv("EDGED_TUNE")
    assert tuning.setting() == "off"  # inside the test suite


def test_busy_machine_defers_unless_forced(cache_dir, monkeypatch):
    monkeypatch.setattr(tuning, "busy", lambda: "the machine is busy (load 9.0 on 2 CPUs)")
    out = tuning.ensure(_tensors()[:1])
    assert "busy" in out["deferred"] and out["tuned"] == [] and not tuning.cache_path().exists()
    forced = tuning.ensure(_tensors()[:1], retune=True, budget=5.0)
    assert forced["tuned"] and "busy" in forced["busy"] and tuning.cache_path().exists()


def test_timing_beside_other_processes_is_not_kept_unless_forced(cache_dir, monkeypatch):
    """Where other processes took more than SHARED of the CPUs while it timed, the tuner keeps
    nothing it timed (defaults, no cache: a later load tunes again), but what the cache already
    held stays installed; a forced retune keeps its choices and says the machine was shared."""
    key = tuning.cpu_key()
    cached = {"Q4_K 8x256": {"n1": {"n": 1, "choice": "tasks=2", "knobs": [2, 0, 0, 0], "ms": {}}}}
    tuning.write_cache(cached, key=key)
    monkeypatch.setattr(tuning, "others_share", lambda *a: tuning.SHARED + 0.1)
    out = tuning.ensure(_tensors(), budget=5.0)
    assert "other processes" in out["deferred"] and out["tuned"] == []
    assert set(out["shapes"]) == {"Q4_K 8x256"} and set(out["shapes"]["Q4_K 8x256"]) == {"n1"}
    assert tuning.read_cache(key=key) == cached  # not rewritten
    assert tuned() == {(T.Q4_K, 8, 256): ((2, 0, 0, 0), (0, 0, 0, 0), (0, 0, 0, 0), gemv_max_n(T.Q4_K))}
    forced = tuning.ensure(_tensors(), retune=True, budget=5.0)
    assert forced["tuned"] and "other processes" in forced["busy"] and "Q8_0 24x64" in tuning.read_cache(key=key)


def test_others_share_counts_other_cpu_time_only():
    """Busy CPU time that is this process's own is not counted; the rest is a share of all CPUs."""
    ncpu = os.cpu_count() or 1
    assert tuning.others_share((100.0, 10.0), (104.0, 12.0), 2.0) == pytest.approx(2.0 / (2.0 * ncpu))
    assert tuning.others_share((100.0, 10.0), (102.0, 12.0), 2.0) == 0.0
    assert tuning.others_share(None, (1.0, 1.0), 1.0) == 0.0
    snap = tuning.cpu_snapshot()
    assert snap is None or (snap[0] > 0 and snap[1] > 0)


def test_noisy_samples_keep_the_default(monkeypatch):
    """A variant that looks faster while the default was slowed in most rounds (median > NOISY x
    its fastest) is not taken."""
    monkeypatch.setattr(tuning, "MIN_ROUNDS", 3)
    monkeypatch.setattr(tuning, "MAX_ROUNDS", 3)
    fast, default_times = tuning.Variant(tasks=2), iter([1.0, 5.0, 4.0])
    entry = tuning.tune_class(lambda v: next(default_times) if v == tuning.DEFAULT else 0.5,
                              [tuning.DEFAULT, fast], budget=0.0)
    assert entry["noisy"] and entry["choice"] == "default" and entry["ms"]["tasks=2"] == 500.0
    steady = tuning.tune_class(lambda v: 1.0 if v == tuning.DEFAULT else 0.5, [tuning.DEFAULT, fast], budget=0.0)
    assert steady["choice"] == "tasks=2" and "noisy" not in steady


def _per_round(times: dict):
    """A sampler returning times[variant][r] at round r (each variant is sampled once a round)."""
    its = {v: iter(t) for v, t in times.items()}
    return lambda v: next(its[v])


@pytest.mark.parametrize("default, other, taken", [
    # 1% slower than the default in every round, though its median is far below the default's
    # (the machine slowed down in two rounds between the two samples): not taken
    ([1.0, 1.4, 1.4], [1.01, 1.01, 1.414], False),
    # 10% faster in the median ratio but slower in 2 of 5 rounds: not a steady win
    ([1.0] * 5, [0.5, 0.5, 0.9, 1.1, 1.1], False),
    # faster in every round by 10%, whatever the drift: taken
    ([1.0, 1.5, 1.2, 1.5, 1.0], [0.9, 1.35, 1.08, 1.35, 0.9], True),
], ids=["unpaired-median-misleads", "unsteady", "steady-under-drift"])
def test_a_variant_must_beat_the_default_round_by_round(monkeypatch, default, other, taken):
    monkeypatch.setattr(tuning, "MIN_ROUNDS", len(default))
    monkeypatch.setattr(tuning, "MAX_ROUNDS", len(default))
    fast = tuning.Variant(tasks=2)
    entry = tuning.tune_class(_per_round({tuning.DEFAULT: default, fast: other}), [tuning.DEFAULT, fast], budget=0.0)
    assert entry["choice"] == ("tasks=2" if taken else "default") and "noisy" not in entry


def test_crossover_is_paired_by_round(monkeypatch):
    """gemm 1% slower than the gemv at n = 2 in every round, its median far lower: the gemv stays."""
    monkeypatch.setattr(tuning, "MIN_ROUNDS", 3)
    monkeypatch.setattr(tuning, "MAX_ROUNDS", 3)
    gv, gm = iter([1.0, 1.4, 1.4]), iter([1.01, 1.01, 1.414])
    samplers = {2: ((lambda v: next(gv), 0.0), (lambda v: next(gm), 0.0))}
    assert tuning.tune_crossover(samplers, 4, budget=0.0)["gemv_max_n"] == 2


def test_budget_skips_what_does_not_fit(cache_dir):
    out = tuning.ensure(_tensors()[:1], budget=0.0)
    entries = out["shapes"]["Q8_0 24x64"]
    assert all(e.get("skipped") == "budget" for e in entries.values())
    assert tuned() == {}


def test_bench_report_lists_choice_and_alternatives():
    from edged.bench.kernels import format_tuning

    shapes = {"Q8_0 24x64": {
        "n1": {"n": 1, "choice": "tasks=8", "knobs": [8, 0, 0, 0],
               "ms": {"default": 2.0, "tasks=8": 1.5, "threads=1": 3.0}},
        "gemm": {"skipped": "budget", "min_ms": 9.0},
        "crossover": {"gemv_max_n": 16,
                      "ms": {"gemv n=16": 2.0, "gemm n=16": 2.5, "gemv n=24": 3.0, "gemm n=24": 2.7}}}}
    text = format_tuning(shapes, {"Q8_0 24x64", "Q4_K 8x256"})
    assert "tasks=8 0.75" in text and "threads=1 1.50" in text and "skipped: budget" in text
    assert "gemv up to n=16" in text and "n=16 1.25 n=24 0.90" in text
    assert "Q4_K" not in text  # shapes without a cache entry are not listed


def test_retune_goes_with_kernels():
    from click.testing import CliRunner

    from edged.cli import main

    res = CliRunner().invoke(main, ["bench", "--retune"])
    assert res.exit_code == 2 and "--kernels" in res.output


def test_loader_tunes_a_cpu_model_once(cache_dir, tmp_path):
    """The first load times the shapes the model's forward runs (q|k fused in its even layers)
    and caches them; the next reads the cache."""
    from edged.loader import load
    from tests.helpers.tiny_models import write_tiny_model

    path = write_tiny_model(tmp_path / "tiny.gguf", "llama")
    first = load(str(path), quiet=True)
    assert first.tuning["tuned"] and tuning.cache_path().exists()
    run = [w for _, w in first.model.matrices(placed=True)]
    shapes = {tuning.shape_key(*g) for g in tuning.group_tensors(run)}
    assert shapes <= set(tuning.read_cache())
    again = load(str(path), quiet=True)
    assert again.tuning["tuned"] == [] and again.tuning["shapes"] == tuning.read_cache()


def test_one_spike_does_not_void_a_class(monkeypatch):
    """One round of three with the default 40x slower (another process for a moment, seen on an
    Intel Xeon VM): its median is steady, so the variant faster in the other rounds is taken."""
    monkeypatch.setattr(tuning, "MIN_ROUNDS", 3)
    monkeypatch.setattr(tuning, "MAX_ROUNDS", 3)
    fast = tuning.Variant(prefetch=4096)
    entry = tuning.tune_class(_per_round({tuning.DEFAULT: [40.0, 1.0, 1.05], fast: [0.7, 0.72, 0.7]}),
                              [tuning.DEFAULT, fast], budget=0.0)
    assert entry["choice"] == "prefetch=4096" and "noisy" not in entry


def test_the_n1_class_tries_mode_only_where_the_kernel_module_names_it():
    """matmul_float's one-row tiles (mode 1) are an n = 1 variant; the legacy kernels' token
    grouping (their mode) is not, since it groups tokens."""
    assert tuning.Variant(mode=1) in tuning.variants(T.F16, 64, 0, threads=2)
    assert tuning.Variant(mode=1) in tuning.variants(T.BF16, 64, 0, threads=2)
    assert tuning.Variant(mode=1) not in tuning.variants(T.Q8_0, 64, 0, threads=2)
    assert tuning.Variant(mode=1) in tuning.variants(T.Q8_0, 64, 1, threads=2)
