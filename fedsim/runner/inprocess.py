"""The in-process engine (``sim.engine = "inprocess"``): a Flower ``Grid`` whose nodes are
the ClientApp called directly in the server's process.

No Ray, no serialization, no polling: ``send_and_receive`` calls the ClientApp once per
message, in order, and returns the replies. The strategy and the ClientApp are exactly the
code that runs on Ray and on a Deployment Engine; results are identical to the Ray engine for
the same seed (every user's update depends only on the seed, the round and the user, and the
strategy sums replies in a canonical order), which ``tests/run/test_engines.py`` checks.

A ClientApp exception becomes an error reply, as the Ray engine makes it. A reply that took
longer than the round timeout is dropped, like a reply that arrives too late on Ray (the call
itself cannot be interrupted in-process).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any
from uuid import uuid4

from flwr.app import Context, Error, Message, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

#: Flower's error code for "the ClientApp raised an exception".
CLIENT_APP_RAISED = 0
RUN_ID = 1


class InProcessGrid(Grid):
    """A Grid of ``num_nodes`` virtual nodes that run ``client_app`` in this process.

    Parameters
    ----------
    client_app : the Flower ``ClientApp``.
    num_nodes : virtual SuperNodes (node ids ``1001 ..``).
    node_config : each node's ``node_config`` (default: Flower's simulation keys
        ``partition-id`` and ``num-partitions``).
    stop : an event that, once set, makes :meth:`push_messages` deliver no further message
        (a stop request, :mod:`fedsim.interrupt`); default None (never).
    """

    #: replies are computed inside ``push_messages``: callers use :meth:`send_and_receive`.
    synchronous = True

    def __init__(
        self,
        client_app: Any,
        num_nodes: int,
        node_config: list[dict[str, Any]] | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        if num_nodes < 1:
            raise ValueError("num_nodes must be ≥ 1")
        self.client_app = client_app
        self.node_ids = [1001 + i for i in range(num_nodes)]
        configs = node_config or [{"partition-id": i, "num-partitions": num_nodes} for i in range(num_nodes)]
        self.contexts = {
            n: Context(run_id=RUN_ID, node_id=n, node_config=dict(c), state=RecordDict(), run_config={})
            for n, c in zip(self.node_ids, configs)
        }
        self._run: Any = None
        self._replies: dict[str, Message] = {}
        self.stop = stop

    # Grid's abstract interface ------------------------------------------------------------
    def set_run(self, run: Any) -> None:
        self._run = run

    @property
    def run(self) -> Any:
        return self._run

    def create_message(
        self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str, ttl: float | None = None
    ) -> Message:
        return Message(content, dst_node_id=dst_node_id, message_type=message_type, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.node_ids)

    def _call(self, msg: Message) -> Message:
        try:
            return self.client_app(msg, self.contexts[msg.metadata.dst_node_id])
        except Exception as e:
            return Message(Error(code=CLIENT_APP_RAISED, reason=f"{type(e).__name__}: {e}"), reply_to=msg)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Deliver each message now (the ClientApp runs in this call); its reply waits for
        :meth:`pull_messages`. Messages to unknown nodes get no id and no reply."""
        ids = []
        for msg in messages:
            if self.stop is not None and self.stop.is_set():
                break
            msg.metadata.__dict__["_message_id"] = str(uuid4())
            if msg.metadata.dst_node_id not in self.contexts:
                continue
            self._replies[msg.metadata.message_id] = self._call(msg)
            ids.append(msg.metadata.message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """The replies to ``message_ids`` that are waiting (each is returned once)."""
        return [self._replies.pop(i) for i in message_ids if i in self._replies]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        """Call the ClientApp for each message in turn; return the replies (errors as error
        replies). A reply that took longer than ``timeout`` seconds is dropped."""
        replies = []
        for msg in messages:
            t0 = time.perf_counter()
            ids = list(self.push_messages([msg]))
            late = timeout is not None and time.perf_counter() - t0 > timeout
            for reply in self.pull_messages(ids):
                if not late:
                    replies.append(reply)
        return replies


class task_identity:
    """Context manager: the process-wide Flower task identity of an in-process run (the server
    side creates messages as the SuperLink node), restored afterwards."""

    def __enter__(self) -> task_identity:
        self._saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = RUN_ID, SUPERLINK_NODE_ID, 0
        return self

    def __exit__(self, *exc: object) -> None:
        TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = self._saved
