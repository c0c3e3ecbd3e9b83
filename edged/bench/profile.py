"""Where an engine step's time goes: a timing proxy for the model's backend ops and timers around
the engine's step phases (schedule, batch building, forward, sampling, delivery).

Installed on a live engine by `StepProfiler.attach` and removed by `detach`; the engine code itself
carries no instrumentation. Used by `python -m edged.bench.engine breakdown`.
"""

from __future__ import annotations

import time
from collections import defaultdict

# how ops are grouped in the report
_OP_GROUP = {
    "attention": "attention", "store_kv": "attention",
    "rms_norm": "norms/rope/act", "rope": "norms/rope/act", "gelu_tanh_mul": "norms/rope/act",
    "silu_mul": "norms/rope/act", "softcap": "norms/rope/act", "add": "norms/rope/act",
    "scale": "norms/rope/act", "embed": "embed",
}


class _TimedOps:
    """Stands in for a backend ops module: same attributes, each op call timed into `acc`."""

    def __init__(self, ops, acc: dict, output_name: str | None, clock, calls: dict):
        self._ops, self._acc, self._output_name, self._clock = ops, acc, output_name, clock
        self._calls = calls

    def __getattr__(self, name):
        fn = getattr(self._ops, name)
        if not callable(fn) or name.startswith("_") or name in ("allocate_kv", "check_supported"):
            return fn
        acc, out_name, clock, calls = self._acc, self._output_name, self._clock, self._calls

        def timed(*args, **kwargs):
            t0 = clock()
            r = fn(*args, **kwargs)
            dt = clock() - t0
            if name == "matmul":
                key = "matmul output" if getattr(args[0], "name", None) == out_name else "matmul layers"
            else:
                key = _OP_GROUP.get(name, name)
            acc[key] += dt
            calls[key] += 1
            return r

        setattr(self, name, timed)  # later lookups skip __getattr__
        return timed


def _clock_cost(clock, n: int = 2000) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        clock()
    return (time.perf_counter() - t0) / n


class StepProfiler:
    """Accumulates seconds per phase over the steps an engine runs while attached.

    Phases: schedule, build_batch, forward (split into matmul layers / matmul output / attention /
    norms/rope/act / embed / forward python, plus the estimated cost of the profiler's own clock
    readings), update, sample, deliver and step other (the rest of `_step`).
    """

    def __init__(self, clock: str = "wall"):
        if clock not in ("wall", "thread"):
            raise ValueError(f"clock must be 'wall' or 'thread', got {clock!r}")
        # thread: CPU time of the engine thread, steady on a busy machine; it sees all kernel
        # work only when kernels run on the calling thread alone (NUMBA_NUM_THREADS=1)
        self.clock = time.perf_counter if clock == "wall" else time.thread_time
        self.acc: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)  # timed calls per key
        self.clock_cost = _clock_cost(self.clock)  # seconds one clock reading adds
        self.steps = 0
        self.tokens = 0  # tokens in the batches
        self.sampled = 0  # logits rows sampled
        self._undo: list = []

    def attach(self, engine) -> "StepProfiler":
        import edged.engine.engine as engine_mod

        acc, clock = self.acc, self.clock
        model = engine.model
        out_name = getattr(getattr(model, "output", None), "name", None)
        if hasattr(model, "layer_ops"):
            old_layer, old_out = model.layer_ops, model.output_ops
            model.layer_ops = [_TimedOps(o, acc, out_name, self.clock, self.calls) for o in old_layer]
            model.output_ops = _TimedOps(old_out, acc, out_name, self.clock, self.calls)
            self._undo.append(lambda: (setattr(model, "layer_ops", old_layer),
                                       setattr(model, "output_ops", old_out)))

        def wrap(obj, attr, key, count=None):
            fn = getattr(obj, attr)

            def timed(*args, **kwargs):
                t0 = clock()
                r = fn(*args, **kwargs)
                acc[key] += clock() - t0
                if count is not None:
                    count(args, r)
                return r

            had = attr in vars(obj)
            setattr(obj, attr, timed)
            self._undo.append(lambda: setattr(obj, attr, fn) if had else delattr(obj, attr))

        def on_batch(args, r):
            self.tokens += int(r[0].n_tokens)

        def on_step(args, r):
            self.steps += 1

        def on_sample(args, r):
            self.sampled += len(r[0])

        wrap(engine.scheduler, "schedule", "schedule")
        wrap(engine.scheduler, "update", "update")
        wrap(engine_mod, "build_batch", "build_batch", on_batch)
        wrap(model, "forward", "forward")
        wrap(engine.sampler, "sample", "sample", on_sample)
        wrap(engine, "_sample_and_deliver", "sample+deliver")
        wrap(engine, "_step", "step", on_step)
        return self

    def detach(self) -> None:
        while self._undo:
            self._undo.pop()()

    def reset(self) -> None:
        self.acc.clear()
        self.calls.clear()
        self.steps = self.tokens = self.sampled = 0

    def per_step_ms(self) -> dict[str, float]:
        """Milliseconds per step of each phase (forward split into its ops)."""
        a, n = self.acc, max(self.steps, 1)
        ops = ("matmul layers", "matmul output", "attention", "norms/rope/act", "embed")
        # each timed op carries about one clock reading inside its interval and one outside it
        c = self.clock_cost
        out = {k: max(a.get(k, 0.0) - c * self.calls.get(k, 0), 0.0) for k in ops}
        n_ops = sum(self.calls.get(k, 0) for k in ops)
        out["timer overhead"] = 2 * c * n_ops  # the op wrappers' clock readings (an estimate)
        out["forward python"] = a.get("forward", 0.0) - sum(out.values())
        out["schedule"] = a.get("schedule", 0.0)
        out["build_batch"] = a.get("build_batch", 0.0)
        out["update"] = a.get("update", 0.0)
        out["sample"] = a.get("sample", 0.0)
        out["deliver"] = a.get("sample+deliver", 0.0) - a.get("sample", 0.0)
        named = sum(out.values())
        out["step other"] = a.get("step", 0.0) - named
        out["step total"] = a.get("step", 0.0)
        return {k: v * 1e3 / n for k, v in out.items()}
