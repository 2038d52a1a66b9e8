"""DiLoCo with pccl_aio on numpy: local training, an averaged pseudo-gradient, an outer Nesterov
step.

No torch needed; ``examples/diloco.py`` is the same algorithm on a small torch GPT.

    python -m pccl_aio.master --port 48148 &
    python examples/numpy_diloco.py --master 127.0.0.1:48148 --seed 1 &
    python examples/numpy_diloco.py --master 127.0.0.1:48148 --seed 2 &
    python examples/numpy_diloco.py --master 127.0.0.1:48148 --seed 3  # join or kill -9 any time

The run lasts ``--steps`` outer steps (300 by default, about a minute: long enough to start,
join and kill peers by hand; a joiner continues from the run's step). Each peer fits the same
small numpy MLP to its own shard of data (``--seed``). One outer step: ``--inner`` local SGD
steps from the outer parameters (in a thread, so the event loop keeps answering heartbeats),
stretched to at least ``--inner-time`` seconds as a real inner phase would take (minutes), the
pseudo-gradient ``outer - local`` averaged over the group, then an outer Nesterov step applied
identically everywhere. The outer parameters and momentum are a
``SharedState``: a peer that joins mid-run receives them (and the step) at the next sync, and
the sync checks by hash that every peer holds the same bytes.

``--overlap`` is the one-step-delayed variant (async DiLoCo): the all-reduce of step t runs
while step t+1 trains, and step t's average is applied after that. The shared state is then
synced only when the group changes, after the pipeline was drained, so every peer enters the
sync with the same outer state; the step count travels in the state as a tensor.

The pseudo-gradient is all-reduced with ``restore_on_abort=False``: it is recomputed from the
kept parameters after a lost peer, so the library need not keep a copy of it. Each outer step
prints one line with a digest of the outer parameters (the same on every peer); the last is
``done step=... outer=...``. Changes of the group print one line each: ``waiting`` (too few
peers), ``admitted`` (newcomers voted in), ``lost`` (an all-reduce aborted by a lost peer,
retried) and ``left`` (the group is smaller than at the last step; a peer lost between
collectives raises nothing).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import sys

import numpy as np

import pccl_aio as pccl

D, H = 8, 32  # input features, hidden units
SIZES = {"w1": D * H, "b1": H, "w2": H, "b2": 1}


def unpack(flat: np.ndarray) -> dict[str, np.ndarray]:
    """Views of the flat parameter vector: w1 (D, H), b1 (H,), w2 (H,), b2 (1,)."""
    out, at = {}, 0
    for name, n in SIZES.items():
        out[name] = flat[at:at + n]
        at += n
    out["w1"] = out["w1"].reshape(D, H)
    return out


def make_shard(seed: int, n: int = 512) -> tuple[np.ndarray, np.ndarray]:
    """This peer's data: the same target function everywhere, different samples."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, D)).astype(np.float32)
    y = np.sin(x @ np.linspace(-1, 1, D, dtype=np.float32)) + 0.05 * rng.standard_normal(n)
    return x, y.astype(np.float32)


def inner_steps(flat: np.ndarray, x: np.ndarray, y: np.ndarray, steps: int, lr: float) -> float:
    """``steps`` full-batch SGD steps on the MSE of a tanh MLP, in place; the last loss."""
    p = unpack(flat)
    loss = 0.0
    for _ in range(steps):
        h = np.tanh(x @ p["w1"] + p["b1"])
        err = h @ p["w2"] + p["b2"] - y
        loss = float(np.mean(err * err))
        g = 2.0 * err / len(y)
        gh = np.outer(g, p["w2"]) * (1.0 - h * h)
        p["w2"] -= lr * (h.T @ g)
        p["b2"] -= lr * g.sum()
        p["w1"] -= lr * (x.T @ gh)
        p["b1"] -= lr * gh.sum(axis=0)
    return loss


class Outer:
    """Outer parameters and Nesterov momentum, kept identical on every peer (shared state)."""

    def __init__(self, lr: float, mu: float) -> None:
        n = sum(SIZES.values())
        self.params = (np.random.default_rng(0).standard_normal(n) * 0.3).astype(np.float32)
        self.momentum = np.zeros(n, np.float32)
        self.count = np.zeros(1, np.int64)  # outer steps taken by the run
        self.state = pccl.SharedState({"params": self.params, "momentum": self.momentum,
                                       "step": self.count})
        self.lr, self.mu = np.float32(lr), np.float32(mu)

    def digest(self) -> str:
        """A short digest of the outer parameters: equal on every peer, step by step."""
        return hashlib.blake2b(self.params.tobytes(), digest_size=8).hexdigest()

    def step(self, avg_delta: np.ndarray) -> None:
        """Nesterov SGD on the averaged pseudo-gradient (float32, the same bytes everywhere)."""
        self.momentum *= self.mu
        self.momentum += avg_delta
        self.params -= self.lr * (avg_delta + self.mu * self.momentum)
        self.count += 1


def log(kind: str, comm: pccl.Communicator, **fields: object) -> None:
    """One line about the group: ``kind peer=<this peer's id> key=value...``."""
    print(" ".join([kind, f"peer={comm.peer_id}", *(f"{k}={v}" for k, v in fields.items())]),
          flush=True)


