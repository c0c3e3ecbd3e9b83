"""edged's command line keeps freed memory mapped (edged.malloc_policy): steps of varying
temporaries in a worker thread fault far fewer pages in than under glibc's moving thresholds."""

import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(sys.platform != "linux" or platform.libc_ver()[0] != "glibc",
                                reason="mallopt's thresholds are glibc's")

# Twelve steps in one thread, each allocating, touching and freeing four arrays of 6-14 MB (sizes
# varying step to step, as prefill chunks' do); prints the minor faults of steps 4-11.
_STEPS = r"""
import resource, sys, threading
if sys.argv[1] == "cli":
    import edged.cli
import numpy as np

faults = []

def work():
    for i in range(12):
        a = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        arrs = [np.ones(((6 + (i * 5 + j * 3) % 9) << 20) >> 3) for j in range(4)]
        del arrs
        faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - a)

t = threading.Thread(target=work)
t.start()
t.join()
print(sum(faults[4:]))
"""


def _faults(mode: str, env_extra: dict | None = None) -> int:
    drop = ("GLIBC_TUNABLES", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_THRESHOLD_")
    env = {k: v for k, v in os.environ.items() if k not in drop} | (env_extra or {})
    out = subprocess.run([sys.executable, "-c", _STEPS, mode], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split()[-1])


def test_the_cli_keeps_step_memory_mapped():
    plain, cli = _faults("plain"), _faults("cli")
    assert plain > 10_000  # ~88 MB faulted in again over 8 steps: what the policy is for
    assert cli * 8 < plain, (cli, plain)


def test_malloc_settings_in_the_environment_are_the_users():
    assert _faults("cli", {"GLIBC_TUNABLES": "glibc.malloc.check=0"}) > 10_000
