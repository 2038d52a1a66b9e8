"""Small collectives in ceil(log2 P) rounds: Bruck's all-gather, laid out (sans-IO).

The ring's small path (``gather.py``) takes P - 1 hops one after another: over the internet,
P - 1 one-way delays. Bruck's all-gather takes ceil(log2 P) rounds, for any P. Each rank keeps
the blocks it holds *rotated*: slot j holds rank (r + j) mod P's block, so after round k it
holds slots [0, 2^k). In round k it sends them, ``min(2^k, P - 2^k)`` blocks as one frame, to
rank r - 2^k, and receives as many from rank r + 2^k into slots [2^k, ...). A round's frame
goes out once every earlier round's frame is in; a frame of a later round may arrive first
(it lands in its own slots and waits).

Parity: the small all-reduce reduces the gathered inputs in rank order, exactly as the ring's
small path does (``gather.reduce_in_order``), so every peer computes the same operations on
the same operands in the same order: bit-identical for every op and dtype with nothing relied
on beyond determinism (not commutativity: MIN and MAX with NaN, or PROD, keep parity too; AVG
is the sum divided by P once). A world that is not a power of two needs no extra round: the
last round sends only the P - 2^k blocks still missing.
"""

from __future__ import annotations

from typing import Final

from .gather import GATHER_MAX

BRUCK: Final = 16  # round k's frames have phase BRUCK + k
LOGP_MIN_WORLD: Final = 4  # below, log2 P rounds are no fewer than the ring's P - 1 hops


def chosen(nbytes: int, world: int, quantized: bool) -> bool:
    """A collective of ``nbytes`` per rank in ``world`` takes the rounds (every peer decides
    alike: it depends only on what they agree on)."""
    return not quantized and 0 < nbytes <= GATHER_MAX and world >= LOGP_MIN_WORLD


class BruckPlan:
    """Rank ``rank`` of ``world``, blocks of ``nbytes``: who sends what to whom in each round."""

    __slots__ = ("nbytes", "rank", "rounds", "world")

    def __init__(self, rank: int, world: int, nbytes: int) -> None:
        self.rank, self.world, self.nbytes = rank, world, nbytes
        self.rounds = (world - 1).bit_length()

    def to(self, k: int) -> int:
        """The rank this one sends to in round ``k``."""
        return (self.rank - (1 << k)) % self.world

    def sender(self, k: int) -> int:
        """The rank this one receives from in round ``k``."""
        return (self.rank + (1 << k)) % self.world

    def blocks(self, k: int) -> int:
        """Blocks moved in round ``k``."""
        return min(1 << k, self.world - (1 << k))

    def frame(self, k: int) -> tuple[int, int, int]:
        """Round ``k``'s frame: (phase, byte offset at the receiver, byte length); its payload
        is this rank's first ``length`` bytes (slots 0 ...)."""
        return BRUCK + k, (1 << k) * self.nbytes, self.blocks(k) * self.nbytes

    def round_of(self, phase: int) -> int:
        """The round a frame's phase names, or -1."""
        k = phase - BRUCK
        return k if 0 <= k < self.rounds else -1

    def slot(self, r: int) -> int:
        """Byte offset of rank ``r``'s block in the rotated buffer."""
        return (r - self.rank) % self.world * self.nbytes

    def in_rank_order(self, rotated: memoryview) -> list[memoryview]:
        """Every rank's block, rank 0 first, as views of ``rotated``."""
        n = self.nbytes
        return [rotated[self.slot(r) : self.slot(r) + n] for r in range(self.world)]
