"""A stand-in example for the launcher's tests: the line protocol of ``examples/charlm.py``
(``joined``, a ``step`` line per outer step, ``done``) with the validation losses and the world
size it is given, without a master or any training; it takes the options the launcher passes.

    python tests/process/line_example.py --master H:P --seed 1 --min-peers 2 --vals 4,2,2.5
"""

from __future__ import annotations

import argparse

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--master", help="ignored")
ap.add_argument("--seed", type=int, default=1)
ap.add_argument("--min-peers", type=int, help="ignored")
ap.add_argument("--vals", required=True, help="validation loss of each outer step, comma-separated")
ap.add_argument("--world", type=int, default=2, help="the world size of every step")
args = ap.parse_args()
vals = args.vals.split(",")
print(f"joined peer={args.seed} world={args.world}", flush=True)
for k, val in enumerate(vals, 1):
    print(f"step peer={args.seed} outer={k} inner={10 * k} world={args.world} loss=3.0000 "
          f"val={val} sent={100 * k} digest={k:016x}", flush=True)
print(f"done peer={args.seed} outer={len(vals)} inner={10 * len(vals)} val={vals[-1]} "
      f"digest={len(vals):016x}", flush=True)
