"""Issue 46: point-to-point and all-to-all on the by-name group under a SIGKILL. Three ranks
(``torch_p2p_peer.py``) run steps of ``all_to_all_single`` and ``send``/``recv`` with the last
rank; it is SIGKILLed while the others wait on it. Every survivor raises a typed error within
``data_timeout`` + 2 s (never a wrong block, never a hang), and ``send``/``recv`` between the
two survivors works afterwards; on torch 2.14+ (``dist.shrink_group``) the survivors shrink
the world to themselves and all-reduce in it."""

from __future__ import annotations

import signal
import time

import pytest

from tests.process.procs import HERE, MASTER, events, spawn

torch = pytest.importorskip("torch")
from torch.torch_version import TorchVersion  # noqa: E402

pytestmark = pytest.mark.timeout(120)

PEER = str(HERE / "torch_p2p_peer.py")
DATA_TIMEOUT = 10.0  # the communicator's default, which the by-name group uses
STOP_AT = 30


async def test_every_survivor_raises_when_a_rank_is_killed_mid_exchange(procs, tmp_path):
    master = await spawn("master", MASTER, "10.0")
    procs.append(master)
    port = int(await master.line())
    env = {"OMP_NUM_THREADS": "1", "PCCL_AIO_MASTER": f"127.0.0.1:{port}"}
    init = str(tmp_path / "init")
    ranks = []
    for r in range(3):
        extra = [str(STOP_AT)] if r == 2 else []
        ranks.append(await spawn(f"rank{r}", PEER, init, "3", str(r), *extra, env=env,
                                 stdin=r == 2))
        procs.append(ranks[-1])
    await events(ranks[2], {"stopping"}, timeout=90)
    ranks[2].signal(signal.SIGKILL)
    killed = time.monotonic()
    for p in ranks[:2]:
        raised = (await events(p, {"raised"}, timeout=DATA_TIMEOUT + 10))[-1]
        assert time.monotonic() - killed <= DATA_TIMEOUT + 2, raised
        assert raised["step"] == STOP_AT, raised  # (it never got past the lost rank)
        assert raised["type"] in ("PeerLostError", "MembershipChangedError",
                                  "RuntimeError"), raised
        assert "Error" in raised["error"] or "peer" in raised["error"], raised
    for r, p in enumerate(ranks[:2]):
        after = (await events(p, {"after"}, timeout=30))[-1]
        assert after["got"] == 7.0 + (1 - r)
    if TorchVersion(torch.__version__) >= "2.14":  # (.ci/torch-next runs it)
        for r, p in enumerate(ranks[:2]):
            shrunk = (await events(p, {"shrunk"}, timeout=30))[-1]
            assert shrunk == {"event": "shrunk", "world": 2, "rank": r, "sum": 3.0}, shrunk
    for p in ranks[:2]:
        assert await p.proc.wait() == 0
