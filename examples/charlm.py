"""The model and data of the torch examples, and the churn handling they share.

A small GPT-style byte-level ("character-level") language model trained on the Python
standard library's own ``.py`` sources: every peer reads the same files of its own
interpreter, so there is nothing to download. Files are split by name into train and
validation (``crc32(path) % 10 == 0`` validates), sorted, joined and capped (``--tiny``: a
much smaller model and corpus, for tests). Peers of one run need the same Python version
(the same corpus) and the same ``--threads`` (bit-identical floats).

``Peer`` wraps a ``pccl_aio.blocking.Communicator`` with what every example does around its
collectives: connect, wait for ``--min-peers``, and before each outer step admit pending
peers, sync the shared state (a joiner receives the model and the step there) and notice
peers that left; it prints the line protocol (``joined``, ``waiting``, ``admitted``,
``failed``, ``lost``, ``left``, ``fetch``, ``step``, ``done``) and counts the payload bytes
sent. A joiner's fetch of the state shows a tqdm bar when tqdm is installed.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import math
import os
import sysconfig
import time
import zlib
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import pccl_aio as pccl
from pccl_aio import blocking

VOCAB = 256  # bytes
STARTED = time.monotonic()  # the ``time=`` of the step lines counts from here


@dataclasses.dataclass(frozen=True)
class Config:
    """Model and corpus sizes."""

    d: int = 64  # embedding width
    layers: int = 2
    heads: int = 4
    ctx: int = 64  # context length (bytes)
    batch: int = 32  # windows per inner step
    train_bytes: int = 4 << 20
    val_bytes: int = 256 << 10
    val_windows: int = 256  # fixed validation windows


TINY = Config(d=32, layers=1, heads=2, ctx=32, batch=8, train_bytes=256 << 10,
              val_bytes=32 << 10, val_windows=32)


# ---- data ------------------------------------------------------------------------------------
def stdlib_files() -> tuple[str, list[str]]:
    """The stdlib directory and its ``.py`` files (sorted relative paths), without
    ``site-packages`` and test directories."""
    root = sysconfig.get_paths()["stdlib"]
    skip = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
    found = []
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if x not in skip]
        found += [os.path.relpath(os.path.join(d, f), root) for f in files if f.endswith(".py")]
    return root, sorted(found)


def load_corpus(cfg: Config) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, validation) bytes as uint8 tensors, split by file, each capped at its size."""
    root, files = stdlib_files()
    parts: dict[bool, list[bytes]] = {False: [], True: []}
    left = {False: cfg.train_bytes, True: cfg.val_bytes}
    for rel in files:
        is_val = zlib.crc32(rel.encode()) % 10 == 0
        if left[is_val] <= 0:
            if left[not is_val] <= 0:
                break
            continue
        with open(os.path.join(root, rel), "rb") as f:
            data = f.read(left[is_val])
        parts[is_val].append(data)
        left[is_val] -= len(data)
    train, val = (torch.frombuffer(bytearray(b"".join(parts[v])), dtype=torch.uint8)
                  for v in (False, True))
    return train, val


def batch(data: torch.Tensor, cfg: Config, seed: int, step: int) -> tuple[torch.Tensor,
                                                                           torch.Tensor]:
    """``cfg.batch`` random windows (inputs, next-byte targets), drawn from ``seed`` and
    ``step`` only: the same call gives the same batch on any peer."""
    key = hashlib.blake2b(f"{seed}:{step}".encode(), digest_size=4).digest()
    g = torch.Generator().manual_seed(int.from_bytes(key, "little"))  # 32 bits are used
    starts = torch.randint(len(data) - cfg.ctx - 1, (cfg.batch,), generator=g)
    windows = data.unfold(0, cfg.ctx + 1, 1)[starts].long()
    return windows[:, :-1], windows[:, 1:]


@torch.no_grad()
def evaluate(model: GPT, val: torch.Tensor, cfg: Config) -> float:
    """Mean loss over ``cfg.val_windows`` fixed, evenly spaced validation windows."""
    was = model.training
    model.eval()
    starts = torch.linspace(0, len(val) - cfg.ctx - 1, cfg.val_windows).long()
    windows = val.unfold(0, cfg.ctx + 1, 1)[starts].long()
    total = 0.0
    for i in range(0, len(windows), 64):
        chunk = windows[i:i + 64]
        total += float(model(chunk[:, :-1], chunk[:, 1:])) * len(chunk)
    model.train(was)
    return total / len(windows)


