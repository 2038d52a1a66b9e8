"""The public surface of ``pccl_aio``: exported names, exception tree, version."""

from __future__ import annotations

import pytest

import pccl_aio
from pccl_aio import _errors, _version

EXPECTED_ALL = {
    "AllReduceHandle", "Communicator", "DataType", "InvalidUsageError", "KickedError", "Master",
    "MasterConnectionError", "PcclError", "PcclTimeoutError", "PeerLostError", "ProtocolError",
    "QuantAlgo", "Quantization", "ReduceInfo", "ReduceOp", "RemoteProtocolError",
    "SharedState", "SharedStateError", "SyncInfo", "SyncStrategy", "TooFewPeersError", "VersionMismatchError",
    "__version__", "run",
}


def test_all_is_exactly_the_public_surface() -> None:
    assert len(pccl_aio.__all__) == len(set(pccl_aio.__all__)), "duplicates in __all__"
    assert set(pccl_aio.__all__) == EXPECTED_ALL


def test_every_exported_name_exists_and_star_import_matches() -> None:
    for name in pccl_aio.__all__:
        assert hasattr(pccl_aio, name), name
    ns: dict[str, object] = {}
    exec("from pccl_aio import *", ns)
    assert set(ns) - {"__builtins__"} == EXPECTED_ALL


def test_exported_objects_are_what_they_claim() -> None:
    assert callable(pccl_aio.run)
    for name in EXPECTED_ALL - {"__version__", "run"}:
        assert isinstance(getattr(pccl_aio, name), type), name
    assert pccl_aio.RemoteProtocolError is _errors.RemoteProtocolError
    assert pccl_aio.Master.__module__.startswith("pccl_aio.")


def test_version() -> None:
    assert pccl_aio.__version__ == _version.__version__
    assert isinstance(pccl_aio.__version__, str) and pccl_aio.__version__


ERRORS = ["InvalidUsageError", "KickedError", "MasterConnectionError",
          "PcclTimeoutError", "PeerLostError", "ProtocolError", "RemoteProtocolError",
          "SharedStateError", "TooFewPeersError", "VersionMismatchError"]


@pytest.mark.parametrize("name", ERRORS)
def test_every_error_derives_from_pccl_error_and_names_a_code(name: str) -> None:
    cls = getattr(_errors, name)
    assert issubclass(cls, _errors.PcclError) and issubclass(cls, Exception)
    assert isinstance(cls.code, str) and cls.code.isupper()
    if hasattr(pccl_aio, name):
        assert getattr(pccl_aio, name) is cls


@pytest.mark.parametrize(("name", "builtin", "expected"), [
    ("InvalidUsageError", ValueError, True),
    ("MasterConnectionError", ConnectionError, True),
    ("VersionMismatchError", ConnectionError, True),
    ("PeerLostError", ConnectionError, True),
    ("PcclTimeoutError", TimeoutError, True),
    ("PcclTimeoutError", ConnectionError, False),
    ("TooFewPeersError", ConnectionError, False),
    ("TooFewPeersError", ValueError, False),
    ("KickedError", ConnectionError, False),
    ("SharedStateError", ConnectionError, False),
    ("ProtocolError", ConnectionError, False),
    ("PeerLostError", TimeoutError, False),
    ("InvalidUsageError", ConnectionError, False),
])
def test_exception_builtin_bases(name: str, builtin: type, expected: bool) -> None:
    assert issubclass(getattr(_errors, name), builtin) is expected


def test_exception_tree_inside_pccl() -> None:
    e = _errors
    assert issubclass(e.VersionMismatchError, e.MasterConnectionError)
    assert issubclass(e.RemoteProtocolError, e.ProtocolError)
    assert not issubclass(e.PeerLostError, e.MasterConnectionError)
    assert e.PeerLostError.code == "RANK_CONNECTION_LOST"
    assert e.TooFewPeersError.code == "TOO_FEW_PEERS"
    assert e.InvalidUsageError.code == "INVALID_USAGE"
    assert set(e.__all__) == {*ERRORS, "PcclError"}
    with pytest.raises(ConnectionError):
        raise pccl_aio.PeerLostError("peer 3 left")
    with pytest.raises(pccl_aio.PcclError):
        raise pccl_aio.PcclTimeoutError("deadline")
