"""The blocking facade (``pccl_aio.blocking``) as a plain training script uses it: user
threads, no event loop of their own, real sockets on 127.0.0.1."""

from __future__ import annotations

import concurrent.futures
import gc
import os
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pccl_aio as pccl
from pccl_aio import blocking

FAST = {"heartbeat_interval": 0.2, "heartbeat_timeout": 2.0}


@pytest.fixture
def master() -> Iterator[blocking.Master]:
    with blocking.Master("127.0.0.1", 0, admission_interval=0.0, **FAST) as m:
        yield m


def _join(master: blocking.Master, n: int, **kw: Any) -> list[blocking.Communicator]:
    """``n`` blocking communicators, the first alone, each next one admitted by the others."""
    comms = [blocking.Communicator(master.address, **FAST, **kw) for _ in range(n)]
    comms[0].connect()
    with ThreadPoolExecutor(n) as pool:
        for i in range(1, n):
            joining = pool.submit(comms[i].connect)
            while not all(pool.map(lambda c: c.are_peers_pending(), comms[:i])):
                assert not joining.done() or joining.exception() is None
            list(pool.map(lambda c: c.update_topology(), comms[:i]))
            joining.result()
    return comms


def _in_threads(fns: list[Callable[[], Any]]) -> list[Any]:
    with ThreadPoolExecutor(len(fns)) as pool:
        return [f.result() for f in [pool.submit(fn) for fn in fns]]


def test_peers_in_their_own_threads_reduce_exactly(master: blocking.Master) -> None:
    comms = _join(master, 3)
    try:
        xs = [np.arange(1 << 16, dtype=np.float32) * (i + 1) for i in range(3)]
        infos = _in_threads([lambda c=c, x=x: c.all_reduce(x) for c, x in zip(comms, xs)])
        want = np.arange(1 << 16, dtype=np.float32) * 6
        assert [i.world_size for i in infos] == [3, 3, 3]
        for x in xs:
            np.testing.assert_array_equal(x, want)
    finally:
        for c in comms:
            c.close()


def test_one_communicator_used_from_two_user_threads_at_once(master: blocking.Master) -> None:
    """Each peer launches tags 1 and 2 in the same order (the README's rule: the same calls
    in the same order on every peer), then two of its threads wait on them at the same time
    while a third reads the communicator's attributes."""
    comms = _join(master, 2)
    stop = threading.Event()

    def watch(c: blocking.Communicator) -> int:
        seen = 0
        while not stop.is_set():
            assert c.world_size == 2 and c.peer_group_world_size == 2
            seen += 1
        return seen

    try:
        with ThreadPoolExecutor(6) as pool:
            watchers = [pool.submit(watch, c) for c in comms]
            try:
                for step in range(20):
                    xs = {(p, t): np.full(4096, float(p + 1 + step + 100 * t), np.float32)
                          for p in range(2) for t in (1, 2)}
                    hs = {(p, t): c.all_reduce_async(xs[p, t], tag=t)
                          for p, c in enumerate(comms) for t in (1, 2)}
                    list(pool.map(lambda h: h.wait(timeout=10), hs.values()))
                    for (_, t), x in xs.items():
                        assert (x == 3 + 2 * step + 200 * t).all()
            finally:  # the watchers end before the pool's exit waits for them
                stop.set()
            assert all(w.result() > 0 for w in watchers)
    finally:
        stop.set()
        for c in comms:
            c.close()


def test_handles_wait_done_and_cancel(master: blocking.Master) -> None:
    a, _ = comms = _join(master, 2)
    try:
        xs = [np.ones(1 << 20, np.float32) for _ in comms]
        hs = [c.all_reduce_async(x, tag=5) for c, x in zip(comms, xs)]
        assert [h.wait(timeout=10).world_size for h in hs] == [2, 2]
        assert all(h.done() for h in hs) and (xs[0] == 2).all()
        lone = a.all_reduce_async(np.ones(8, np.float32), tag=6)  # b never joins it
        assert not lone.done()
        lone.cancel()
        with pytest.raises(concurrent.futures.CancelledError):  # as awaiting the async one
            lone.wait(timeout=5)
        ys = [np.full(8, i + 1.0, np.float32) for i in range(2)]  # both usable after it
        _in_threads([lambda c=c, y=y: c.all_reduce(y, tag=6) for c, y in zip(comms, ys)])
        assert (ys[0] == 3).all() and (ys[1] == 3).all()
    finally:
        for c in comms:
            c.close()


