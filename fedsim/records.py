"""Typed reads of Flower message records (Flower glue: imports Flower).

A Flower record holds a union of value types (an ``Array``, numbers, strings, lists of them);
these helpers read one value as the type the protocol (:mod:`fedsim.protocol`) says it has,
and return None where it does not — so a malformed reply is dropped by its reader instead of
raising inside the server. The ClientApp uses the raising variants: the server's messages are
well formed, and a malformed one is an error reply.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord


def int_list(value: Any) -> list[int] | None:
    """``value`` as a list of ints, or None when it is not a list of integral numbers."""
    if not isinstance(value, list):
        return None
    try:
        return [int(v) for v in value]
    except (TypeError, ValueError, OverflowError):
        return None


def float_list(value: Any) -> list[float] | None:
    """``value`` as a list of floats, or None when it is not a list of numbers."""
    if not isinstance(value, list):
        return None
    try:
        return [float(v) for v in value]
    except (TypeError, ValueError, OverflowError):
        return None


def array_numpy(record: ArrayRecord | None, key: str) -> np.ndarray | None:
    """The ``key`` array of ``record`` as numpy, or None when it is missing or not an Array."""
    if record is None or key not in record:
        return None
    value = record[key]
    return value.numpy() if isinstance(value, Array) else None


def config(msg: Message, name: str) -> ConfigRecord:
    """The ConfigRecord ``name`` of ``msg`` (KeyError when it has none)."""
    return msg.content.config_records[name]


def metrics(msg: Message, name: str) -> MetricRecord | None:
    """The MetricRecord ``name`` of ``msg``, or None."""
    return msg.content.metric_records.get(name)


def need_int(value: Any, what: str) -> int:
    """``value`` as an int; TypeError naming ``what`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{what}: expected a number, got {type(value).__name__}")
    return int(value)


def need_float(value: Any, what: str) -> float:
    """``value`` as a float; TypeError naming ``what`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{what}: expected a number, got {type(value).__name__}")
    return float(value)


def need_ints(value: Any, what: str) -> list[int]:
    """``value`` as a list of ints; TypeError naming ``what`` otherwise."""
    out = int_list(value)
    if out is None:
        raise TypeError(f"{what}: expected a list of integers, got {type(value).__name__}")
    return out


def need_array(record: ArrayRecord | None, key: str) -> np.ndarray:
    """The ``key`` array of ``record`` as numpy; KeyError when it is missing."""
    out = array_numpy(record, key)
    if out is None:
        raise KeyError(f"array {key!r} missing from the message")
    return out
