"""Words for a control-plane message that failed to decode (``messages.py``), sans-IO."""

from __future__ import annotations

import re
from typing import Any, Final

import msgspec

# msgspec raises more than DecodeError on hostile input: invalid UTF-8 in a str field and
# deeply nested arrays surface as UnicodeDecodeError / RecursionError.
DECODE_ERRORS: Final = (msgspec.DecodeError, UnicodeDecodeError, RecursionError)
_AT: Final = re.compile(r" - at `\$((?:\[\d+\])+)`$")


def explain(buf: bytes | memoryview, exc: Exception, by_tag: dict[int, Any]) -> str:
    """msgspec's error with its path (``$[5]``) named: ``Hello.state_port: Expected ...``."""
    text = str(exc)
    found = _AT.search(text)
    if not isinstance(exc, msgspec.ValidationError) or found is None:
        return text
    try:
        raw = msgspec.msgpack.decode(buf)
        info: object = msgspec.inspect.type_info(by_tag[raw[0]])
    except Exception:  # the path names no known message: keep msgspec's words
        return text
    where = ""
    for index in map(int, re.findall(r"\d+", found.group(1))):
        if isinstance(info, msgspec.inspect.StructType):
            i = index - (info.tag_field is not None)  # a tagged array leads with its tag
            if not 0 <= i < len(info.fields):
                where += f"[{index}]"
                break
            where += f".{info.fields[i].name}" if where else (
                f"{info.cls.__name__}.{info.fields[i].name}")
            info = info.fields[i].type
        elif isinstance(info, msgspec.inspect.ListType):
            where, info = where + f"[{index}]", info.item_type
        else:
            where += f"[{index}]"
    return f"{where}: {text[:found.start()]}" if where else text


def peek_hello_version(buf: bytes | memoryview) -> int | None:
    """The protocol version inside a Hello body this version cannot decode, else None.

    Lets the master refuse a peer of another version with a clear reason even when the
    Hello's schema changed.
    """
    try:
        raw = msgspec.msgpack.decode(buf)
    except DECODE_ERRORS:
        return None
    if (isinstance(raw, list) and len(raw) >= 2 and raw[0] == 1 and type(raw[1]) is int):
        return raw[1]
    return None
