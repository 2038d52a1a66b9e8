"""DiLoCo as ``examples/diloco.py`` (same options, same run, same lines), with the async API.

    python -m pccl_aio.master --port 48148 &
    python examples/diloco_asyncio.py --seed 1 &
    python examples/diloco_asyncio.py --seed 2 &
    python examples/diloco.py --seed 3  # the two forms take part in one run

Every call to the communicator is awaited on the event loop; the inner phase and the outer
step (with its evaluation) run in ``asyncio.to_thread``, so the loop keeps answering the
master's heartbeats however long they take. The model, the data and the steps are
``diloco.DiLoCo``'s; only the communication is written here.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import charlm
import diloco

import pccl_aio as pccl


class Peer(charlm.Lines):
    """``charlm.Peer``'s churn handling, awaited."""

    def __init__(self, comm: pccl.Communicator, args: argparse.Namespace) -> None:
        super().__init__()
        self.comm, self.args, self.first = comm, args, True

    async def connect(self) -> None:
        await self.comm.connect(attempts=self.args.attempts)
        self.peer_id = self.comm.peer_id
        self.log("joined", world=self.comm.world_size)
        if self.comm.peer_group_world_size < self.args.min_peers:
            await self.wait_for_peers(self.args.min_peers)
        self.world = self.comm.peer_group_world_size

    async def wait_for_peers(self, n: int) -> None:
        """Sleep until the group has ``n`` peers, admitting joiners as they come."""
        before = self.comm.peer_group_world_size
        self.log("waiting", world=before, need=n)
        await self.comm.wait_for_peers(n)
        self.log("admitted", world=f"{before}->{self.comm.peer_group_world_size}")

    async def sync(self, state: pccl.SharedState) -> None:
        """Admit pending peers, wait when alone, sync ``state`` (retried), log who left."""
        while True:
            joining = not self.first and await self.comm.are_peers_pending()
            self.first = False
            if joining:
                before = self.comm.peer_group_world_size
                await self.comm.update_topology()
                self.log("admitted", world=f"{before}->{self.comm.peer_group_world_size}")
            if self.comm.peer_group_world_size < 2:
                await self.wait_for_peers(2)
            try:
                info = await self.comm.sync_shared_state(state, progress=self.fetch_progress())
            except pccl.SharedStateError as exc:  # every peer of the group got it: retry
                self.log("failed", error=repr(str(exc)).replace(" ", "_"))
                continue
            self.sent += info.tx_bytes
            state.revision += 1
            break
        if self.comm.peer_group_world_size < self.world:
            self.log("left", world=f"{self.world}->{self.comm.peer_group_world_size}")
        self.world = self.comm.peer_group_world_size


async def average(peer: Peer, run: diloco.DiLoCo, k: int) -> int:
    """``diloco.average``, awaited."""
    while True:
        run.pseudo_gradient()
        try:
            if run.sparse is not None:  # (in place: flat is read before the exchange)
                x = run.flat.numpy()
                info = await run.sparse.average(peer.comm, x, x)
            else:
                info = await peer.comm.all_reduce(run.flat, op=pccl.ReduceOp.AVG,
                                                  quantization=run.quant, restore_on_abort=False)
        except pccl.TooFewPeersError:
            return 1
        except pccl.PeerLostError:
            peer.lost(k, peer.comm.peer_group_world_size)
            continue
        return peer.reduced([info], k)


async def main(args: argparse.Namespace) -> int:
    run = diloco.DiLoCo(args)
    secret = pccl.load_secret(args.secret_file) or b""
    async with pccl.Communicator(args.master, secret=secret) as comm:
        peer = Peer(comm, args)
        await peer.connect()
        while int(run.count) < run.last:
            await peer.sync(run.state)  # a joiner receives the global model and the step
            k = int(run.count) + 1
            if k > run.last:
                break
            loss = await asyncio.to_thread(run.inner_phase, k)
            world = await average(peer, run, k)
            await asyncio.to_thread(run.outer_step, peer, k, world, loss)
        run.finish(peer)
    return 0


if __name__ == "__main__":
    sys.exit(pccl.run(main(diloco.parse(doc=__doc__))))
