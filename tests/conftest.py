"""Suite-wide settings: an empty model store; slow tests get a longer default timeout than pyproject's 600 s."""

import os
import shutil
import tempfile

import pytest

SLOW_TIMEOUT_S = 1800


def pytest_configure(config):
    from edged.store import default_store_root

    # the user's own store (where ./install.sh put SmolLM2), for tests that need a real chat model
    os.environ.setdefault("EDGED_TEST_USER_STORE", str(default_store_root()))
    # An empty model store for the whole suite (subprocesses inherit it): what a user's store holds
    # never changes a test; MODEL left out means the Gemma package, as tests/helpers/model.py assumes.
    config._edged_store = os.environ["EDGED_MODELS"] = tempfile.mkdtemp(prefix="edged-test-store-")


def pytest_unconfigure(config):
    if hasattr(config, "_edged_store"):
        shutil.rmtree(config._edged_store, ignore_errors=True)


def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT_S))
