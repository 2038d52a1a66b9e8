"""The wan-mesh fixture: brought up once for the module, always taken down."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .mesh import Mesh

HOSTS, DELAY_MS, RATE_MBIT = 4, 5, 500


@pytest.fixture(scope="module")
def mesh() -> Iterator[Mesh]:
    """4 hosts, 5 ms one way, 500 Mbit/s on every ordered pair (tests change pairs with
    ``set`` and restore them with ``uniform``). Needs root."""
    net = Mesh(HOSTS, DELAY_MS, RATE_MBIT)
    try:
        net.up()
        yield net
    finally:
        net.down()
