"""The peer: ``Communicator``, the public API of a run's participant.

A communicator is composed of parts that each own their sockets and tasks: the master
session (``session/control.py`` ``ControlPlane``: votes, verdicts, membership), the data
plane (``data/dataplane.py`` ``DataPlane``: listener, links, buffers, collective tasks), the
ring measurements (``data/measure.py`` ``Measurer``), point-to-point (``p2p/calls.py``
``PointToPoint``), shared-state sync (``state/sync.py`` ``SharedStateSync``: its state
server) and the observer (``observe/``: metrics, events). This module wires them; what the
calls do sits beside it: ``session/topology.py`` (the joint votes), ``data/reduce.py`` (the
all-reduces), ``collective_calls.py`` (broadcast, all-gather, reduce-scatter, barrier ...)
and ``transfer_calls.py`` (send, receive, all-to-all).
"""

from __future__ import annotations

import asyncio
import os
import ssl as _ssl
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Literal

from .. import _log
from .._errors import InvalidUsageError
from .._net.credentials import run_key, tls_from_env
from .._net.handshake import Gate
from .._net.stream import local_address
from .._types import SyncInfo, SyncStrategy, TopologyInfo
from .._wire import liveness
from .._wire import messages as m
from . import deadline
from .core.config import PeerConfig
from .core.environment import from_environ
from .data.dataplane import DataPlane
from .data.handle import AllReduceHandle
from .data.keys import KeyRing
from .data.measure import Measurer
from .data.receiver import Registry
from .data.reduce import ReduceCalls
from .observe.metrics import PeerMetrics, check_options
from .observe.observer import Observer
from .p2p.calls import PointToPoint
from .session.control import ControlPlane
from .session.topology import TopologyCalls
from .state.core.shared_state import SharedState
from .state.progress import ProgressFn
from .state.sync import SharedStateSync
from .transfer_calls import TransferCalls

__all__ = ["AllReduceHandle", "Communicator"]


