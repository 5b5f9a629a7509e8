"""Round latency on the Ray engine (fedsim/runner/dispatch.py): Flower's message scan wakes when
the strategy pushes (and otherwise waits Flower's own 0.1 s), Flower's reply store signals the
strategy, and the strategy's wait for replies ends on that signal; without a signal it polls,
backing off from 1 ms and starting over after every reply. What is checked is behaviour (which
waits are asked for, what is delivered, that a stop still stops), not timings."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from fedsim.runner.dispatch import NotifyingState, WakeableEvent, prompt_exchange
from fedsim.strategies.user_dp import UserLevelDPStrategy


def test_wakeable_wait_ends_on_a_push_and_reports_the_stop_events_own_state():
    stop, wake = threading.Event(), threading.Event()
    view = WakeableEvent(stop, wake)
    t0 = time.monotonic()
    assert view.wait(0.05) is False and time.monotonic() - t0 >= 0.04  # nothing pushed: Flower's own wait
    threading.Timer(0.02, wake.set).start()
    t0 = time.monotonic()
    assert view.wait(60.0) is False and time.monotonic() - t0 < 30  # a push ends the wait
    assert not wake.is_set()  # and is consumed: the next wait waits again
    view.set()  # a stop through the view stops the engine's event and ends the wait at once
    assert stop.is_set() and view.is_set() and view.wait(60.0) is True


def test_a_stop_set_on_flowers_own_event_ends_the_scan_within_its_timeout():
    stop, wake = threading.Event(), threading.Event()
    view = WakeableEvent(stop, wake)
    threading.Timer(0.01, stop.set).start()
    assert view.wait(0.2) is True  # seen when the (Flower's 0.1 s) wait times out


def test_notifying_state_stores_then_signals_and_is_the_state_otherwise():
    stored = []
    state = SimpleNamespace(store_message_res=lambda m: stored.append(m) or True, num_nodes=lambda: 3)
    signal = threading.Event()
    view = NotifyingState(state, signal)
    assert view.num_nodes() == 3 and not signal.is_set()
    assert view.store_message_res("reply") is True
    assert stored == ["reply"] and signal.is_set()


def test_prompt_exchange_wraps_flowers_own_functions_and_the_hooks_and_restores_them():
    from flwr.server.superlink.fleet.vce import vce_api

    scan, store = vce_api.add_messages_to_queue, vce_api.put_message_into_state
    strategy = SimpleNamespace(after_push=None, reply_signal=None)
    with prompt_exchange(strategy):
        assert vce_api.add_messages_to_queue.__wrapped__ is scan  # type: ignore[attr-defined]
        assert vce_api.put_message_into_state.__wrapped__ is store  # type: ignore[attr-defined]
        assert callable(strategy.after_push) and isinstance(strategy.reply_signal, threading.Event)
        stop = threading.Event()
        stop.set()  # Flower's scan and store both return at once when the engine is stopping
        vce_api.add_messages_to_queue("state", "queue", {}, stop)
        vce_api.put_message_into_state("state", "queue", stop)
    assert (vce_api.add_messages_to_queue, vce_api.put_message_into_state) == (scan, store)
    assert strategy.after_push is None and strategy.reply_signal is None
    with pytest.raises(RuntimeError), prompt_exchange(strategy):
        raise RuntimeError("the engine failed")
    assert (vce_api.add_messages_to_queue, vce_api.put_message_into_state) == (scan, store)  # on an error too
    assert strategy.after_push is None and strategy.reply_signal is None


class FakeGrid:
    """Replies to messages ``0..n-1``: reply ``i`` becomes visible on pull number ``at[i]``."""

    def __init__(self, at: list[int]) -> None:
        self.at = at
        self.pulls = 0

    def push_messages(self, messages):
        return [str(i) for i in range(len(messages))]

    def pull_messages(self, ids):
        self.pulls += 1
        return [
            SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=str(i)))
            for i, p in enumerate(self.at)
            if p == self.pulls and str(i) in ids
        ]


def _strategy(stop_after: int | None = None, grid: FakeGrid | None = None, signal=None, after_push=None):
    return SimpleNamespace(
        round_timeout=1e9,
        pull_interval=0.05,
        pull_interval_min=0.001,
        stopping=lambda: stop_after is not None and grid is not None and grid.pulls >= stop_after,
        reply_signal=signal,
        after_push=after_push,
    )


def test_reply_polling_backs_off_and_starts_over_after_each_reply(monkeypatch):
    waits: list[float] = []
    monkeypatch.setattr("fedsim.strategies.user_dp.time.sleep", waits.append)
    grid = FakeGrid(at=[9, 10, 12])
    got = UserLevelDPStrategy.exchange(_strategy(), grid, ["m0", "m1", "m2"])  # type: ignore[arg-type]
    assert sorted(m.metadata.reply_to_message_id for m in got) == ["0", "1", "2"]
    assert grid.pulls == 12 and len(waits) == 11
    # 2, 4, 8, 16, 32 ms, then the 50 ms ceiling; after each reply 1 ms again
    assert waits[:8] == [0.002, 0.004, 0.008, 0.016, 0.032, 0.05, 0.05, 0.05]
    assert waits[8] == 0.001 and waits[9] == 0.001 and waits[10] == 0.002
    assert max(waits) == 0.05


def test_reply_polling_still_stops_on_a_stop_request(monkeypatch):
    monkeypatch.setattr("fedsim.strategies.user_dp.time.sleep", lambda s: None)
    grid = FakeGrid(at=[100, 100])
    assert UserLevelDPStrategy.exchange(_strategy(stop_after=3, grid=grid), grid, ["a", "b"]) is None  # type: ignore[arg-type]
    assert grid.pulls == 3


class RecordingSignal:
    """A reply signal that records the waits asked of it (and never blocks)."""

    def __init__(self) -> None:
        self.waits: list[float] = []
        self.clears = 0

    def clear(self) -> None:
        self.clears += 1

    def wait(self, timeout=None) -> bool:
        self.waits.append(timeout)
        return True


def test_with_a_reply_signal_the_wait_is_on_the_signal_and_after_push_runs_once(monkeypatch):
    def no_sleep(_):
        raise AssertionError("with a reply signal the strategy must not sleep")

    monkeypatch.setattr("fedsim.strategies.user_dp.time.sleep", no_sleep)
    grid = FakeGrid(at=[3, 5])
    pushes: list[int] = []
    signal = RecordingSignal()
    strategy = _strategy(signal=signal, after_push=lambda: pushes.append(grid.pulls))
    got = UserLevelDPStrategy.exchange(strategy, grid, ["m0", "m1"])  # type: ignore[arg-type]
    assert sorted(m.metadata.reply_to_message_id for m in got) == ["0", "1"]
    assert pushes == [0]  # once, after the push and before the first pull
    assert grid.pulls == 5 and signal.waits == [0.05] * 4 and signal.clears == 5


def test_a_real_signal_ends_the_wait_when_a_reply_is_stored():
    signal = threading.Event()
    grid = FakeGrid(at=[2])
    strategy = _strategy(signal=signal)
    strategy.pull_interval = 30.0  # only the signal can end the wait in time
    threading.Timer(0.05, signal.set).start()
    t0 = time.monotonic()
    got = UserLevelDPStrategy.exchange(strategy, grid, ["m0"])  # type: ignore[arg-type]
    assert len(got) == 1 and time.monotonic() - t0 < 20
