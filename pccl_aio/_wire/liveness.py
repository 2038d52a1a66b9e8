"""The liveness rule both ends of a master connection follow: each side sends a beacon (a
peer's ``Heartbeat``, the master's ``MasterHeartbeat``) every ``heartbeat_interval``, by
default a third of ``heartbeat_timeout``, and judges the other's silence every ``period``
(``CHECK``, or the interval or a quarter of the timeout if shorter), so that silence is noticed
within a period of the timeout whatever the interval."""

from __future__ import annotations

__all__ = ["CHECK", "due", "interval", "period"]

CHECK = 0.5  # s between checks of the other side's silence


def interval(timeout: float, given: float | None) -> float:
    """The beacon interval: ``given``, or a third of ``timeout`` (the ratio of ZooKeeper's
    and Kafka's clients: two beacons may be late before the timeout)."""
    return timeout / 3 if given is None else given


def period(beacon_interval: float, timeout: float) -> float:
    """Seconds between two checks of the other side's silence."""
    return min(CHECK, beacon_interval, timeout / 4)


def due(now: float, last: float, beacon_interval: float, check_period: float) -> bool:
    """Is a beacon due at ``now``, the last at ``last``, checks ``check_period`` apart (half
    a period early rather than a whole one late)?"""
    return now - last >= beacon_interval - check_period / 2
