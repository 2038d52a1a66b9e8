"""``host:port``, the one parser of the addresses users give (a master's, another master's)."""

from __future__ import annotations

import ipaddress

from .._errors import InvalidUsageError

__all__ = ["parse_address"]

FORM = "'host:port' (e.g. 'localhost:48148', or '[::1]:48148' for IPv6; no scheme, no path)"


def parse_address(text: object, what: str = "master") -> tuple[str, int]:
    """``(host, port)`` of ``"host:port"``: IPv6 in brackets (``"[::1]:48148"``), or bare
    when the host part is an IPv6 address as a whole (``"::1:48148"``). ``what`` names the
    address in the ``InvalidUsageError`` raised for anything else."""
    if not isinstance(text, str):
        raise InvalidUsageError(f"{what} address must be {FORM}, not {text!r}")
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not host or "/" in host or " " in text:
        raise InvalidUsageError(f"{what} address must be {FORM}, not {text!r}")
    bracketed = host.startswith("[") and host.endswith("]") and len(host) > 2
    if ":" in host and not bracketed and not _is_ipv6(host):
        raise InvalidUsageError(
            f"{what} address {text!r} is malformed: {host!r} is not a host (one colon, "
            f"before the port); the form is {FORM}")
    if not 1 <= int(port) <= 65535:
        raise InvalidUsageError(f"{what} port must be in 1..65535, not {port}")
    return host.strip("[]"), int(port)


def _is_ipv6(host: str) -> bool:
    try:
        ipaddress.IPv6Address(host)
    except ValueError:
        return False
    return True
