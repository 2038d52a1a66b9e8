"""``SharedState``: named tensors kept bit-identical across the peers of a group.

Entries are numpy arrays or torch tensors of any supported dtype (float16, bfloat16 and
int16 included). Each entry is hashed with xxh3-128; an entry with
``allow_content_inequality`` is not compared between peers, but is still sent to a joiner.
A CUDA tensor is kept in a host twin (pinned): copied into it when a sync starts
(``refresh``), copied back from it when a sync succeeded (``store``); a failed sync leaves
the device tensor as it was.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import xxhash

from ...._errors import InvalidUsageError
from ...._wire.state import MAX_KEY
from ...core import staging
from ...core.buffers import Buffer, as_buffer

__all__ = ["SharedState", "hash_bytes"]


def hash_bytes(view: memoryview) -> bytes:
    """xxh3-128 digest (16 bytes) of a byte view. Releases no GIL; ~10 GB/s."""
    return xxhash.xxh3_128_digest(view)


@dataclasses.dataclass(frozen=True, slots=True)
class _Entry:
    key: str
    buf: Buffer
    allow_inequality: bool


class SharedState:
    """The tensors a group keeps identical, and the revision they are at.

    Args:
        tensors: name -> tensor (numpy array, torch CPU or CUDA tensor, writable buffer);
            the tensors are updated in place by ``Communicator.sync_shared_state``.
        revision: the revision this peer holds; advance it by exactly one per sync
            (a peer resuming from a checkpoint passes the checkpoint's revision).
        allow_content_inequality: names whose contents may differ between peers.
    """

    def __init__(self, tensors: Mapping[str, Any], revision: int = 0, *,
                 allow_content_inequality: Iterable[str] = ()) -> None:
        if not isinstance(revision, int) or not 0 <= revision < 2**63:
            raise InvalidUsageError(f"revision must be an int in [0, 2**63), not {revision!r}")
        self._loose = frozenset(allow_content_inequality)
        self._source: Callable[[], Mapping[str, Any]] | None = None
        self._entries: list[_Entry] = []
        self._by_key: dict[str, _Entry] = {}
        self._twins: dict[str, Any] = {}  # key -> host twin of a device tensor
        self._staged: list[tuple[Any, Any]] = []  # (device tensor, its host twin)
        self._set(tensors)
        self.revision = revision
        self.fresh = True  # never synced: a joiner also receives the inequality-allowed entries

    @classmethod
    def from_module(cls, module: Any, optimizer: Any = None, *,
                    extra: Mapping[str, Any] | None = None, revision: int = 0,
                    allow_content_inequality: Iterable[str] = ()) -> SharedState:
        """The state of a torch ``module`` (its ``state_dict()``: parameters and buffers, bf16
        included) and of its ``optimizer``, plus ``extra`` named tensors (a step counter, ...).

        Entries are ``model.<key>``, ``optim.<parameter name>.<state key>`` and the ``extra``
        names; they alias the tensors (no copy) and are read again at every sync, so the
        state follows ``module.load_state_dict`` and ``optimizer.load_state_dict``. An
        optimizer that never stepped gets its fresh state materialized as zeros (Adam, AdamW,
        Adamax, RAdam, SGD; others must step once first). CPU or CUDA tensors."""
        from .torch_state import module_tensors

        def read() -> Mapping[str, Any]:
            return module_tensors(module, optimizer, extra)

        state = cls(read(), revision, allow_content_inequality=allow_content_inequality)
        state._source = read
        return state

    def refresh(self) -> None:
        """Re-read the entries of a ``from_module`` state and copy device tensors into their
        host twins (the sync calls this first; blocks for the copies). Raises
        ``InvalidUsageError`` for a bad tensor."""
        if self._source is not None:
            self._set(self._source())
        else:
            for device, host in self._staged:
                host.copy_(device)

    def store(self) -> None:
        """A sync succeeded: the host twins' bytes into their device tensors (blocks for the
        copies; nothing to do without device tensors)."""
        for device, host in self._staged:
            device.copy_(host)

    def _set(self, tensors: Mapping[str, Any]) -> None:
        if not tensors:
            raise InvalidUsageError("a SharedState needs at least one tensor")
        unknown = self._loose - set(tensors)
        if unknown:
            raise InvalidUsageError(
                f"allow_content_inequality names unknown keys {sorted(unknown)}")
        entries, staged = [], []
        for key, t in tensors.items():
            if not isinstance(key, str) or not key:
                raise InvalidUsageError(f"shared-state keys must be non-empty str, not {key!r}")
            if len(key.encode()) > MAX_KEY:
                raise InvalidUsageError(
                    f"shared-state key {key[:40]!r}... is longer than {MAX_KEY} UTF-8 bytes")
            if staging.needs(t):
                host = self._twins.get(key)
                if host is None or host.shape != t.shape or host.dtype != t.dtype:
                    host = self._twins[key] = staging.twin(t)
                host.copy_(t)
                staged.append((t, host))
                t = host
            entries.append(_Entry(key, as_buffer(t, writable=True, what=f"entry {key!r}"),
                                  key in self._loose))
        self._entries, self._staged = entries, staged
        self._by_key = {e.key: e for e in entries}

    def __repr__(self) -> str:
        return f"SharedState({[e.key for e in self._entries]}, revision={self.revision})"

    @property
    def keys(self) -> list[str]:
        """The entries' keys, in the order they are hashed and sent."""
        return [e.key for e in self._entries]

    @property
    def nbytes(self) -> int:
        """Total bytes of all entries."""
        return sum(e.buf.view.nbytes for e in self._entries)

    def view(self, key: str) -> memoryview:
        """The bytes of entry ``key`` (writable, aliasing the tensor)."""
        return self._by_key[key].buf.view

    def hashes(self) -> dict[str, bytes]:
        """xxh3-128 of every entry (blocks for the time of one pass over the bytes)."""
        return {e.key: hash_bytes(e.buf.view) for e in self._entries}

    def entries(self) -> list[tuple[str, int, int, bool]]:
        """(key, dtype, nbytes, allow_inequality) of every entry, in insertion order."""
        return [(e.key, int(e.buf.dtype), e.buf.view.nbytes, e.allow_inequality)
                for e in self._entries]
