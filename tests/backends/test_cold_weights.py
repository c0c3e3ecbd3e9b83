"""cold_weights.dram_copies: the tensors a kernel is timed over, copied until they exceed twice the
last-level cache, each copy its own buffer holding the same blocks."""

import numpy as np
from gguf import GGMLQuantizationType as T

from edged.backends.cpu.cold_weights import dram_copies, last_level_cache_bytes
from edged.quant.synth import random_qtensor


def test_copies_exceed_twice_the_cache_in_separate_buffers():
    w = random_qtensor(T.Q4_K, 8, 256)  # 8 x 144 bytes
    copies = dram_copies(w, cache_bytes=10_000)
    assert copies[0] is w
    assert sum(c.data.nbytes for c in copies) >= 20_000 > sum(c.data.nbytes for c in copies[1:])
    assert len({c.data.ctypes.data for c in copies}) == len(copies)
    assert all(np.array_equal(c.data, w.data) and c.shape == w.shape for c in copies)
    big = random_qtensor(T.Q8_0, 64, 64)
    assert dram_copies(big, cache_bytes=100) == [big]
    assert last_level_cache_bytes() > 0


def test_a_list_is_copied_in_turn():
    ws = [random_qtensor(T.Q6_K, 4, 256, seed=s) for s in range(3)]  # 4 x 210 bytes each
    copies = dram_copies(ws, cache_bytes=5_000)
    assert copies[:3] == ws
    assert sum(c.data.nbytes for c in copies) >= 10_000
    for i, c in enumerate(copies[3:]):
        assert c.data is not ws[i % 3].data and np.array_equal(c.data, ws[i % 3].data)
