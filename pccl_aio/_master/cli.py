"""The master's command line: ``python -m pccl_aio.master`` (``--help`` says more)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys

from .._errors import InvalidUsageError
from .._log import FORMATS, LEVELS, configure
from .._net.credentials import load_secret, run_key, tls_contexts
from .kept import STATE_DIR_ENV, default_path, master_secret_in, state_dir
from .server import Master
from .status import Limits

__all__ = ["STATE_DIR_ENV", "main", "master_secret", "parser", "state_dir"]

log = logging.getLogger("pccl_aio.master")

_DESCRIPTION = """\
Run a pccl_aio master. Peers join a run through it (pccl_aio.Communicator("HOST:PORT")):
it admits them, counts their votes and starts their collectives; tensor data flows between
the peers, never through the master. One master serves one run. Ctrl-C or SIGTERM stops it
(exit status 0)."""
_EPILOG = "example: python -m pccl_aio.master --port 48148 --log-level debug"


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (0-65535)")
    return port


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows a default unless the help says it already or there is none to show."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "(default:" in text or action.default in (None, False, []):
            return text
        return super()._get_help_string(action)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pccl_aio.master", description=_DESCRIPTION,
                                epilog=_EPILOG, formatter_class=_Formatter)
    p.add_argument("--host", default="0.0.0.0",
                   help="address to listen on; 0.0.0.0 listens on every interface")
    p.add_argument("--port", type=_port, default=48148,
                   help="TCP port to listen on; 0 lets the OS pick one (the log says which)")
    p.add_argument("--heartbeat-timeout", type=_seconds, default=5.0, metavar="SECONDS",
                   help="a peer silent this long is treated as dead")
    p.add_argument("--heartbeat-interval", type=_seconds, metavar="SECONDS",
                   help="how often the master tells each peer it is alive (default: a third "
                        "of the heartbeat timeout)")
    p.add_argument("--run-id", metavar="ID",
                   help="serve only this run: peers of another run are refused (default: "
                        "the run of the first peer that arrives)")
    p.add_argument("--recovery-grace", type=_seconds, metavar="SECONDS",
                   help="after a restart, how long to wait for the run's peers to rejoin "
                        "before going on without the missing ones (default: twice the "
                        "heartbeat timeout)")
    p.add_argument("--vote-timeout", type=_seconds, default=600.0, metavar="SECONDS",
                   help="kick a member that withholds a vote every other member waits in "
                        "this long (default 600)")
    p.add_argument("--no-vote-timeout", dest="vote_timeout", action="store_const", const=None,
                   help="never kick a member for withholding a vote")
    p.add_argument("--other-master", action="append", default=[], metavar="HOST:PORT",
                   help="another master of this run (repeatable): it is watched, and if it "
                        "serves the run at a higher term this master steps down")
    p.add_argument("--log-level", type=str.upper, choices=LEVELS, default=None,
                   help="least severe log messages shown, any case (default: "
                        "$PCCL_AIO_LOG_LEVEL, else INFO)")
    p.add_argument("--log-format", type=str.lower, choices=FORMATS, default=None,
                   help="text, or json: one object per line (default: $PCCL_AIO_LOG_FORMAT, "
                        "else text)")
    obs = p.add_argument_group("status page and metrics (docs, 'Logs, metrics and status')")
    obs.add_argument("--status-port", type=_port, metavar="PORT",
                     help="serve the live status page (/) and /status.json on this HTTP port")
    obs.add_argument("--metrics-port", type=_port, metavar="PORT",
                     help="serve Prometheus metrics at /metrics on this HTTP port (may be "
                          "the status port)")
    obs.add_argument("--http-host", default="127.0.0.1",
                     help="interface of the HTTP ports; they have no authentication and show "
                          "the peers' addresses, so expose them with care")
    obs.add_argument("--http-max-clients", type=_count, default=Limits().max_clients,
                     metavar="N", help="connections each HTTP port serves at once; when all "
                     "are held, a client from a new address takes the oldest of the "
                     "address holding the most")
    obs.add_argument("--http-per-address", type=_count, default=Limits().per_address,
                     metavar="N", help="connections each HTTP port serves at once from one "
                     "client address (an IPv6 /64); more are closed at once")
    obs.add_argument("--http-head-timeout", type=_seconds, default=Limits().head_timeout,
                     metavar="SECONDS", help="an HTTP client must send its whole request head "
                     "within this long of connecting, or is closed")
    sec = p.add_argument_group("security (docs, 'Security')")
    sec.add_argument("--secret-file", metavar="PATH",
                     help="file holding the run secret every peer must prove (default: "
                          "$PCCL_AIO_SECRET_FILE, else $PCCL_AIO_SECRET, else no secret)")
    sec.add_argument("--master-secret-file", metavar="PATH",
                     help="file holding a second secret that only the run's masters hold: "
                          "memberships are sealed with it, and a restarted master believes "
                          "a rejoining peer's id only with its seal; made (mode 0600) if "
                          "there is none. Default, with a run secret: one kept in "
                          f"${STATE_DIR_ENV}, else $XDG_STATE_HOME/pccl_aio, else "
                          "~/.local/state/pccl_aio, named after the run secret")
    sec.add_argument("--no-master-secret", action="store_true",
                     help="seal no memberships: a restarted master believes what a rejoining "
                          "peer says of its id and ring")
    sec.add_argument("--allow-any-advertise-host", action="store_true",
                     help="let peers advertise an address other than the one they connect "
                          "from (behind NAT or proxies)")
    sec.add_argument("--tls-cert", metavar="PEM", help="certificate chain: serve over TLS")
    sec.add_argument("--tls-key", metavar="PEM", help="private key of --tls-cert")
    sec.add_argument("--tls-ca", metavar="PEM",
                     help="CA of the peers' certificates: peers must present one (mutual TLS)")
    return p


async def _run_cli(args: argparse.Namespace) -> int:
    try:
        if (args.tls_cert is None) != (args.tls_key is None) or (args.tls_ca and not args.tls_cert):
            raise InvalidUsageError(
                "--tls-cert and --tls-key go together (and --tls-ca needs them)")
        context = (tls_contexts(args.tls_cert, args.tls_key, args.tls_ca)[0] if args.tls_cert
                   else None)
        secret = load_secret(args.secret_file)
        sealer = master_secret(args, secret)
    except InvalidUsageError as exc:
        print(f"pccl_aio.master: {exc}", file=sys.stderr)
        return 2
    try:
        master = Master(args.host, args.port, heartbeat_timeout=args.heartbeat_timeout,
                        heartbeat_interval=args.heartbeat_interval,
                        secret=secret or b"", ssl=context,
                        allow_any_advertise_host=args.allow_any_advertise_host,
                        run_id=args.run_id, recovery_grace=args.recovery_grace,
                        vote_timeout=args.vote_timeout,
                        others=args.other_master, status_port=args.status_port,
                        metrics_port=args.metrics_port, http_host=args.http_host,
                        http_limits=Limits(args.http_max_clients, args.http_per_address,
                                           args.http_head_timeout),
                        master_secret=sealer)
    except InvalidUsageError as exc:
        print(f"pccl_aio.master: {exc}", file=sys.stderr)
        return 2
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):  # before "listening": a stop right after it
        with contextlib.suppress(NotImplementedError):  # is a clean one
            loop.add_signal_handler(sig, stop.set)
    try:
        await master.start()
    except OSError as exc:
        where = exc.filename or f"{args.host}:{args.port}"
        print(f"pccl_aio.master: cannot listen on {where}: {_why(exc)}", file=sys.stderr)
        await master.close()
        return 2
    await stop.wait()
    log.info("shutting down")
    await master.close()
    return 0


def master_secret(args: argparse.Namespace, secret: bytes | None) -> str | None:
    """The master secret: none ("") with ``--no-master-secret``; None without a run secret
    and a ``--master-secret-file``; else the one in that file, or in the default file for the
    run secret (``kept.py``), made there on the first start. Raises InvalidUsageError if the
    file given cannot be read or made, or holds a weak secret; a default file that cannot be
    kept is logged (a warning: memberships are not sealed) and the master goes on without."""
    if args.no_master_secret:
        if args.master_secret_file:
            raise InvalidUsageError("--no-master-secret and --master-secret-file exclude each "
                                    "other")
        return ""
    if args.master_secret_file is not None:
        return master_secret_in(args.master_secret_file, True)
    if not secret:
        return None
    return master_secret_in(default_path(run_key(secret)), False) or ""


def _why(exc: OSError) -> str:
    """``address already in use``: the system's words for ``exc``, without asyncio's frame."""
    text = os.strerror(exc.errno) if exc.errno and exc.errno > 0 else exc.strerror or str(exc)
    return text[:1].lower() + text[1:]


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point: ``python -m pccl_aio.master`` (``--help`` says more)."""
    ap = parser()
    args = ap.parse_args(argv)
    try:
        configure(args.log_level, args.log_format)
    except ValueError as exc:  # from the environment (the options are checked by argparse)
        ap.error(str(exc))
    from .. import run

    return run(_run_cli(args))
