"""Launch a training example on this machine: ``python -m pccl_aio.launch``.

    python -m pccl_aio.launch EXAMPLE.py --peers N [--churn SECONDS] [--out DIR] [--seed S]
                              [--timeout SECONDS] [--replica-procs K]
                              [-- ARGUMENTS FOR EVERY PEER]

    python -m pccl_aio.launch examples/diloco.py --peers 4 --churn 20 -- --inner-steps 2000
    python -m pccl_aio.launch examples/ddp.py --peers 2 --out /tmp/ddp -- --tiny
    python -m pccl_aio.launch examples/fsdp_diloco.py --peers 3 --replica-procs 2 --churn 10 \
        -- --tiny --inner-steps 600

Starts ``python -m pccl_aio.master`` on a free port of 127.0.0.1 with a fresh run secret, then
N peers ``python EXAMPLE --master HOST:PORT --seed i --min-peers N ARGUMENTS`` (seeds S, S+1,
...). With ``--churn SECONDS``, every SECONDS a random peer is SIGKILLed and a replacement with
the next seed starts (``--min-peers 2``); it joins mid-run and receives the shared state. One
peer is down at a time (the next kill waits until the replacement took part in a step), and
churn stops in the last quarter of the run's outer steps (known when ``--inner-steps`` is given)
and once a peer printed ``done``; a replacement that could not join before the end is stopped.

A progress bar on stderr shows the outer step, world size, latest validation loss, kills and
joins, and whether the peers' digests agree; a second one, while a peer fetches more than 4 MiB
of shared state (its ``fetch done= total=`` lines), the bytes it received. DIR (default
``runs/<example stem>``) gets
``<stem>.csv`` (every protocol line of every peer and the launcher's start/kill/exit events;
``time`` is seconds since the launch, ``seed`` names the process, ``peer`` its peer id),
``<stem>.png`` (validation loss against inner steps and against bytes sent per peer),
``<stem>.json`` (the summary, also printed as a table, and the plotted series) and ``logs/``
(each process's output).

The summary (the table, ``ok`` last) gives the best and the final validation loss, the share
of outer steps that ran with company (world >= 2), and with churn the kills done, and a kill
that came due but did not happen because the run ended first (or the first, when none did).
``ok`` is no when the run failed, when its final validation loss is more than 3 % above its
own best, or when it never had company (world 1 at every outer step); ``flags`` names a run
that ran most of its outer steps alone and kills that did not happen.

The exit status is 0 when the run finished, every peer that was not killed exited 0, every
outer step had one digest across the peers and ``ok`` is yes; 1 otherwise (a peer failed,
digests differ, ``--timeout`` passed, the loss or the company above), with the reason on
stderr; 128+n on signal n. Every child is killed
whenever the launcher ends, even by SIGKILL (Linux). Needs ``pip install 'pccl_aio[launch]'``
(matplotlib, tqdm). An example is any script that takes those options and prints the line
protocol of ``examples/charlm.py`` (``joined``, ``step``, ``done``, ... lines on stdout).

With ``--replica-procs K`` each of the N peers is a replica of K processes (a model sharded
over K processes, as in ``examples/fsdp_diloco.py``): ``EXAMPLE ... --seed i --shard j
--replica-store 127.0.0.1:PORT`` for j = 0 .. K-1, meeting at a store on a free port (shard 0
listens there). Churn SIGKILLs a replica whole (all K processes) and starts a replacement
replica; digests are compared per shard (shard j of every replica holds the same part of the
model); the CSV's ``shard`` column names the process within its replica.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from ._launch.record import Record
from ._launch.report import plot, summary, table, title
from ._launch.verdict import judge


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m pccl_aio.launch", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="%(prog)s EXAMPLE.py --peers N [options] [-- ARGUMENTS FOR EVERY PEER]")
    p.add_argument("example", type=Path, help="the example script, e.g. examples/diloco.py")
    p.add_argument("--peers", type=int, required=True, help="peers of the run")
    p.add_argument("--churn", type=_positive, metavar="SECONDS",
                   help="SIGKILL a random peer every SECONDS and start a replacement")
    p.add_argument("--out", type=Path, metavar="DIR", help="default: runs/<example stem>")
    p.add_argument("--seed", type=int, default=0, help="first peer seed; also picks the victims")
    p.add_argument("--timeout", type=_positive, metavar="SECONDS",
                   help="fail if the run has not finished after SECONDS")
    p.add_argument("--replica-procs", type=int, default=1, metavar="K",
                   help="processes per replica, each given --shard j and --replica-store "
                        "(default 1: a peer is one process)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; the exit status of the run (see the module docstring)."""
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--") if "--" in argv else len(argv)
    p = _parser()
    args = p.parse_args(argv[:cut])
    if not args.example.is_file():
        p.error(f"no such example: {args.example}")
    if args.peers < (2 if args.churn else 1):
        p.error("--peers must be at least 2 with --churn (at least 1 without)")
    if args.replica_procs < 1:
        p.error("--replica-procs must be at least 1")
    try:
        import matplotlib  # noqa: F401 - the plot at the end
        import tqdm
    except ImportError:
        p.error("the launcher needs matplotlib and tqdm: pip install 'pccl_aio[launch]'")
    import asyncio

    from ._launch.runner import Config, Launcher

    stem = args.example.stem
    out: Path = args.out or Path("runs") / stem
    cfg = Config(args.example, args.peers, args.churn, out, args.seed, args.timeout,
                 argv[cut + 1:], args.replica_procs)
    record = Record(out / f"{stem}.csv")
    tqdm.tqdm.monitor_interval = 0  # no monitor thread: children are forked
    bar = tqdm.tqdm(desc=stem, unit="outer", file=sys.stderr, dynamic_ncols=True)
    launcher = Launcher(cfg, record, bar)
    started = time.monotonic()
    try:
        failure = asyncio.run(launcher.run())
    finally:
        bar.close()
        record.close()
    wall = time.monotonic() - started
    paths = {kind: out / f"{stem}.{kind}" for kind in ("csv", "png", "json")}
    drawn = plot(record, paths["png"],
                 title(stem, args.peers, args.churn, launcher.kills, launcher.joins))
    info = summary(record, example=str(args.example), peers=args.peers,
                   replica_procs=args.replica_procs, churn=args.churn,
                   seed=args.seed, kills=launcher.kills, kills_not_done=launcher.kills_not_done,
                   joins=launcher.joins, late_replacements=launcher.late)
    problems, flags = judge(info)
    info.update(wall_seconds=round(wall, 2), flags=flags, ok=failure is None and not problems,
                problems=problems, failure=failure)
    series = [[None if isinstance(v, float) and math.isnan(v) else v for v in row]
              for row in record.series()]  # (outer, inner, train, val, bytes per peer)
    paths["json"].write_text(json.dumps({**info, "series": series}, indent=2) + "\n",
                             encoding="utf-8")
    print(table({**info, "failure": None if failure is None else failure.splitlines()[0],
                 "output": f"{out}/{stem}.{{csv,{'png,' if drawn else ''}json}}"}), flush=True)
    if failure is not None:
        print(f"pccl_aio.launch: FAILED: {failure}", file=sys.stderr, flush=True)
        return 128 + launcher.interrupted if launcher.interrupted else 1
    if problems:
        print(f"pccl_aio.launch: not ok: {'; '.join(problems)}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
