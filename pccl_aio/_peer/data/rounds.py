"""``Rounds``: the data flow of a collective in log2 P rounds (``paths/bruck.py``).

A ``Pipeline`` whose frames do not follow the ring: round k's one frame goes to the peer
``dests[k]`` once every earlier round's frame is in, and frames of round k are taken from
``senders[k]`` only (the receiver asks ``sender(phase)``; anyone else's frame fails the
attempt for the group, as a ring frame from a non-predecessor does). Links are the
communicator's, opened on first use and kept (``DataPlane.link``): a peer keeps at most
log2 P of them open for these rounds. Everything else is the pipeline's: the verdict, the
data deadline (from the last arrival), early starts on a ticket, reports and cancellation.
"""

from __future__ import annotations

from collections.abc import Callable

from .env import CollectiveEnv
from .paths.bruck import BruckPath
from .pipeline import Pipeline, Ring


class Rounds(Pipeline):
    """Attempt ``seq`` of collective ``tag`` over ``path`` in rounds: ``dests[k]`` /
    ``senders[k]``, the peer ids round k sends to and receives from."""

    path: BruckPath

    def __init__(self, env: CollectiveEnv, tag: int, seq: int, path: BruckPath, ring: Ring,
                 confirmed: bool, done: Callable[[], None], dests: list[int],
                 senders: list[int]) -> None:
        super().__init__(env, tag, seq, path, ring, confirmed, done)
        self._dests, self._senders = dests, senders
        self._sent = 0  # rounds whose frame is queued (the next one's link is dests[_sent])

    def sender(self, phase: int) -> int:
        k = self.path.plan.round_of(phase)
        return self._senders[k] if k >= 0 else -1

    def waits_on(self, peer: int) -> bool:
        return peer in self._waited()

    def _waited(self) -> list[int]:
        """The senders of the rounds whose frames are not all in yet."""
        plan = self.path.plan
        return [self._senders[k] for k in range(plan.rounds) if not self.path.got(k)]

    def traffic(self) -> list[tuple[int, int, int]]:
        """Per round: the bytes sent to its destination (once sent), received from its
        sender (once in)."""
        plan, out = self.path.plan, []
        for k in range(plan.rounds):
            n = plan.frame(k)[2]
            if k < self._sent:
                out.append((self._dests[k], n, 0))
            if self.path.got(k):
                out.append((self._senders[k], 0, n))
        return out

    def _sending_to(self) -> int:
        return self._dests[min(self._sent, len(self._dests) - 1)]

    def _stalled_on(self) -> int:
        """Round 0's sender, if its frame never came: it sends that frame at once, whatever
        else happens. A later round's sender may itself be waiting on a stalled peer, so it
        is not named (the master would remove an innocent peer)."""
        return 0 if self.path.got(0) else self._senders[0]

    def on_segment(self, phase: int, offset: int, length: int, p0: float, p1: float) -> None:
        """A round's frame is in (in the receive callback): the run task sends the next.
        The data deadline counts from the last round completed in order (not from a later
        round's frame that came early): a peer missing round 0 then reaches its deadline no
        later than the others, and names round 0's silent sender (the master removes it,
        even when another peer's report aborted the attempt first)."""
        self.rx += length
        through = self.path.through
        if self._failure is None:
            try:
                self.path.process(phase, offset, p0, p1)
            except Exception as exc:  # a local failure: the run task reports it
                self._failure = exc
        if self.path.through > through:
            self._last_rx = self._loop.time()
        self._poke()

    async def _flow(self) -> None:
        path = self.path
        for k, dest in enumerate(self._dests):
            while not path.ready(k):
                self._check()
                await self._wait()
            self._check()
            link = await self._env.link(dest)
            await self._send(link, *path.send(k))
            self._sent = k + 1
        while path.remaining:
            self._check()
            await self._wait()
        self._check()
        path.finish()
