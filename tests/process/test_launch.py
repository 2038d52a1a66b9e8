"""``python -m pccl_aio.launch`` as a real process: a torch DiLoCo run with SIGKILL churn, a
failing example, SIGTERM, the bytes-per-peer arithmetic of its plot, and its verdict on what a
run trained (``line_example.py`` prints the lines it is given): not ok when the final
validation loss ends over 3 % above the best or the run never had company, flagged when the
run ended before its first kill.

The churn run checks what the launcher writes (CSV rows, PNG, JSON summary), that every outer
step had one digest across the peers, that at least one peer was SIGKILLed and a replacement
joined and trained, and that no child process outlives the launcher."""

from __future__ import annotations

import asyncio
import csv
import json
import math
import os
import re
import struct
import sys
import time
import zlib
from collections import defaultdict
from pathlib import Path

from pccl_aio._launch.record import Record, parse
from pccl_aio._launch.report import group_event, plot, title
from tests.process.procs import HERE

ROOT = HERE.parent.parent
DILOCO = str(ROOT / "examples" / "diloco.py")
LINES = str(HERE / "line_example.py")  # prints the protocol lines it is given, no training


async def _launch(*args: str, timeout: float = 150) -> tuple[int, str, str]:
    """Run the launcher to its end; (exit status, stdout, stderr)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pccl_aio.launch", *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=env, cwd=str(ROOT))
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    finally:
        if proc.returncode is None:
            proc.kill()  # its children die with it (PR_SET_PDEATHSIG)
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _running(rows: list[dict[str, str]]) -> list[str]:
    """The processes of the CSV's start rows that still run (by pid and command line)."""
    alive = []
    for r in rows:
        if r["kind"] != "start":
            continue
        pid = r["detail"].split("pid=")[1].split()[0]
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except FileNotFoundError:
            continue
        if "pccl_aio.master" in cmd or "diloco.py" in cmd:
            alive.append(f"{pid}: {cmd}")
    return alive


def _png_text(path: Path) -> dict[str, str]:
    """The PNG's text chunks (tEXt, zTXt, iTXt), by keyword."""
    data, pos, text = path.read_bytes(), 8, {}
    while pos < len(data):
        size, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + size]
        key, _, value = body.partition(b"\0")
        if kind == b"tEXt":
            text[key.decode("latin-1")] = value.decode("latin-1")
        elif kind == b"zTXt":
            text[key.decode("latin-1")] = zlib.decompress(value[1:]).decode("latin-1")
        elif kind == b"iTXt":
            flag, rest = value[0], value[2:].split(b"\0", 2)[2]
            text[key.decode()] = (zlib.decompress(rest) if flag else rest).decode()
        pos += 12 + size
    return text


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", data[:16]
    assert len(data) > 20_000, len(data)  # two panels of curves, not an empty canvas
    width, height = struct.unpack(">II", data[16:24])
    return width, height


