"""Make ``examples/RESULTS.md``: every example on the same budget, with and without churn.

    python examples/results.py                       # about half an hour on 2 cores
    python examples/results.py --inner-steps 200 --tiny --only ddp diloco   # a quick look
    python examples/results.py --reuse     # run only what is missing, then the whole table

Runs ``python -m pccl_aio.launch`` once per configuration (same peers, same total inner
steps, same seeds), reads each run's JSON summary (``runs/results/<name>/<stem>.json``), and
writes the table to ``examples/RESULTS.md`` (between its ``<!-- results -->`` markers, the
text around them is kept) and two plots of all runs to ``examples/results/``: validation loss
against inner steps and against bytes sent per peer. Exits non-zero if a run failed (its
digests disagreed, a peer crashed) or was not ok by the launcher's verdict (its final loss
over 3 % above its best, no company); the table still shows the others.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
#: name -> (example script, its arguments); the budget and evaluation cadence are added.
CONFIGS: dict[str, tuple[str, list[str]]] = {
    "ddp": ("ddp.py", []),
    "diloco": ("diloco.py", ["--inner", "50"]),
    "diloco uint8": ("diloco.py", ["--inner", "50", "--quant", "uint8"]),
    "async diloco": ("async_diloco.py", ["--inner", "50"]),
    "streaming": ("streaming_diloco.py", ["--inner", "50", "--fragments", "3"]),
    "streaming uint4": ("streaming_diloco.py", ["--inner", "56", "--fragments", "3",
                                                "--quant", "uint4"]),
    # fewer bytes per inner step, for the churn row's budget (joiners' state is a third of it)
    "streaming uint4 H=72": ("streaming_diloco.py", ["--inner", "72", "--fragments", "3",
                                                     "--quant", "uint4"]),
    "streaming uint4 H=96": ("streaming_diloco.py", ["--inner", "96", "--fragments", "3",
                                                     "--quant", "uint4"]),
    "diloco sparse 1% 2-bit": ("diloco.py", ["--inner", "50", "--sparse", "0.01"]),
    "diloco sparse 5% 4-bit": ("diloco.py", ["--inner", "50", "--sparse", "0.05",
                                             "--sparse-bits", "4"]),
    # error feedback in place of the outer momentum (SparseLoCo's choice), more outer steps
    "diloco sparse EF H=10": ("diloco.py", ["--inner", "10", "--sparse", "0.03",
                                            "--sparse-bits", "4", "--momentum", "0",
                                            "--outer-lr", "1.0", "--sparse-decay", "0.95"]),
}
#: outer steps between evaluations, so that every run is evaluated every 50 inner steps
EVAL_EVERY = {"ddp": 50, "streaming": 3, "streaming uint4": 3, "streaming uint4 H=72": 2,
              "streaming uint4 H=96": 2,
              "diloco sparse EF H=10": 5}


def run(name: str, churn: float | None, args: argparse.Namespace) -> dict[str, Any]:
    """One launch; its JSON summary (with ``name``), or a failure record."""
    script, extra = CONFIGS[name]
    tag = name.replace(" ", "-") + ("-churn" if churn else "")
    out = args.out / tag
    cmd = [sys.executable, "-m", "pccl_aio.launch", str(HERE / script), "--peers",
           str(args.peers), "--out", str(out), "--timeout", str(args.timeout),
           *(["--churn", f"{churn:g}"] if churn else []), "--",
           "--inner-steps", str(args.inner_steps), "--eval-every",
           str(EVAL_EVERY.get(name, 1)), *extra, *(["--tiny"] if args.tiny else [])]
    path = out / f"{Path(script).stem}.json"
    if args.reuse and path.exists():  # a run made before with the same arguments
        before = json.loads(path.read_text())
        if before.get("argv") == cmd[3:]:
            return {**before, "name": name, "churned": bool(churn), "status": 0}
    print("$", " ".join(cmd[1:]), flush=True)
    status = subprocess.run(cmd, check=False).returncode
    info: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    if info:
        path.write_text(json.dumps({**info, "argv": cmd[3:]}, indent=2) + "\n")
    return {**info, "name": name, "churned": bool(churn), "status": status}


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f}"


def table(results: list[dict[str, Any]]) -> str:
    """The Markdown table: loss (final, and the run's best), its gap to DDP's, bytes and the
    factor fewer, wall time, and the launcher's verdict (``ok``, else its first problem)."""
    base = {r["churned"]: r for r in results if r["name"] == "ddp" and r.get("ok")}
    lines = ["| run | churn | final val loss | best | vs DDP | MiB sent per peer | fewer bytes "
             "| wall s | kills / joins | digests agree | ok |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    for r in results:
        if r.get("failure") or r.get("final_val_loss") is None:  # it did not finish
            lines.append(f"| {r['name']} | {'yes' if r['churned'] else 'no'} | FAILED: "
                         f"{(r.get('failure') or 'status ' + str(r['status'])).splitlines()[0]}"
                         " | | | | | | | | |")
            continue
        ref = base.get(r["churned"]) or base.get(False)  # (no DDP run with churn: without)
        loss, sent = r["final_val_loss"], r["bytes_sent_per_peer"]
        gap = f"{100 * (loss / ref['final_val_loss'] - 1):+.1f} %" if ref else "-"
        fewer = f"{ref['bytes_sent_per_peer'] / sent:.0f}x" if ref and sent else "-"
        churn = f"every {r['churn']:g} s" if r["churned"] else "no"
        best = r.get("best_val_loss")
        ok = "yes" if r.get("ok") else "no: " + "; ".join(r.get("problems") or ["see its log"])
        lines.append(f"| {r['name']} | {churn} | {loss:.4f} | "
                     f"{'-' if best is None else f'{best:.4f}'} | {gap} | {_mib(sent)} | "
                     f"{fewer} | {r['wall_seconds']:.0f} | {r['kills']} / {r['joins']} | "
                     f"{'yes' if r['digests_agree'] else 'NO'} | {ok} |")
    return "\n".join(lines)


def plots(results: list[dict[str, Any]], folder: Path) -> list[Path]:
    """Validation loss of every run against inner steps and against MiB sent per peer."""
    from matplotlib.figure import Figure

    folder.mkdir(parents=True, exist_ok=True)
    fig = Figure(figsize=(13, 5), dpi=100, layout="constrained")
    by_step, by_bytes = fig.subplots(1, 2)
    names = list(CONFIGS)
    for r in results:
        pts = [(row[1], row[3], row[4]) for row in r.get("series", []) if row[3] is not None]
        if not pts:
            continue
        style: dict[str, Any] = {
            "color": f"C{names.index(r['name'])}", "linestyle": "--" if r["churned"] else "-",
            "marker": "o", "markersize": 2.5, "linewidth": 1.2,
            "label": r["name"] + (" (churn)" if r["churned"] else "")}
        by_step.plot([p[0] for p in pts], [p[1] for p in pts], **style)
        by_bytes.plot([p[2] / 2**20 for p in pts], [p[1] for p in pts], **style)
    by_step.set(xlabel="inner steps of the run", ylabel="validation loss",
                title="validation loss against inner steps")
    by_bytes.set(xlabel="MiB sent per peer (log)", ylabel="validation loss", xscale="log",
                 title="validation loss against bytes sent per peer")
    for ax in (by_step, by_bytes):
        ax.grid(alpha=0.3)
    by_step.legend(fontsize="small")
    path = folder / "val_loss.png"
    fig.savefig(path)
    return [path]


def write(results: list[dict[str, Any]], args: argparse.Namespace, figures: list[Path]) -> None:
    md = HERE / "RESULTS.md"
    text = md.read_text() if md.exists() else "# Results\n\n<!-- results -->\n<!-- /results -->\n"
    head, rest = text.split("<!-- results -->", 1)
    tail = rest.split("<!-- /results -->", 1)[1]
    cmd = "python examples/results.py " + shlex.join(sys.argv[1:])
    body = (f"\n`{cmd.strip()}`: {args.peers} peers, {args.inner_steps} inner steps each"
            f"{', tiny model' if args.tiny else ''}; churn: a random peer SIGKILLed every "
            f"{args.churn:g} s and a replacement started (launcher `--churn`).\n\n"
            f"{table(results)}\n\n"
            + "".join(f"![{p.stem}]({p.relative_to(HERE)})\n" for p in figures))
    md.write_text(head + "<!-- results -->" + body + "<!-- /results -->" + tail)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peers", type=int, default=3)
    ap.add_argument("--inner-steps", type=int, default=1000)
    ap.add_argument("--churn", type=float, default=20.0, help="seconds between SIGKILLs")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--no-churn-runs", action="store_true", help="only the runs without churn")
    ap.add_argument("--churn-runs", nargs="+", choices=list(CONFIGS), metavar="NAME",
                    help="the runs also made with churn (default: all)")
    ap.add_argument("--only", nargs="+", choices=list(CONFIGS), help="a subset of the runs")
    ap.add_argument("--out", type=Path, default=Path("runs/results"))
    ap.add_argument("--reuse", action="store_true",
                    help="keep the runs already made with the same arguments")
    args = ap.parse_args()
    names = args.only or list(CONFIGS)
    churns: list[float | None] = [None] if args.no_churn_runs else [None, args.churn]
    again = set(args.churn_runs or names)
    results = [run(n, c, args) for c in churns for n in names if c is None or n in again]
    figures = plots(results, HERE / "results")
    write(results, args, figures)
    print(table(results))
    return 0 if all(r.get("ok") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
