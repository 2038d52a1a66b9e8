"""Where a run's credentials come from: the run secret (argument, file or environment), TLS
contexts made from PEM files (named by the environment too, ``tls_from_env``), and secrets
made (``make``) or kept in a file (``keep``, the master secret's: ``pccl_aio.secret``
re-exports both)."""

from __future__ import annotations

import contextlib
import os
import secrets
import ssl
from typing import Final

from .._errors import InvalidUsageError
from .._wire import auth

SECRET_ENV: Final = "PCCL_AIO_SECRET"
SECRET_FILE_ENV: Final = "PCCL_AIO_SECRET_FILE"


def load_secret(path: str | None = None) -> bytes | None:
    """The run secret: the contents of ``path`` if given, else of the file named by
    ``$PCCL_AIO_SECRET_FILE``, else ``$PCCL_AIO_SECRET``, else None (a run without a
    secret). Surrounding whitespace (a trailing newline) is stripped. Raises
    ``InvalidUsageError`` if the file cannot be read or the secret is empty."""
    path = path or os.environ.get(SECRET_FILE_ENV) or None
    if path is not None:
        try:
            with open(path, "rb") as f:
                secret = f.read().strip()
        except OSError as exc:
            raise InvalidUsageError(
                f"cannot read the secret file {path!r}: {exc.strerror}") from exc
        if not secret:
            raise InvalidUsageError(f"the secret file {path!r} is empty")
        return secret
    value = os.environ.get(SECRET_ENV, "").strip()
    return value.encode() if value else None


def run_key(secret: str | bytes | None) -> bytes:
    """The handshake key of ``secret`` (``load_secret()`` when None; empty for no secret):
    stretched once (``auth.secret_key``, tens of ms). Raises ``InvalidUsageError`` for a
    secret too weak to keep outsiders out, saying how to make a good one."""
    try:
        return auth.secret_key(secret if secret is not None else load_secret())
    except ValueError as exc:
        raise InvalidUsageError(str(exc)) from None


def tls_contexts(cert: str, key: str, ca: str | None = None
                 ) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server context, client context) from PEM files: this host's certificate chain and
    key, and the CA that signed every member's certificate (default: the system's).

    With ``ca``, both sides verify each other (mutual TLS): a peer needs a certificate of
    the run's CA to connect at all. Pass the server context as ``Master(ssl=...)`` or
    ``Communicator(ssl_server=...)`` and the client context as ``Communicator(ssl=...)``.
    Raises ``InvalidUsageError`` for an unreadable or mismatched file.
    """
    try:
        server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=ca)
        client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
        for ctx in (server, client):
            ctx.load_cert_chain(cert, key)
            ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    except (OSError, ssl.SSLError) as exc:
        raise InvalidUsageError(f"cannot load TLS files ({cert}, {key}, {ca}): {exc}") from exc
    if ca is not None:
        server.verify_mode = ssl.CERT_REQUIRED
    return server, client


def client_context(server: ssl.SSLContext | None) -> ssl.SSLContext | None:
    """How a master connects to the others: TLS if it serves TLS (verifying against the
    default CAs; the run secret is proved on top)."""
    return ssl.create_default_context() if server is not None else None


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


#: the environment's TLS for a whole run (master, peers, between peers): this host's
#: certificate chain and key, and the run's CA (mutual TLS), as ``tls_contexts`` takes them
TLS_ENV: Final = ("PCCL_AIO_TLS_CERT", "PCCL_AIO_TLS_KEY", "PCCL_AIO_TLS_CA")


def tls_from_env() -> tuple[ssl.SSLContext | None, ssl.SSLContext | None]:
    """(server, client) TLS contexts from ``$PCCL_AIO_TLS_CERT``, ``$PCCL_AIO_TLS_KEY`` and
    ``$PCCL_AIO_TLS_CA`` (``tls_contexts``), or (None, None) where the first two are unset;
    ``InvalidUsageError`` for one set without the other or an unreadable file."""
    cert, key, ca = (os.environ.get(name, "") for name in TLS_ENV)
    if not cert and not key:
        return None, None
    if not (cert and key):
        raise InvalidUsageError(f"TLS needs both {TLS_ENV[0]} and {TLS_ENV[1]}")
    return tls_contexts(cert, key, ca or None)