async def average(comm: pccl.Communicator, outer: np.ndarray, local: np.ndarray,
                  step: int) -> np.ndarray:
    """The group's mean of ``outer - local``. A lost peer aborts the attempt for everyone; the
    survivors recompute their pseudo-gradient and retry together (alone: their own)."""
    while True:
        delta: np.ndarray = outer - local
        try:
            if comm.peer_group_world_size >= 2:
                await comm.all_reduce(delta, op=pccl.ReduceOp.AVG, tag=0, restore_on_abort=False)
            return delta
        except pccl.TooFewPeersError:  # alone now; raised before anything was sent
            return delta
        except pccl.PeerLostError as exc:
            log("lost", comm, step=step, world=comm.peer_group_world_size, retrying=1,
                error=repr(str(exc)))
            continue


async def wait_for_peers(comm: pccl.Communicator, n: int) -> None:
    """Sleep until the group has ``n`` peers, admitting joiners as they come (joint votes;
    nothing is sent to the master while nobody arrives)."""
    before = comm.peer_group_world_size
    log("waiting", comm, world=before, need=n)
    await comm.wait_for_peers(n)
    log("admitted", comm, world=f"{before}->{comm.peer_group_world_size}")


async def main(args: argparse.Namespace) -> int:
    x, y = make_shard(args.seed)
    # the one-step-delayed update wants a gentler outer step (it oscillates at 0.7 / 0.9 here)
    outer = Outer(args.outer_lr or (0.5 if args.overlap else 0.7),
                  args.momentum or (0.7 if args.overlap else 0.9))
    about = f", about {args.steps * args.inner_time:.0f} s" if args.inner_time else ""
    print(f"running {args.steps} outer steps{about} (--steps, --inner-time); master "
          f"{args.master}", flush=True)
    secret = pccl.load_secret(args.secret_file)  # else $PCCL_AIO_SECRET(_FILE), else none
    async with pccl.Communicator(args.master, secret=secret or b"") as comm:
        await comm.connect(attempts=args.attempts)
        print(f"joined peer={comm.peer_id} world={comm.world_size}", flush=True)
        if comm.peer_group_world_size < args.min_peers:  # the first step waits for them
            await wait_for_peers(comm, args.min_peers)
        first = True
        world = comm.peer_group_world_size
        bar = pccl.progress_bar(f"peer {comm.peer_id}: shared state")  # tqdm, if installed
        pending: asyncio.Future[np.ndarray] | None = None  # --overlap: the last step's average
        while outer.count[0] + (pending is not None) < args.steps:
            joining = not first and await comm.are_peers_pending()  # a joint vote of the run
            first = False
            if joining or comm.peer_group_world_size < 2:
                if pending is not None:  # drain the pipeline before the group changes
                    outer.step(await pending)
                    pending = None
                if joining:
                    before = comm.peer_group_world_size
                    await comm.update_topology()
                    log("admitted", comm, world=f"{before}->{comm.peer_group_world_size}")
                if comm.peer_group_world_size < 2:  # alone: wait for company
                    await wait_for_peers(comm, 2)
            if pending is None:  # a joiner receives the outer state and the step count here
                try:
                    await comm.sync_shared_state(outer.state, progress=bar)
                except pccl.SharedStateError as exc:
                    # A fetch failed (every source died mid-transfer, or a hash mismatch):
                    # the sync fails on every peer of the group, so all retry it together.
                    log("failed", comm, error=repr(str(exc)))
                    continue
                outer.state.revision += 1
                if outer.count[0] >= args.steps:
                    break
            if comm.peer_group_world_size < world:  # peers left between collectives
                log("left", comm, world=f"{world}->{comm.peer_group_world_size}")
            world = comm.peer_group_world_size
            step = int(outer.count[0]) + (pending is not None) + 1  # the step this one makes
            base = outer.params.copy()  # the outer parameters this step trains from
            local = base.copy()
            loss, _ = await asyncio.gather(  # an inner phase lasts at least --inner-time
                asyncio.to_thread(inner_steps, local, x, y, args.inner, args.lr),
                asyncio.sleep(args.inner_time))
            if args.overlap:
                if pending is not None:
                    outer.step(await pending)  # step t-1's average, applied after step t trained
                pending = asyncio.ensure_future(average(comm, base, local, step))
            else:
                outer.step(await average(comm, base, local, step))
            print(f"step={step} world={world} loss={loss:.5f} outer={outer.digest()} "
                  f"peer={comm.peer_id}", flush=True)
        if pending is not None:
            outer.step(await pending)
        print(f"done step={int(outer.count[0])} outer={outer.digest()}", flush=True)
    return 0


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n", 1)[0].split()))
    ap.add_argument("--master", default="127.0.0.1:48148")
    ap.add_argument("--seed", type=int, default=1, help="this peer's data shard")
    ap.add_argument("--steps", type=int, default=300, help="outer steps of the run")
    ap.add_argument("--inner", type=int, default=20, help="local SGD steps per outer step")
    ap.add_argument("--inner-time", type=float, default=0.2,
                    help="seconds an inner phase lasts at least (0: as fast as it computes)")
    ap.add_argument("--lr", type=float, default=0.05, help="inner learning rate")
    ap.add_argument("--outer-lr", type=float, help="default 0.7, with --overlap 0.5")
    ap.add_argument("--momentum", type=float, help="Nesterov; default 0.9, with --overlap 0.7")
    ap.add_argument("--overlap", action="store_true",
                    help="one-step-delayed outer update, all-reduce overlapping training")
    ap.add_argument("--min-peers", type=int, default=2,
                    help="peers the run waits for before its first step (joiners skip this)")
    ap.add_argument("--attempts", type=int, default=20, help="master connection attempts")
    ap.add_argument("--secret-file", metavar="PATH",
                    help="the run secret (default: $PCCL_AIO_SECRET_FILE or $PCCL_AIO_SECRET)")
    return ap.parse_args(argv)


if __name__ == "__main__":
    sys.exit(pccl.run(main(parse())))
