"""``PeerConfig``: a communicator's options, validated once (sans-IO)."""

from __future__ import annotations

import dataclasses
import ssl as _ssl
from collections.abc import Sequence

from ..._errors import InvalidUsageError
from ..._wire import liveness
from ..._wire.address import parse_address


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PeerConfig:
    """Every option of one ``Communicator`` (see its docstring for their meaning)."""

    masters: tuple[tuple[str, int], ...]  # (host, port) of each master address, in order
    peer_group: int = 0
    p2p_connections: int | None = None  # None: chosen per link (``core/bdp.py``)
    listen_host: str = ""  # "": the interface that routes to the first master
    advertise_host: str = ""
    heartbeat_interval: float = liveness.interval(5.0, None)  # the default timeout's
    heartbeat_timeout: float = 5.0
    data_timeout: float = 10.0
    master_timeout: float = 60.0  # how long a lost master is waited for (0: not at all)
    run_id: str = ""  # the run this peer belongs to ("": the first master's)
    key: bytes = b""  # the run secret's key (``auth.secret_key``); empty: no secret
    ssl: _ssl.SSLContext | None = None  # client side: the master and, with ssl_server, peers
    ssl_server: _ssl.SSLContext | None = None  # this peer's listeners; TLS between peers
    replica: str = ""  # the replica this process is one of ("": none)
    replica_size: int = 1  # its processes: admitted together

    @property
    def master_host(self) -> str:
        """The host of the first master address."""
        return self.masters[0][0]

    @property
    def master_port(self) -> int:
        """The port of the first master address."""
        return self.masters[0][1]

    @classmethod
    def parse(cls, master: str | Sequence[str], **options: object) -> PeerConfig:
        """Split each ``"host:port"`` and check every option; InvalidUsageError if one is
        wrong."""
        addrs = [master] if isinstance(master, str) else master
        if not isinstance(addrs, Sequence) or not addrs or len(addrs) > 16:
            raise InvalidUsageError(
                f"master must be a 'host:port' str or a list of 1-16 of them, not {master!r}")
        if options.get("p2p_connections") == "auto":
            options["p2p_connections"] = None
        config = cls(masters=tuple(parse_address(a) for a in addrs), **options)  # type: ignore[arg-type]
        config.check()
        return config

    def check(self) -> None:
        if not 0 <= self.peer_group < 2**32:
            raise InvalidUsageError(f"peer_group must be a u32, not {self.peer_group}")
        if len(self.advertise_host) > 253:
            raise InvalidUsageError("advertise_host must be an address (at most 253 characters)")
        k = self.p2p_connections
        if k is not None and (not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= 256):
            raise InvalidUsageError(
                f"p2p_connections must be an int in 1..256, or None / 'auto' (chosen per link "
                f"from its bandwidth-delay product), not {k!r}")
        if min(self.heartbeat_interval, self.heartbeat_timeout, self.data_timeout) <= 0:
            raise InvalidUsageError("timeouts must be positive")
        t = self.master_timeout
        if not isinstance(t, (int, float)) or isinstance(t, bool) or not 0 <= t < float("inf"):
            raise InvalidUsageError(f"master_timeout must be seconds >= 0, not {t!r}")
        r = self.run_id
        if not isinstance(r, str) or len(r) > 128 or not r.isprintable():
            raise InvalidUsageError(f"run_id must be at most 128 printable characters, not {r!r}")
        r, k = self.replica, self.replica_size
        if not isinstance(r, str) or len(r) > 128 or not r.isprintable():
            raise InvalidUsageError(f"replica must be at most 128 printable characters, not {r!r}")
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= 1024 or (k > 1 and not r):
            raise InvalidUsageError(
                f"replica_size must be an int in 1..1024 (above 1 with a replica), not {k!r}")
        for name in ("ssl", "ssl_server"):
            if not isinstance(getattr(self, name), (_ssl.SSLContext, type(None))):
                raise InvalidUsageError(f"{name} must be an ssl.SSLContext or None")
        if self.ssl_server is not None and self.ssl is None:
            raise InvalidUsageError(
                "ssl_server (TLS between peers) needs ssl, the client context peers connect with")


