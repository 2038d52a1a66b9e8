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
import functools
import weakref
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

from ._errors import InvalidUsageError
from ._master.blocking import Master
from ._net.loopthread import LoopThread, finalize
from ._net.loopthread import owned as _owned
from ._peer.communicator import Communicator as _AsyncCommunicator
from ._peer.communicator import env_options
from ._peer.core.config import PeerConfig
from ._peer.data.buckets import Buckets as _AsyncBuckets
from ._peer.data.handle import CollectiveHandle as _AsyncHandle
from ._peer.p2p import threaded
from ._peer.p2p.threaded import TransferHandle
from ._peer.state.core.shared_state import SharedState
from ._types import (
    Quantization,
    ReduceInfo,
    ReduceOp,
    SyncInfo,
    SyncStrategy,
    TopologyInfo,
    TransferInfo,
)

__all__ = ["AllReduceHandle", "Buckets", "Communicator", "Master", "TransferHandle"]

_HERE = frozenset({__file__})  # a traceback leaves this module's wrappers out


class AllReduceHandle:
    """A collective in flight (``Communicator.all_reduce_async`` or any ``*_async`` call):
    ``wait()`` blocks for its ``ReduceInfo`` or raises; ``cancel()`` aborts it for the whole
    group."""

    def __init__(self, runner: LoopThread,
                 handle: _AsyncHandle | concurrent.futures.Future[_AsyncHandle]) -> None:
        self._runner = runner
        if isinstance(handle, concurrent.futures.Future):
            self._launched = handle  # (a posted launch: it runs on the loop thread soon)
        else:
            self._launched = concurrent.futures.Future()
            self._launched.set_result(handle)

    @property
    def _handle(self) -> _AsyncHandle:
        """The async handle; blocks until a posted launch ran, raises what it raised."""
        return self._launched.result()

    @property
    def tag(self) -> int:
        """The tag the all-reduce was launched with."""
        return self._handle.tag

    def done(self) -> bool:
        """The collective ended (completed, aborted or rejected): ``wait()`` will not block."""
        if not self._launched.done():
            return False
        return self._launched.exception() is not None or self._handle.done()

    def started(self) -> bool:
        """Block until the master started the collective (data is flowing); False if it
        ended without starting (rejected, aborted while voting)."""
        return self._runner.call(self._handle.started())

    def wait(self, timeout: float | None = None) -> ReduceInfo:
        """Block until the all-reduce ends; ``PcclTimeoutError`` after ``timeout`` s (then
        aborted for the group), ``PeerLostError`` if it was aborted, as the async handle."""
        return self._runner.call(self._handle.wait(timeout))

    def add_done_callback(self, fn: Callable[[AllReduceHandle], None]) -> None:
        """Call ``fn(handle)`` once the collective ended, on the communicator's loop thread
        (keep it short, it holds the loop; hand work to another thread); ``result()`` then
        gives the outcome. Does not block: the callback is registered from the loop thread."""

        def register() -> None:
            if self._launched.exception() is not None:
                fn(self)  # (the launch raised: that is the outcome)
            else:
                self._handle.add_done_callback(lambda _: fn(self))

        self._runner.loop.call_soon_threadsafe(register)

    def result(self) -> ReduceInfo:
        """The outcome of a collective that ended (``done()``): its ``ReduceInfo`` or its
        error; ``InvalidUsageError`` if it is still running. Never blocks."""
        if not self._launched.done():
            raise InvalidUsageError("the collective is still being launched (wait() for it)")
        try:
            return self._handle.result()
        except asyncio.CancelledError as exc:  # (as wait() raises it)
            raise concurrent.futures.CancelledError(*exc.args) from exc

    def cancel(self) -> None:
        """Abort the all-reduce for the whole group (the others get ``PeerLostError``)."""
        if self._launched.exception() is not None:
            return  # (never launched)

        async def cancel() -> None:
            self._handle.cancel()

        self._runner.call(cancel())


