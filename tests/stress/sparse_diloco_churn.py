"""Sparse DiLoCo under churn, the whole launcher run, several times (issue 45, item 4):

    python tests/stress/sparse_diloco_churn.py                 # 3 runs, about a minute each
    python tests/stress/sparse_diloco_churn.py --runs 5 --out /tmp/sparse

Each run is ``python -m pccl_aio.launch examples/diloco.py --peers 3 --churn 8 -- --tiny
--sparse 0.01`` (``--out DIR/runN``); its line gives the launcher's summary: best and final
validation loss, the share of outer steps with company (world >= 2), kills and joins. Pass (exit
0): every run is ok (digests agree, the final loss within 3 % of the run's best, company) and
had a kill. ``tests/process/test_sparse_diloco.py`` is the short form the suite runs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = ["-m", "pccl_aio.launch", str(ROOT / "examples" / "diloco.py"), "--peers", "3",
          "--churn", "8"]
EXAMPLE = ["--tiny", "--sparse", "0.01"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("runs/sparse_diloco_churn"))
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    args = ap.parse_args()
    bad = 0
    for n in range(1, args.runs + 1):
        out = args.out / f"run{n}"
        cmd = [sys.executable, *LAUNCH, "--out", str(out), "--timeout", f"{args.timeout:g}",
               "--", *EXAMPLE]
        status = subprocess.run(cmd, check=False, stdout=subprocess.DEVNULL).returncode
        path = out / "diloco.json"
        s = json.loads(path.read_text()) if path.exists() else {}
        ok = status == 0 and bool(s.get("ok")) and s.get("kills", 0) > 0
        bad += not ok
        best, final = s.get("best_val_loss"), s.get("final_val_loss")
        gap = f"{100 * (final / best - 1):+.1f} %" if best and final else "-"
        share = s.get("company_share")
        print(f"run {n}: {'ok' if ok else 'NOT OK'} status {status}, best {best} (outer step "
              f"{s.get('best_val_outer')}), final {final} ({gap}), with company "
              f"{'-' if share is None else f'{100 * share:.0f} %'}, kills {s.get('kills')} "
              f"(not done {s.get('kills_not_done')}), joins {s.get('joins')}; "
              f"{' '.join(cmd[1:])}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
