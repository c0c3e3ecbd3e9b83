"""One thread runs the forward pass of every model the server has loaded.

libgomp keeps an OpenMP worker team per thread that ever ran a parallel region, and once the
teams' threads outnumber the cores, every team's workers spin only 100 times between regions
(its "throttled" spin) and then sleep on a futex. A second model, loaded and idle, thus halved
the first one's decode speed (35 vs 79 tok/s, Gemma 3 270M with SmolLM2 idle, 2 cores) when each
engine thread ran its own forward passes. One compute thread keeps one team, whatever the number
of models; the engines' threads still schedule, sample and stream concurrently.
"""

from __future__ import annotations

import queue
import threading

from edged.backends.cpu.rows_scan_parallel import rows_scan_parallel
from edged.backends.cpu.sampling import rows_scan

SCAN_PARALLEL_ROWS = 4  # fewer rows: the hand-off to the compute thread costs more than it saves


class _Job:
    __slots__ = ("fn", "args", "result", "error", "done")

    def __init__(self, fn, args):
        self.fn, self.args = fn, args
        self.result = self.error = None
        self.done = threading.Event()


class ComputeThread:
    """Runs callables one at a time on a single long-lived thread (started on first use)."""

    def __init__(self, name: str = "edged-compute"):
        self._name = name
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def run(self, fn, *args):
        """fn(*args) on the compute thread; returns its result or raises its exception."""
        if threading.current_thread() is self._thread:
            return fn(*args)
        self._ensure_started()
        job = _Job(fn, args)
        self._jobs.put(job)
        job.done.wait()
        if job.error is not None:
            raise job.error
        return job.result

    def _ensure_started(self) -> None:
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                job.result = job.fn(*job.args)
            except BaseException as e:  # re-raised in the caller's thread
                job.error = e
            job.fn = job.args = None  # keep no reference to an unloaded model's arrays
            job.done.set()
            del job


COMPUTE = ComputeThread()


class SharedForward:
    """A model whose forward() runs on the compute thread; everything else is the model's."""

    def __init__(self, model, compute: ComputeThread = COMPUTE):
        self._model = model
        self._compute = compute

    def forward(self, batch, kv):
        return self._compute.run(self._model.forward, batch, kv)

    def rows_scan(self, logits):
        """backends/cpu/sampling.rows_scan of the sampled rows: from 4 rows on (1 MB each at a
        262k vocabulary) a parallel pass on the compute thread, beside whose team no other may run."""
        if logits.shape[0] < SCAN_PARALLEL_ROWS:
            return rows_scan(logits)
        return self._compute.run(rows_scan_parallel, logits)

    def __getattr__(self, name):
        return getattr(self._model, name)
