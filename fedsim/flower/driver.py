"""The wrapped strategy's own `start()`, driven by the wrapper's rounds.

`UserLevelDP.start` runs the wrapped strategy's own `start()` (Flower's, or the app's override
that writes results files, saves checkpoints and logs), bound to a driver: an instance of a
subclass of the strategy's class that shares the strategy's attributes (one `__dict__`) and whose
round methods (`configure_train`, `aggregate_train`, `configure_evaluate`, `aggregate_evaluate`,
`summary`) are the wrapper's. So `self.…` inside the app's `start()` reads and writes the
strategy's own state, `super().start(…)` works, and every round goes through the wrapper.

The strategy's code only ever sees a guarded grid: it lists the nodes, and it sends only the
messages the wrapper issued for the round, once each. The train replies come back sealed: the
app's `start()` can pass them to `self.aggregate_train` but cannot read them (they carry the
users' own models, outside ε).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from flwr.app import Message, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fedsim.errors import FedsimError

#: The methods the wrapper answers for the strategy while its `start()` runs.
ROUND_METHODS = ("configure_train", "aggregate_train", "configure_evaluate", "aggregate_evaluate", "summary")

#: Attributes of the wrapped strategy that the wrapper does not pass on: they would describe a
#: sampling, clipping or noise that the wrapper replaces (read them on `dp.strategy` if needed).
WITHHELD = frozenset(
    {"fraction_train", "min_train_nodes", "noise_multiplier", "clipping_norm", "clip_norm", "num_sampled_nodes"}
)


def refuse_unsafe(strategy: Any) -> None:
    """Raise `FedsimError` (one line, why) for a strategy the wrapper cannot keep safe (the wrapper
    itself refuses a strategy that is already wrapped)."""
    if not isinstance(strategy, Strategy):
        raise FedsimError(
            f"UserLevelDP wraps a Flower Message-API strategy (flwr.serverapp.strategy.Strategy); got "
            f"{type(strategy).__name__}"
        )
    shadowing = sorted(set(vars(strategy)) & {*ROUND_METHODS, "start"})
    if shadowing:
        raise FedsimError(
            f"the strategy has its own instance attribute {shadowing[0]!r}, which would bypass the wrapper's "
            "rounds; define it on the class instead"
        )
    if type(strategy).__getattribute__ is not object.__getattribute__:
        raise FedsimError(
            f"{type(strategy).__name__} overrides __getattribute__, so the wrapper cannot be sure its rounds run; "
            "wrap a strategy without it"
        )


def driver_of(strategy: Strategy, dp: Any) -> Strategy:
    """`strategy` as its own `start()` should see it: same class (a subclass), same attributes,
    the wrapper `dp`'s round methods.

    Raises `FedsimError` before round 1 when the class cannot be subclassed this way."""
    cls = type(strategy)

    def answer(name: str) -> Any:
        def method(_self: Any, *args: Any, **kwargs: Any) -> Any:
            return getattr(dp, name)(*args, **kwargs)

        method.__name__ = name
        return method

    try:
        meta: Any = type(cls)
        driven = meta(f"UserLevelDP[{cls.__name__}]", (cls,), {n: answer(n) for n in ROUND_METHODS})
        driver = object.__new__(driven)
        driver.__dict__ = strategy.__dict__  # one state: the app's start() writes the strategy's attributes
    except (TypeError, AttributeError) as err:
        raise FedsimError(
            f"cannot run {cls.__name__}.start() under the wrapper ({err}); wrap a plain subclass"
        ) from err
    return driver


class SealedReplies:
    """A round's train replies, readable only by the wrapper's `aggregate_train`."""

    __slots__ = ("_replies",)

    def __init__(self, replies: Iterable[Message]) -> None:
        self._replies = list(replies)

    def __iter__(self) -> Iterator[Message]:
        raise FedsimError(
            "the nodes' train replies are sealed: they carry the users' own models, outside the guarantee; "
            "pass them unread to self.aggregate_train (side_statistics=True passes the nodes' metrics on)"
        )

    def __len__(self) -> int:
        raise FedsimError("the nodes' train replies are sealed; pass them unread to self.aggregate_train")

    def open(self) -> list[Message]:
        """The replies (the wrapper's use only)."""
        return self._replies


def unseal(replies: Iterable[Message] | SealedReplies) -> Iterable[Message]:
    return replies.open() if isinstance(replies, SealedReplies) else replies


class GuardedGrid(Grid):
    """The grid as the wrapped strategy's code sees it.

    Parameters
    ----------
    grid : flwr.serverapp.Grid
        The real Flower grid.
    outbox : dict[str, list[Message]]
        The wrapper's messages of the round, by kind (`train`, `evaluate`); a send takes them
        out, so each is sent once.
    """

    def __init__(self, grid: Any, outbox: dict[str, list[Message]]) -> None:
        self.grid = grid
        self._outbox = outbox

    def get_node_ids(self) -> Iterable[int]:
        return self.grid.get_node_ids()

    @property
    def run(self) -> Any:
        return self.grid.run

    def create_message(
        self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str, ttl: float | None = None
    ) -> Message:
        return self.grid.create_message(content, message_type, dst_node_id, group_id, ttl)

    def set_run(self, run: Any) -> None:
        raise FedsimError("under UserLevelDP the strategy cannot change the grid's run")

    def _kind(self, messages: list[Message]) -> str:
        for kind, issued in self._outbox.items():
            ids = {id(m) for m in issued}
            if messages and all(id(m) in ids for m in messages):
                self._outbox[kind] = [m for m in issued if id(m) not in {id(x) for x in messages}]
                return kind
        if not messages:
            return "none"
        raise FedsimError(
            f"the strategy sent a message the wrapper did not issue this round (to node {messages[0].metadata.dst_node_id}, "
            "or a second time): under UserLevelDP only the wrapper's round messages reach the nodes"
        )

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Any:  # sealed
        msgs = list(messages)
        kind = self._kind(msgs)
        replies = self.grid.send_and_receive(msgs, timeout=timeout) if msgs else []
        return SealedReplies(replies) if kind == "train" else list(replies)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        raise FedsimError("under UserLevelDP the strategy reaches the nodes through grid.send_and_receive only")

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        raise FedsimError("under UserLevelDP the strategy reaches the nodes through grid.send_and_receive only")


def real_grid(grid: Any) -> Any:
    """The Flower grid behind a `GuardedGrid` (or `grid` itself)."""
    return grid.grid if isinstance(grid, GuardedGrid) else grid