class Communicator(TransferCalls):
    """One peer of a run.

    Args:
        master: ``"host:port"`` of the master, or a list of them: the addresses a master of
            the run may be found at (docs: "Master failover").
        peer_group: collectives and shared state are partitioned by group; membership votes
            (``update_topology``, ``are_peers_pending``) stay global.
        p2p_connections: TCP connections to each ring neighbour; one collective is striped
            over all of them. None or ``"auto"`` (the default) chooses them per neighbour
            when the link opens: the first connection's RTT times the bandwidth (10 Gbit/s
            assumed until measured) over one stream's window (half of ``tcp_wmem`` max), at
            most 8. Loopback and LANs get 1; a 100 ms RTT gets 8. An int (1..256) fixes it.
        listen_host: interface of the data and state listeners (default: the one that routes
            to the first master address; ``"0.0.0.0"``: all).
        advertise_host: address other peers reach this one at (default: the master's view).
        heartbeat_interval: how often this peer sends the master a liveness beacon
            (default: a third of ``heartbeat_timeout``).
        heartbeat_timeout: a master silent this long is treated as gone (default 5 s). The
            event loop must not be blocked for longer than that.
        data_timeout: an all-reduce that receives nothing for this long reports a failure
            and is aborted for the group (default 10 s); also bounds connecting a data link.
        secret: the run secret (``str`` or ``bytes``, the master's); every connection of the
            run proves it. At least 128 bits (``python -m pccl_aio.secret`` makes one; a
            weaker one raises ``InvalidUsageError``). None reads ``$PCCL_AIO_SECRET_FILE`` or
            ``$PCCL_AIO_SECRET`` and runs without one if neither is set (docs: "Security").
        ssl: a client ``ssl.SSLContext``: the master connection is TLS, and so are the
            connections to other peers when ``ssl_server`` is given too.
        ssl_server: a server ``ssl.SSLContext`` for this peer's listeners: TLS between peers
            (every peer of the run must use it). ``pccl_aio.tls_contexts`` makes both.
        master_timeout: how long a lost master is waited for (default 60 s). Meanwhile the
            communicator keeps its state and links and rejoins the run at its master address
            (or the best of several); calls in flight fail with ``MasterLostError`` (retry),
            later calls wait. Then everything raises ``MasterConnectionError``. 0: at once.
        run_id: the run this peer belongs to; a master of another run refuses it (None:
            the run of the first master that accepts it).
        metrics_port: serve Prometheus metrics (``pccl_peer_*``, docs: "Logs, metrics and status")
            at ``http://metrics_host:metrics_port/metrics`` from ``connect`` to ``close``;
            0: a port the OS picks (``metrics_port`` tells it). None (the default):
            ``$PCCL_AIO_METRICS_PORT`` if set, else no metrics.
        metrics_host: the interface metrics are served on (default: loopback only).
        replica: the name of the replica this process is one of (e.g. the shards of an
            FSDP model, each in its own peer group): the master admits a joining replica's
            processes in one round, once all of them registered, and the processes of the
            run's first replica start it together. None (the default): a replica of one
            process.
        replica_size: how many processes the replica has.

    Logging: one line per event on the ``pccl_aio.*`` loggers, with the run, peer and group
    ids; ``$PCCL_AIO_LOG_LEVEL`` sets their level (read when a communicator is created).

    A communicator belongs to the event loop it connected on: a call from another loop or
    thread raises ``InvalidUsageError`` before anything is sent. Use as
    ``async with Communicator(...) as comm: await comm.connect()``.
    """

    @classmethod
    def from_env(cls, **options: Any) -> Communicator:
        """A communicator of the run the environment names (``$PCCL_AIO_MASTER``, torchrun's
        job as one replica, the secret and TLS: ``_peer/core/environment.py``); ``options``
        override what it gives. ``InvalidUsageError`` for a missing master or a malformed
        variable (the secret's errors as the constructor's). Connects nothing."""
        masters, found = env_options()
        return cls(masters, **{**found, **options})

    def __init__(self, master: str | Sequence[str], *, peer_group: int = 0,
                 p2p_connections: int | Literal["auto"] | None = None,
                 listen_host: str = "", advertise_host: str = "",
                 heartbeat_interval: float | None = None, heartbeat_timeout: float = 5.0,
                 data_timeout: float = 10.0, secret: str | bytes | None = None,
                 ssl: _ssl.SSLContext | None = None,
                 ssl_server: _ssl.SSLContext | None = None, master_timeout: float = 60.0,
                 run_id: str | None = None, metrics_port: int | None = None,
                 metrics_host: str = "127.0.0.1", replica: str | None = None,
                 replica_size: int = 1) -> None:
        _log.from_env()
        metrics = check_options(metrics_port, metrics_host)
        if secret is not None and not isinstance(secret, (str, bytes)):
            raise InvalidUsageError(f"secret must be str or bytes, not {type(secret).__name__}")
        self.config = PeerConfig.parse(
            master, peer_group=peer_group, p2p_connections=p2p_connections,
            listen_host=listen_host, advertise_host=advertise_host,
            heartbeat_interval=liveness.interval(heartbeat_timeout, heartbeat_interval),
            heartbeat_timeout=heartbeat_timeout,
            data_timeout=data_timeout, master_timeout=master_timeout, run_id=run_id or "",
            key=run_key(secret),
            ssl=ssl, ssl_server=ssl_server, replica=replica or "", replica_size=replica_size)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._keys = KeyRing(bool(self.config.key))
        registry = Registry()  # seq -> collective, shared by the data and control planes
        # The measurer and the planes call each other through callables (lambdas: built below)
        self._control = ControlPlane(self.config, self._on_membership, registry,
                                     lambda plan: self._measure.on_plan(plan))
        self.gate = Gate("pccl_aio peer listener")  # both listeners' handshakes
        self._measure = Measurer(self.config, self._keys, self._control.report_measure,
                                 lambda peer, bits: self._data.set_bandwidth(peer, bits))
        self._p2p = PointToPoint(self.config, self._keys, lambda: self._control.peer_id,
                                 lambda peer: self._data.address(peer))
        self._data = DataPlane(self.config, self._control.report, self._keys, self.gate,
                               registry, self._measure, self._p2p)
        self._sync = SharedStateSync(self._control, self.config, self._keys, self.gate)
        self._obs = Observer(self._control)
        self._metrics = PeerMetrics(self._control, self._obs.stats, *metrics)
        self._topology = TopologyCalls(self._control, self._check_usable, self.config.peer_group)
        self._reduce = ReduceCalls(self._control, self._data, self._obs, self._check_loop,
                               self.config.peer_group)

    async def __aenter__(self) -> Communicator:
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    # ---- attributes -------------------------------------------------------------------------
    @property
    def peer_id(self) -> int:
        """This peer's id in the run (0 before ``connect``)."""
        return self._control.peer_id

    @property
    def peer_group(self) -> int:
        """The peer group this peer joined (its ``peer_group`` option); collectives and
        shared-state syncs run within a group."""
        return self.config.peer_group

    @property
    def world_size(self) -> int:
        """Accepted peers of the whole run, all groups together, as of the last membership
        update this peer received (0 before ``connect``)."""
        ms = self._control.membership
        return ms.global_world_size if ms else 0

    @property
    def peer_group_world_size(self) -> int:
        """Accepted peers of this peer's group, itself included: the ring an all-reduce runs
        on, and what AVG divides by."""
        return self._control.peer_group_world_size

    @property
    def num_peer_groups(self) -> int:
        """Peer groups with at least one accepted peer."""
        ms = self._control.membership
        return ms.num_groups if ms else 0

    @property
    def largest_peer_group_world_size(self) -> int:
        """Accepted peers of the largest peer group, as of the last membership update."""
        ms = self._control.membership
        return ms.largest_group_world_size if ms else 0

    @property
    def metrics_port(self) -> int | None:
        """The port ``/metrics`` is served on (the OS's choice for 0 once connected); None
        without metrics."""
        return self._metrics.port

    @property
    def tx_bytes(self) -> int:
        """Payload bytes this communicator's collectives sent since it was made, every kind
        and every attempt (aborted ones included), counted as each ended; a collective made
        for you (the ``pccl_aio.torch`` group's, its DDP hook's) counts too. Shared-state
        transfers are not collectives: ``SyncInfo`` counts them."""
        return sum(self._obs.stats.sent.values())

    @property
    def rx_bytes(self) -> int:
        """Payload bytes this communicator's collectives received (as ``tx_bytes``)."""
        return sum(self._obs.stats.received.values())

    # ---- session ----------------------------------------------------------------------------
    async def connect(self, attempts: int = 5, *, backoff: float = 0.2,
                      timeout: float | None = 300.0) -> None:
        """Register with the master and wait until this peer is accepted into the run.

        The first peer is accepted at once; later ones wait until the accepted peers call
        ``update_topology()``. Retries ``attempts`` times with exponential back-off while no
        master answers. ``timeout`` bounds the whole call, the wait for admission included
        (default 300 s; None waits for ever); each handshake is also bounded by
        ``heartbeat_timeout``; with several master addresses, it joins the one serving the
        run at the highest term. Raises ``MasterConnectionError`` (``VersionMismatchError``
        for a master of another protocol version), ``AuthenticationError`` (the secret or TLS
        refused; a handshake the master closed without a verdict, as one killed at that moment
        does, is tried twice more first), ``PcclTimeoutError`` (a master that accepts
        and does not answer, or no admission in time), ``InvalidUsageError`` if already
        connected or the listeners cannot bind. Cancelling closes everything opened so far;
        after a failure ``connect`` may be called again.
        """
        self._check_loop(binding=True)
        if self._control.connected:
            raise InvalidUsageError("connect() called twice")
        if not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 1:
            raise InvalidUsageError(f"attempts must be an int >= 1, not {attempts!r}")
        limit = deadline.check(timeout)
        self._loop = asyncio.get_running_loop()
        cfg = self.config
        try:
            host = cfg.listen_host or await local_address(cfg.master_host, cfg.master_port)
            try:
                await self._data.start(host)
                await self._sync.server.start(host, cfg.ssl_server)
            except OSError as exc:
                raise InvalidUsageError(f"cannot listen on {host!r}: {exc.strerror}") from exc
            await self._metrics.start()  # (InvalidUsageError if it cannot bind)
            hello = m.Hello(m.PROTOCOL_VERSION, cfg.peer_group, self._data.listener.port,
                            cfg.advertise_host, self._sync.server.port,
                            cfg.ssl_server is not None, replica=cfg.replica,
                            replica_size=cfg.replica_size)
            await deadline.within(self._control.connect(hello, attempts, backoff), limit,
                                  "connect()")
        except BaseException:
            await self._shutdown()
            raise
        self._obs.admitted(self.world_size)

    async def close(self) -> None:
        """Leave the run gracefully and release every socket and task.

        Collectives still in flight fail with ``MasterConnectionError``. Blocks until every
        task of the communicator ended. Idempotent.
        """
        self._check_loop()
        self._control.leave()
        await self._shutdown()

    async def _shutdown(self) -> None:
        await self._measure.close()
        await self._control.close()
        await self._p2p.close()
        await self._data.close()
        await self._sync.server.close()
        await self._metrics.close()

    def _check_loop(self, *, binding: bool = False) -> None:
        """InvalidUsageError unless called on the event loop this communicator belongs to."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise InvalidUsageError(
                "a Communicator must be used from a coroutine on its event loop") from None
        if self._loop is not None and loop is not self._loop and not (
                binding and not self._control.connected):
            raise InvalidUsageError(
                "this Communicator belongs to another event loop (the one it connected on); "
                "calls from other loops or threads would corrupt its state")

    def _check_usable(self) -> None:
        self._check_loop()
        self._control.check_usable()

    def _on_membership(self, msg: m.Membership) -> None:
        self._keys.update(self._control.peer_id, msg, self._control.session)
        self._data.on_membership(msg, self._control.peer_id)
        self._p2p.on_membership(msg)
        self._obs.on_membership(msg)

    # ---- votes ------------------------------------------------------------------------------
    async def update_topology(self, *, timeout: float | None = None) -> None:
        """Joint vote of all accepted peers (all groups): admit the peers waiting in ``connect``.

        Blocks until every accepted peer voted. Raises ``InvalidUsageError`` if collectives
        are in flight (nothing is sent) or if other peers are in another vote (the master
        withdraws it), ``MasterConnectionError``/``KickedError`` if the session ended. Peers
        that die meanwhile are dropped from the vote. ``DeadlockError`` if every peer waits on
        another call. Cancelling, or ``timeout`` expiring (``PcclTimeoutError``), takes the
        vote back.
        """
        await self._topology.update_topology(timeout)

    async def are_peers_pending(self, *, timeout: float | None = None) -> bool:
        """Joint vote of all accepted peers: is any peer waiting to be admitted?

        Allowed while collectives are in flight. Blocks until every accepted peer asked.
        ``DeadlockError`` if every peer waits on another call. Cancelling, or ``timeout``
        expiring (``PcclTimeoutError``), takes the vote back.
        """
        return await self._topology.are_peers_pending(timeout)

    async def wait_for_peers(self, n: int = 2, *, timeout: float | None = None) -> int:
        """Wait until this peer's group has at least ``n`` peers (itself included); return
        the group's size.

        Returns at once if it has. Else it waits for the master's word that peers wait to
        join, and admits them by the joint votes a training loop makes: every member votes
        ``are_peers_pending()`` and then ``update_topology()``, so every member of the run
        (all groups) must be waiting here or making those calls. While nobody arrives it
        sends the master nothing (no polling). Raises ``InvalidUsageError`` for a bad ``n``
        (nothing is sent), ``PcclTimeoutError`` when ``timeout`` expires first, the votes'
        errors (``DeadlockError``...) and why the session ended. Cancelling, or ``timeout``
        expiring, takes back a vote in flight; the communicator stays usable.
        """
        return await self._topology.wait_for_peers(n, timeout)

    async def optimize_topology(self, *, timeout: float | None = None) -> TopologyInfo:
        """Joint vote of the group's accepted peers: order the ring to fit the network.

        Once every member voted, the master has the ordered pairs without a measurement
        measured (each sender pushes bytes to its receiver over several connections for half
        a second, or 12 round trips; pairs that share no peer run at once), solves the ring
        whose slowest link is fastest (peers that cannot reach each other are never
        neighbours) and the whole group switches to it at once. Measurements are kept: after
        churn only the new peers' pairs are measured. Blocks until then (about a second per
        round of pairs on a short path).
        Returns the new ring, the pairs measured for this call and the ring's slowest link.
        Raises ``InvalidUsageError`` if collectives are in flight (nothing is sent), or if no
        ring avoids the unreachable pairs (the ring stays) or a member gave up meanwhile;
        ``DeadlockError`` if the members wait on each other in other calls;
        ``MasterConnectionError``/``KickedError`` if the session ended. Cancelling, or
        ``timeout`` expiring (``PcclTimeoutError``), takes the vote back; during the
        measurement that ends the call for the whole group (measurements so far are kept).
        """
        return await self._topology.optimize_topology(timeout)

    # ---- shared state -----------------------------------------------------------------------
    async def sync_shared_state(self, state: SharedState,
                                strategy: SyncStrategy = SyncStrategy.ENFORCE_POPULAR, *,
                                timeout: float | None = None,
                                progress: ProgressFn | None = None) -> SyncInfo:
        """Make ``state`` identical on every peer of the group (a vote of the whole group).

        Each entry is hashed (xxh3-128); the master elects the popular content and revision.
        Outdated or drifted peers fetch only their dirty entries, in place, from up-to-date
        peers (ranges spread over all of them, failing over when one dies) and re-hash them.
        Blocks until the whole group finished. Returns ``SyncInfo(tx_bytes, rx_bytes,
        revision)`` and sets ``state.revision``. Raises ``InvalidUsageError`` (bad argument,
        collectives in flight; nothing is sent), ``SharedStateError`` (no up-to-date source,
        fetch failed or a hash mismatch; retry), ``KickedError`` (this peer's
        keys/dtypes/sizes, revision or strategy broke the rules), ``DeadlockError`` if the
        peers wait on each other. ``timeout`` expiring
        raises ``PcclTimeoutError``: this peer's vote is taken back, or its fetch ends as a
        failed one for the group; the communicator stays usable. Cancelling leaves the peer
        in the sync; close the communicator then. ``progress(done_bytes, total_bytes)`` is
        called on the event loop (keep it quick) while this peer fetches over 4 MiB, at most
        every 0.1 s, ending at ``(rx_bytes, rx_bytes)`` once all bytes matched their hash; one
        that raises is logged once and dropped. ``pccl_aio.progress_bar()`` draws a tqdm bar.
        """
        self._check_loop()
        return await self._sync.run(state, strategy, deadline.check(timeout), progress)


def env_options() -> tuple[list[str], dict[str, Any]]:
    """``from_environ(os.environ)`` with the environment's TLS contexts added."""
    masters, options = from_environ(os.environ)
    server, client = tls_from_env()
    if server is not None:
        options.update(ssl=client, ssl_server=server)
    return masters, options
