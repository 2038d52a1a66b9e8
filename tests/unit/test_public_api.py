"""The public surface of ``pccl_aio``: exported names, exception tree, version, the
argument habits of ``Quantization``, and the one dtype table and op check of ``_types``."""

from __future__ import annotations

import dataclasses

import pytest

import pccl_aio
import pccl_aio as pccl
from pccl_aio import _errors, _types, _version

EXPECTED_ALL = {
    "AllReduceHandle", "AuthenticationError", "Buckets", "Communicator", "DataType",
    "DeadlockError", "InvalidUsageError",
    "KickedError", "Master",
    "MasterConnectionError", "MasterLostError", "MembershipChangedError", "PcclError",
    "PcclTimeoutError", "PeerLostError",
    "ProtocolError",
    "QuantAlgo", "Quantization", "ReduceInfo", "ReduceOp", "RemoteProtocolError",
    "SharedState", "SharedStateError", "SparseCompressor", "SyncInfo", "SyncStrategy",
    "TooFewPeersError",
    "TopologyInfo", "TransferHandle", "TransferInfo", "VersionMismatchError",
    "__version__", "load_secret", "progress_bar", "run", "tls_contexts",
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
    assert callable(pccl_aio.run) and callable(pccl_aio.progress_bar)
    for name in EXPECTED_ALL - {"__version__", "run", "load_secret", "tls_contexts",
                                "progress_bar"}:
        assert isinstance(getattr(pccl_aio, name), type), name
    assert pccl_aio.RemoteProtocolError is _errors.RemoteProtocolError
    assert pccl_aio.Master.__module__.startswith("pccl_aio.")


def test_version() -> None:
    assert pccl_aio.__version__ == _version.__version__
    assert isinstance(pccl_aio.__version__, str) and pccl_aio.__version__


ERRORS = ["AuthenticationError", "DeadlockError", "InvalidUsageError", "KickedError",
          "MasterConnectionError", "MasterLostError", "MembershipChangedError",
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
    assert issubclass(e.AuthenticationError, e.MasterConnectionError)
    assert issubclass(e.RemoteProtocolError, e.ProtocolError)
    assert not issubclass(e.PeerLostError, e.MasterConnectionError)
    assert issubclass(e.MembershipChangedError, e.PeerLostError)  # (caught as a lost peer)
    assert e.PeerLostError.code == "RANK_CONNECTION_LOST"
    assert e.TooFewPeersError.code == "TOO_FEW_PEERS"
    assert e.InvalidUsageError.code == "INVALID_USAGE"
    assert set(e.__all__) == {*ERRORS, "PcclError"}
    with pytest.raises(ConnectionError):
        raise pccl_aio.PeerLostError("peer 3 left")
    with pytest.raises(pccl_aio.PcclError):
        raise pccl_aio.PcclTimeoutError("deadline")


# ---- Quantization: keyword arguments only, every bad value an InvalidUsageError -------------

def test_quantization_takes_keywords_and_normalises() -> None:
    q = pccl.Quantization(algo=pccl.QuantAlgo.ZERO_POINT_SCALE, dtype="uint16")
    assert q.algo is pccl.QuantAlgo.ZERO_POINT_SCALE and q.dtype is pccl.DataType.UINT16
    assert q == pccl.Quantization(algo=2, dtype=pccl.DataType.UINT16)  # type: ignore[arg-type]
    assert hash(q) == hash(pccl.Quantization(algo=2, dtype="UINT16"))  # type: ignore[arg-type]
    assert pccl.Quantization() == pccl.Quantization(algo=pccl.QuantAlgo.MIN_MAX, dtype="uint8")
    assert dataclasses.replace(q, dtype="uint8").dtype is pccl.DataType.UINT8
    with pytest.raises(dataclasses.FrozenInstanceError):
        q.algo = pccl.QuantAlgo.MIN_MAX  # type: ignore[misc]


@pytest.mark.parametrize("args", [
    (pccl.DataType.UINT16,),  # once silently meant algo=ZERO_POINT_SCALE
    (pccl.QuantAlgo.MIN_MAX, "uint8"),
    (pccl.QuantAlgo.MIN_MAX,),
])
def test_quantization_rejects_positional_arguments(args: tuple[object, ...]) -> None:
    with pytest.raises(pccl.InvalidUsageError, match="keyword arguments only"):
        pccl.Quantization(*args)  # type: ignore[misc]


@pytest.mark.parametrize("algo", [3, -1, "MIN_MAX", 1.0, True, None, pccl.DataType.UINT16,
                                  pccl.ReduceOp.AVG])
def test_quantization_rejects_bad_algorithms(algo: object) -> None:
    with pytest.raises(pccl.InvalidUsageError, match="unknown quantization algorithm"):
        pccl.Quantization(algo=algo, dtype="uint8")  # type: ignore[arg-type]


@pytest.mark.parametrize(("dtype", "message"), [
    ("int8", "uint8, uint16 or uint4, not int8"),
    (pccl.DataType.FLOAT32, "uint8, uint16 or uint4, not float32"),
    ("f4", "unsupported dtype 'f4'"),
    (0, "unsupported dtype 0"),
    (None, "unsupported dtype None"),
])
def test_quantization_rejects_bad_dtypes(dtype: object, message: str) -> None:
    with pytest.raises(pccl.InvalidUsageError, match=message):
        pccl.Quantization(algo=pccl.QuantAlgo.MIN_MAX, dtype=dtype)  # type: ignore[arg-type]


# ---- the one dtype table and the one op check ---------------------------------------------

def test_dtype_table_and_names() -> None:
    import numpy as np

    assert [*_types.TENSOR_DTYPES, pccl.DataType.UINT4] == list(pccl.DataType)
    for dt in _types.TENSOR_DTYPES:
        assert dt.label == dt.name.lower() == _types.DTYPE_NAMES[dt]
        assert dt.itemsize == np.dtype(_types.NUMPY_STORAGE[dt]).itemsize
        assert dt.is_float == (dt.label in ("float16", "bfloat16", "float32", "float64"))
        assert pccl.DataType.parse(dt.label) is dt and pccl.DataType.parse(dt) is dt
        if dt is not pccl.DataType.BFLOAT16:
            assert pccl.DataType.parse(np.dtype(dt.label)) is dt
    assert _types.NUMPY_STORAGE[pccl.DataType.BFLOAT16] == "uint16"
    assert pccl.DataType.parse(" Float ") is pccl.DataType.FLOAT32
    assert pccl.DataType.parse("bf16") is pccl.DataType.BFLOAT16


def test_uint4_is_a_quantization_dtype_only() -> None:
    """uint4 (MIN_MAX codes, two per byte) is refused as a tensor, shared-state or
    all-reduce dtype: by DataType.parse and by the buffers the API views."""
    from pccl_aio._peer.core.buffers import as_buffer

    u4 = pccl.DataType.UINT4
    for q in (pccl.Quantization(dtype="uint4"), pccl.Quantization(dtype=" UINT4 "),
              pccl.Quantization(algo=pccl.QuantAlgo.MIN_MAX, dtype=u4)):
        assert (q.algo, q.dtype) == (pccl.QuantAlgo.MIN_MAX, u4)
    assert pccl.Quantization(algo=pccl.QuantAlgo.NONE, dtype="uint4").dtype is u4
    with pytest.raises(pccl.InvalidUsageError, match="uint4 quantization supports MIN_MAX only"):
        pccl.Quantization(algo=pccl.QuantAlgo.ZERO_POINT_SCALE, dtype="uint4")
    assert u4.label == "uint4" and not u4.is_float and u4 not in _types.DTYPE_NAMES
    with pytest.raises(pccl.InvalidUsageError, match="two codes share a byte"):
        u4.itemsize  # noqa: B018
    for value in (u4, "uint4"):
        with pytest.raises(pccl.InvalidUsageError, match="uint4 is a quantization dtype only"):
            pccl.DataType.parse(value)
    with pytest.raises(pccl.InvalidUsageError, match="unsupported dtype 12"):
        pccl.DataType.parse(12)
    with pytest.raises(pccl.InvalidUsageError, match="quantization dtype only"):
        as_buffer(bytearray(8), writable=True, dtype=u4)


def test_torch_uint4_tensors_are_refused() -> None:
    from pccl_aio._peer.core.buffers import as_buffer

    torch = pytest.importorskip("torch")
    t = torch.zeros(8, dtype=torch.uint8).view(torch.uint4)
    with pytest.raises(pccl.InvalidUsageError, match="unsupported dtype uint4"):
        as_buffer(t, writable=True)
    with pytest.raises(pccl.InvalidUsageError, match="unsupported dtype uint4"):
        pccl.SharedState({"w": t})


def test_dtype_parse_takes_torch_dtypes_by_name() -> None:
    torch = pytest.importorskip("torch")
    assert pccl.DataType.parse(torch.bfloat16) is pccl.DataType.BFLOAT16
    assert pccl.DataType.parse(torch.int16) is pccl.DataType.INT16
    with pytest.raises(pccl.InvalidUsageError, match="float8_e4m3fn"):
        pccl.DataType.parse(torch.float8_e4m3fn)


@pytest.mark.parametrize("bad", [5, -1, True, "SUM", 1.5, None, pccl.QuantAlgo.MIN_MAX])
def test_reduce_op_check_is_one_definition(bad: object) -> None:
    """The communicator's op check and the kernels' front raise the same error, naming the
    ops by name."""
    from pccl_aio._compute import ops as _ops
    from pccl_aio._peer.core import args

    assert args.op(pccl.ReduceOp.MAX) is pccl.ReduceOp.MAX and args.op(2) is pccl.ReduceOp.PROD
    with pytest.raises(pccl.InvalidUsageError, match="SUM, AVG, PROD, MAX, MIN") as mine:
        args.op(bad)
    with pytest.raises(pccl.InvalidUsageError) as theirs:
        _ops.reduce_into(bytearray(4), bytes(4), bad, pccl.DataType.FLOAT32)  # type: ignore[arg-type]
    assert str(mine.value) == str(theirs.value)


def test_argument_errors_name_dtypes() -> None:
    import numpy as np

    from pccl_aio._peer.core import args

    with pytest.raises(pccl.InvalidUsageError,
                       match=r"src \(4 x float32\) and dst \(5 x float32\)"):
        args.buffers(np.zeros(4, np.float32), np.zeros(5, np.float32))
    with pytest.raises(pccl.InvalidUsageError, match="float64 tensor, not int32"):
        args.quantization(pccl.Quantization(), pccl.DataType.INT32)
    none = pccl.Quantization(algo=pccl.QuantAlgo.NONE)
    assert args.quantization(none, pccl.DataType.INT32) is None
