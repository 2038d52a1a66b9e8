"""numpy is optional for torch users: ``import pccl_aio`` does not import it, torch tensors
are viewed through their memory (every supported dtype, bfloat16 included), and the whole
stack runs with numpy unimportable (``torch_without_numpy.py``, also a CI step)."""

from __future__ import annotations

import gc
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import pccl_aio as pccl
from pccl_aio._peer.core import args
from pccl_aio._peer.core.buffers import as_buffer

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("torch_without_numpy.py")
#: Without the compiled kernels (a pure-Python build) pccl_aio runs on numpy's.
HAS_EXTENSION = importlib.util.find_spec("pccl_aio._kernels") is not None
DTYPES = {torch.uint8: "UINT8", torch.int8: "INT8", torch.uint16: "UINT16",
          torch.int16: "INT16", torch.uint32: "UINT32", torch.int32: "INT32",
          torch.uint64: "UINT64", torch.int64: "INT64", torch.float16: "FLOAT16",
          torch.bfloat16: "BFLOAT16", torch.float32: "FLOAT32", torch.float64: "FLOAT64"}


def _python(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run this interpreter on the checkout (with the extension, unless the build has none)."""
    full = {k: v for k, v in os.environ.items() if k != "PCCL_AIO_NO_EXTENSIONS"}
    full["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), full.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, *argv], env={**full, **env}, cwd=ROOT,
                          capture_output=True, text=True, timeout=100)


def test_import_does_not_import_numpy() -> None:
    out = _python("-c", "import sys, pccl_aio; import pccl_aio._compute.ops; "
                  "print(sorted(m for m in sys.modules if m.partition('.')[0] == 'numpy'))")
    assert out.returncode == 0, out.stderr
    assert (out.stdout.strip() == "[]") is HAS_EXTENSION, out.stdout


def test_torch_all_reduce_and_shared_state_with_numpy_unimportable() -> None:
    out = _python(str(SCRIPT))
    if not HAS_EXTENSION:
        assert out.returncode != 0 and "needs its compiled kernels or numpy" in out.stderr
        return
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip().splitlines()[-1] == "ok"


def test_the_numpy_kernels_without_numpy_say_what_is_missing() -> None:
    out = _python("-c", "import sys; sys.modules['numpy'] = None; import pccl_aio",
                  PCCL_AIO_NO_EXTENSIONS="1")
    assert out.returncode != 0
    want = "PCCL_AIO_NO_EXTENSIONS is set: pccl_aio needs its compiled kernels or numpy"
    assert want in out.stderr


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_every_supported_torch_dtype_is_viewed_in_place(dtype: torch.dtype) -> None:
    t = torch.arange(2, 50, dtype=torch.int64).to(dtype).reshape(4, 12)[1:]  # an offset view
    b = as_buffer(t, writable=True)
    assert b.dtype is getattr(pccl.DataType, DTYPES[dtype]) and b.count == t.numel() == 36
    assert b.view.nbytes == t.numel() * t.element_size() and b.address == t.data_ptr()
    assert b.view.tobytes() == bytes(t.view(torch.uint8).flatten().tolist())
    b.view[: t.element_size()] = bytes(t.element_size())  # writes land in the tensor
    assert t.flatten()[0] == 0 and t.flatten()[1] != 0
    empty = as_buffer(torch.empty(0, dtype=dtype), writable=True)
    assert empty.count == 0 and empty.view.nbytes == 0


def test_a_view_keeps_its_tensor_alive() -> None:
    view = as_buffer(torch.arange(4096, dtype=torch.float32), writable=True).view
    gc.collect()
    junk = [torch.full((4096,), -1.0) for _ in range(64)]  # reuse any freed memory
    assert view.tobytes() == torch.arange(4096, dtype=torch.float32).numpy().tobytes()
    del junk


@pytest.mark.parametrize(("tensor", "name"), [
    (torch.zeros(4, dtype=torch.float8_e4m3fn), "float8_e4m3fn"),
    (torch.zeros(4, dtype=torch.float8_e5m2), "float8_e5m2"),
    (torch.zeros(4, dtype=torch.bool), "bool"),
    (torch.zeros(4, dtype=torch.complex64), "complex64"),
    (np.zeros(4, np.complex64), "complex64"),
    (np.zeros(4, np.bool_), "bool"),
])
def test_unsupported_dtypes_raise_invalid_usage_naming_the_dtype(tensor: Any, name: str) -> None:
    with pytest.raises(pccl.InvalidUsageError, match=f"src has unsupported dtype {name}; "):
        args.buffers(tensor, None)
    with pytest.raises(pccl.InvalidUsageError, match=f"unsupported dtype {name}"):
        pccl.SharedState({"k": tensor})


def test_bad_layouts_raise_invalid_usage() -> None:
    with pytest.raises(pccl.InvalidUsageError, match="not contiguous"):
        as_buffer(torch.zeros(4, 4).t(), writable=True)
    with pytest.raises(pccl.InvalidUsageError, match="not in native byte order"):
        as_buffer(np.zeros(4, ">f4"), writable=True)
    with pytest.raises(pccl.InvalidUsageError, match="read-only"):
        as_buffer(np.frombuffer(bytes(8), np.float32), writable=True)
    with pytest.raises(pccl.InvalidUsageError, match="resolve_neg"):
        as_buffer(torch._neg_view(torch.ones(4)), writable=True)
    grad = torch.zeros(3, requires_grad=True)
    assert as_buffer(grad, writable=True).count == 3


def test_overlap_is_an_address_range_comparison() -> None:
    x = torch.zeros(10)
    with pytest.raises(pccl.InvalidUsageError, match="overlap partially"):
        args.buffers(x[0:8], x[2:10])
    assert args.buffers(x[:5], x[5:])[2] is False  # adjacent, not overlapping
    assert args.buffers(x, x.view(torch.int32).view(torch.float32))[2] is True  # same memory
    raw = bytearray(16)
    with pytest.raises(pccl.InvalidUsageError, match="overlap partially"):
        args.buffers(memoryview(raw)[0:8].toreadonly(), memoryview(raw)[4:12])
    assert args.buffers(memoryview(raw).toreadonly(), raw)[2] is True
    a = np.zeros(8, np.float32)
    ro = a[:6]
    ro.flags.writeable = False
    with pytest.raises(pccl.InvalidUsageError, match="overlap partially"):
        args.buffers(ro, a[2:])
    assert args.buffers(bytes(8), bytearray(8))[2] is False
