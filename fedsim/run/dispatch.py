"""Prompt message dispatch in Flower's simulation engine.

Flower 1.41's simulation engine hands the messages a ServerApp pushes to its Ray workers from
one thread that scans the link state and then waits 0.1 s on the engine's stop event
(``vce_api.add_messages_to_queue``). Every round therefore starts, on average, 50 ms after the
strategy pushed it. On a short round that wait is most of the round (W2 on Ray: about 0.1 s
per round against 3 ms of training per worker; ``benchmarks/throughput.py``).

:func:`prompt_dispatch` runs Flower's own scanning function with the stop event seen through
:class:`CappedWaitEvent`, which caps every wait at :data:`DISPATCH_POLL_S`. Nothing else
changes: the same function, the same link state, the same messages and replies (so the same
results; the engine-equality tests check that); a stop request still ends the scan, since the
capped wait returns as soon as the event is set.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

#: seconds between two scans of the link state for pushed messages (Flower's own: 0.1).
DISPATCH_POLL_S = 0.005


class CappedWaitEvent:
    """A view of ``event`` whose :meth:`wait` waits at most ``cap`` seconds.

    Parameters
    ----------
    event : the event seen (``is_set``, ``set`` and ``wait`` are its own).
    cap : longest wait in seconds (default :data:`DISPATCH_POLL_S`).
    """

    def __init__(self, event: threading.Event, cap: float = DISPATCH_POLL_S) -> None:
        self._event = event
        self.cap = float(cap)

    def is_set(self) -> bool:
        return self._event.is_set()

    def set(self) -> None:
        self._event.set()

    def wait(self, timeout: float | None = None) -> bool:
        """``event.wait`` for ``min(timeout, cap)`` seconds: True as soon as the event is set."""
        return self._event.wait(self.cap if timeout is None else min(float(timeout), self.cap))


def _capped(scan: Callable[..., Any]) -> Callable[..., Any]:
    """Flower's ``scan(state, queue, nodes_mapping, f_stop)`` with ``f_stop`` capped."""

    def prompt_scan(state: Any, queue: Any, nodes_mapping: Any, f_stop: threading.Event) -> Any:
        return scan(state, queue, nodes_mapping, CappedWaitEvent(f_stop))

    prompt_scan.__wrapped__ = scan  # type: ignore[attr-defined]
    return prompt_scan


@contextmanager
def prompt_dispatch() -> Iterator[None]:
    """Within the block, Flower's simulation engine scans for pushed messages every
    :data:`DISPATCH_POLL_S` seconds instead of every 0.1 s; the original is restored after."""
    from flwr.server.superlink.fleet.vce import vce_api

    original = vce_api.add_messages_to_queue
    vce_api.add_messages_to_queue = _capped(original)
    try:
        yield
    finally:
        vce_api.add_messages_to_queue = original
