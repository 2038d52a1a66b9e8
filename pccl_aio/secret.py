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
does so by default; README, "Security").
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import sys

__all__ = ["keep", "main", "make"]


def make() -> str:
    """A fresh run secret: 32 random bytes as URL-safe base64 (43 characters)."""
    return secrets.token_urlsafe(32)


def keep(path: str | os.PathLike[str]) -> tuple[str, bool]:
    """The secret in the file ``path`` and whether this call made it: if there is no such
    file, a fresh secret (``make``) is written to it, readable by its owner only (mode 0600;
    missing folders are made, mode 0700). The file appears whole or not at all: it is
    written under another name and linked into place, so of several processes making it at
    once, every one gets the one that was linked first. Raises OSError if it cannot be read
    or made, ValueError if it is empty. Blocks on the file system only."""
    path = os.fspath(path)
    while True:
        with contextlib.suppress(FileNotFoundError):
            with open(path, encoding="utf-8") as f:
                secret = f.read().strip()
            if not secret:
                raise ValueError(f"the secret file {path!r} is empty")
            return secret, False
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, mode=0o700, exist_ok=True)
        secret = make()
        part = os.path.join(folder, f".{os.path.basename(path)}.{secrets.token_hex(8)}")
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(secret + "\n")
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(part, path)  # never over an existing file (os.replace would be)
            except FileExistsError:
                continue  # another process made it meanwhile: read theirs
            folder_fd = os.open(folder, os.O_RDONLY)
            try:  # the new name survives a crash of the machine
                os.fsync(folder_fd)
            finally:
                os.close(folder_fd)
            return secret, True
        finally:
            os.unlink(part)


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
