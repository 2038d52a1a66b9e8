"""The README's PyTorch quick start: data-parallel training with the blocking API.

    python -m pccl_aio.master &
    python examples/quickstart.py &    # start several; kill -9 or add peers at any time
    python examples/quickstart.py

Every step: admit newcomers (a joint vote), sync the model and optimizer (a newcomer receives
them, and the step), compute the gradients, average them over the group (a bucket aborted by
a lost peer is retried on the survivors), step. A peer alone takes no step: it polls until
someone joins (so a peer started after the run ended waits for the next one). The block between
the two ``# ---`` markers is the README's, word for word (a test checks it). Ends with one line
``peer <id> done: step <n>, digest <hex>``, the digest equal on every peer that
finished the run.
"""

# ruff: noqa: I001  (the quick start block carries its own imports)
from __future__ import annotations

import hashlib

# --- quick start ---
import contextlib
import os

import torch

import pccl_aio as pccl
from pccl_aio.blocking import Buckets, Communicator

MASTER, STEPS = os.environ.get("MASTER", "127.0.0.1:48148"), int(os.environ.get("STEPS", "300"))
torch.manual_seed(0)  # the same initial model on every peer (a newcomer receives the run's)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
state = pccl.SharedState.from_module(model, opt)  # state.revision counts the run's steps
grads = Buckets.grads_of(model)  # flat reusable gradient buckets, like DDP's
data = torch.Generator().manual_seed(os.getpid())  # this peer's own samples

with Communicator(MASTER) as comm:
    comm.connect()  # returns once admitted into the run
    while state.revision < STEPS:
        if comm.are_peers_pending():  # a joint vote of every peer
            comm.update_topology()  # admit the newcomers
            continue  # and start the step over together
        comm.sync_shared_state(state)  # newcomers receive model, optimizer and step
        x = torch.randn(64, 16, generator=data)
        loss = (model(x) - x.sum(1, keepdim=True).sin()).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        with contextlib.suppress(pccl.TooFewPeersError):  # alone: no step, wait for company
            grads.all_reduce(comm, op=pccl.ReduceOp.AVG)  # retried if a peer dies
            opt.step()
            state.revision += 1
    print(f"peer {comm.peer_id}: step {state.revision}, loss {loss.item():.4f}")
# --- end ---
    digest = hashlib.blake2b(b"".join(t.numpy().tobytes() for t in model.state_dict().values()),
                             digest_size=8).hexdigest()
    print(f"peer {comm.peer_id} done: step {state.revision}, digest {digest}", flush=True)
