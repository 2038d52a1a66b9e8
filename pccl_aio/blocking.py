"""The blocking facade: the async API's calls, blocking, for plain (synchronous) training
loops and scripts.

    from pccl_aio import blocking
    with blocking.Communicator("10.0.0.1:48148") as comm:
        comm.connect()
        comm.all_reduce(grads)

Each ``Communicator`` and ``Master`` owns one event loop in one background thread (uvloop when
installed); every call is one hop to that thread and back, and it may come from any thread of
the program. The loop keeps heartbeating while the calling thread computes, so a training step
may take as long as it likes. Errors are the same typed exceptions as the async API's. A
``KeyboardInterrupt`` (or any exception) in the waiting thread cancels the call, as cancelling
the coroutine would. ``close()``, garbage collection and interpreter exit close the session and
stop the thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import weakref
from collections.abc import Callable, Coroutine, Sequence
from types import TracebackType
from typing import Any, TypeVar

from ._master.server import Master as _AsyncMaster
from ._net.loops import new_loop
from ._peer.communicator import AllReduceHandle as _AsyncHandle
from ._peer.communicator import Communicator as _AsyncCommunicator
from ._peer.core.config import PeerConfig
from ._peer.data.buckets import Buckets as _AsyncBuckets
from ._peer.state.core.shared_state import SharedState
from ._types import Quantization, ReduceInfo, ReduceOp, SyncInfo, SyncStrategy, TopologyInfo

__all__ = ["AllReduceHandle", "Buckets", "Communicator", "Master"]

_T = TypeVar("_T")


class _LoopThread:
    """An event loop running forever in a daemon thread; ``call`` runs a coroutine on it and
    blocks the calling thread for the result."""

    def __init__(self, name: str) -> None:
        self.loop = new_loop()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, _T]) -> concurrent.futures.Future[_T]:
        if threading.current_thread() is self.thread:
            coro.close()
            raise RuntimeError("a blocking pccl_aio call from its own event loop thread "
                               "(use the async API inside coroutines)")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """Run ``coro`` on the loop; blocks until it ends. An exception in the waiting thread
        (``KeyboardInterrupt``) cancels it, and waits until the cancellation took effect.
        The coroutine's exception is raised with a short traceback: the caller's frames,
        then the library's (not the future's nor this module's wrappers)."""
        fut = self.submit(coro)
        try:
            exc = fut.exception()
        except BaseException:
            if fut.cancel():
                with contextlib.suppress(BaseException):
                    concurrent.futures.wait([fut])
            raise
        if exc is None:
            return fut.result()
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
            tb = tb.tb_next  # this module's coroutine wrappers
        del fut
        try:
            raise exc.with_traceback(tb)
        finally:
            del exc, tb

    def stop(self, last: Callable[[], Coroutine[Any, Any, None]] | None = None) -> None:
        """Run ``last()`` (a close), then stop the loop and join the thread. Idempotent."""
        if self.loop.is_closed():
            return
        if self.thread.is_alive() and threading.current_thread() is not self.thread:
            if last is not None:
                with contextlib.suppress(BaseException):
                    self.call(last())
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join()
        if not self.loop.is_running():
            self.loop.close()


def _finalize(runner: _LoopThread, close: Callable[[], Coroutine[Any, Any, None]]) -> None:
    runner.stop(close)


def _owned(name: str, factory: Callable[[], _T]) -> tuple[_LoopThread, _T]:
    """A new loop thread and the object ``factory`` builds on it (the thread is stopped
    again if that raises)."""
    runner = _LoopThread(name)

    async def make() -> _T:
        return factory()

    try:
        return runner, runner.call(make())
    except BaseException:
        runner.stop()
        raise


class AllReduceHandle:
    """An all-reduce in flight (``Communicator.all_reduce_async``): ``wait()`` blocks for its
    ``ReduceInfo`` or raises; ``cancel()`` aborts it for the whole group."""

    def __init__(self, runner: _LoopThread, handle: _AsyncHandle) -> None:
        self._runner, self._handle = runner, handle

    @property
    def tag(self) -> int:
        """The tag the all-reduce was launched with."""
        return self._handle.tag

    def done(self) -> bool:
        """The collective ended (completed, aborted or rejected): ``wait()`` will not block."""
        return self._handle.done()

    def started(self) -> bool:
        """Block until the master started the collective (data is flowing); False if it
        ended without starting (rejected, aborted while voting)."""
        return self._runner.call(self._handle.started())

    def wait(self, timeout: float | None = None) -> ReduceInfo:
        """Block until the all-reduce ends; ``PcclTimeoutError`` after ``timeout`` s (then
        aborted for the group), ``PeerLostError`` if it was aborted, as the async handle."""
        return self._runner.call(self._handle.wait(timeout))

    def cancel(self) -> None:
        """Abort the all-reduce for the whole group (the others get ``PeerLostError``)."""

        async def cancel() -> None:
            self._handle.cancel()

        self._runner.call(cancel())


