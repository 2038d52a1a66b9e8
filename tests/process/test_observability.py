"""Issue 21's acceptance with real processes: the master CLI (``--log-format json
--status-port 0 --metrics-port 0``) and three ``state_worker.py ddp`` peers; one peer is
SIGKILLed in the middle of an all-reduce, a fourth joins and fetches the state.

- the master's log tells each event with its cause (join, SIGKILL, abort, sync);
- ``/metrics``, scraped over HTTP during the run, moves as the run does;
- the status page, loaded by headless Chromium after the kill and the join, shows the new
  membership (a screenshot is taken; ``PCCL_SCREENSHOT=path`` keeps it, for the README).
"""

from __future__ import annotations

import asyncio
import html.parser
import json
import os
import re
import shutil
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.process.ddp_run import Event, Run
from tests.process.procs import Proc, spawn

pytestmark = pytest.mark.timeout(120)

ENV = {"STEP_SECONDS": "0", "STATE_ELEMS": str(1 << 20)}  # 4 MiB gradients: long all-reduces
REVISIONS = 300  # the join lands early; the run goes on well after it


class MasterCli:
    """``python -m pccl_aio.master`` with JSON logs; its log lines, parsed, as they come."""

    def __init__(self, proc: Proc) -> None:
        self.proc = proc
        self.lines: list[dict[str, Any]] = []
        self._new = asyncio.Event()
        self._task = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        stderr = self.proc.proc.stderr
        assert stderr is not None
        while raw := await stderr.readline():
            self.lines.append(json.loads(raw))  # every line is one JSON object
            self._new.set()

    async def wait(self, pattern: str, timeout: float = 20.0) -> re.Match[str]:
        """The first log message matching ``pattern`` (waiting for it)."""
        try:
            async with asyncio.timeout(timeout):
                while True:
                    for line in self.lines:
                        if found := re.search(pattern, line["msg"]):
                            return found
                    self._new.clear()
                    await self._new.wait()
        except TimeoutError:
            tail = "\n".join(line["msg"] for line in self.lines[-30:])
            raise AssertionError(f"no {pattern!r} in the master's log; its end:\n{tail}") from None

    def events(self, name: str) -> list[dict[str, Any]]:
        return [line for line in self.lines if line.get("event") == name]

    def close(self) -> None:
        """Stop reading the log (the lines read so far stay)."""
        self._task.cancel()


