"""The README's PyTorch quick start: data-parallel training with the blocking API.

    python -m pccl_aio.master &
    python examples/quickstart.py &    # start several; kill -9 or add peers at any time
    python examples/quickstart.py

Every step: admit newcomers (a joint vote), sync the model and optimizer (a newcomer receives
them, and the step), compute the gradients, average them over the group (a bucket aborted by
a lost peer is retried on the survivors), step. A peer alone takes no step: it waits for
another (``wait_for_peers``, which costs the master nothing while nobody comes) for up to
``PATIENCE`` seconds. It prints when it joins, when the group grows or shrinks, every 50
steps, and at the end ``peer <id>: done at step <n>, digest <hex>``, the digest equal on
every peer that finished the run. The default run (600 steps of at least ``PACE`` = 0.1 s)
lasts over a minute: time to kill a peer by hand; ``STEPS=100 PACE=0`` makes it quick. The
block between the two ``# ---`` markers is the README's, word for word (a test checks it).
"""

from __future__ import annotations

# --- quick start ---
import hashlib
import os
import time

import torch

import pccl_aio as pccl
from pccl_aio.blocking import Buckets, Communicator

MASTER = os.environ.get("MASTER", "127.0.0.1:48148")
STEPS = int(os.environ.get("STEPS", "600"))  # the run's length: 600 steps of 0.1 s or more
PACE = float(os.environ.get("PACE", "0.1"))  # seconds a real model would compute per step
PATIENCE = float(os.environ.get("PATIENCE", "600"))  # seconds to wait for another peer
torch.manual_seed(0)  # the same initial model on every peer (a newcomer receives the run's)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
state = pccl.SharedState.from_module(model, opt)  # state.revision counts the run's steps
grads = Buckets.grads_of(model)  # flat reusable gradient buckets, like DDP's
data = torch.Generator().manual_seed(os.getpid())  # this peer's own samples

with Communicator(MASTER) as comm:
    comm.connect()  # returns once admitted into the run
    me, peers = f"peer {comm.peer_id}", 0  # the group size of its last sync (none yet)
    print(f"{me}: joined the run; its first sync brings the run's step", flush=True)
    while state.revision < STEPS:
        if comm.peer_group_world_size < 2:  # alone: no step until another peer joins
            print(f"{me}: alone, waiting up to {PATIENCE:g} s for another peer", flush=True)
            comm.wait_for_peers(2, timeout=PATIENCE)  # sleeps; PcclTimeoutError if none
        if comm.are_peers_pending():  # a joint vote of every peer
            comm.update_topology()  # admit the newcomers
            continue  # and start the step over together
        comm.sync_shared_state(state)  # newcomers receive model, optimizer and step
        if comm.peer_group_world_size != peers:  # joined, or a peer joined, left or died
            peers = comm.peer_group_world_size
            print(f"{me}: a group of {peers} at step {state.revision}", flush=True)
        x = torch.randn(64, 16, generator=data)
        loss = (model(x) - x.sum(1, keepdim=True).sin()).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        time.sleep(PACE)  # stands in for a bigger model's compute (PACE=0: full speed)
        try:
            grads.all_reduce(comm, op=pccl.ReduceOp.AVG)  # retried if a peer dies
        except pccl.TooFewPeersError:
            continue  # the other peers are gone: no step
        opt.step()
        state.revision += 1
        if state.revision % 50 == 0:
            print(f"{me}: step {state.revision}, loss {loss.item():.4f}", flush=True)
    weights = b"".join(t.numpy().tobytes() for t in model.state_dict().values())
    digest = hashlib.blake2b(weights, digest_size=8).hexdigest()  # equal on every peer
    print(f"{me}: done at step {state.revision}, digest {digest}", flush=True)
# --- end ---
