"""torch's ``test/distributed/test_distributed_spawn.py`` for any backend, ``pccl_aio`` too.

``DistributedTest._DistTestBase`` (``torch/testing/_internal/distributed/distributed_test.py``,
in the wheel) with each test in ``WORLD_SIZE`` spawned processes that meet through a
``file://`` init method, as PyTorch's CI runs it for gloo::

    BACKEND=gloo python -m pytest tests/torch_suite/spawn_suite.py -p no:cacheprovider -q -rA
    BACKEND=pccl_aio python -m pytest tests/torch_suite/spawn_suite.py -p no:cacheprovider -q -rA

``WORLD_SIZE`` defaults to 3, ``TEMP_DIR`` to a fresh temporary folder, ``INIT_METHOD`` to a
``file://`` one (each test makes a folder of its own as well: barrier files, the init file).
With ``BACKEND=pccl_aio`` this module imports ``pccl_aio.torch``: the spawned ranks unpickle
the test class from this module, so the import registers the backend in each of them too.

A backend that is not one of torch's own is added to ``DistTestCases.backend_feature``'s
sets that gloo is in (and "plugin"), so that the tests torch gates on those features (DDP,
subgroups, object collectives) run for it as they do for gloo (tests that need a GPU still
skip on a machine without one).

For such a backend the tests that torch runs for the name "gloo" alone (``BACKEND != "gloo"``,
``require_backend_is_available({"gloo"})``: barrier timeouts, batch_isend_irecv on CPU,
sparse all_reduce, ``Work.get_future``, all_reduce_coalesced, scatter_object_list, no_sync,
monitored_barrier) run too, since gloo passes them here; ``TORCH_SUITE_UNGATE=0`` skips them
as torch does. ``expected.py`` lists those that test an API torch keeps for gloo.

``DISTRIBUTED_TESTS_DEFAULT_TIMEOUT`` (torch's per-test limit, after which it terminates the
ranks) defaults to 100 s here, not torch's 300 s; ``check_expected.py`` compares a run with
``expected.py``.
"""

import functools
import os
import sys
import tempfile

os.environ.setdefault("WORLD_SIZE", "3")
os.environ.setdefault("TEMP_DIR", tempfile.mkdtemp(prefix="torch_suite_"))
# as PyTorch's CI sets it: torch reads it at import (test_barrier_timeout_global skips without
# a file:// one); each test then points it at an init file of its own before it spawns
os.environ.setdefault("INIT_METHOD", "file://" + os.path.join(os.environ["TEMP_DIR"], "init"))
os.environ.setdefault("DISTRIBUTED_TESTS_DEFAULT_TIMEOUT", "100")
BACKEND = os.environ["BACKEND"]
_TORCH_BACKENDS = ("gloo", "nccl", "ucc", "mpi")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

if BACKEND == "pccl_aio":
    import pccl_aio.torch  # noqa: F401  (registers the backend, in every spawned rank)

from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402
from torch.testing._internal.common_utils import run_tests  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = False

if not dist.is_available():
    print("torch.distributed is not available, no tests", file=sys.stderr)
    sys.exit(0)

# before distributed_test's import: its decorators read these sets when the class is made
if BACKEND not in _TORCH_BACKENDS:
    for _feature, _backends in DistTestCases.backend_feature.items():
        if "gloo" in _backends or _feature == "plugin":
            _backends.add(BACKEND)

from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()


# skip reasons of the tests that torch runs for the backend named "gloo" only (on this
# machine gloo passes each of them); TORCH_SUITE_UNGATE=0 leaves them skipped
_GLOO_NAME_GATES = (
    "Only gloo backend supports timeouts",
    "GLOO Batch Send Recv CPU",
    "Only Gloo backend supports sparse all reduce",
    "get_future is only supported on mpi, nccl and gloo",
    f"Test requires backend {BACKEND} to be one of {{'gloo'}}",
)


def _ungated(fn):
    @functools.wraps(fn)
    def test(self):
        return fn(self)

    test.__unittest_skip__ = False
    return test


if BACKEND not in _TORCH_BACKENDS and os.environ.get("TORCH_SUITE_UNGATE", "1") == "1":
    for _name, _fn in vars(DistributedTest._DistTestBase).items():
        if _name.startswith("test_") and getattr(_fn, "__unittest_skip_why__", None) in (
            _GLOO_NAME_GATES
        ):
            setattr(TestDistBackendWithSpawn, _name, _ungated(_fn))


if __name__ == "__main__":
    run_tests()