class Communicator:
    """A blocking ``pccl_aio.Communicator``: the same options (``secret``, ``ssl``,
    timeouts, ...) and the same calls, each blocking the calling thread until it ends. See
    the async class for what each call does and raises."""

    def __init__(self, master: str | Sequence[str], **options: Any) -> None:
        self._runner, self._comm = _owned("pccl_aio blocking communicator",
                                          lambda: _AsyncCommunicator(master, **options))
        self._finalizer = weakref.finalize(self, _finalize, self._runner, self._comm.close)

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        """``close()`` ran (explicitly, by ``with`` or by garbage collection)."""
        return not self._finalizer.alive

    def close(self) -> None:
        """Leave the run and stop the background thread. Idempotent."""
        self._finalizer()

    # ---- attributes (read from the communicator; plain values) ------------------------------
    @property
    def peer_id(self) -> int:
        """This peer's id in the run (0 before ``connect``)."""
        return self._comm.peer_id

    @property
    def world_size(self) -> int:
        """Accepted peers of the whole run, all groups together (0 before ``connect``)."""
        return self._comm.world_size

    @property
    def peer_group(self) -> int:
        """The peer group this peer joined (its ``peer_group`` option)."""
        return self._comm.peer_group

    @property
    def peer_group_world_size(self) -> int:
        """Accepted peers of this peer's group, itself included: what AVG divides by."""
        return self._comm.peer_group_world_size

    @property
    def rank(self) -> int:
        """This peer's position in its group's ring for the current epoch (-1: not admitted)."""
        return self._comm.rank

    @property
    def ranks(self) -> list[int]:
        """The peer ids of this peer's group in rank order (the ring's) for the current epoch."""
        return self._comm.ranks

    @property
    def num_peer_groups(self) -> int:
        """Peer groups with at least one accepted peer."""
        return self._comm.num_peer_groups

    @property
    def largest_peer_group_world_size(self) -> int:
        """Accepted peers of the largest peer group."""
        return self._comm.largest_peer_group_world_size

    @property
    def gate(self) -> Any:
        """The listeners' handshake counters (``gate.stats``)."""
        return self._comm.gate

    @property
    def config(self) -> PeerConfig:
        """The options this communicator was made with, parsed (immutable)."""
        return self._comm.config

    @property
    def metrics_port(self) -> int | None:
        """The port ``/metrics`` is served on (the OS's choice for 0 once connected); None
        without metrics."""
        return self._comm.metrics_port

    # ---- calls -------------------------------------------------------------------------------
    def connect(self, attempts: int = 5, *, backoff: float = 0.2,
                timeout: float | None = 300.0) -> None:
        self._runner.call(self._comm.connect(attempts, backoff=backoff, timeout=timeout))

    def update_topology(self, *, timeout: float | None = None) -> None:
        self._runner.call(self._comm.update_topology(timeout=timeout))

    def wait_for_peers(self, n: int = 2, *, timeout: float | None = None) -> int:
        """Block until this peer's group has at least ``n`` peers, admitting joiners by the
        joint votes as they come (``pccl_aio.Communicator.wait_for_peers``)."""
        return self._runner.call(self._comm.wait_for_peers(n, timeout=timeout))

    def optimize_topology(self, *, timeout: float | None = None) -> TopologyInfo:
        return self._runner.call(self._comm.optimize_topology(timeout=timeout))

    def are_peers_pending(self, *, timeout: float | None = None) -> bool:
        return self._runner.call(self._comm.are_peers_pending(timeout=timeout))

    def barrier(self, *, tag: int = 0, timeout: float | None = None) -> None:
        self._runner.call(self._comm.barrier(tag=tag, timeout=timeout))

    def barrier_async(self, *, tag: int = 0) -> AllReduceHandle:
        """Launch a barrier and return at once; the handle's ``wait()`` blocks until every
        peer of the group called it."""

        async def launch() -> _AsyncHandle:
            return self._comm.barrier_async(tag=tag)

        return AllReduceHandle(self._runner, self._runner.call(launch()))

    def all_reduce(self, src: Any, dst: Any = None, *, op: ReduceOp = ReduceOp.SUM,
                   tag: int = 0, quantization: Quantization | None = None,
                   restore_on_abort: bool = True, timeout: float | None = None) -> ReduceInfo:
        return self._runner.call(self._comm.all_reduce(
            src, dst, op=op, tag=tag, quantization=quantization,
            restore_on_abort=restore_on_abort, timeout=timeout))

    def all_reduce_async(self, src: Any, dst: Any = None, *, op: ReduceOp = ReduceOp.SUM,
                         tag: int = 0, quantization: Quantization | None = None,
                         restore_on_abort: bool = True) -> AllReduceHandle:
        """Launch an all-reduce and return at once; do not touch ``src``/``dst`` until the
        handle's ``wait()`` returned."""

        async def launch() -> _AsyncHandle:
            return self._comm.all_reduce_async(src, dst, op=op, tag=tag,
                                               quantization=quantization,
                                               restore_on_abort=restore_on_abort)

        return AllReduceHandle(self._runner, self._runner.call(launch()))

    def all_reduce_multiple_with_retry(
            self, tensors: Sequence[Any], *, op: ReduceOp = ReduceOp.SUM,
            max_in_flight: int = 8, first_tag: int = 0, max_attempts: int = 32,
            quantization: Quantization | None = None,
            restore_on_abort: bool = True, timeout: float | None = None) -> list[ReduceInfo]:
        return self._runner.call(self._comm.all_reduce_multiple_with_retry(
            tensors, op=op, max_in_flight=max_in_flight, first_tag=first_tag,
            max_attempts=max_attempts, quantization=quantization,
            restore_on_abort=restore_on_abort, timeout=timeout))

    def sync_shared_state(self, state: SharedState,
                          strategy: SyncStrategy = SyncStrategy.ENFORCE_POPULAR, *,
                          timeout: float | None = None,
                          progress: Callable[[int, int], None] | None = None) -> SyncInfo:
        """Blocks until the group's sync ended. ``progress`` runs in this communicator's
        loop thread, not the calling one: it must not call back into the communicator (that
        raises) and should be quick (it holds up the loop)."""
        return self._runner.call(self._comm.sync_shared_state(state, strategy,
                                                              timeout=timeout,
                                                              progress=progress))