async def http_get(url: str) -> str:
    host, port, path = re.fullmatch(r"http://([^:/]+):(\d+)(/.*)", url).groups()  # type: ignore[union-attr]
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    data = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    return body.decode()


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus text (0 if absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        sample, _, value = line.rpartition(" ")
        if sample == (f"{name}{{{want}}}" if want else name):
            return float(value)
    return 0.0


Hook = Callable[[str, Run, MasterCli], Awaitable[None]]


async def scenario(procs: list[Proc], hook: Hook) -> tuple[Run, MasterCli]:
    """Master, p0-p2, SIGKILL p2 mid-collective, p3 joins; ``hook(step, run, master)`` at
    "running", "killed", "joined" and "done" (the master still up, every peer gone)."""
    proc = await spawn("master", "-m", "pccl_aio.master", "--host", "127.0.0.1", "--port", "0",
                       "--heartbeat-timeout", "5", "--log-format", "json", "--status-port", "0",
                       "--metrics-port", "0")
    procs.append(proc)
    master = MasterCli(proc)
    port = (await master.wait(r"listening on 127\.0\.0\.1:(\d+)")).group(1)
    await master.wait(r"metrics on http")
    run = Run(procs, f"127.0.0.1:{port}", revisions=REVISIONS, env=ENV)
    for i in range(3):
        await run.add(f"p{i}")
    step: dict[str, int] = {}

    async def events(ev: Event) -> None:
        if "running" not in step and ev["revision"] >= 3 and ev["ws"] == 3:
            step["running"] = ev["revision"]
            await hook("running", run, master)
        elif "running" in step and "killed" not in step and await kill_mid_collective(run, master):
            step["killed"] = ev["revision"]
            await hook("killed", run, master)
        elif "killed" in step and "joined" not in step and ev["revision"] >= step["killed"] + 3:
            await run.add("p3")
            step["joined"] = ev["revision"]
        elif "joined" in step and "hooked" not in step and ev["ws"] == 3:
            step["hooked"] = ev["revision"]
            await hook("joined", run, master)

    await run.drive(events)
    run.check()
    await run.close()
    for name in ("p0", "p1", "p3"):  # gone as they finished (the tests check how)
        await master.wait(rf"peer {run.ids[name]} (left|dead|kicked|dropped)")
    await hook("done", run, master)
    return run, master


async def kill_mid_collective(run: Run, master: MasterCli) -> bool:
    """SIGKILL p2 while a collective waits for its part: stop it (once it is stopped,
    whatever it sent has reached the master, and nothing can start or finish without it),
    and kill it if the master lists a running collective that waits for p2; else let it go
    on (the caller tries again at p0's next sync)."""
    p2 = run.peers["p2"]
    p2.signal(signal.SIGSTOP)
    await stopped(p2.proc.pid)
    status = json.loads(await http_get(status_url(master) + "status.json"))
    if not any(run.ids["p2"] in r["waiting_for"] for r in status["running"]):
        p2.signal(signal.SIGCONT)
        return False
    run.mark()
    run.kill("p2")
    return True


async def stopped(pid: int) -> None:
    """Until the process is in the stopped state (``T`` in /proc/PID/stat)."""
    async with asyncio.timeout(10):
        while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
            await asyncio.sleep(0.001)  # polling the kernel's process state


def metrics_url(master: MasterCli) -> str:
    return next(line["msg"].split(" on ")[1].split(" ")[0] + "metrics"
                for line in master.lines if "metrics on http" in line["msg"])


def status_url(master: MasterCli) -> str:
    return next(line["msg"].split(" on ")[1].split(" ")[0]
                for line in master.lines if "status page on http" in line["msg"])


class Observed:
    """One run of ``scenario`` that the three tests below look at from their sides: the
    master's log, the metrics scraped at each step, the status page a browser loaded after
    the join (when Chromium is installed)."""

    def __init__(self) -> None:
        self.run: Run | None = None
        self.master: MasterCli | None = None
        self.metrics: dict[str, str] = {}
        self.pages: dict[str, str] = {}
        self.shot: Path | None = None


async def _observe(tmp: Path) -> Observed:
    seen = Observed()
    seen.shot = Path(os.environ.get("PCCL_SCREENSHOT") or tmp / "status.png")
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    made: list[Proc] = []

    async def look(step: str, run: Run, master: MasterCli) -> None:
        seen.metrics[step] = await http_get(metrics_url(master))
        if step == "joined" and browser:
            url = status_url(master)
            await chromium(f"--user-data-dir={tmp / 'profile'}", f"--screenshot={seen.shot}",
                           "--window-size=1280,1100", url)
            seen.pages["dom"] = (await chromium(f"--user-data-dir={tmp / 'profile'}",
                                                "--dump-dom", url)).decode()
            seen.pages["json"] = await http_get(url + "status.json")

    try:
        seen.run, seen.master = await scenario(made, look)
    finally:
        for p in made:
            p.signal(signal.SIGKILL)
            try:
                await asyncio.wait_for(p.proc.wait(), 10)
            except TimeoutError:
                pass
        if seen.master is not None:
            seen.master.close()
    return seen


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> Observed:
    """The run, once for the module (each run of it takes ~20 s of CI)."""
    return asyncio.run(_observe(tmp_path_factory.mktemp("observed")))


def test_the_master_log_tells_join_kill_abort_and_sync_with_causes(observed):
    run, master = observed.run, observed.master
    assert run is not None and master is not None
    ids = run.ids
    run_id = master.events("registered")[0]["run"]
    assert all(line.get("run") == run_id for line in master.lines if "event" in line)
    registered = {e["peer"] for e in master.events("registered")}
    assert registered == {ids["p0"], ids["p1"], ids["p2"], ids["p3"]}
    assert {e["peer"] for e in master.events("admitted")} == {ids["p1"], ids["p2"], ids["p3"]}
    # The SIGKILL: p2 dead, its connection closed (or its heartbeat stopped), with its cause.
    gone = {e["peer"]: e for e in master.events("departed")}
    assert gone[ids["p2"]]["cause"] in ("closed", "heartbeat"), gone[ids["p2"]]
    assert re.search(rf"peer {ids['p2']} dead: ", gone[ids["p2"]]["msg"])
    # ... which aborted the collective p2 was in, with its cause, for the group.
    aborts = master.events("aborted")
    assert aborts and {a["cause"] for a in aborts} <= {"peer_left", "peer_failed"}, aborts
    assert aborts[0]["group"] == 0 and aborts[0]["seq"] > 0
    # ... and the ring went on without it.
    at = master.lines.index(gone[ids["p2"]])
    ring = next(e["ring"] for e in master.lines[at:] if e.get("event") == "ring")
    assert sorted(ring) == sorted([ids["p0"], ids["p1"]])
    # The joiner's sync: who fetched how much from whom, matching what p3 received.
    fetches = [e for e in master.events("sync_fetch") if e["peer"] == ids["p3"]]
    received = next(e["rx"] for e in run.logs["p3"] if e["event"] == "synced")
    assert fetches and fetches[0]["bytes"] == received > 8 * 2**20
    assert ids["p3"] not in fetches[0]["sources"] and fetches[0]["sources"]
    # Everyone else said goodbye at the end.
    assert [gone[ids[n]]["cause"] for n in ("p0", "p1", "p3")] == ["left"] * 3, gone


def test_metrics_scraped_during_the_run_move_as_it_does(observed):
    seen = observed.metrics
    got = {step: {
        "members": metric(t, "pccl_master_peers", state="member"),
        "completed": metric(t, "pccl_master_collectives_completed_total"),
        "aborted": sum(metric(t, "pccl_master_collectives_aborted_total", cause=c)
                       for c in ("peer_left", "peer_failed")),
        "dead": sum(metric(t, "pccl_master_departures_total", cause=c)
                    for c in ("closed", "heartbeat")),
        "left": metric(t, "pccl_master_departures_total", cause="left"),
        "joins": metric(t, "pccl_master_joins_total"),
        "syncs": metric(t, "pccl_master_syncs_total", outcome="completed"),
        "sync_bytes": metric(t, "pccl_master_sync_bytes_total"),
        "bytes": metric(t, "pccl_master_reduced_bytes_total"),
    } for step, t in seen.items()}
    run_, killed, joined, done = (got[s] for s in ("running", "killed", "joined", "done"))
    assert (run_["members"], joined["members"], done["members"]) == (3, 3, 0)
    assert run_["joins"] == 3 and joined["joins"] == 4
    assert run_["dead"] == 0 and joined["dead"] == 1  # p2's kill
    assert run_["aborted"] == 0 and joined["aborted"] >= 1
    assert done["left"] == 3
    for a, b in ((run_, killed), (killed, joined), (joined, done)):
        assert b["completed"] > a["completed"] and b["bytes"] > a["bytes"]
        assert b["syncs"] > a["syncs"]
    assert joined["sync_bytes"] - killed["sync_bytes"] > 8 * 2**20  # the joiner's fetch


class _Text(html.parser.HTMLParser):
    """The text of the element with id ``target`` (and its children)."""

    def __init__(self, target: str) -> None:
        super().__init__()
        self.target, self.depth, self.parts = target, 0, []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self.depth or ("id", self.target) in attrs:
            self.depth += 1

    def handle_endtag(self, tag: str) -> None:
        if self.depth:
            self.depth -= 1

    def handle_data(self, data: str) -> None:
        if self.depth:
            self.parts.append(data)


def text_of(dom: str, element: str) -> str:
    parser = _Text(element)
    parser.feed(dom)
    return " ".join(parser.parts)


CHROMIUM_MISSING = ("headless Chromium is not installed; install it with "
                    "`sudo apt-get install chromium` (Debian, Ubuntu) to run this test")


def chromium_exe() -> str:
    """The browser's path. Missing, the test is skipped, saying how to install it, except
    under ``CI=true``, where the browser is required and its absence fails the test."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe:
        return exe
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{CHROMIUM_MISSING} (CI=true: the browser test is required)")
    pytest.skip(CHROMIUM_MISSING)


async def chromium(*args: str) -> bytes:
    exe = chromium_exe()
    proc = await asyncio.create_subprocess_exec(
        exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, proc.returncode
    return out


def test_the_status_page_in_a_browser_shows_the_new_membership(observed):
    chromium_exe()  # skipped (or, under CI=true, failed) if there is none
    run, pages, shot = observed.run, observed.pages, observed.shot
    assert run is not None and shot is not None
    ids, dom = run.ids, pages["dom"]
    assert shot.stat().st_size > 10_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    peers = text_of(dom, "peers")
    for name in ("p0", "p1", "p3"):  # the membership after the kill and the join
        assert re.search(rf"peer {ids[name]}\b.*?member", peers), (name, peers)
    assert f"peer {ids['p2']} " not in peers + " "
    assert "3 members, 0 waiting" in text_of(dom, "peers-title")
    ring = text_of(dom, "groups")
    assert all(f"peer {ids[n]}" in ring for n in ("p0", "p1", "p3")), ring
    recent = text_of(dom, "recent")
    assert f"peer {ids['p2']} dead" in recent and f"peer {ids['p3']} admitted" in recent
    status = json.loads(pages["json"])  # the same data as JSON
    assert sorted(p["id"] for p in status["peers"]) == sorted(ids[n] for n in ("p0", "p1", "p3"))


@pytest.mark.parametrize("ci", ["", "true"])
def test_without_chromium_the_browser_test_says_how_to_install_it(monkeypatch, ci):
    """No browser: skipped with the install command, except under CI=true, where it fails."""
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setenv("CI", ci)
    expected = pytest.fail.Exception if ci else pytest.skip.Exception
    with pytest.raises(expected, match=r"install it with `sudo apt-get install chromium`"):
        chromium_exe()