# ---- model -----------------------------------------------------------------------------------
class Block(nn.Module):
    """Pre-LayerNorm transformer block: causal self-attention, then a 4x MLP."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        qkv = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, c // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        out: torch.Tensor = x + self.mlp(self.ln2(x))
        return out


class GPT(nn.Module):
    """Token and position embeddings, ``cfg.layers`` blocks, a weight-tied head. The
    initial weights come from a fixed seed: every peer builds the same model."""

    def __init__(self, cfg: Config, seed: int = 0) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, cfg.d), nn.Embedding(cfg.ctx, cfg.d)
        self.blocks = nn.ModuleList(Block(cfg.d, cfg.heads) for _ in range(cfg.layers))
        self.ln = nn.LayerNorm(cfg.d)
        self.head = nn.Linear(cfg.d, VOCAB, bias=False)
        self.head.weight = self.tok.weight
        g = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():  # GPT-2's init; LayerNorms as built
            if p.dim() == 2:  # residual projections scaled down by depth
                scaled = name.endswith(("proj.weight", "mlp.2.weight"))
                std = 0.02 / math.sqrt(2 * cfg.layers) if scaled else 0.02
                nn.init.normal_(p, 0.0, std, generator=g)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The mean next-byte cross-entropy of ``idx`` against ``targets``."""
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.view(-1, VOCAB), targets.reshape(-1))


