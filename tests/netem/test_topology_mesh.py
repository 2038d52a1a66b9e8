"""``optimize_topology()`` on an emulated WAN (wan-mesh, 4 namespaces; root): the ring moves
off the slow links and the all-reduce gets faster; after churn only new pairs are measured."""

from __future__ import annotations

import asyncio
import statistics

import pytest

from .mesh import Mesh, Proc, run_master, run_peers

pytestmark = pytest.mark.timeout(150)

SLOW_MBIT = 50
MIB, ITERS = 8, 2


def edges(ring: list[int]) -> set[frozenset[int]]:
    return {frozenset((a, b)) for a, b in zip(ring, ring[1:] + ring[:1])}


async def command(procs: list[Proc], line: str, event: str) -> list[dict]:
    for p in procs:
        p.send(line)
    return list(await asyncio.gather(*(p.expect(event, 120) for p in procs)))


async def reduce_time(procs: list[Proc]) -> float:
    """Median over iterations of the slowest peer's all-reduce time."""
    got = await command(procs, f"reduce {MIB} {ITERS}", "reduced")
    return statistics.median(max(t) for t in zip(*(g["times"] for g in got)))


async def test_the_optimized_ring_avoids_slow_links_and_is_3x_faster(mesh: Mesh) -> None:
    mesh.uniform()
    master, addr = await run_master()
    procs: list[Proc] = []
    try:
        procs, ids, ring = await run_peers(addr, [1, 2, 3, 4], 4)
        host = dict(zip(ids, [1, 2, 3, 4]))
        a, b, c, d = ring  # the join-order ring crosses a<->b and c<->d: make them slow
        for x, y in ((a, b), (c, d)):
            mesh.set(host[x], host[y], f"rate={SLOW_MBIT}")
        before = await reduce_time(procs)
        got = await command(procs, "optimize", "optimized")
        new = got[0]["ring"]
        assert all(g["ring"] == new and g["membership"] == new for g in got), got
        assert all(g["measured"] == 12 for g in got)
        assert not edges(new) & {frozenset((a, b)), frozenset((c, d))}, (ring, new)
        assert got[0]["bottleneck_bps"] > 4 * SLOW_MBIT * 1e6
        after = await reduce_time(procs)
        print(f"all-reduce {MIB} MiB: join-order ring {before:.3f} s, optimized {after:.3f} s, "
              f"{before / after:.2f}x")
        assert before >= 3 * after, (before, after)
    finally:
        for p in [*procs, master]:
            await p.stop()


async def test_after_churn_only_the_new_pairs_are_measured(mesh: Mesh) -> None:
    mesh.uniform()
    master, addr = await run_master()
    procs: list[Proc] = []
    try:
        procs, ids, _ = await run_peers(addr, [1, 2, 3, 4], 4)
        first = await command(procs, "optimize", "optimized")
        assert [g["measured"] for g in first] == [12] * 4
        leaver = procs.pop()
        await command([leaver], "leave", "left")
        await leaver.stop()
        joiner = await Proc.start(4, "peer", addr, Mesh.ip(4), "4")
        procs.append(joiner)
        await command(procs[:3], "admit 4", "admitted")
        new_id = (await joiner.expect("joined", 60))["id"]
        assert new_id not in ids
        second = await command(procs, "optimize", "optimized")
        assert [g["measured"] for g in second] == [6] * 4  # 3 pairs each way with the joiner
        assert len({tuple(g["ring"]) for g in second}) == 1 and new_id in second[0]["ring"]
        master.send("links")
        links = (await master.expect("links"))["links"]
        assert len(links) == 12 and all(bps > 0 for _, _, bps, _ in links)
        assert ids[3] not in {x for a, b, _, _ in links for x in (a, b)}
        await reduce_time(procs)
    finally:
        for p in [*procs, master]:
            await p.stop()


async def test_peers_that_cannot_reach_each_other_are_never_neighbours(mesh: Mesh) -> None:
    mesh.uniform()
    master, addr = await run_master()  # on host 1: its links stay up
    procs: list[Proc] = []
    try:
        procs, ids, ring = await run_peers(addr, [1, 2, 3, 4], 4)
        host = dict(zip(ids, [1, 2, 3, 4]))
        x, y = next((a, b) for a, b in zip(ring, ring[1:] + ring[:1]) if 1 not in
                    (host[a], host[b]))  # a join-order ring link that avoids the master's host
        mesh.set(host[x], host[y], "cut=1")
        got = await command(procs, "optimize", "optimized")
        new = got[0]["ring"]
        assert all(g["ring"] == new for g in got) and frozenset((x, y)) not in edges(new)
        master.send("links")
        links = {(a, b): bps for a, b, bps, _ in (await master.expect("links"))["links"]}
        assert links[(x, y)] == links[(y, x)] == 0.0
        assert all(bps > 0 for pair, bps in links.items() if set(pair) != {x, y})
        await reduce_time(procs)  # the new ring works across the cut mesh
    finally:
        for p in [*procs, master]:
            await p.stop()
