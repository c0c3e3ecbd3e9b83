"""Where an engine step's time goes: the engine's step phases (schedule, batch building, forward,
update, sampling, delivery) through its step-timer hook, and the forward split by a timing proxy
for the model's backend ops.

Installed on a live engine by `StepProfiler.attach` and removed by `detach`. Used by
`edged bench --breakdown`.
"""

from __future__ import annotations

import time
from collections import defaultdict

# how ops are grouped in the report
_OP_GROUP = {
    # attention_block_step: a decode layer's attention block in one call, and its FFN where it takes it
    "attention": "attention", "store_kv": "attention", "attention_block_step": "layer step",
    "layers_step": "layer step",  # every layer of a decode step in one call
    "rms_norm": "norms/rope/act", "rope": "norms/rope/act", "gelu_tanh_mul": "norms/rope/act",
    "silu_mul": "norms/rope/act", "softcap": "norms/rope/act", "add": "norms/rope/act",
    "scale": "norms/rope/act", "embed": "embed", "rope_store_kv": "norms/rope/act",  # + the KV store
    "matmuls": "matmul layers", "moe_matmul": "matmul layers", "moe_ffn_step": "matmul layers",
    "moe_block_step": "matmul layers", "swiglu_oai_mul": "norms/rope/act",
    "moe_combine": "norms/rope/act",  # a MoE layer's experts, their sum
}
# the ops per_step_ms reports, in order; a timed op of no group counts in "other ops"
_OPS = ("matmul layers", "matmul output", "layer step", "attention", "norms/rope/act", "embed",
        "other ops")


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
                key = _OP_GROUP.get(name, "other ops")
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
    """Accumulates seconds per phase over the steps an engine runs while attached (an
    edged.engine.engine.StepTimer).

    Phases: schedule, build_batch, forward (split into matmul layers / matmul output / attention
    block (a decode step's fused attention) / attention / norms/rope/act / embed / other ops (batch
    uploads, copies) / forward python, plus the estimated cost of the profiler's own clock
    readings), update, sample and deliver; step total is their sum.
    """

    _PHASES = ("schedule", "build_batch", "forward", "update", "sample", "deliver")

    def __init__(self, clock: str = "wall"):
        if clock not in ("wall", "thread"):
            raise ValueError(f"clock must be 'wall' or 'thread', got {clock!r}")
        # thread: CPU time of the engine thread, steady on a busy machine; it sees all kernel
        # work only when kernels run on the calling thread alone (NUMBA_NUM_THREADS=1)
        self.clock = time.perf_counter if clock == "wall" else time.thread_time
        self.acc: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)  # timed op calls per key
        self.items: dict[str, int] = defaultdict(int)  # tokens batched, rows sampled
        self.clock_cost = _clock_cost(self.clock)  # seconds one clock reading adds
        self.steps = 0
        self._t = 0.0
        self._undo: list = []

    @property
    def tokens(self) -> int:
        """Tokens in the batches."""
        return self.items["build_batch"]

    @property
    def sampled(self) -> int:
        """Logits rows sampled."""
        return self.items["sample"]

    # -- the engine's StepTimer (engine thread) ----------------------------------------------
    def begin(self) -> None:
        self.steps += 1
        self._t = self.clock()

    def phase(self, name: str, items: int = 0) -> None:
        t = self.clock()
        self.acc[name] += t - self._t
        self.items[name] += items
        self._t = t

    # -- any thread --------------------------------------------------------------------------
    def attach(self, engine) -> "StepProfiler":
        model = engine.model
        out_name = getattr(getattr(model, "output", None), "name", None)
        if hasattr(model, "layer_ops"):  # the model's backends, swapped for timing proxies of them
            old_layer, old_out = model.layer_ops, model.output_ops
            model.layer_ops = [_TimedOps(o, self.acc, out_name, self.clock, self.calls) for o in old_layer]
            model.output_ops = _TimedOps(old_out, self.acc, out_name, self.clock, self.calls)
            self._undo.append(lambda: (setattr(model, "layer_ops", old_layer),
                                       setattr(model, "output_ops", old_out)))
        engine.step_timer = self
        self._undo.append(lambda: setattr(engine, "step_timer", None))
        return self

    def detach(self) -> None:
        while self._undo:
            self._undo.pop()()

    def reset(self) -> None:
        self.acc.clear()
        self.calls.clear()
        self.items.clear()
        self.steps = 0

    def per_step_ms(self) -> dict[str, float]:
        """Milliseconds per step of each phase (forward split into its ops)."""
        a, n = self.acc, max(self.steps, 1)
        # each timed op carries about one clock reading inside its interval and one outside it
        c = self.clock_cost
        out = {k: max(a.get(k, 0.0) - c * self.calls.get(k, 0), 0.0) for k in _OPS}
        n_ops = sum(self.calls.get(k, 0) for k in _OPS)
        out["timer overhead"] = 2 * c * n_ops  # the op wrappers' clock readings (an estimate)
        out["forward python"] = a.get("forward", 0.0) - sum(out.values())
        for k in self._PHASES:
            if k != "forward":
                out[k] = a.get(k, 0.0)
        out["step total"] = sum(a.get(k, 0.0) for k in self._PHASES)
        return {k: v * 1e3 / n for k, v in out.items()}
