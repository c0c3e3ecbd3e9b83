"""Delivery of deltas from the engine thread: one loop wake-up per step (Outbox), sinks, and the
engine's asyncio path equal to its blocking path."""

import asyncio

import numpy as np
import pytest

from edged.engine.engine import Engine, EngineConfig
from edged.engine.stream import Delta, Outbox, RequestStream
from edged.sampling import SamplingParams
from tests.server.stub_model import StubModel


class _CountingLoop:
    """Records call_soon_threadsafe calls; runs them when asked."""

    def __init__(self, closed=False):
        self.calls = []
        self.closed = closed

    def call_soon_threadsafe(self, fn, *args):
        if self.closed:
            raise RuntimeError("Event loop is closed")
        self.calls.append((fn, args))

    def run(self):
        calls, self.calls = self.calls, []
        for fn, args in calls:
            fn(*args)


def _delta(i, reason=None):
    return Delta(i, f"t{i}", finish_reason=reason)


def test_outbox_one_wakeup_per_loop_per_flush():
    a, b = _CountingLoop(), _CountingLoop()
    got = {k: [] for k in range(5)}
    streams = []
    for k in range(5):
        s = RequestStream(f"r{k}")
        s.bind_loop(a if k < 3 else b, got[k].append)
        streams.append(s)
    plain = RequestStream("plain")  # not bound: its consumer is a thread
    out = Outbox()
    for step in range(2):
        for k, s in enumerate(streams):
            out.put(s, _delta(10 * step + k))
        out.put(plain, _delta(step))
        assert plain._q.qsize() == step + 1  # delivered at once, no flush needed
        assert not a.calls and not b.calls  # nothing reaches a loop before the flush
        out.flush()
        assert len(a.calls) == 1 and len(b.calls) == 1  # one wake-up per loop for the step
        a.run()
        b.run()
    assert got == {k: [_delta(k), _delta(10 + k)] for k in range(5)}
    out.flush()
    assert not a.calls and not b.calls  # an empty step wakes nobody


def test_outbox_closed_loop_and_failing_sink_spare_the_others():
    gone = RequestStream("gone")
    gone.bind_loop(_CountingLoop(closed=True))
    live = _CountingLoop()
    bad, good = RequestStream("bad"), RequestStream("good")
    seen = []

    def boom(d):
        raise KeyError("consumer bug")

    bad.bind_loop(live, boom)
    good.bind_loop(live, seen.append)
    out = Outbox()
    out.put(gone, _delta(1))
    out.put(bad, _delta(2))
    out.put(good, _delta(3))
    out.flush()  # the closed loop is skipped silently
    live.run()  # the failing sink is logged; the next stream still gets its delta
    assert seen == [_delta(3)]


def test_sink_needs_a_loop():
    eng = Engine(StubModel(64), _Tok(), EngineConfig(num_blocks=16, block_size=4))
    with pytest.raises(ValueError, match="loop"):
        eng.add_request([5, 6], SamplingParams(temperature=0.0, max_tokens=2), sink=print)


class _Tok:
    """The tokenizer surface the engine uses: eos ids and a streaming decoder."""

    eos_ids = (1,)

    def stream_decoder(self):
        class D:
            def push(self, t):
                return f"<{t}>"

            def flush(self):
                return ""

        return D()


def test_engine_async_sinks_equal_blocking_streams():
    rng = np.random.default_rng(0)
    prompts = [rng.integers(4, 64, size=int(rng.integers(1, 12))).tolist() for _ in range(6)]
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    eng = Engine(StubModel(64), _Tok(), EngineConfig(num_blocks=64, block_size=4, max_seqs=6)).start()
    try:
        blocking = [list(eng.add_request(p, params)) for p in prompts]

        async def run():
            loop = asyncio.get_running_loop()
            got = [[] for _ in prompts]
            done = asyncio.Event()
            left = [len(prompts)]

            def sink(i, d):
                got[i].append(d)
                if d.finish_reason is not None:
                    left[0] -= 1
                    if not left[0]:
                        done.set()

            for i, p in enumerate(prompts):
                eng.add_request(p, params, loop=loop, sink=lambda d, i=i: sink(i, d))
            # and one stream consumed with `async for` (no sink) on the same loop
            s = eng.add_request(prompts[0], params, loop=loop)
            via_iter = [d async for d in s]
            await asyncio.wait_for(done.wait(), 60)
            return got, via_iter

        got, via_iter = asyncio.run(run())
        assert got == blocking
        assert via_iter == blocking[0]
        assert all(d[-1].finish_reason == "length" for d in got)
    finally:
        eng.stop()
