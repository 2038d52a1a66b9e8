"""The unit tests turn every warning into an error (an unclosed file or connection, an
exception ignored in ``__del__``, a deprecation): they leave nothing behind."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.path)).parent == HERE:
            item.add_marker(pytest.mark.filterwarnings("error"))
