"""``KeyRing``: the keys this peer shares with each peer of its ring, for the handshakes of
connections between peers (``_wire/auth.py``).

In a run with a secret the master issues them with every ``Membership``, wrapped for this
peer's master session: only the two peers of a pair know its key, so a member cannot pose as
another. In a run without a secret every key is empty and anyone passes, as ever.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Final

from ..._net.handshake import KeyFor
from ..._wire import auth
from ..._wire import messages as m

KEY_WAIT: Final = 2.0  # how long a listener waits for the Membership that names a new peer


class KeyRing:
    """Pair keys by peer id, updated with each ``Membership``."""

    def __init__(self, secured: bool) -> None:
        self.secured = secured
        self.me = -1
        self._keys: dict[int, bytes] = {}
        self._changed = asyncio.Event()

    def update(self, me: int, msg: m.Membership, session: bytes) -> None:
        """Take the keys of a new ``Membership`` (unwrapped with the master ``session``)."""
        self.me = me
        if self.secured:
            ids = [p.peer_id for p in msg.ring]
            self._keys = {i: k for i, k in zip(ids, auth.wrap(session, msg.epoch, ids, msg.keys))
                          if i != me}
        else:
            self._keys = {p.peer_id: b"" for p in msg.ring if p.peer_id != me}
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def key(self, peer_id: int) -> bytes:
        """The key to present to ``peer_id`` (empty without a secret or for an unknown peer:
        the handshake then fails on the other side)."""
        return self._keys.get(peer_id, b"")

    def accepting(self, role: int) -> KeyFor:
        """A ``Gate`` key lookup for connections of ``role`` from members of the ring. Waits
        (up to ``KEY_WAIT`` s) for a ``Membership`` naming a peer not known yet: the master
        sends it to both sides, and the connecting side may have read it first."""

        async def key_for(opening: auth.Opening) -> bytes | None:
            if opening.role != role:
                return None
            if not self.secured:
                return b""
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(KEY_WAIT):
                    while opening.server_id != self.me or opening.client_id not in self._keys:
                        await self._changed.wait()
            if opening.server_id != self.me:
                return None
            return self._keys.get(opening.client_id)

        return key_for
