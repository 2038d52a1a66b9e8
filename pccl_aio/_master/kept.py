"""The master secret a master keeps (docs, "Security"): read from a file, or made there on
the first start (``pccl_aio.secret.keep``: mode 0600, written whole), so that a restarted
master seals and checks memberships with the same one. A master given a run secret and no
master secret keeps one in ``state_dir()``, under a name derived from the run secret
(``keys.kept_secret_name``: each run secret its own file). Blocks for the file's I/O."""

from __future__ import annotations

import logging
import os

from .._errors import InvalidUsageError
from .._net.credentials import keep, run_key
from .keys import kept_secret_name

__all__ = ["STATE_DIR_ENV", "default_path", "master_secret_in", "state_dir"]

log = logging.getLogger("pccl_aio.master")

STATE_DIR_ENV = "PCCL_AIO_STATE_DIR"


def state_dir() -> str:
    """Where a master keeps what its restarted self needs: ``$PCCL_AIO_STATE_DIR``, else
    ``$XDG_STATE_HOME/pccl_aio``, else ``~/.local/state/pccl_aio``."""
    if folder := os.environ.get(STATE_DIR_ENV):
        return folder
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local",
                                                            "state")
    return os.path.join(base, "pccl_aio")


def default_path(key: bytes) -> str:
    """The file of the master secret kept for the run key ``key`` (``run_key(secret)``)."""
    return os.path.join(state_dir(), kept_secret_name(key))


def master_secret_in(path: str, given: bool) -> str | None:
    """The master secret in ``path``, made there if missing. A file the user ``given`` that
    cannot be read or made, or that holds a weak secret, is an ``InvalidUsageError``; the
    default file failing is logged (a warning: memberships are not sealed) and gives None."""
    try:
        sealer, made = keep(path)
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        if given:
            raise InvalidUsageError(f"cannot keep the master secret in {path}: {why}") from exc
        log.warning("cannot keep a master secret in %s (%s): memberships are not sealed, so a "
                    "restarted master believes what a rejoining peer says of its id; give "
                    "one (--master-secret-file PATH, Master(master_secret=)) or none "
                    "(--no-master-secret, master_secret='')", path, why)
        return None
    run_key(sealer)  # a weak one (made by hand) is refused
    log.info("%s the master secret in %s: memberships are sealed, and a restarted master "
             "finds it there%s", "made" if made else "read", path,
             " (give it to the run's other masters too)" if made else "")
    return sealer