def test_done_callbacks_run_on_the_loop_thread_and_result_never_blocks(
        master: blocking.Master) -> None:
    a, _ = comms = _join(master, 2)
    try:
        ended: list[tuple[str, Any]] = []
        got = threading.Event()

        def on_end(h: blocking.AllReduceHandle) -> None:
            try:
                ended.append((threading.current_thread().name, h.result().world_size))
            except BaseException as exc:  # (the cancelled one: CancelledError, as wait())
                ended.append((threading.current_thread().name, exc))
            if len(ended) == 3:
                got.set()

        xs = [np.ones(1 << 16, np.float32) for _ in comms]
        hs = [c.all_reduce_async(x, tag=9) for c, x in zip(comms, xs)]
        with pytest.raises(pccl.InvalidUsageError, match="still running"):
            hs[0].result()  # (b's launch may not be there yet: it cannot have ended)
        for h in hs:
            h.add_done_callback(on_end)
        assert [h.wait(timeout=10).world_size for h in hs] == [2, 2]
        lone = a.all_reduce_async(np.ones(8, np.float32), tag=10)  # b never joins it
        lone.add_done_callback(on_end)
        lone.cancel()
        assert got.wait(10)
        names = {n for n, _ in ended}
        assert names <= {"pccl_aio blocking communicator"} and len(ended) == 3
        assert sorted(str(v) for _, v in ended[:2]) == ["2", "2"] and (xs[0] == 2).all()
        assert isinstance(ended[2][1], concurrent.futures.CancelledError)
        with pytest.raises(concurrent.futures.CancelledError):
            lone.result()  # (never blocks: it ended)
        late = threading.Event()  # (registered after the end: called all the same)
        hs[1].add_done_callback(lambda h: late.set() if h.result().world_size == 2 else None)
        assert late.wait(10)
    finally:
        for c in comms:
            c.close()


def test_started_metrics_port_and_the_masters_addresses(master: blocking.Master) -> None:
    """What the async classes offer besides the calls: ``handle.started()`` (blocking),
    ``metrics_port``, ``config``, the master's ``status_address``/``metrics_address``."""
    comms = _join(master, 2, metrics_port=0)
    try:
        xs = [np.ones(1 << 16, np.float32) for _ in comms]
        hs = [c.all_reduce_async(x, tag=7) for c, x in zip(comms, xs)]
        assert _in_threads([h.started for h in hs]) == [True, True]
        assert [h.wait(timeout=10).world_size for h in hs] == [2, 2]
        ports = [c.metrics_port for c in comms]
        assert all(isinstance(p, int) and p > 0 for p in ports) and ports[0] != ports[1]
        assert comms[0].config.heartbeat_interval == FAST["heartbeat_interval"]
        assert master.status_address == master.metrics_address == ""
        assert master.host == "127.0.0.1" and master.heartbeat_interval == 0.2
    finally:
        for c in comms:
            c.close()


def test_errors_are_the_async_apis_typed_errors(master: blocking.Master) -> None:
    a, _ = comms = _join(master, 2)
    try:
        with pytest.raises(pccl.InvalidUsageError):
            a.all_reduce("not a tensor")
        with pytest.raises(pccl.PcclTimeoutError):
            a.all_reduce(np.ones(8, np.float32), timeout=0.3)  # b never calls
        with pytest.raises(pccl.InvalidUsageError):
            blocking.Communicator("no-port")
        x = [np.full(8, i + 1.0, np.float32) for i in range(2)]
        _in_threads([lambda c=c, v=v: c.all_reduce(v) for c, v in zip(comms, x)])
        assert (x[0] == 3).all()  # usable after the timeout
    finally:
        for c in comms:
            c.close()


def test_heartbeats_go_on_while_the_user_thread_computes(master: blocking.Master) -> None:
    """The user's step takes longer than the heartbeat timeout (2 s): nobody is dropped."""
    comms = _join(master, 2)
    try:
        def step(c: blocking.Communicator, i: int) -> float:
            time.sleep(3.0)  # the user's compute, not a synchronisation
            x = np.full(16, i + 1.0, np.float32)
            c.all_reduce(x)
            return float(x[0])

        assert _in_threads([lambda c=c, i=i: step(c, i) for i, c in enumerate(comms)]) == [3, 3]
        assert [c.world_size for c in comms] == [2, 2]
    finally:
        for c in comms:
            c.close()