class Communicator:
    """A blocking ``pccl_aio.Communicator``: the same options (``secret``, ``ssl``,
    timeouts, ...) and the same calls, each blocking the calling thread until it ends. See
    the async class for what each call does and raises."""

    @classmethod
    def from_env(cls, **options: Any) -> Communicator:
        """The run the environment names (the async ``Communicator.from_env``)."""
        masters, found = env_options()
        return cls(masters, **{**found, **options})

    def __init__(self, master: str | Sequence[str], **options: Any) -> None:
        self._runner, self._comm = _owned("pccl_aio blocking communicator",
                                           lambda: _AsyncCommunicator(master, **options), _HERE)
        self._finalizer = weakref.finalize(self, finalize, self._runner, self._comm.close)

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

    @property
    def tx_bytes(self) -> int:
        """Payload bytes its collectives sent (as the async ``Communicator.tx_bytes``)."""
        return self._comm.tx_bytes

    @property
    def rx_bytes(self) -> int:
        """Payload bytes its collectives received (as the async ``Communicator.rx_bytes``)."""
        return self._comm.rx_bytes

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

    def barrier_async(self, *, tag: int = 0, ring: Sequence[int] | None = None
                      ) -> AllReduceHandle:
        """Launch a barrier and return at once; the handle's ``wait()`` blocks until every
        peer of the group called it."""
        return self._launch(lambda: self._comm.barrier_async(tag=tag, ring=ring))

    def all_to_all(self, src: Sequence[Any], dst: Sequence[Any], *, tag: int = 0,
                   timeout: float | None = None) -> ReduceInfo:
        return self._runner.call(self._comm.all_to_all(src, dst, tag=tag, timeout=timeout))

    def all_to_all_async(self, src: Sequence[Any], dst: Sequence[Any], *, tag: int = 0,
                         ring: Sequence[int] | None = None) -> AllReduceHandle:
        return self._launch(lambda: self._comm.all_to_all_async(src, dst, tag=tag, ring=ring))

    def _launch(self, make: Callable[[], _AsyncHandle]) -> AllReduceHandle:
        """``make()`` (an ``*_async`` launch) run on the loop thread; its blocking handle."""

        async def launch() -> _AsyncHandle:
            return make()

        return AllReduceHandle(self._runner, self._runner.call(launch()))

    def _post(self, make: Callable[[_AsyncCommunicator], _AsyncHandle]) -> AllReduceHandle:
        """``make(async_comm)`` (an ``*_async`` launch) queued on the loop thread without
        waiting for it, for callers that must not block (torch's autograd threads): the
        handle's ``wait()``, ``result()`` and ``done()`` report what the launch raised.
        Launches posted and made from one thread keep their order (the loop runs them
        first in, first out)."""
        launched: concurrent.futures.Future[_AsyncHandle] = concurrent.futures.Future()
        comm = self._comm

        def launch() -> None:
            try:
                launched.set_result(make(comm))
            except BaseException as exc:  # (reported through the handle)
                launched.set_exception(exc)

        if self.closed:
            raise InvalidUsageError("the communicator is closed")
        self._runner.loop.call_soon_threadsafe(launch)
        return AllReduceHandle(self._runner, launched)

    def broadcast(self, tensor: Any, *, root: int, tag: int = 0,
                  restore_on_abort: bool = False, timeout: float | None = None) -> ReduceInfo:
        return self._runner.call(self._comm.broadcast(
            tensor, root=root, tag=tag, restore_on_abort=restore_on_abort, timeout=timeout))

    def broadcast_async(self, tensor: Any, *, root: int, tag: int = 0,
                        restore_on_abort: bool = False, ring: Sequence[int] | None = None
                        ) -> AllReduceHandle:
        """Launch a broadcast and return at once; do not touch ``tensor`` until it ended."""
        return self._launch(lambda: self._comm.broadcast_async(
            tensor, root=root, tag=tag, restore_on_abort=restore_on_abort, ring=ring))

    def all_gather(self, src: Any, dst: Any, *, tag: int = 0,
                   timeout: float | None = None) -> ReduceInfo:
        return self._runner.call(self._comm.all_gather(src, dst, tag=tag, timeout=timeout))

    def all_gather_async(self, src: Any, dst: Any, *, tag: int = 0,
                         ring: Sequence[int] | None = None) -> AllReduceHandle:
        """Launch an all-gather and return at once; do not touch ``dst`` until it ended."""
        return self._launch(lambda: self._comm.all_gather_async(src, dst, tag=tag, ring=ring))

    def reduce_scatter(self, src: Any, dst: Any, *, op: ReduceOp = ReduceOp.SUM,
                       tag: int = 0, quantization: Quantization | None = None,
                       timeout: float | None = None) -> ReduceInfo:
        return self._runner.call(self._comm.reduce_scatter(
            src, dst, op=op, tag=tag, quantization=quantization, timeout=timeout))

    def reduce_scatter_async(self, src: Any, dst: Any, *, op: ReduceOp = ReduceOp.SUM,
                             tag: int = 0, quantization: Quantization | None = None,
                             ring: Sequence[int] | None = None) -> AllReduceHandle:
        """Launch a reduce-scatter and return at once; do not touch ``dst`` until it ended."""
        return self._launch(lambda: self._comm.reduce_scatter_async(
            src, dst, op=op, tag=tag, quantization=quantization, ring=ring))

    def all_reduce(self, src: Any, dst: Any = None, *, op: ReduceOp = ReduceOp.SUM,
                   tag: int = 0, quantization: Quantization | None = None,
                   restore_on_abort: bool = True, timeout: float | None = None) -> ReduceInfo:
        return self._runner.call(self._comm.all_reduce(
            src, dst, op=op, tag=tag, quantization=quantization,
            restore_on_abort=restore_on_abort, timeout=timeout))

    def all_reduce_async(self, src: Any, dst: Any = None, *, op: ReduceOp = ReduceOp.SUM,
                         tag: int = 0, quantization: Quantization | None = None,
                         restore_on_abort: bool = True,
                         ring: Sequence[int] | None = None) -> AllReduceHandle:
        """Launch an all-reduce and return at once; do not touch ``src``/``dst`` until the
        handle's ``wait()`` returned."""
        return self._launch(lambda: self._comm.all_reduce_async(
            src, dst, op=op, tag=tag, quantization=quantization,
            restore_on_abort=restore_on_abort, ring=ring))

    def all_reduce_multiple_with_retry(
            self, tensors: Sequence[Any], *, op: ReduceOp = ReduceOp.SUM,
            max_in_flight: int = 8, first_tag: int = 0, max_attempts: int = 32,
            quantization: Quantization | None = None,
            restore_on_abort: bool = True, timeout: float | None = None) -> list[ReduceInfo]:
        return self._runner.call(self._comm.all_reduce_multiple_with_retry(
            tensors, op=op, max_in_flight=max_in_flight, first_tag=first_tag,
            max_attempts=max_attempts, quantization=quantization,
            restore_on_abort=restore_on_abort, timeout=timeout))

    def send(self, tensor: Any, peer: int, *, tag: int = 0,
             timeout: float | None = None) -> TransferInfo:
        return self._runner.call(self._comm.send(tensor, peer, tag=tag, timeout=timeout))

    def recv(self, tensor: Any, peer: int | None, *, tag: int = 0,
             timeout: float | None = None) -> TransferInfo:
        return self._runner.call(self._comm.recv(tensor, peer, tag=tag, timeout=timeout))

    def send_async(self, tensor: Any, peer: int, *, tag: int = 0) -> TransferHandle:
        return threaded.launch(self._runner, lambda: self._comm.send_async(tensor, peer, tag=tag))

    def recv_async(self, tensor: Any, peer: int | None, *, tag: int = 0) -> TransferHandle:
        return threaded.launch(self._runner, lambda: self._comm.recv_async(tensor, peer, tag=tag))

    def _post_transfer(self, make: Callable[[_AsyncCommunicator], Any]) -> TransferHandle:
        """``make(async_comm)`` queued on the loop thread without waiting (torch's threads)."""
        if self.closed:
            raise InvalidUsageError("the communicator is closed")
        return threaded.post(self._runner, functools.partial(make, self._comm))

    def _send_now(self, tensor: Any, peer: int, tag: int) -> Any:  # (None: closed, not sent)
        return None if self.closed else self._comm.send_from_thread(tensor, peer, tag=tag)

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
