"""Smoke tests of the kernel benchmark plumbing (tiny sizes; speed itself is never asserted)."""

import json

import numpy as np
from click.testing import CliRunner
from gguf import GGMLQuantizationType as T

from edged.bench import kernels as bench_kernels
from edged.cli import main
from edged.quant.synth import random_qtensor
from edged.quant.tensor import QTensor


def test_bandwidth_and_one_row():
    bw = bench_kernels.measure_bandwidth(8 << 20, repeat=1)
    assert bw > 0
    w = random_qtensor(T.Q5_0, 33, 64)
    row = bench_kernels.bench_tensor(w, "synthetic", bw, repeat=1, cache_bytes=1 << 16)
    bench_kernels.bench_blas(w, row, repeat=1)
    assert row.ms_n1 > 0 and row.ms_n16 > 0 and row.blas_ms_n16 > 0 and row.cols_ratio > 0
    assert row.ms_n1_dram > 0 and row.ms_n16_dram > 0 and row.cols_ratio_dram > 0
    result = {"bandwidth_gbs": bw, "threads": 2, "repeat": 1, "rows": [bench_kernels.asdict(row)]}
    table = bench_kernels.format_table(result)
    assert "Q5_0" in table and "GB/s" in table
    json.dumps(result)  # JSON-able as `--json` prints it


def test_unsupported_type_is_skipped_with_a_note():
    bad = QTensor("w", T.Q8_1, (4, 256), np.zeros(4 * 8 * 36, np.uint8))  # a type edged has no kernel for
    assert bench_kernels.bench_tensor(bad, "synthetic", 1.0).note.startswith("skipped")


def test_cli_lists_every_section():
    res = CliRunner().invoke(main, ["bench", "--help"])
    assert res.exit_code == 0
    for flag in ("--kernels", "--concurrency", "--prefix-cache", "--breakdown", "--prompt-tokens", "serve"):
        assert flag in res.output