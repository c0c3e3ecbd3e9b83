"""Placeholder: kernels land in the next commit (see backends/cpu/matmul.py for the contract)."""

KERNELS = {}
