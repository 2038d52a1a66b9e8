"""Where a peer finds its run in the environment (``Communicator.from_env()``): what a
launcher (torchrun, TorchX, SLURM, Kubernetes, Ray) sets.

- **The master**: ``$PCCL_AIO_MASTER`` (``host:port``; several, comma-separated, for a run
  with standby masters), else ``$MASTER_ADDR`` with ``$PCCL_AIO_MASTER_PORT`` (default
  ``DEFAULT_PORT``, the master's own default): a master beside torchrun's rank 0.
- **torchrun's job is one replica**: with ``$RANK``, ``$WORLD_SIZE`` and ``$LOCAL_RANK`` set
  (torchrun, torchelastic) and ``WORLD_SIZE`` above 1, the job's processes are one replica
  (``replica_size`` = WORLD_SIZE, admitted together) and process ``RANK`` is in peer group
  ``RANK`` (shard i of every replica in peer group i: FSDP inside the replica on torchrun's
  group, pccl_aio across replicas). The replica's name is ``$PCCL_AIO_REPLICA``, else
  ``torchrun:<$TORCHELASTIC_RUN_ID>``, or, for torchrun's default run id ``none``,
  ``torchrun:<$MASTER_ADDR>:<$MASTER_PORT>`` (the job's own store: no two running jobs share
  it). ``$PCCL_AIO_PEER_GROUP`` sets the peer group of a process outside torchrun.
- The run secret (``$PCCL_AIO_SECRET_FILE``, ``$PCCL_AIO_SECRET``) and TLS
  (``$PCCL_AIO_TLS_CERT``, ``_KEY``, ``_CA``) are read as every communicator reads them.

A variable that is malformed raises ``InvalidUsageError`` naming it. Pure: reads only the
mapping it is given.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from ..._errors import InvalidUsageError
from ..._wire.address import parse_address

__all__ = ["DEFAULT_PORT", "MASTER_ENV", "from_environ"]

MASTER_ENV: Final = "PCCL_AIO_MASTER"
PORT_ENV: Final = "PCCL_AIO_MASTER_PORT"
REPLICA_ENV: Final = "PCCL_AIO_REPLICA"
GROUP_ENV: Final = "PCCL_AIO_PEER_GROUP"
DEFAULT_PORT: Final = 48148


def from_environ(env: Mapping[str, str]) -> tuple[list[str], dict[str, Any]]:
    """The master addresses and the ``Communicator`` options ``env`` names (see the
    module); ``InvalidUsageError`` for a missing master or a malformed variable."""
    return _masters(env), _membership(env)


def _masters(env: Mapping[str, str]) -> list[str]:
    named = env.get(MASTER_ENV, "").strip()
    if named:
        masters = [m.strip() for m in named.split(",")]
        for m in masters:
            parse_address(m, f"${MASTER_ENV}'s")
        return masters
    host = env.get("MASTER_ADDR", "").strip()
    if not host:
        raise InvalidUsageError(
            f"no master named: set ${MASTER_ENV}=host:port (the address `python -m "
            f"pccl_aio.master` listens at), or $MASTER_ADDR (with ${PORT_ENV}, default "
            f"{DEFAULT_PORT}) for a master on that host")
    port = _int(env, PORT_ENV, DEFAULT_PORT, 1, 65535)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    parse_address(address, f"$MASTER_ADDR's (with ${PORT_ENV})")
    return [address]


def _membership(env: Mapping[str, str]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if all(name in env for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK")):
        world = _int(env, "WORLD_SIZE", 1, 1, 1024)
        rank = _int(env, "RANK", 0, 0, world - 1)
        if world > 1:
            run = env.get("TORCHELASTIC_RUN_ID", "").strip()
            if not run or run == "none":
                run = f"{env.get('MASTER_ADDR', '')}:{env.get('MASTER_PORT', '')}"
            replica = env.get(REPLICA_ENV, "").strip() or f"torchrun:{run}"
            options.update(replica=replica, replica_size=world, peer_group=rank)
    if GROUP_ENV in env:
        options["peer_group"] = _int(env, GROUP_ENV, 0, 0, 2**32 - 1)
    return options


def _int(env: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    text = env.get(name, "").strip()
    if not text:
        return default
    if not text.isdigit() or not low <= int(text) <= high:
        raise InvalidUsageError(f"${name} must be an integer in {low}..{high}, not {text!r}")
    return int(text)
