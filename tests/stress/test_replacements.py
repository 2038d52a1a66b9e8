"""The kill/replace memory script (``churn_memory.py``) in a short mode: five peers join two
survivor processes (a master process, the README's loop) and are SIGKILLed; the survivors run
without the garbage collector, and none of the library's objects was left in a reference
cycle (the previous code left every replaced neighbour's link and connections, and the aborted
collectives with their buffers). The 100-cycle RSS reading is the script's long mode:
``python tests/stress/churn_memory.py``."""

from __future__ import annotations

import pytest

from tests.stress.churn_memory import cycles


@pytest.mark.timeout(90)
async def test_replaced_peers_leave_nothing_in_reference_cycles_on_the_survivors():
    out = await cycles(n=5, warm=1, life=3, garbage=True)
    found: list[list[list[object]]] = out["garbage"]  # type: ignore[assignment]
    ours = [kind for survivor in found for kind, _ in survivor if str(kind).startswith("pccl")]
    assert not ours, found