def lr_at(base: float, step: int, total: int, warmup: int = 50) -> float:
    """The learning rate of the run's inner step ``step`` (1 .. ``total``): a linear warmup
    over ``warmup`` steps, then a cosine decay to zero. It depends on the step alone, so a
    joiner follows the run's schedule."""
    decay = 0.5 * (1 + math.cos(math.pi * min(step, total) / total))
    return base * min(1.0, step / warmup) * decay


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def digest(tensors: Iterable[torch.Tensor]) -> str:
    """blake2b (8 bytes, hex) of the tensors' bytes, in order: equal only if bit-identical."""
    h = hashlib.blake2b(digest_size=8)
    for t in tensors:
        h.update(t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


# ---- command line ----------------------------------------------------------------------------
def about(doc: str) -> str:
    """A docstring's first paragraph on one line: an example's ``--help`` description (its
    first line alone may end mid-sentence)."""
    return " ".join(doc.split("\n\n", 1)[0].split())


def parser(doc: str, **defaults: Any) -> argparse.ArgumentParser:
    """The options every example takes (``--help`` tells ``about(doc)``); ``defaults``
    overrides their defaults."""
    ap = argparse.ArgumentParser(description=about(doc))
    ap.add_argument("--master", default=os.environ.get("PCCL_AIO_MASTER", "127.0.0.1:48148"),
                    help="HOST:PORT (default: $PCCL_AIO_MASTER, else 127.0.0.1:48148)")
    ap.add_argument("--seed", type=int, default=1, help="this peer's data-sampling seed")
    ap.add_argument("--inner-steps", type=int, default=5000,
                    help="total inner (local optimizer) steps of the run")
    ap.add_argument("--eval-every", type=int, default=1,
                    help="outer steps between validation evaluations (and the last)")
    ap.add_argument("--min-peers", type=int, default=2, help="peers the first step waits for")
    ap.add_argument("--attempts", type=int, default=20, help="master connection attempts")
    ap.add_argument("--secret-file", metavar="PATH",
                    help="the run secret (default: $PCCL_AIO_SECRET_FILE or $PCCL_AIO_SECRET)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--tiny", action="store_true", help="a tiny model and corpus (tests)")
    ap.set_defaults(**defaults)
    return ap


def diloco_parser(doc: str, inner: str, sent: str = "pseudo-gradient",
                  **defaults: Any) -> argparse.ArgumentParser:
    """``parser`` and the options of the DiLoCo examples: ``--inner`` (H, help ``inner``), the
    inner AdamW and outer Nesterov steps, ``--quant`` (help: what is ``sent``); ``defaults``
    overrides the defaults of any option."""
    ap = parser(doc)
    ap.add_argument("--inner", type=int, default=50, help=inner)
    ap.add_argument("--lr", type=float, default=5e-3,
                    help="inner AdamW peak learning rate (warmup, cosine decay over the run)")
    ap.add_argument("--weight-decay", type=float, default=0.01, help="inner AdamW")
    ap.add_argument("--outer-lr", type=float, default=0.7)
    ap.add_argument("--momentum", type=float, default=0.9, help="outer Nesterov momentum")
    ap.add_argument("--quant", choices=("none", "uint8", "uint16", "uint4"), default="none",
                    help=f"send the {sent} quantized (MIN_MAX)")
    ap.set_defaults(**defaults)
    return ap


def ddp_parser(doc: str) -> argparse.ArgumentParser:
    """``parser`` and the options of the data-parallel examples: AdamW's ``--lr`` and
    ``--weight-decay``; validation every 50 steps."""
    ap = parser(doc, eval_every=50)
    ap.add_argument("--lr", type=float, default=3e-3,
                    help="AdamW peak learning rate (warmup, then cosine decay over the run)")
    ap.add_argument("--weight-decay", type=float, default=0.01)
    return ap


def setup(args: argparse.Namespace) -> tuple[Config, torch.Tensor, torch.Tensor]:
    """Threads, the configuration and the corpus (train, validation)."""
    torch.set_num_threads(args.threads)
    cfg = TINY if args.tiny else Config()
    return (cfg, *load_corpus(cfg))


def evaluate_at(args: argparse.Namespace, k: int, last: int) -> bool:
    """Outer step ``k`` evaluates (every ``--eval-every`` and the last)."""
    return k % args.eval_every == 0 or k >= last


# ---- the run ---------------------------------------------------------------------------------
class Lines:
    """The line protocol: one flushed ``kind peer=<id> key=value ...`` line per event, and
    the payload bytes sent."""

    def __init__(self) -> None:
        self.sent = 0  # ReduceInfo.tx_bytes + SyncInfo.tx_bytes
        self.peer_id = -1
        self.world = 0  # the group size at the last step

    def log(self, kind: str, **fields: object) -> None:
        print(" ".join([kind, f"peer={self.peer_id}", *(f"{k}={v}" for k, v in fields.items())]),
              flush=True)

    def fetch_progress(self) -> Callable[[int, int], None]:
        """A ``progress=`` for ``sync_shared_state`` (called only while this peer fetches
        over 4 MiB): a tqdm bar on stderr (none without tqdm or a terminal) and ``fetch``
        lines (``done=``, ``total=`` bytes) from which the launcher draws its own bar."""
        bar = pccl.progress_bar(f"peer {self.peer_id}: shared state")

        def progress(done: int, total: int) -> None:
            bar(done, total)
            self.log("fetch", done=done, total=total)

        return progress

    def step(self, outer: int, inner: int, world: int, loss: float, val: float,
             digest: str) -> None:
        self.log("step", outer=outer, inner=inner, world=world, loss=f"{loss:.4f}",
                 val=f"{val:.4f}", sent=self.sent, digest=digest,
                 time=f"{time.monotonic() - STARTED:.2f}")

    def done(self, outer: int, inner: int, val: float, digest: str) -> None:
        self.log("done", outer=outer, inner=inner, val=f"{val:.4f}", digest=digest)

    def lost(self, outer: int, world: int) -> None:
        """A ``lost`` line: peers were lost during outer step ``outer``'s collectives."""
        self.log("lost", outer=outer, world=f"{self.world}->{world}")
        self.world = world

    def reduced(self, infos: Iterable[pccl.ReduceInfo], outer: int) -> int:
        """Count what the collectives of outer step ``outer`` sent; their world size (a
        ``lost`` line if it is smaller than the group's at the last step)."""
        infos = list(infos)
        self.sent += sum(i.tx_bytes for i in infos)
        world = min(i.world_size for i in infos)
        if world < self.world:
            self.lost(outer, world)
        return world


class Peer(Lines):
    """A peer of the run on the blocking facade (``with Peer(args) as peer``): ``connect``,
    then ``sync(state)`` before every outer step and ``reduced(infos)`` after its collectives.
    Alone, it waits for company (a run needs two peers to average anything)."""

    def __init__(self, args: argparse.Namespace,
                 comm: blocking.Communicator | None = None) -> None:
        super().__init__()
        self.args = args
        self.given = comm is not None  # connected already (pccl_aio.torch's group's)
        self.comm = comm if comm is not None else blocking.Communicator(
            args.master, secret=pccl.load_secret(args.secret_file) or b"")
        self.first = True  # the first sync of this peer (a joiner's too) skips the vote

    def __enter__(self) -> Peer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.comm.close()

    def connect(self) -> None:
        """Join the run; the first step waits for ``--min-peers`` (a joiner finds them)."""
        if not self.given:
            self.comm.connect(attempts=self.args.attempts)
        self.peer_id = self.comm.peer_id
        self.log("joined", world=self.comm.world_size)
        if self.comm.peer_group_world_size < self.args.min_peers:
            self.wait_for_peers(self.args.min_peers)
        self.world = self.comm.peer_group_world_size

    def wait_for_peers(self, n: int) -> None:
        """Sleep until the group has ``n`` peers, admitting joiners as they come (joint
        votes; nothing is sent to the master while nobody arrives)."""
        before = self.comm.peer_group_world_size
        self.log("waiting", world=before, need=n)
        self.comm.wait_for_peers(n)
        self.log("admitted", world=f"{before}->{self.comm.peer_group_world_size}")

    def vote(self) -> bool:
        """The joint vote of the examples that vote apart from ``sync``: do peers wait to be
        admitted? Also logs peers that left since the last step."""
        joining = self.comm.are_peers_pending()
        world = self.comm.peer_group_world_size
        if world < self.world:
            self.log("left", world=f"{self.world}->{world}")
            self.world = world
        return joining

    def admit(self, state: pccl.SharedState, joining: bool) -> None:
        """After ``vote`` (and a drain): admit the peers waiting if ``joining``, then sync
        ``state`` (``sync`` without a second vote, which would answer no until the master's
        next admission batch); alone, it waits for company."""
        self.admit_pending(joining)
        self.first = True  # the vote is taken
        self.sync(state)

    def join_point(self, state: pccl.SharedState, drain: Callable[[], None]) -> bool:
        """Where joiners may come in (the examples that do not sync every step): the joint
        vote (skipped at the first call), and if peers wait, or this one is alone, or it is
        the first call: ``drain()`` (end what is in flight, so that every peer syncs the same
        state), admit them and sync ``state`` (a joiner receives it here). True if it synced."""
        joining = not self.first and self.vote()
        if not (self.first or joining or self.comm.peer_group_world_size < 2):
            return False
        drain()
        self.admit(state, joining)
        return True

    def admit_pending(self, joining: bool) -> None:
        """Admit the peers waiting (the vote said ``joining``), with an ``admitted`` line."""
        if joining:
            before = self.comm.peer_group_world_size
            self.comm.update_topology()
            self.log("admitted", world=f"{before}->{self.comm.peer_group_world_size}")

    def sync(self, state: pccl.SharedState) -> None:
        """Before an outer step: admit pending peers (a joint vote), wait when alone, sync
        ``state`` (retried, on every peer, when a fetch failed) and log peers that left."""
        while True:
            joining = not self.first and self.comm.are_peers_pending()
            self.first = False
            self.admit_pending(joining)
            if self.comm.peer_group_world_size < 2:
                self.wait_for_peers(2)
            try:
                info = self.comm.sync_shared_state(state, progress=self.fetch_progress())
            except pccl.SharedStateError as exc:  # every peer of the group got it: retry
                self.log("failed", error=repr(str(exc)).replace(" ", "_"))
                continue
            self.sent += info.tx_bytes
            state.revision += 1
            break
        if self.comm.peer_group_world_size < self.world:  # left between collectives
            self.log("left", world=f"{self.world}->{self.comm.peer_group_world_size}")
        self.world = self.comm.peer_group_world_size


def average(peer: Peer, flat: torch.Tensor, k: int, pseudo_gradient: Callable[[], None],
            quantization: pccl.Quantization | None = None,
            sparse: pccl.SparseCompressor | None = None) -> int:
    """Average ``flat`` (the pseudo-gradient ``pseudo_gradient()`` writes) over the group;
    the world size it took. A lost peer aborts the attempt for everyone: the survivors
    recompute theirs and retry together. Alone (nothing was sent): our own, world 1. With
    ``sparse``: its error-feedback average (the error buffer kept across retries)."""
    while True:
        pseudo_gradient()
        try:
            if sparse is not None:  # (in place: flat is read before the exchange)
                x = flat.numpy()
                info = sparse.average_blocking(peer.comm, x, x)
            else:
                info = peer.comm.all_reduce(flat, op=pccl.ReduceOp.AVG,
                                            quantization=quantization, restore_on_abort=False)
        except pccl.TooFewPeersError:
            return 1
        except pccl.PeerLostError:
            peer.lost(k, peer.comm.peer_group_world_size)
            continue
        return peer.reduced([info], k)
