"""The named tensors of a torch module and its optimizer, for ``SharedState.from_module``.

Entries, in a fixed order: ``model.<key>`` for every tensor of ``module.state_dict()`` (views of
the parameters and buffers, no copy; a tensor tied under two names is taken once), then
``optim.<parameter name>.<state key>`` for every tensor of the optimizer's per-parameter state
(the parameter named as in ``module.named_parameters()``, else ``group<g>.param<i>``). Python
numbers in the optimizer's state and its hyperparameters (``lr``, ...) are not shared.

An optimizer that never stepped has no state yet, so a joiner would hold fewer entries than
the run. Its state is materialized as a fresh one would start: a step with zero gradients at
``lr = 0`` (as ``torch.distributed.checkpoint`` does) creates the tensors, which are then
zeroed. That is exact for the optimizers whose fresh state is zeros (``FRESH_IS_ZEROS``);
any other optimizer without state raises ``InvalidUsageError`` (take one step first).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...._errors import InvalidUsageError

__all__ = ["FRESH_IS_ZEROS", "module_tensors"]

#: Optimizers whose state, before their first step, is equivalent to all zeros.
FRESH_IS_ZEROS = frozenset({"SGD", "Adam", "AdamW", "Adamax", "RAdam"})


def _materialize(optimizer: Any) -> None:
    """Create the state of an optimizer that never stepped, equal to a fresh one's."""
    import torch

    kind = type(optimizer).__name__
    groups = optimizer.param_groups
    if kind not in FRESH_IS_ZEROS or (kind == "SGD" and any(g.get("dampening", 0) for g in groups)):
        raise InvalidUsageError(
            f"{kind} has no state yet and its fresh state is not zeros; take one optimizer step "
            "before building the SharedState (a joiner's state is replaced by the sync)")
    params = [p for g in groups for p in g["params"] if p.requires_grad]
    grads = [p.grad for p in params]
    lrs = [g["lr"] for g in groups]
    try:
        for p in params:
            p.grad = torch.zeros_like(p)
        for g in groups:
            g["lr"] = 0.0
        with torch.no_grad():
            saved = [p.detach().clone() for p in params]
            optimizer.step()
            for p, s in zip(params, saved):  # lr = 0 leaves them; keep even the sign of zeros
                p.detach().copy_(s)
    finally:
        for g, lr in zip(groups, lrs):
            g["lr"] = lr
        for p, grad in zip(params, grads):
            p.grad = grad
    for state in optimizer.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor):
                v.zero_()


def module_tensors(module: Any, optimizer: Any = None,
                   extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """name -> tensor for ``module`` (a ``torch.nn.Module``), ``optimizer`` and ``extra``;
    read afresh on every call, so ``load_state_dict`` on either is followed."""
    import torch

    if not isinstance(module, torch.nn.Module):
        raise InvalidUsageError(f"expected a torch.nn.Module, not {type(module).__name__}")
    out: dict[str, Any] = {}
    seen: set[tuple[int, torch.dtype, tuple[int, ...]]] = set()
    for key, t in module.state_dict().items():
        if not isinstance(t, torch.Tensor):
            continue
        alias = (t.data_ptr(), t.dtype, tuple(t.shape))
        if t.numel() and alias in seen:  # a tied weight: the same bytes under another name
            continue
        seen.add(alias)
        out[f"model.{key}"] = t
    if optimizer is not None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise InvalidUsageError(
                f"expected a torch.optim.Optimizer, not {type(optimizer).__name__}")
        if not optimizer.state:
            _materialize(optimizer)
        names = {id(p): n for n, p in module.named_parameters()}
        for g, group in enumerate(optimizer.param_groups):
            for i, p in enumerate(group["params"]):
                pname = names.get(id(p), f"group{g}.param{i}")
                state = optimizer.state.get(p, {})
                for k in sorted(state):
                    if isinstance(state[k], torch.Tensor):
                        out[f"optim.{pname}.{k}"] = state[k]
    for key, t in (extra or {}).items():
        if key in out:
            raise InvalidUsageError(f"extra entry {key!r} clashes with a module or optimizer entry")
        out[key] = t
    return out