def _facade_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("pccl_aio blocking")]


def test_close_and_garbage_collection_stop_the_thread(master: blocking.Master) -> None:
    before = len(_facade_threads())
    c = blocking.Communicator(master.address, **FAST)
    c.connect()
    assert len(_facade_threads()) == before + 1
    c.close()
    c.close()  # idempotent
    assert c.closed and len(_facade_threads()) == before
    d = blocking.Communicator(master.address, **FAST)
    d.connect()
    del d
    gc.collect()
    assert len(_facade_threads()) == before


EXIT_SCRIPT = """
import numpy as np
from pccl_aio import blocking
m = blocking.Master("127.0.0.1", 0).start()
c = blocking.Communicator(m.address)
c.connect()
assert c.are_peers_pending() is False
print("voted", flush=True)
# no close(): interpreter exit must end both cleanly
"""


def test_interpreter_exit_without_close_neither_hangs_nor_warns() -> None:
    proc = subprocess.run([sys.executable, "-W", "always", "-X", "dev", "-c", EXIT_SCRIPT],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0 and proc.stdout == "voted\n", proc
    assert proc.stderr == "", proc.stderr


def test_a_blocking_call_from_the_loop_thread_is_refused(master: blocking.Master) -> None:
    c = blocking.Communicator(master.address, **FAST)
    try:
        async def inside() -> None:
            c.are_peers_pending()

        with pytest.raises(RuntimeError, match="its own event loop thread"):
            c._runner.call(inside())
    finally:
        c.close()


@pytest.mark.timeout(60)
def test_sync_shared_state_passes_progress_to_the_loop_thread(master: blocking.Master) -> None:
    a, b = comms = _join(master, 2)
    try:
        good = np.random.default_rng(5).integers(0, 256, 6 << 20, dtype=np.uint8)
        xb = np.zeros_like(good)
        calls: list[tuple[int, int, threading.Thread]] = []

        def progress(done: int, total: int) -> None:
            calls.append((done, total, threading.current_thread()))

        _, ib = _in_threads([
            lambda: a.sync_shared_state(pccl.SharedState({"w": good}, revision=1)),
            lambda: b.sync_shared_state(pccl.SharedState({"w": xb}), progress=progress)])
        assert xb.tobytes() == good.tobytes() and ib.rx_bytes == good.nbytes
        assert calls and calls[-1][:2] == (good.nbytes, good.nbytes), calls
        assert {t for *_, t in calls} == {b._runner.thread}  # the runner's loop thread
        with pytest.raises(pccl.InvalidUsageError):
            b.sync_shared_state(pccl.SharedState({"w": xb}), progress=42)  # type: ignore[arg-type]
    finally:
        for c in comms:
            c.close()


def _frames(exc: BaseException) -> list[traceback.FrameSummary]:
    return traceback.extract_tb(exc.__traceback__)


def test_errors_carry_a_short_traceback_without_future_or_thread_frames() -> None:
    """The caller's frame, then the library's own: no ``concurrent.futures`` / threading
    internals (nor the facade's wrappers) between them; the message is the library's."""
    with pytest.raises(pccl.InvalidUsageError) as bad:
        blocking.Communicator("localhost:48148:1")
    with socket.create_server(("127.0.0.1", 0)) as mute:  # accepts, never answers
        c = blocking.Communicator(f"127.0.0.1:{mute.getsockname()[1]}",
                                  heartbeat_interval=0.1, heartbeat_timeout=0.3)
        try:
            with pytest.raises(pccl.PcclTimeoutError) as late:
                c.connect(attempts=1)
        finally:
            c.close()
    for err, raiser in ((bad, "address.py"), (late, "dial.py")):
        frames = _frames(err.value)
        text = "".join(traceback.format_exception(err.value))
        assert frames[0].name == (
            "test_errors_carry_a_short_traceback_without_future_or_thread_frames")
        assert Path(frames[-1].filename).name == raiser, text
        assert len(frames) <= 10, text
        assert not any(f"{os.sep}concurrent{os.sep}" in f.filename or
                       Path(f.filename).name == "threading.py" or f.name == "<lambda>"
                       for f in frames), text
        assert str(err.value) in text.splitlines()[-1]
    assert "malformed" in str(bad.value) and "did not answer" in str(late.value)
