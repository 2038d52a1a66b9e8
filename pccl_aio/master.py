"""Command line of the master: ``python -m pccl_aio.master --host 0.0.0.0 --port 48148``.

Logs where it listens; SIGINT or SIGTERM shut it down cleanly (exit status 0). A port it
cannot listen on is one line on stderr and exit status 2, as are bad options; ``--help``.
"""

from __future__ import annotations

import sys

from ._master.cli import main
from ._master.server import Master

__all__ = ["Master", "main"]

if __name__ == "__main__":
    sys.exit(main())
