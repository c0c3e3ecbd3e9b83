"""Suite-wide settings: slow tests get a longer default timeout than pyproject's 600 s."""

import pytest

SLOW_TIMEOUT_S = 1800


def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT_S))
