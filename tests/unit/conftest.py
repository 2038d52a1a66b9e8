"""The unit tests turn every warning into an error (an unclosed file or connection, an
exception ignored in ``__del__``, a deprecation): they leave nothing behind."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pccl_aio._launch.record import Record

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.path)).parent == HERE:
            item.add_marker(pytest.mark.filterwarnings("error"))


@pytest.fixture
def csv_record(tmp_path: Path) -> Iterator[Record]:
    """A launcher's record writing ``r.csv`` in the test's folder, closed after the test."""
    rec = Record(tmp_path / "r.csv")
    yield rec
    rec.close()
