"""``SharedState.from_module``: a torch module's state_dict and its optimizer's state as shared
state — views, tied weights once, a fresh optimizer materialized exactly, and the state
following ``load_state_dict`` on either."""

from __future__ import annotations

import pytest
import torch

import pccl_aio as pccl
from tests.integration.state_harness import RO, SO, sync


class Tiny(torch.nn.Module):
    """Embedding tied to the head (two state_dict names, one tensor), a bf16 layer, a buffer."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.emb = torch.nn.Embedding(50, 16)
        self.mid = torch.nn.Linear(16, 16).to(torch.bfloat16)
        self.norm = torch.nn.BatchNorm1d(16)
        self.head = torch.nn.Linear(16, 50, bias=False)
        self.head.weight = self.emb.weight
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x)
        h = h + self.mid(h.to(torch.bfloat16)).float()
        return self.head(self.norm(h))


def _train(model: Tiny, opt: torch.optim.Optimizer, steps: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randint(0, 50, (32,), generator=g)
        loss = torch.nn.functional.cross_entropy(model(x), x)
        opt.zero_grad()
        loss.backward()
        opt.step()


def _snapshot(model: Tiny, opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    out = [t.clone() for t in model.state_dict().values()]
    for st in opt.state.values():
        out += [v.clone() for v in st.values() if isinstance(v, torch.Tensor)]
    return out


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(a, b))


def test_entries_are_views_with_tied_weights_once_and_the_optimizer_materialized():
    model = Tiny()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    before = [t.clone() for t in model.state_dict().values()]
    step = torch.zeros(1, dtype=torch.int64)
    state = pccl.SharedState.from_module(model, opt, extra={"step": step})
    keys = state.keys
    assert "model.emb.weight" in keys and "model.head.weight" not in keys  # tied: once
    assert {"model.mid.weight", "model.norm.running_mean", "model.norm.num_batches_tracked",
            "optim.mid.weight.exp_avg", "optim.emb.weight.exp_avg_sq",
            "optim.norm.bias.step", "step"} <= set(keys)
    assert {k: dt for k, dt, _, _ in state.entries()}["model.mid.weight"] == int(
        pccl.DataType.BFLOAT16)
    # views: writing through the state writes the parameter, and the other way round
    assert state.view("model.emb.weight").tobytes() == model.emb.weight.detach().numpy().tobytes()
    with torch.no_grad():
        model.emb.weight[0, 0] = 123.0
    assert state.view("model.emb.weight")[:4].cast("f")[0] == 123.0
    with torch.no_grad():
        model.emb.weight[0, 0] = before[0][0, 0]
    # materialized like a fresh optimizer: zeros, parameters untouched
    assert all(torch.equal(a, b) for a, b in zip(before, model.state_dict().values()))
    assert all(not v.any() for st in opt.state.values() for v in st.values())


def test_a_materialized_optimizer_trains_exactly_like_a_fresh_one():
    a, b = Tiny(), Tiny()
    opt_a = torch.optim.AdamW(a.parameters(), lr=1e-2, weight_decay=0.1)
    opt_b = torch.optim.AdamW(b.parameters(), lr=1e-2, weight_decay=0.1)
    pccl.SharedState.from_module(a, opt_a)
    assert opt_a.state and not opt_b.state
    _train(a, opt_a, 3, seed=1)
    _train(b, opt_b, 3, seed=1)
    assert _same(_snapshot(a, opt_a), _snapshot(b, opt_b))


@pytest.mark.parametrize("make", [
    lambda ps: torch.optim.Rprop(ps), lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9,
                                                                  dampening=0.5)],
    ids=["rprop", "sgd-dampening"])
def test_an_optimizer_whose_fresh_state_is_not_zeros_must_step_first(make):
    model = Tiny()
    opt = make(model.parameters())
    with pytest.raises(pccl.InvalidUsageError, match="take one optimizer step"):
        pccl.SharedState.from_module(model, opt)
    _train(model, opt, 1, seed=0)
    assert any(k.startswith("optim.") for k in pccl.SharedState.from_module(model, opt).keys)


def test_bad_arguments_are_typed_errors():
    model = Tiny()
    with pytest.raises(pccl.InvalidUsageError, match=r"torch\.nn\.Module"):
        pccl.SharedState.from_module({"w": torch.zeros(3)})
    with pytest.raises(pccl.InvalidUsageError, match="Optimizer"):
        pccl.SharedState.from_module(model, object())
    with pytest.raises(pccl.InvalidUsageError, match="clashes"):
        pccl.SharedState.from_module(model, extra={"model.emb.weight": torch.zeros(3)})
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)  # no state at all: model entries only
    assert all(k.startswith("model.") for k in pccl.SharedState.from_module(model, sgd).keys)


async def test_a_joiner_receives_model_and_optimizer_then_both_train_identically(peers):
    comms = await peers(2)
    models = [Tiny(), Tiny()]
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in models]
    _train(models[0], opts[0], 4, seed=7)  # the run's veteran; peer 1 is a fresh joiner
    states = [pccl.SharedState.from_module(m, o, revision=r)
              for m, o, r in zip(models, opts, (1, 0))]
    infos = await sync(comms, states, [SO, RO])
    assert infos[1].rx_bytes == states[1].nbytes and infos[0].rx_bytes == 0
    assert _same(_snapshot(models[0], opts[0]), _snapshot(models[1], opts[1]))
    for m, o in zip(models, opts):
        _train(m, o, 2, seed=8)
    assert _same(_snapshot(models[0], opts[0]), _snapshot(models[1], opts[1]))


async def test_the_state_follows_load_state_dict_on_module_and_optimizer(peers):
    """After the SharedState was built, peer 1 resumes from a checkpoint:
    ``optimizer.load_state_dict`` replaces the optimizer's tensors, ``load_state_dict`` copies
    into the parameters. The sync writes into the new tensors, not the dropped ones."""
    comms = await peers(2)
    models = [Tiny(), Tiny()]
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in models]
    states = [pccl.SharedState.from_module(m, o) for m, o in zip(models, opts)]
    _train(models[0], opts[0], 3, seed=3)
    states[0].revision = 1
    other = Tiny()
    other_opt = torch.optim.AdamW(other.parameters(), lr=1e-2)
    _train(other, other_opt, 2, seed=4)  # the checkpoint
    dropped = list(opts[1].state[models[1].mid.weight].values())
    kept = [t.clone() for t in dropped]
    opts[1].load_state_dict(other_opt.state_dict())
    models[1].load_state_dict(other.state_dict())
    assert opts[1].state[models[1].mid.weight]["exp_avg"] is not dropped[1]
    await sync(comms, states, [SO, RO])
    assert all(torch.equal(d, k) for d, k in zip(dropped, kept))  # nothing written there
    assert _same(_snapshot(models[0], opts[0]), _snapshot(models[1], opts[1]))
    assert states[0].hashes() == states[1].hashes() and states[1].revision == 1


async def test_a_module_whose_parameters_were_replaced_is_followed(peers):
    """``load_state_dict(assign=True)`` puts new tensors in the module: they are synced."""
    comms = await peers(2)
    models = [Tiny(), Tiny()]
    states = [pccl.SharedState.from_module(m, revision=r) for m, r in zip(models, (1, 0))]
    with torch.no_grad():
        models[0].mid.weight.add_(1)
    dropped = models[1].mid.weight
    models[1].load_state_dict(Tiny().state_dict(), assign=True)  # tied tensors stay tied
    assert models[1].mid.weight is not dropped
    await sync(comms, states, [SO, RO])
    assert torch.equal(models[1].mid.weight, models[0].mid.weight)
    assert torch.equal(dropped, Tiny().mid.weight)  # the dropped tensor kept its bytes
