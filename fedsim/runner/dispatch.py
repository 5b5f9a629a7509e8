"""Prompt message exchange in Flower's simulation engine.

Flower 1.41's simulation engine moves messages between the ServerApp and its Ray workers with
two threads: one scans the link state for pushed messages and then waits 0.1 s on the engine's
stop event (``vce_api.add_messages_to_queue``), the other stores the workers' replies in the
link state (``vce_api.put_message_into_state``); the strategy learns of a reply by pulling.
Left alone, a round starts on average 50 ms after the strategy pushed it (W2 on Ray: about
0.1 s per round against 3 ms of training per worker; ``benchmarks/throughput.py``), and ends a
poll interval after the last reply. Scanning more often costs the server CPU for the whole
round: scanning every 5 ms took about 55 ms of CPU per 2 s Stack Overflow LSTM round on the
2-core development machine, CPU the two workers then did not have.

:func:`prompt_exchange` wakes both sides instead:

- Flower's own scanning function runs with its stop event seen through :class:`WakeableEvent`,
  whose wait ends as soon as the strategy has pushed messages (the strategy calls its
  ``after_push`` hook), or the stop event is set through it, or Flower's own timeout passes. A
  pushed round is scanned at once, and no scan runs while the workers train.
- Flower's own reply-storing function runs on a view of the link state
  (:class:`NotifyingState`) whose ``store_message_res`` also sets the strategy's
  ``reply_signal``, so the strategy's wait for replies ends when a reply is stored.

Nothing else changes: the same functions, the same link state, the same messages and replies (so
the same results; the engine-equality tests check that). A stop request still ends the scan:
within Flower's own 0.1 s when the engine sets its event, at once through the view.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class WakeableEvent:
    """A view of the stop event ``event`` whose :meth:`wait` also ends when ``wake`` is set.

    Parameters
    ----------
    event : the stop event seen (``is_set``, ``set`` and the result of ``wait`` are its own).
    wake : set by the strategy after it pushes messages; cleared when a wait ends on it.
    """

    def __init__(self, event: threading.Event, wake: threading.Event) -> None:
        self._event = event
        self._wake = wake

    def is_set(self) -> bool:
        return self._event.is_set()

    def set(self) -> None:
        self._event.set()
        self._wake.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until ``wake`` is set or ``timeout`` seconds pass; return whether the stop event is set."""
        if self._wake.wait(timeout):
            self._wake.clear()
        return self._event.is_set()


class NotifyingState:
    """The link state ``state``, with ``store_message_res`` also setting ``signal``.

    Parameters
    ----------
    state : Flower's link state (every other attribute is its own).
    signal : set after each reply is stored.
    """

    def __init__(self, state: Any, signal: threading.Event) -> None:
        self._state = state
        self._signal = signal

    def store_message_res(self, message: Any) -> Any:
        stored = self._state.store_message_res(message)
        self._signal.set()
        return stored

    def __getattr__(self, name: str) -> Any:
        return getattr(self._state, name)


def _woken_scan(scan: Callable[..., Any], wake: threading.Event) -> Callable[..., Any]:
    """Flower's ``scan(state, queue, nodes_mapping, f_stop)`` with ``f_stop`` seen through
    :class:`WakeableEvent`."""

    def prompt_scan(state: Any, queue: Any, nodes_mapping: Any, f_stop: threading.Event) -> Any:
        return scan(state, queue, nodes_mapping, WakeableEvent(f_stop, wake))

    prompt_scan.__wrapped__ = scan  # type: ignore[attr-defined]
    return prompt_scan


def _notifying_store(store: Callable[..., Any], signal: threading.Event) -> Callable[..., Any]:
    """Flower's ``store(state, queue, f_stop)`` on a :class:`NotifyingState` view."""

    def prompt_store(state: Any, queue: Any, f_stop: threading.Event) -> Any:
        return store(NotifyingState(state, signal), queue, f_stop)

    prompt_store.__wrapped__ = store  # type: ignore[attr-defined]
    return prompt_store


@contextmanager
def prompt_exchange(strategy: Any) -> Iterator[None]:
    """Within the block, Flower's simulation engine scans for pushed messages when ``strategy``
    pushes them (its ``after_push`` hook), and tells ``strategy`` of every stored reply (its
    ``reply_signal``). Flower's functions and the strategy's hooks are restored after."""
    from flwr.server.superlink.fleet.vce import vce_api

    pushed, replied = threading.Event(), threading.Event()
    scan, store = vce_api.add_messages_to_queue, vce_api.put_message_into_state
    hooks = (getattr(strategy, "after_push", None), getattr(strategy, "reply_signal", None))
    vce_api.add_messages_to_queue = _woken_scan(scan, pushed)
    vce_api.put_message_into_state = _notifying_store(store, replied)
    strategy.after_push, strategy.reply_signal = pushed.set, replied
    try:
        yield
    finally:
        vce_api.add_messages_to_queue, vce_api.put_message_into_state = scan, store
        strategy.after_push, strategy.reply_signal = hooks
