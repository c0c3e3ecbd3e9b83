"""CUDA kernel tests under the numba-cuda simulator (NUMBA_ENABLE_CUDASIM=1).

The variable must be set before numba.cuda is first imported: if numba itself is already loaded
(by earlier tests), its config is re-read. If numba.cuda was imported without the simulator, every
test here is skipped with the reason. The variable stays set for the rest of the session (numba
re-reads its config at each compile, and numba.cuda cannot switch modes once imported).
"""

import os
import sys

import edged  # noqa: F401  (numba settings before numba is imported)

_already = "numba.cuda" in sys.modules
if not _already:
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    if "numba" in sys.modules:
        from numba.core import config as _config

        _config.reload_config()

import pytest  # noqa: E402
from numba import cuda  # noqa: E402

SIMULATED = "simulator" in getattr(cuda.to_device, "__module__", "")


@pytest.fixture(autouse=True)
def _need_simulator():
    if not SIMULATED:
        pytest.skip("numba.cuda was imported without NUMBA_ENABLE_CUDASIM=1 before these tests; "
                    "run tests/backends/cuda in its own pytest process")


# The simulator runs each CUDA thread as a Python thread and each syncthreads() as a barrier its
# block manager polls for; at Python's 5 ms GIL switch interval a 128-thread barrier took ~34 ms,
# at 0.1 ms ~6 ms (the hybrid model tests: 3-4x faster).
SWITCH_INTERVAL_S = 1e-4


@pytest.fixture(autouse=True)
def _quick_thread_switches():
    before = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    yield
    sys.setswitchinterval(before)
