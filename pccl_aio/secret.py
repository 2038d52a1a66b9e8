"""``python -m pccl_aio.secret``: make a run secret (256 random bits from ``secrets``, 43
URL-safe characters).

    python -m pccl_aio.secret                      # print one
    python -m pccl_aio.secret --file run.secret    # write one, readable by its owner only

Give the same secret to the master (``--secret-file``) and every peer
(``$PCCL_AIO_SECRET_FILE``). A secret made by hand is often guessable; one made here is not.
``--file`` never overwrites: an existing file is an error (exit status 1), so a running
run's secret is not replaced by accident. Nothing here blocks beyond writing the file.

``keep(path)`` is the secret in ``path``, made there first if there is none: how a master
keeps its master secret where its restarted self finds it (``python -m pccl_aio.master``
does so by default; docs, "Security").
"""

from __future__ import annotations

import argparse
import os
import sys

from ._net.credentials import keep, make

__all__ = ["keep", "main", "make"]


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit status."""
    ap = argparse.ArgumentParser(prog="python -m pccl_aio.secret",
                                 description="Make a run secret (256 random bits).")
    ap.add_argument("--file", help="write it to FILE (mode 0600; never overwrites) instead "
                                   "of printing it")
    args = ap.parse_args(argv)
    secret = make()
    if args.file is None:
        print(secret)
        return 0
    try:
        fd = os.open(args.file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        print(f"python -m pccl_aio.secret: cannot create {args.file}: {exc.strerror}",
              file=sys.stderr)
        return 1
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
