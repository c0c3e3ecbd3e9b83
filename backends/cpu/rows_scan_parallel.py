"""rows_scan over both cores, for the compute thread only: the server's engine thread runs the
serial scan (an OpenMP team there would throttle the compute thread's, edged/server/compute_thread.py),
and at c = 16 that serial pass over 16 x 262k logits was ~3 ms of every decode step.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from edged.backends.cpu.sampling import rows_scan, scan_chunk


@nb.njit(cache=True, nogil=True, parallel=True)
def _chunk_scan_parallel(bits, chunk, keys, bad):
    """sampling._chunk_scan with the (row, chunk) steps spread over the threads."""
    nc = keys.shape[1]
    for t in nb.prange(bits.shape[0] * nc):
        scan_chunk(bits, t // nc, t % nc, chunk, keys, bad)


def rows_scan_parallel(logits: np.ndarray, argmax: bool = True):
    """sampling.rows_scan (same results), its pass over the logits in parallel."""
    return rows_scan(logits, argmax, scan=_chunk_scan_parallel)
