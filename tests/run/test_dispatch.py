"""Round latency on the Ray engine: Flower's message scan with a capped wait
(fedsim/run/dispatch.py), and the strategy's reply polling, which backs off from 1 ms and
starts over after every reply. What is checked is behaviour (which waits are asked for, what
is delivered, that a stop still stops), not timings."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from fedsim.run.dispatch import DISPATCH_POLL_S, CappedWaitEvent, prompt_dispatch
from strategies.user_dp import UserLevelDPStrategy


class RecordingEvent:
    def __init__(self) -> None:
        self.waits: list[float | None] = []
        self.flag = False

    def is_set(self) -> bool:
        return self.flag

    def set(self) -> None:
        self.flag = True

    def wait(self, timeout=None) -> bool:
        self.waits.append(timeout)
        return self.flag


def test_capped_wait_caps_every_wait_and_sees_the_events_own_state():
    inner = RecordingEvent()
    capped = CappedWaitEvent(inner)  # type: ignore[arg-type]
    assert capped.wait(0.1) is False and capped.wait(0.001) is False and capped.wait() is False
    assert inner.waits == [DISPATCH_POLL_S, 0.001, DISPATCH_POLL_S]
    capped.set()
    assert inner.flag and capped.is_set() and capped.wait(0.1) is True
    real = threading.Event()
    view = CappedWaitEvent(real, cap=0.5)
    threading.Timer(0.01, real.set).start()
    assert view.wait(60.0) is True  # a stop set during the wait ends it


def test_prompt_dispatch_runs_flowers_own_scan_with_the_capped_event_and_restores_it():
    from flwr.server.superlink.fleet.vce import vce_api

    original = vce_api.add_messages_to_queue
    calls = []
    with prompt_dispatch():
        patched = vce_api.add_messages_to_queue
        assert patched is not original and patched.__wrapped__ is original
        stop = threading.Event()
        stop.set()  # Flower's scan returns at once when the engine is stopping
        patched("state", "queue", {}, stop)
        calls.append("ran")
    assert vce_api.add_messages_to_queue is original and calls == ["ran"]
    with pytest.raises(RuntimeError), prompt_dispatch():
        raise RuntimeError("the engine failed")
    assert vce_api.add_messages_to_queue is original  # restored on an error too


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


def _strategy(stop_after: int | None = None, grid: FakeGrid | None = None):
    return SimpleNamespace(
        round_timeout=1e9,
        pull_interval=0.05,
        pull_interval_min=0.001,
        stopping=lambda: stop_after is not None and grid is not None and grid.pulls >= stop_after,
    )


def test_reply_polling_backs_off_and_starts_over_after_each_reply(monkeypatch):
    waits: list[float] = []
    monkeypatch.setattr("strategies.user_dp.time.sleep", waits.append)
    grid = FakeGrid(at=[9, 10, 12])
    got = UserLevelDPStrategy.exchange(_strategy(), grid, ["m0", "m1", "m2"])  # type: ignore[arg-type]
    assert sorted(m.metadata.reply_to_message_id for m in got) == ["0", "1", "2"]
    assert grid.pulls == 12 and len(waits) == 11
    # 2, 4, 8, 16, 32 ms, then the 50 ms ceiling; after each reply 1 ms again
    assert waits[:8] == [0.002, 0.004, 0.008, 0.016, 0.032, 0.05, 0.05, 0.05]
    assert waits[8] == 0.001 and waits[9] == 0.001 and waits[10] == 0.002
    assert max(waits) == 0.05


def test_reply_polling_still_stops_on_a_stop_request(monkeypatch):
    monkeypatch.setattr("strategies.user_dp.time.sleep", lambda s: None)
    grid = FakeGrid(at=[100, 100])
    assert UserLevelDPStrategy.exchange(_strategy(stop_after=3, grid=grid), grid, ["a", "b"]) is None  # type: ignore[arg-type]
    assert grid.pulls == 3