async def test_launch_diloco_with_churn_writes_csv_png_and_json(tmp_path):
    status, out, err = await _launch(
        DILOCO, "--peers", "3", "--churn", "1", "--out", str(tmp_path), "--seed", "10",
        "--timeout", "120", "--", "--tiny", "--inner-steps", "2000", "--inner", "20",
        "--eval-every", "4")
    assert status == 0, f"{out}\n{err[-4000:]}"
    rows = _rows(tmp_path / "diloco.csv")
    assert not _running(rows)
    steps = [r for r in rows if r["kind"] == "step"]
    by_outer: dict[int, set[str]] = defaultdict(set)
    for r in steps:
        by_outer[int(r["outer"])].add(r["digest"])
    assert all(len(d) == 1 for d in by_outer.values()), by_outer
    last = max(by_outer)
    assert sorted(by_outer) == list(range(1, last + 1))
    kills = [r for r in rows if r["kind"] == "kill"]
    replacements = {r["seed"] for r in rows
                    if r["kind"] == "start" and "replacement" in r["detail"]}
    assert kills and replacements, [r for r in rows if r["kind"] != "step"]
    assert {r["seed"] for r in kills} <= {r["seed"] for r in steps}  # victims had trained
    first = {s: min(int(r["outer"]) for r in steps if r["seed"] == s)
             for s in replacements if any(r["seed"] == s for r in steps)}
    assert first and all(k > 1 for k in first.values()), first  # joined mid-run and trained
    killed = {r["seed"] for r in kills}
    exits = {r["seed"]: r["detail"] for r in rows if r["kind"] == "exit"}
    done = {r["seed"] for r in rows if r["kind"] == "done"}
    assert done and all(exits[s].startswith("status=0") for s in done), exits
    assert all("status=-9" in exits[s] for s in killed), exits
    assert all(r["digest"] in by_outer[int(r["outer"])] for r in rows if r["kind"] == "done")

    summary = json.loads((tmp_path / "diloco.json").read_text())
    assert summary["ok"] is True and summary["failure"] is None
    assert summary["kills"] == len(kills) >= 1 and summary["joins"] >= 1
    assert summary["digests_agree"] is True and summary["peers"] == 3
    assert summary["outer_steps"] == last and summary["inner_steps"] == 2000
    first_val = next(float(r["val"]) for r in steps if r["val"] != "nan")
    assert summary["final_val_loss"] < first_val - 0.3  # it trained through the churn
    assert summary["best_val_loss"] <= summary["final_val_loss"] <= summary["best_val_loss"] * 1.03
    assert 0.5 < summary["company_share"] <= 1 and summary["kills_not_done"] in (0, 1)
    assert summary["problems"] == [] and isinstance(summary["flags"], list)
    assert summary["bytes_sent_per_peer"] > 0
    series = summary["series"]  # what the plot shows: one row per outer step
    assert [row[0] for row in series] == list(range(1, last + 1))
    assert round(series[-1][4]) == summary["bytes_sent_per_peer"] and series[-1][3] is not None
    assert summary["wall_seconds"] > 0
    assert _png_size(tmp_path / "diloco.png") == (1200, 460)
    n = summary["kills"], summary["joins"]
    assert _png_text(tmp_path / "diloco.png")["Title"] == (
        f"diloco: 3 peers, SIGKILL every 1 s, {n[0]} kill{'s' * (n[0] != 1)} / "
        f"{n[1]} join{'s' * (n[1] != 1)}")
    # the launcher's lines name the lost peer (one it killed) and, apart, the peer reporting it
    peer_of = {r["seed"]: r["peer"] for r in rows if r["kind"] == "joined"}
    victims = {(r["peer"], r["seed"]) for r in kills}
    lost = re.findall(r"\] lost peer (\d+) \(seed (\d+)\), SIGKILLed by the launcher \(.*\): "
                      r"reported by peer (\d+) \(seed (\d+)\)$", err, re.M)
    assert lost, err[-4000:]
    for peer, seed, by_peer, by_seed in lost:
        assert (peer, seed) in victims and peer_of[by_seed] == by_peer != peer, (lost, victims)
    assert not re.search(r"\] seed \d+: (lost|left) peer=", err), err[-4000:]
    assert "digests agree" in out and "kills" in out  # the table


async def test_a_run_that_ends_clearly_worse_than_its_best_is_not_ok(tmp_path):
    status, out, err = await _launch(LINES, "--peers", "2", "--out", str(tmp_path), "--",
                                     "--vals", "4.0,2.0,2.1,2.5", timeout=60)
    assert status == 1, (out, err[-3000:])
    assert "not ok: the final validation loss 2.5000 is 25.0 % above the run's best, 2.0000 " \
           "at outer step 2" in err, err[-3000:]
    assert re.search(r"^ok +no: the final validation loss", out, re.M), out
    summary = json.loads((tmp_path / "line_example.json").read_text())
    assert summary["ok"] is False and summary["failure"] is None
    assert (summary["best_val_loss"], summary["final_val_loss"]) == (2.0, 2.5)
    assert summary["company_share"] == 1.0 and summary["kills_not_done"] is None


async def test_within_3_percent_of_the_best_the_run_is_ok(tmp_path):
    status, out, err = await _launch(LINES, "--peers", "2", "--out", str(tmp_path), "--",
                                     "--vals", "4.0,2.0,2.05", timeout=60)
    assert status == 0, (out, err[-3000:])
    assert re.search(r"^ok +yes$", out, re.M) and re.search(r"^flags +-$", out, re.M), out


async def test_a_run_that_never_had_company_is_not_ok(tmp_path):
    status, out, err = await _launch(LINES, "--peers", "1", "--out", str(tmp_path), "--",
                                     "--vals", "4.0,3.0", "--world", "1", timeout=60)
    assert status == 1, (out, err[-3000:])
    assert "not ok: the run never had company: world 1 at every outer step" in err, err[-3000:]
    summary = json.loads((tmp_path / "line_example.json").read_text())
    assert summary["company_share"] == 0.0 and summary["ok"] is False


async def test_a_churn_run_that_ends_before_its_first_kill_is_flagged(tmp_path):
    status, out, err = await _launch(LINES, "--peers", "2", "--churn", "30", "--out",
                                     str(tmp_path), "--", "--vals", "4.0,3.0", timeout=60)
    assert status == 0, (out, err[-3000:])
    summary = json.loads((tmp_path / "line_example.json").read_text())
    assert (summary["kills"], summary["kills_not_done"]) == (0, 1)
    assert summary["flags"] == ["the run ended before its first kill (SIGKILL every 30 s)"]
    assert re.search(r"^flags +the run ended before its first kill", out, re.M), out


