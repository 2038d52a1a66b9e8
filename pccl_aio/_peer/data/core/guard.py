"""The receive side's admission rules, sans-IO: connection caps and how far ahead a frame may be.

``receiver._Receiver`` asks ``ConnCaps.admit`` at each connection's HELLO (a refusal closes it)
and ``seq_too_far`` for each frame of a collective not yet announced (a violation closes the
connection). Nothing here blocks or touches a socket.
"""

from __future__ import annotations

from typing import Final

MAX_CONNS_PER_PEER: Final = 256  # receive connections from one sending peer id
MAX_CONNS: Final = 4096  # receive connections of one communicator, in total
SEQ_AHEAD: Final = 1 << 16  # a frame's seq may be this far beyond the last announced one
PARK_TIMEOUT: Final = 10.0  # seconds a connection may hold a frame of an unannounced seq


def seq_too_far(seq: int, max_seq: int) -> bool:
    """A frame for ``seq`` is absurdly far ahead of the last announced collective.

    A fresh communicator (``max_seq == 0``) has heard no seq yet, while the master's global
    number may be high already: nothing is too far for it."""
    return max_seq > 0 and seq - max_seq > SEQ_AHEAD


class ConnCaps:
    """Counts the open, admitted receive connections per sending peer id and in total."""

    def __init__(self, per_peer: int = MAX_CONNS_PER_PEER, total: int = MAX_CONNS) -> None:
        self.per_peer, self.total = per_peer, total
        self.count = 0
        self._by_peer: dict[int, int] = {}

    def admit(self, peer: int) -> str | None:
        """Count one more connection from ``peer``; the reason to refuse it instead (then
        nothing is counted)."""
        n = self._by_peer.get(peer, 0)
        if n >= self.per_peer:
            return f"more than {self.per_peer} data connections from peer {peer}"
        if self.count >= self.total:
            return f"more than {self.total} data connections in total"
        self._by_peer[peer] = n + 1
        self.count += 1
        return None

    def release(self, peer: int) -> None:
        """An admitted connection from ``peer`` closed."""
        n = self._by_peer.get(peer, 0) - 1
        if n < 0:
            return
        if n:
            self._by_peer[peer] = n
        else:
            del self._by_peer[peer]
        self.count -= 1

    def of(self, peer: int) -> int:
        """The open admitted connections from ``peer``."""
        return self._by_peer.get(peer, 0)
