"""Async DiLoCo: DiLoCo (``diloco.py``) with a one-step-delayed outer update, whose all-reduce
overlaps the next inner phase. The blocking API.

    python -m pccl_aio.master --port 48148 &
    python examples/async_diloco.py --seed 1 &
    python examples/async_diloco.py --seed 2 &
    python examples/async_diloco.py --seed 3  # join or kill -9 any time

``diloco.py`` stops training while the group averages the pseudo-gradient. Here the average
of outer step k runs in the background (``all_reduce_async``, out of place: the
pseudo-gradient buffer is only read, the mean lands in the global model's ``.grad``) while
inner phase k + 1 trains from the global model as it was before step k. After that phase,
step k's mean is applied to the global model (the outer Nesterov SGD step), and phase k + 2
starts from the result. Every phase thus starts from a global model one outer step behind,
the price of hiding the communication: DiLoCo's outer step (lr 0.7, Nesterov momentum 0.9)
diverges with the delay, so the default is gentler (lr 0.4, momentum 0.3; 3 peers, 1000 inner
steps, H = 50: validation loss 2.17 where ``diloco.py`` reaches 2.02, and 1.46 against 1.38
after 5000 steps; momentum 0.5 or more did worse). The run makes ``--inner-steps / H`` outer
steps.

Each outer step's ``step`` line comes when its mean is applied (``inner`` counts the phases
trained by then, one more than the step's own, except when the pipeline drains). Before the
group changes (a joiner is admitted, or the peer is left alone) the pipeline drains: the step
in flight is applied, so every peer enters the shared-state sync with the same global model,
outer momentum and step count, which a joiner receives there. A peer lost during the
all-reduce aborts it on every survivor (``PeerLostError`` from the handle's ``wait``): they
all-reduce the same pseudo-gradient again, together. Lines as in ``charlm.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import charlm
import diloco
import torch

import pccl_aio as pccl
from pccl_aio import blocking


@dataclasses.dataclass
class InFlight:
    """Outer step ``k``'s all-reduce (``run.delta`` into ``run.flat``), launched after its
    inner phase, whose mean train loss was ``loss``; ``handle`` None: alone at launch."""

    k: int
    loss: float
    handle: blocking.AllReduceHandle | None


class AsyncDiLoCo(diloco.DiLoCo):
    """``diloco.DiLoCo`` plus a second flat buffer: the pseudo-gradient in flight."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        self.delta = torch.zeros_like(self.flat)  # read by the all-reduce, never written

    @torch.no_grad()
    def pseudo_gradient(self) -> None:
        """``global - local`` into ``delta`` (``flat``, the ``.grad``, may be in flight)."""
        at = 0
        for pg, pl in zip(self.params, self.local_params):
            n = pg.numel()
            torch.sub(pg, pl, out=self.delta[at:at + n].view_as(pg))
            at += n

    def launch(self, peer: charlm.Peer, k: int, loss: float) -> InFlight:
        """Start averaging ``delta`` into ``flat`` in the background."""
        try:
            handle = peer.comm.all_reduce_async(self.delta, self.flat, op=pccl.ReduceOp.AVG,
                                                quantization=self.quant)
        except pccl.TooFewPeersError:  # alone (nothing sent): wait() takes our own
            handle = None
        return InFlight(k, loss, handle)

    def wait(self, peer: charlm.Peer, step: InFlight) -> int:
        """Wait for ``step``'s mean (in ``flat``); the world size it took. After a lost peer
        the survivors all-reduce the same ``delta`` again (out of place: it is intact)."""
        handle = step.handle
        while True:
            try:
                if handle is None:
                    info = peer.comm.all_reduce(self.delta, self.flat, op=pccl.ReduceOp.AVG,
                                                quantization=self.quant)
                else:
                    info = handle.wait()
            except pccl.TooFewPeersError:  # alone now: our own pseudo-gradient
                self.flat.copy_(self.delta)
                return 1
            except pccl.PeerLostError:  # (a "left" line may have told already)
                if peer.comm.peer_group_world_size < peer.world:
                    peer.lost(step.k, peer.comm.peer_group_world_size)
                handle = None
                continue
            return peer.reduced([info], step.k)

    def land(self, peer: charlm.Peer, step: InFlight, trained: int) -> None:
        """Finish ``step`` and apply it: the outer step and its ``step`` line."""
        world = self.wait(peer, step)
        self.apply(peer, step, world, trained)

    def apply(self, peer: charlm.Peer, step: InFlight, world: int, trained: int) -> None:
        """The outer step on the mean in ``flat``; ``trained`` phases were trained by now."""
        self.outer.step()
        self.count += 1
        now = charlm.evaluate_at(self.args, step.k, self.last)
        self.val_loss = charlm.evaluate(self.model, self.val, self.cfg) if now else float("nan")
        peer.step(step.k, self.inner_steps(trained), world, step.loss, self.val_loss,
                  self.digest())


def main(args: argparse.Namespace) -> int:
    run = AsyncDiLoCo(args)
    with charlm.Peer(args) as peer:
        peer.connect()
        flight: InFlight | None = None

        def drain() -> None:  # land the step in flight: every peer syncs the same model
            nonlocal flight
            if flight is not None:
                run.land(peer, flight, flight.k)
                flight = None

        while int(run.count) + (flight is not None) < run.last:
            # a joiner receives the model and step at a join point
            if peer.join_point(run.state, drain) and int(run.count) >= run.last:
                break
            k = int(run.count) + (flight is not None) + 1  # the phase this one trains
            loss = run.inner_phase(k)  # while step k - 1's all-reduce runs
            world = run.wait(peer, flight) if flight is not None else 0
            run.pseudo_gradient()  # from the global model this phase started from
            if flight is not None:
                run.apply(peer, flight, world, k)
            flight = run.launch(peer, k, loss)
        if flight is not None:
            run.land(peer, flight, flight.k)
        run.finish(peer)
    return 0


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """``diloco.py``'s options, with the gentler outer step as the default."""
    return charlm.diloco_parser(__doc__, "inner steps per outer step (H)", outer_lr=0.4,
                                momentum=0.3).parse_args(argv)


if __name__ == "__main__":
    sys.exit(main(parse()))