class Master:
    """A blocking ``pccl_aio.Master`` for scripts and tests: the same options; ``start()`` (or
    ``with``) binds and serves from a background thread until ``close()``."""

    def __init__(self, host: str = "127.0.0.1", port: int = 48148, **options: Any) -> None:
        self._runner, self._master = _owned("pccl_aio blocking master",
                                            lambda: _AsyncMaster(host, port, **options))
        self._finalizer = weakref.finalize(self, _finalize, self._runner, self._master.close)

    def start(self) -> Master:
        """Bind and serve; returns once listening. OSError if the address is taken."""
        self._runner.call(self._master.start())
        return self

    def close(self) -> None:
        """Stop serving, close every connection and stop the thread. Idempotent."""
        self._finalizer()

    def __enter__(self) -> Master:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    @property
    def port(self) -> int:
        """The port the master listens on (the OS's choice when constructed with 0)."""
        return self._master.port

    @property
    def address(self) -> str:
        """``host:port`` peers connect to."""
        return self._master.address

    @property
    def gate(self) -> Any:
        """The listener's handshake counters (``gate.stats``)."""
        return self._master.gate

    @property
    def host(self) -> str:
        """The host the master listens on."""
        return self._master.host

    @property
    def heartbeat_interval(self) -> float:
        """Seconds between the master's liveness ticks."""
        return self._master.heartbeat_interval

    @property
    def status_address(self) -> str:
        """``http://host:port/`` of the status page ("" without one)."""
        return self._master.status_address

    @property
    def metrics_address(self) -> str:
        """``http://host:port/metrics`` ("" without metrics)."""
        return self._master.metrics_address


class Buckets(_AsyncBuckets):
    """``pccl_aio.Buckets`` for a blocking ``Communicator``: the same buffers and
    ``grads_of`` (which returns this class); ``all_reduce(comm)`` blocks the calling thread
    until every bucket is done, so both APIs call it by the same name."""

    def all_reduce(  # type: ignore[override]  # blocking here, a coroutine in the base
            self, comm: Communicator, *, op: ReduceOp = ReduceOp.SUM, first_tag: int = 0,
            max_in_flight: int = 8, quantization: Quantization | None = None,
            timeout: float | None = None) -> list[ReduceInfo]:
        """All-reduce every tensor through the buckets on ``comm``, blocking; tags
        ``first_tag`` .. ``first_tag + len(flat) - 1``. Raises as
        ``all_reduce_multiple_with_retry`` (the tensors then unchanged)."""
        return self._reduce_blocking(comm, op, first_tag, max_in_flight, quantization, timeout)