async def test_a_failing_example_fails_the_launch_fast_and_leaves_no_child(tmp_path):
    began = time.monotonic()
    status, out, err = await _launch(
        DILOCO, "--peers", "2", "--out", str(tmp_path), "--timeout", "60",
        "--", "--tiny", "--no-such-option", timeout=60)
    assert status == 1, (out, err[-3000:])
    assert time.monotonic() - began < 30
    assert "FAILED" in err and "no-such-option" in err, err[-3000:]
    rows = _rows(tmp_path / "diloco.csv")
    assert sum(r["kind"] == "start" for r in rows) == 3  # the master and two peers
    assert not _running(rows)
    summary = json.loads((tmp_path / "diloco.json").read_text())
    assert summary["ok"] is False and "exited with status 2" in summary["failure"]


async def test_sigterm_stops_the_launcher_and_every_child(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pccl_aio.launch", DILOCO, "--peers", "3", "--out",
        str(tmp_path), "--", "--tiny", stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=env, cwd=str(ROOT))
    try:
        assert proc.stderr is not None
        while b"master on" not in await asyncio.wait_for(proc.stderr.readline(), 30):
            pass  # the master runs and the peers are being started
        proc.terminate()
        out, err = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 128 + 15, (out, err)
    assert b"interrupted by SIGTERM" in err
    rows = _rows(tmp_path / "diloco.csv")
    assert sum(r["kind"] == "start" for r in rows) >= 2
    assert not _running(rows)


def test_bytes_per_peer_count_increments_not_cumulative_totals(tmp_path):
    """A joiner's counter starts at 0: its first step adds what it sent, not minus the others."""
    rec = Record(tmp_path / "r.csv")

    def step(seed: int, outer: int, sent: int, val: str = "nan") -> None:
        kind, fields = parse(f"step peer={seed} outer={outer} inner={10 * outer} world=2 "
                             f"loss=1.0 val={val} sent={sent} digest=ab time=0.1") or ("", {})
        assert rec.line(0.0, seed, kind, fields) is not None

    step(1, 1, 100)
    step(2, 1, 100)
    step(1, 2, 200, "2.5")
    step(3, 2, 40, "2.5")  # a joiner: 40 bytes this step, its counter started at 0
    rec.close()
    series = rec.series()
    assert [(s[0], s[1], s[4]) for s in series] == [(1, 10, 100.0), (2, 20, 170.0)]
    assert math.isnan(series[0][3]) and series[1][3] == 2.5
    assert parse("lost peer=3 error='peer 4 gone' retrying=1") == (
        "lost", {"peer": "3", "error": "'peer 4 gone'", "retrying": "1"})
    assert parse("running 300 outer steps") is None


def test_group_event_lines_say_who_was_lost_and_who_reports_it():
    assert group_event("lost", {"peer": "2", "outer": "5", "world": "3->2"}, "peer 2 (seed 0)",
                       "peer 3 (seed 3)") == ("lost peer 3 (seed 3), SIGKILLed by the launcher "
                                              "(world 3->2; outer step 5): reported by peer 2 "
                                              "(seed 0)")
    assert group_event("left", {"peer": "2", "world": "3->2"}, "peer 2 (seed 0)", None) == \
        "lost a peer (world 3->2): reported by peer 2 (seed 0)"
    assert group_event("admitted", {"peer": "1", "world": "2->3"}, "peer 1 (seed 1)", None) == \
        "admitted newcomers (world 2->3): reported by peer 1 (seed 1)"
    assert group_event("failed", {"peer": "1", "error": "'boom'"}, "peer 1 (seed 1)", None) == \
        "peer 1 (seed 1) failed (error='boom')"


def test_the_plot_title_counts_one_kill_and_one_join_in_the_singular(tmp_path):
    rec = Record(tmp_path / "r.csv")
    for outer in (1, 2, 3):
        kind, fields = parse(f"step peer=1 outer={outer} inner={10 * outer} world=2 loss=1.0 "
                             f"val=2.0 sent={100 * outer} digest=ab") or ("", {})
        assert rec.line(0.0, 1, kind, fields) is not None
    rec.marks += [("kill", 10), ("join", 20)]
    rec.close()
    assert plot(rec, tmp_path / "r.png", title("diloco", 3, 1.0, 1, 1))
    assert _png_text(tmp_path / "r.png")["Title"] == \
        "diloco: 3 peers, SIGKILL every 1 s, 1 kill / 1 join"
    assert title("diloco", 1, None, 0, 0) == "diloco: 1 peer"
