"""Matmul kernel benchmark: every supported type at n = 1 and n = 16 on the default model's tensors
(synthesized ones for types it lacks) next to the streaming bandwidth and numpy BLAS, same run.

Usage: .venv/bin/python bench/kernels.py [MODEL.gguf] [--repeat 5] [--json]
(the same as `edged bench --kernels`; the logic lives in edged/bench_kernels.py)
"""

import sys

from edged.cli.bench import command

if __name__ == "__main__":
    command.main(args=["--kernels", *sys.argv[1:]], prog_name="bench/kernels.py")
