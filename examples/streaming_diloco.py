"""Streaming DiLoCo (Douillard et al., 2025, "Streaming DiLoCo with overlapping
communication") on the small GPT of ``charlm.py``, with the blocking API.

    python -m pccl_aio.master --port 48148 &
    python examples/streaming_diloco.py --seed 1 &
    python examples/streaming_diloco.py --seed 2 &
    python examples/streaming_diloco.py --seed 3  # join or kill -9 any time

DiLoCo (``diloco.py``) averages the whole pseudo-gradient every H inner steps and waits for
it. Streaming DiLoCo splits the parameters into F fragments (``--fragments``: the parameter
list in model order, cut at tensor boundaries into contiguous pieces of about equal size) and
synchronises each fragment every H steps (``--inner``), on staggered schedules, so that only
1/F of the model is on the wire at a time and the exchange overlaps training:

- at inner step t = (f + 1) H / F + j H (j = 0, 1, ...), fragment f sends its pseudo-gradient
  ``global_f - local_f`` (the fragment of the global model minus this peer's training copy):
  an ``all_reduce_async`` AVG over the group (``--quant uint8`` quantizes it), in the
  background while training goes on;
- tau inner steps later (``--delay``) it completes: the mean takes the outer Nesterov SGD step
  on the global fragment, and the local fragment, trained on meanwhile, is mixed in:
  ``local_f = alpha local_f + (1 - alpha) global_f`` (``--alpha``, 0.5 as in the paper).
  Each completion is an outer step of the line protocol (``step`` line, digest of the whole
  global model); with H = 30, F = 3, tau = 5: fragment 0 sends at t = 10 and lands at 15,
  fragment 1 at 20 and 25, fragment 2 at 30 and 35, fragment 0 again at 40 and 45, ...
- at the last inner step (``--inner-steps``) every fragment is sent and completed at once, so
  the final global model holds every peer's last step.

With F = 1, tau = 0 and alpha = 0 this is exactly ``diloco.py`` (the tests check the digests).
On the default model (3 peers, 1000 inner steps, H = 50) the defaults reach a validation loss
of 1.74 where ``diloco.py`` reaches 2.02 (1.36 against 1.38 after 5000 steps), for about the
same bytes sent; the mixing is where the gain comes from (alpha = 0: 2.07), and ``--quant
uint8`` costs nothing (1.74).

The global model, the outer momenta and the counters (inner steps, outer steps) are the shared
state (``SharedState.from_module``). The peers vote on pending joiners before every send; when
the group changes (a joiner, or a peer left alone), the exchanges in flight are completed
first, so every peer syncs the same global model and counters, which a joiner receives there;
its training copy starts from the global model (the inner AdamW state stays local: a joiner
starts it fresh). A peer lost during an exchange aborts it on
every survivor (``PeerLostError`` from ``wait``): they all-reduce the same pseudo-gradient again
(out of place: it is intact). Lines as in ``charlm.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys

import charlm
import torch

import pccl_aio as pccl
from pccl_aio import blocking


def split(sizes: list[int], parts: int) -> list[list[int]]:
    """Indices 0..len(sizes)-1 cut into ``parts`` contiguous runs of about equal total size
    (a tensor goes where its middle falls)."""
    total, at = sum(sizes), 0
    runs: list[list[int]] = [[] for _ in range(parts)]
    for i, n in enumerate(sizes):
        runs[min(parts - 1, (2 * at + n) * parts // (2 * total))].append(i)
        at += n
    if not all(runs):
        raise SystemExit(f"cannot cut {len(sizes)} tensors into {parts} fragments")
    return runs


class Fragment:
    """Some global parameters, their local copies, and two flat buffers: the pseudo-gradient
    (read by the all-reduce) and the group's mean (the global parameters' ``.grad``)."""

    def __init__(self, params: list[torch.Tensor], local: list[torch.Tensor]) -> None:
        self.params, self.local = params, local
        n = sum(p.numel() for p in params)
        self.delta, self.mean = torch.zeros(n), torch.zeros(n)
        self.grads, at = [], 0
        for p in params:
            self.grads.append(self.mean[at:at + p.numel()].view_as(p))
            at += p.numel()

    @torch.no_grad()
    def pseudo_gradient(self) -> None:
        at = 0
        for pg, pl in zip(self.params, self.local):
            torch.sub(pg, pl, out=self.delta[at:at + pg.numel()].view_as(pg))
            at += pg.numel()


@dataclasses.dataclass
class Exchange:
    """Fragment ``frag``'s all-reduce, due at inner step ``due``; ``handle`` None: alone at
    launch (or aborted), to be all-reduced (again) when due."""

    frag: int
    due: int
    handle: blocking.AllReduceHandle | None


class Streaming:
    """The global model (shared) with its outer optimizer, this peer's training copy, the
    fragments, the schedule and the exchanges in flight."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.h, self.end = args, int(args.inner), int(args.inner_steps)
        self.cfg, self.train, self.val = charlm.setup(args)
        self.model, self.local = charlm.GPT(self.cfg), charlm.GPT(self.cfg)
        params, local = list(self.model.parameters()), list(self.local.parameters())
        runs = split([p.numel() for p in params], args.fragments)
        self.frags = [Fragment([params[i] for i in r], [local[i] for i in r]) for r in runs]
        self.outer = torch.optim.SGD([{"params": f.params} for f in self.frags],
                                     lr=args.outer_lr, momentum=args.momentum, nesterov=True)
        self.inner = torch.optim.AdamW(local, lr=args.lr, weight_decay=args.weight_decay)
        self.counters = torch.zeros(2, dtype=torch.int64)  # inner steps, outer steps: the run's
        self.state = pccl.SharedState.from_module(self.model, self.outer,
                                                  extra={"counters": self.counters})
        self.quant = pccl.Quantization(algo=pccl.QuantAlgo.MIN_MAX, dtype=args.quant) \
            if args.quant != "none" else None
        self.flight: list[Exchange] = []  # in launch order: every peer completes in this order
        self.losses: list[float] = []  # train losses since the last step line
        self.loss = self.val_loss = math.nan
        self.last = sum(len(self.sends(t)) for t in range(1, self.end + 1))  # outer steps

    @property
    def t(self) -> int:
        return int(self.counters[0])

    def sends(self, t: int) -> list[int]:
        """The fragments that send at inner step ``t`` (all of them at the last)."""
        f = len(self.frags)
        if t >= self.end:
            return list(range(f))
        return [i for i in range(f) if t > 0 and t % self.h == (i + 1) * self.h // f % self.h]

    def next_send(self) -> int:
        t = self.t + 1
        while not self.sends(t):
            t += 1
        return t

    def restart_local(self) -> None:
        """This peer's training copy from the global model (at its first sync)."""
        self.local.load_state_dict(self.model.state_dict())

    def train_step(self) -> None:
        """One inner AdamW step (the run's step t + 1) on this peer's batch."""
        t = self.t + 1
        charlm.set_lr(self.inner, charlm.lr_at(self.args.lr, t, self.end))
        self.inner.zero_grad()
        loss = self.local(*charlm.batch(self.train, self.cfg, self.args.seed, t))
        loss.backward()
        self.inner.step()
        self.losses.append(float(loss.detach()))
        self.counters[0] = t

    def send(self, peer: charlm.Peer, f: int) -> None:
        """Launch fragment ``f``'s exchange (its pseudo-gradient now, into its ``mean``)."""
        frag = self.frags[f]
        frag.pseudo_gradient()
        try:
            handle = peer.comm.all_reduce_async(frag.delta, frag.mean, op=pccl.ReduceOp.AVG,
                                                tag=f, quantization=self.quant)
        except pccl.TooFewPeersError:  # alone (nothing sent): wait() takes our own
            handle = None
        self.flight.append(Exchange(f, self.t + self.args.delay, handle))

    def wait(self, peer: charlm.Peer, ex: Exchange, k: int) -> int:
        """The group's mean of fragment ``ex.frag`` in its ``mean``; the world size it took.
        After a lost peer the survivors all-reduce the same pseudo-gradient again."""
        frag, handle = self.frags[ex.frag], ex.handle
        while True:
            try:
                info = handle.wait() if handle is not None else peer.comm.all_reduce(
                    frag.delta, frag.mean, op=pccl.ReduceOp.AVG, tag=ex.frag,
                    quantization=self.quant)
            except pccl.TooFewPeersError:  # alone now: our own pseudo-gradient
                frag.mean.copy_(frag.delta)
                return 1
            except pccl.PeerLostError:  # (a "left" line may have told already)
                if peer.comm.peer_group_world_size < peer.world:
                    peer.lost(k, peer.comm.peer_group_world_size)
                handle = None
                continue
            return peer.reduced([info], k)

    def complete(self, peer: charlm.Peer, ex: Exchange) -> None:
        """Fragment ``ex.frag``'s outer step on the global model, mixed into the local copy;
        the ``step`` line."""
        k = int(self.counters[1]) + 1
        world = self.wait(peer, ex, k)
        frag = self.frags[ex.frag]
        for i, other in enumerate(self.frags):  # only this fragment has gradients
            for p, g in zip(other.params, other.grads):
                p.grad = g if i == ex.frag else None
        self.outer.step()
        alpha = self.args.alpha
        with torch.no_grad():
            for pl, pg in zip(frag.local, frag.params):
                pl.mul_(alpha).add_(pg, alpha=1 - alpha)
        self.counters[1] = k
        if self.losses:
            self.loss, self.losses = sum(self.losses) / len(self.losses), []
        last = charlm.evaluate_at(self.args, k, self.last)
        self.val_loss = charlm.evaluate(self.model, self.val, self.cfg) if last else math.nan
        peer.step(k, self.t, world, self.loss, self.val_loss, self.digest())

    def complete_due(self, peer: charlm.Peer, everything: bool = False) -> None:
        """Complete the exchanges due by now (``everything``: all in flight), in order."""
        while self.flight and (everything or self.flight[0].due <= self.t):
            self.complete(peer, self.flight.pop(0))

    def digest(self) -> str:
        return charlm.digest(self.model.parameters())

    def finish(self, peer: charlm.Peer) -> None:
        if math.isnan(self.val_loss):  # took no step
            self.val_loss = charlm.evaluate(self.model, self.val, self.cfg)
        peer.done(int(self.counters[1]), self.t, self.val_loss, self.digest())


def main(args: argparse.Namespace) -> int:
    run = Streaming(args)
    with charlm.Peer(args) as peer:
        peer.connect()
        peer.join_point(run.state, lambda: None)  # a joiner receives the model and counters
        run.restart_local()
        while True:  # at a send point (or the start)
            if run.t >= run.end:  # the last step: complete what is in flight, send it all
                run.complete_due(peer, everything=True)
            for f in run.sends(run.t):
                run.send(peer, f)
            run.complete_due(peer, everything=run.t >= run.end)  # tau = 0: at once
            if run.t >= run.end:
                break
            for _ in range(run.next_send() - run.t):  # train on while exchanges run
                run.train_step()
                run.complete_due(peer)
            # every peer syncs the same state: what is in flight is completed first
            peer.join_point(run.state, lambda: run.complete_due(peer, everything=True))
        run.finish(peer)
    return 0


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = charlm.diloco_parser(__doc__, "inner steps between two syncs of a fragment (H)",
                              "pseudo-gradients", eval_every=3)
    ap.add_argument("--fragments", type=int, default=3, help="fragments (F)")
    ap.add_argument("--delay", type=int, default=5,
                    help="inner steps an exchange overlaps before it is applied (tau)")
    ap.add_argument("--alpha", type=float, default=0.5,
                    help="mixing: local = alpha local + (1 - alpha) global")
    args = ap.parse_args(argv)
    if not (1 <= args.fragments <= args.inner and 0 <= args.delay < args.inner):
        ap.error("need 1 <= --fragments <= --inner and 0 <= --delay < --inner")
    return args


if __name__ == "__main__":
    sys.exit(main(parse()))
