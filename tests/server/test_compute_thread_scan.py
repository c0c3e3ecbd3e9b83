"""SharedForward.rows_scan: big steps' logits are scanned on the compute thread, small ones where asked."""

import numpy as np

from edged.backends.cpu.sampling import rows_scan
from edged.server.compute_thread import SCAN_PARALLEL_ROWS, ComputeThread, SharedForward


class _Counting(ComputeThread):
    def __init__(self):
        super().__init__("edged-compute-scan-test")
        self.jobs = 0

    def run(self, fn, *args):
        self.jobs += 1
        return super().run(fn, *args)


def test_big_scans_run_on_the_compute_thread_with_the_serial_results():
    ct = _Counting()
    model = SharedForward(object(), compute=ct)
    logits = np.random.default_rng(0).standard_normal((SCAN_PARALLEL_ROWS + 1, 5000)).astype(np.float32)
    logits[2, 7] = np.inf
    best, finite = model.rows_scan(logits)
    assert ct.jobs == 1
    ref_best, ref_finite = rows_scan(logits)
    np.testing.assert_array_equal(finite, ref_finite)
    np.testing.assert_array_equal(best[finite], ref_best[finite])
    model.rows_scan(logits[: SCAN_PARALLEL_ROWS - 1])  # a small step: no hand-off
    assert ct.jobs == 1
