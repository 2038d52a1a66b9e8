"""``pccl_aio.blocking`` offers what the async API does, under the same names, and every public
property of the public classes says what it is."""

from __future__ import annotations

import inspect
from typing import Any

import pccl_aio
from pccl_aio import blocking
from pccl_aio._peer.core.config import PeerConfig

# Intentional differences, by class: names only one of the two APIs has, and why.
ASYNC_ONLY: dict[str, set[str]] = {
    # the door the blocking facade's threads write small sends through (``pccl_aio.torch``'s
    # ``send``); the blocking communicator's own ``send`` is the call a user makes
    "Communicator": {"send_from_thread"},
    "AllReduceHandle": set(),
    # loop-owned objects (read on the master's loop; another thread would race it), and
    # serve_forever: the blocking master serves from its own thread until close()
    "Master": {"state", "story", "status", "serve_forever"},
}
BLOCKING_ONLY: dict[str, set[str]] = {
    "Communicator": {"closed"},  # whether close() stopped the facade's thread
    "AllReduceHandle": set(),
    "Master": set(),
}


def _public(obj: Any) -> set[str]:
    return {n for n in dir(obj) if not n.startswith("_")}


async def _async_objects() -> dict[str, Any]:
    comm = pccl_aio.Communicator("127.0.0.1:1")  # nothing connects until connect()
    return {"Communicator": comm, "Master": pccl_aio.Master("127.0.0.1", 0)}


async def test_blocking_classes_expose_what_the_async_ones_do() -> None:
    """Instances, so that attributes set in ``__init__`` count as well as the class's."""
    mine = await _async_objects()
    comm = blocking.Communicator("127.0.0.1:1")
    master = blocking.Master("127.0.0.1", 0)
    try:
        pairs = {"Communicator": (mine["Communicator"], comm),
                 "Master": (mine["Master"], master),
                 "AllReduceHandle": (pccl_aio.AllReduceHandle, blocking.AllReduceHandle)}
        for name, (a, b) in pairs.items():
            assert _public(a) - _public(b) == ASYNC_ONLY[name], name
            assert _public(b) - _public(a) == BLOCKING_ONLY[name], name
    finally:
        comm.close()
        master.close()
        await mine["Communicator"].close()
        await mine["Master"].close()


def test_blocking_buckets_is_the_async_class_with_a_blocking_all_reduce() -> None:
    assert issubclass(blocking.Buckets, pccl_aio.Buckets)
    assert _public(blocking.Buckets) == _public(pccl_aio.Buckets)
    assert not inspect.iscoroutinefunction(blocking.Buckets.all_reduce)
    assert inspect.iscoroutinefunction(pccl_aio.Buckets.all_reduce)
    params = inspect.signature(pccl_aio.Buckets.all_reduce).parameters
    assert list(inspect.signature(blocking.Buckets.all_reduce).parameters) == list(params)


def _classes() -> list[type]:
    found = [getattr(pccl_aio, n) for n in pccl_aio.__all__]
    found += [getattr(blocking, n) for n in blocking.__all__]
    found.append(PeerConfig)  # what Communicator.config is
    return [c for c in dict.fromkeys(found)
            if inspect.isclass(c) and c.__module__.startswith("pccl_aio")]


def test_every_public_property_has_a_docstring() -> None:
    missing = []
    for cls in _classes():
        for klass in cls.__mro__:
            for name, value in vars(klass).items():
                if name.startswith("_") or not klass.__module__.startswith("pccl_aio"):
                    continue
                if isinstance(value, property) and not (value.__doc__ or "").strip():
                    missing.append(f"{cls.__module__}.{cls.__name__}.{name}")
    assert not missing, sorted(set(missing))
