"""The user-level DP strategy on Flower's Message API.

Round ``t`` (docs/algorithms.md §1): the sampler picks ``S_t`` from the
participation scheme; users are assigned to worker nodes by expected cost and
each node gets one message with the global parameters and its users; each reply
(the sum of that node's users' clipped updates) is validated and re-clipped by
:class:`~fedsim.server.aggregation.UpdateAggregator`; :class:`~fedsim.server.step.DPServer`
adds the noise row, divides by ``K̄``, steps the server optimizer and records ε.
Then the metrics line, the checkpoint and the progress line.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fedsim import protocol, records
from fedsim.errors import FedsimError
from fedsim.server.aggregation import UpdateAggregator
from fedsim.server.sampling import CohortSampler
from fedsim.server.step import DPServer
from fedsim.training.scheduling import assign_users


def _as_int(v: Any) -> int:
    try:
        return int(v)
    except (TypeError, ValueError, OverflowError):
        return 0


def _as_float(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError, OverflowError):
        return float("nan")


@dataclass
class Screened:
    """The outcome of :func:`screen_replies`.

    valid : ``(assigned users, update array or None, metrics record, message)`` per reply that
        passed the node-level checks (its array is checked by the aggregator).
    seen : the nodes that replied at all (the others are counted ``missing``).
    drops : ``(reason, users dropped)`` for every rejected reply, in arrival order.
    """

    valid: list[tuple[list[int], Any, Any, Message]] = field(default_factory=list)
    seen: set[int] = field(default_factory=set)
    drops: list[tuple[str, int]] = field(default_factory=list)


def screen_replies(
    replies: Iterable[Message],
    assigned: dict[int, list[int]],
    sent: dict[int, list[int]],
    server_round: int,
    destinations: dict[str, int] | None = None,
) -> Screened:
    """Node-level checks of one round's replies, a pure function of its arguments.

    A reply is dropped when its node was sent nothing this round (``unexpected_users``, 0 users),
    when it is a second reply of a node (``duplicate``, 0), when it carries an error
    (``client_error``), when it answers another round's message (``stale``), or when the user ids
    it reports are not the ones sent to that node (``unexpected_users``); the last three drop the
    node's assigned users. ``assigned``/``sent``: node → global user ids / the ids as sent.
    ``destinations``: message id → the node it was sent to. An error reply is the node's it
    answers: Flower answers for an unreachable node with an error reply whose source is the
    SuperLink itself, which would otherwise count as a stranger's reply and the node as missing.
    """
    out = Screened()
    for msg in replies:
        node = msg.metadata.src_node_id
        if msg.has_error() and destinations is not None:
            node = destinations.get(msg.metadata.reply_to_message_id, node)
        users = assigned.get(node)
        if users is None:  # a node this round sent nothing to (its users were not sampled)
            out.drops.append(("unexpected_users", 0))
            continue
        if node in out.seen:  # a second reply from the same node: the first one counts
            out.drops.append(("duplicate", 0))
            continue
        out.seen.add(node)
        if msg.has_error():
            out.drops.append(("client_error", len(users)))
            continue
        if msg.metadata.group_id != f"train-{server_round - 1}":
            out.drops.append(("stale", len(users)))  # a reply to another round's message
            continue
        metrics = msg.content.metric_records.get(protocol.METRICS)
        reported = records.int_list(metrics.get("user_ids", [])) if metrics is not None else None
        if reported is None or reported != sent[node]:
            out.drops.append(("unexpected_users", len(users)))
            continue
        out.valid.append((users, UserLevelDPStrategy._extract_update(msg), metrics, msg))
    return out


_LOG = logging.getLogger("fedsim")


def _reply_traceback(msg: Message) -> str | None:
    """The traceback a train reply carries of a user whose code raised (None: none)."""
    try:
        rec = msg.content.config_records.get(protocol.FAILURE)
        return None if rec is None else str(rec["traceback"])[-protocol.TRACEBACK_CHARS :]
    except Exception:  # a malformed record is no traceback
        return None


@dataclass
class RoundStats:
    """Side statistics summed over one round's accepted replies, and the server-EF residual sum.

    ``centred`` is Σ(b_i − ½) with b_i = 1[‖Δ_i‖ ≤ c_t] over accepted users (adaptive clipping).
    """

    losses: list[float] = field(default_factory=list)
    examples: int = 0
    clipped: int = 0
    failed_users: int = 0
    nonfinite_users: int = 0
    code_failed_users: int = 0
    #: the first traceback a reply carried of a user whose code (model, loss, hook) raised.
    traceback: str | None = None
    centred: float = 0.0
    residual: Any = None

    def add_metrics(self, metrics: Any, m: int) -> None:
        """Add one accepted reply's metrics for its ``m`` users (counts are clamped to [0, m])."""
        self.losses.extend(v for v in (_as_float(x) for x in metrics.get("user_loss", [])) if np.isfinite(v))
        self.examples += int(sum(metrics.get("user_examples", [])))
        self.failed_users += min(max(_as_int(metrics.get("failed_users", 0)), 0), m)
        self.nonfinite_users += min(max(_as_int(metrics.get("nonfinite_users", 0)), 0), m)
        self.code_failed_users += min(max(_as_int(metrics.get("code_failed_users", 0)), 0), m)
        n_clip = min(max(_as_int(metrics.get("num_clipped", 0)), 0), m)  # guard: 0 ≤ · ≤ m
        self.clipped += n_clip
        self.centred += m / 2.0 - n_clip


class UserLevelDPStrategy(Strategy):
    """User-level DP with a fixed denominator, on any noise mechanism and server optimizer.

    Parameters
    ----------
    server : the DP server state (parameters, noise, optimizer, ledger).
    sampler : cohort sampler honouring the run's participation scheme.
    task_json : the worker task (data, model, local training), sent with every message.
    train_costs : expected local cost per user (indexed by user), for scheduling.
    rounds : total rounds ``n``.
    eval_users : users whose test samples the global model is evaluated on.
    eval_costs : evaluation cost per user (indexed by user).
    eval_every : evaluate every this many rounds (0: only after the last round).
    eval_max_examples : test samples per user in evaluation.
    round_timeout : seconds to wait for the replies of one round.
    min_nodes : wait until this many SuperNodes are connected before the first round.
    min_valid_replies : fewer valid replies in a round stop the run (FedsimError) before the
        noise is added; the last checkpoint stays valid, so the run can be resumed.
    on_round_end : called with (metrics row, strategy) after every round (metrics file,
        checkpoint, progress line).
    synthetic : optional simulated users with ids ``≥ synthetic.first_id`` (e.g. the privacy
        audit's canaries, :mod:`fedsim.runner.audit`): the sampler draws them like everyone else; no
        message is sent for them; ``synthetic.update_sum(user_ids, t, clip_norm, dim)`` gives
        the sum of their (already clipped) updates, which passes the same guard as a reply.
    stop : an event set by the first SIGINT/SIGTERM: the round in flight is abandoned before
        aggregation and :meth:`run` returns (default None: never).
    client_evaluations : local-training passes per user (2 for DiSK's two-point estimate); recorded
        in every metrics row. Default 1.
    ef_mode : clipping error feedback, ``none`` (default), ``client`` (users' states in
        ``client_store``, sent down and back with each message) or ``server`` (replies carry
        residual sums).
    client_store : the users' error-feedback states (:class:`fedsim.training.error_feedback.ClientStateStore`)
        for ``ef_mode = "client"``; default None.
    update_clip : the per-user bound of replies when it differs from the noise's
        ``server.clip_norm`` (server error feedback: ``c₁``); default None (the same).
    owners : deployment's global user → (node id, the node's local index), from the census
        (:func:`census`); default None (simulation: any worker trains any user).
    silo_statistics : whether the replies carry the users' training loss and examples taken
        (statistics outside any DP noise); False under example-level DP unless
        ``privacy.silo_statistics = "send"``. Default True.

    Two hooks, set by the runner after construction (both None by default): ``on_dispatch(round,
    users)`` is called before a round's train messages are pushed, with the users they ask to
    train; ``before_publish(row)`` right after a round's noise is added, before its model is sent
    anywhere (evaluation, the next round, the metrics row), with the round's training row.
    Example-level DP counts each silo asked to train in the silo ledger at dispatch, before its
    work can leave the silo, whatever happens to the round afterwards.
    """

    #: where the first traceback of each kind of failing user code is written (the run folder's
    #: failures.log; set by the runner). None: the terminal only.
    failure_log: Any = None
    #: the kinds of failure (a traceback's last line) already shown; rebound, never changed in place.
    failures_shown: frozenset[str] = frozenset()

    def __init__(
        self,
        *,
        server: DPServer,
        sampler: CohortSampler,
        task_json: str,
        train_costs: np.ndarray,
        rounds: int,
        eval_users: list[int],
        eval_costs: np.ndarray,
        eval_every: int,
        eval_max_examples: int,
        round_timeout: float,
        min_nodes: int = 1,
        min_valid_replies: int = 0,
        on_round_end: Callable[[dict[str, Any], UserLevelDPStrategy], None] | None = None,
        synthetic: Any = None,
        stop: threading.Event | None = None,
        client_evaluations: int = 1,
        ef_mode: str = "none",
        client_store: Any = None,
        update_clip: float | None = None,
        owners: dict[int, tuple[int, int]] | None = None,
        silo_statistics: bool = True,
    ) -> None:
        self.server = server
        self.sampler = sampler
        self.task_json = task_json
        self.train_costs = train_costs
        self.rounds = rounds
        self.eval_users = eval_users
        self.eval_costs = eval_costs
        self.eval_every = eval_every
        self.eval_max_examples = eval_max_examples
        self.round_timeout = round_timeout
        self.on_round_end = on_round_end
        self.min_nodes = int(min_nodes)
        self.min_valid_replies = int(min_valid_replies)
        self.synthetic = synthetic
        #: set by the first SIGINT/SIGTERM (:mod:`fedsim.interrupt`): the round in flight is
        #: abandoned before aggregation (no noise drawn) and :meth:`run` returns.
        self.stop = stop
        #: the round abandoned on a stop request, if any (None: the run ended normally).
        self.abandoned_round: int | None = None
        #: seconds between two polls for replies: from ``pull_interval_min`` after a push or a reply,
        #: doubling up to ``pull_interval`` (a reply close behind another is collected within ms).
        self.pull_interval, self.pull_interval_min = 0.05, 0.001
        #: called right after each push (the simulation engine then scans for the messages at
        #: once; :func:`fedsim.runner.dispatch.prompt_exchange`); None: nothing to tell.
        self.after_push: Callable[[], None] | None = None
        #: set by the engine whenever a reply is stored; while one is given, the wait for
        #: replies ends on it (``pull_interval`` at most) instead of sleeping. None: poll.
        self.reply_signal: threading.Event | None = None
        #: local-training passes per user (2 for DiSK two_point): recorded in every metrics row.
        self.client_evaluations = int(client_evaluations)
        #: clipping error feedback: ``none`` | ``client`` (users' states in ``client_store``,
        #: sent down and back with each message) | ``server`` (replies carry residual sums).
        self.ef_mode = ef_mode
        self.client_store: Any = client_store
        #: per-user bound of the replies when it differs from the noise's ``server.clip_norm``
        #: (server error feedback: replies are bounded by ``c₁``, the noise scales with another norm).
        self.update_clip = update_clip
        self.aggregator = UpdateAggregator(server.params.numel(), server.clip_norm, server.params.device)
        #: deployment: global user → (node id, the node's local index of that user), from the
        #: census (:func:`census`). None in simulation (any worker trains any user).
        self.owners = owners
        self.silo_statistics = bool(silo_statistics)  # False: the row says None for loss and examples
        self._assigned: dict[int, list[int]] = {}
        self._sent: dict[int, list[int]] = {}
        self._cohort: list[int] = []
        self._eval_assigned: dict[int, list[int]] = {}
        #: (parameters tensor, its version, their ArrayRecord): see :meth:`_params_record`.
        self._params_cache: tuple[torch.Tensor, int, ArrayRecord] | None = None
        #: message id → destination node of the last pushed messages (see :func:`screen_replies`).
        self._destinations: dict[str, int] = {}
        #: the hooks of the class docstring: (round, users asked to train) before the round's train
        #: messages are pushed; the round's training row after its noise, before its model leaves.
        self.on_dispatch: Callable[[int, list[int]], None] | None = None
        self.before_publish: Callable[[dict[str, Any]], None] | None = None

    # ------------------------------------------------------------------ train
    def _params_record(self) -> ArrayRecord:
        """The global model as the messages' ArrayRecord, serialized once per state of the
        parameters: the end of :meth:`aggregate_train`, the next round's train messages and its
        evaluation send the same parameters. The cache holds the tensor itself and its in-place
        version counter, which every optimizer step moves; a loaded state is a new tensor."""
        params = self.server.params
        cached = self._params_cache
        if cached is None or cached[0] is not params or cached[1] != params._version:
            record = ArrayRecord({protocol.PARAMS: Array(params.detach().cpu().numpy())})
            self._params_cache = cached = (params, params._version, record)
        return cached[2]

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        t = server_round - 1
        self._cohort = self.sampler.sample(t)
        real = self._cohort
        if self.synthetic is not None:
            real = [u for u in self._cohort if u < self.synthetic.first_id]
            self._synthetic_cohort = [u for u in self._cohort if u >= self.synthetic.first_id]
        plan = self._plan(real, self.train_costs, grid)
        self._assigned = {}
        self._sent = {}
        # c_t (moves with adaptive clipping); c₁ + c₂ with client error feedback; c₁ with server EF.
        self.aggregator.clip_norm = self.update_clip if self.update_clip is not None else self.server.clip_norm
        if self.server.track_step:  # DiSK: clients also need the previous server step d_{t−1}
            arrays = ArrayRecord(
                {
                    protocol.PARAMS: Array(self.server.params.detach().cpu().numpy()),
                    protocol.DIRECTION: Array(self._last_step().detach().cpu().numpy()),
                }
            )
        messages = []
        for node, users, sent in plan:
            self._assigned[node] = users
            self._sent[node] = sent
            cfg = ConfigRecord({"task": self.task_json, "round": t, "user_ids": sent})
            if self.server.clip_controller is not None:
                cfg["clip_norm"] = float(self.server.clip_norm)
            content = RecordDict({protocol.ARRAYS: arrays, protocol.CONFIG: cfg})
            if self.ef_mode == "client":  # the simulator hands each user its error state
                content[protocol.CLIENT_STATE] = ArrayRecord(
                    {protocol.state_key(u): Array(self.client_store.get(u)) for u in users}
                )
            messages.append(Message(content, dst_node_id=node, message_type=MessageType.TRAIN, group_id=f"train-{t}"))
        return messages

    def _last_step(self) -> torch.Tensor:
        """DiSK's ``d_{t−1}`` (kept by the server when ``track_step``)."""
        step = self.server.last_step
        if step is None:
            raise RuntimeError("the server keeps no last step (track_step is off)")
        return step

    def _plan(self, users: list[int], costs: np.ndarray, grid: Grid) -> list[tuple[int, list[int], list[int]]]:
        """``(node, global users, ids to send)`` per node that gets work. Simulation: users
        balanced by cost over the connected nodes, ids sent as they are. Deployment: each user
        goes to the node that holds it, sent as that node's local index."""
        if self.owners is None:
            nodes = sorted(grid.get_node_ids())
            return [(n, u, u) for n, u in zip(nodes, assign_users(users, costs, len(nodes))) if u]
        by_node: dict[int, list[int]] = {}
        for u in sorted(users):
            by_node.setdefault(self.owners[u][0], []).append(u)
        return [(n, us, [self.owners[u][1] for u in us]) for n, us in sorted(by_node.items())]

    @staticmethod
    def _extract_update(msg: Message) -> Any:
        try:
            rec = msg.content.array_records.get(protocol.ARRAYS)
            if rec is None or protocol.UPDATE_SUM not in rec:
                return None
            return rec[protocol.UPDATE_SUM].numpy()
        except Exception:  # undecodable array: treat as a wrong dtype
            return np.array(["undecodable"])

    def _extract_ef(self, msg: Message, users: list[int]) -> Any:
        """The reply's error-feedback payload, validated (None = malformed: drop the reply).
        ``client``: {user: new e_i}; ``server``: the residual sum; otherwise an empty dict."""
        if self.ef_mode == "none":
            return {}
        try:
            if self.ef_mode == "client":
                rec = msg.content.array_records.get(protocol.CLIENT_STATE)
                out = {u: records.array_numpy(rec, protocol.state_key(u)) for u in users}
                valid = all(v is not None and self.client_store.valid(v) for v in out.values())
                return out if valid else None
            r = records.array_numpy(msg.content.array_records.get(protocol.ARRAYS), protocol.RESIDUAL_SUM)
            if r is None or r.shape != (self.aggregator.dim,) or not np.issubdtype(r.dtype, np.floating):
                return None
            with np.errstate(over="ignore"):
                r32 = r.astype(np.float32)  # check finiteness on the array that is summed
            return r32 if bool(np.all(np.isfinite(r32))) else None
        except Exception:  # missing or undecodable payload
            return None

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Screen the replies, sum the accepted ones in a canonical order, add the noise
        (:meth:`DPServer.step`) and record the round's metrics row."""
        agg = self.aggregator
        agg.reset()
        screened = screen_replies(replies, self._assigned, self._sent, server_round, self._destinations)
        for reason, n_users in screened.drops:
            agg.drop(reason, n_users)
        stats = self._accumulate(screened.valid)
        for node, users in self._assigned.items():
            if node not in screened.seen:
                agg.drop("missing", len(users))
        self._require_enough_replies(server_round)
        self._report_code_failures(server_round, stats)
        if self.synthetic is not None and self._synthetic_cohort:
            ids = self._synthetic_cohort
            if (
                agg.add(
                    self.synthetic.update_sum(ids, server_round - 1, self.aggregator.clip_norm, agg.dim).numpy(),
                    len(ids),
                )
                is None
            ):
                stats.centred += len(ids) / 2.0  # canaries' updates have norm c: they fit
        c_t = self.server.clip_norm
        residual = stats.residual
        if self.ef_mode == "server" and residual is None:
            residual = np.zeros(agg.dim, dtype=np.float32)
        eps = self.server.step(
            agg.total,
            realized_cohort=len(self._cohort),
            centred_count=stats.centred,
            residual_sum=None if residual is None else torch.from_numpy(residual),
        )
        self._last_train = self._train_row(eps, c_t, stats)
        mr = MetricRecord({k: v for k, v in self._last_train.items() if isinstance(v, (int, float)) and v is not None})
        return self._params_record(), mr

    def _accumulate(self, valid: list[tuple[list[int], Any, Any, Message]]) -> RoundStats:
        """Add the screened replies to the aggregator in a canonical order (by assigned users,
        not arrival order: float32 addition is not associative, and runs and resumed runs must
        be bit-identical), keeping the error-feedback payloads and the side statistics."""
        agg = self.aggregator
        stats = RoundStats()
        for users, update, metrics, msg in sorted(valid, key=lambda v: v[0]):
            extra = self._extract_ef(msg, users)
            if extra is None:
                agg.drop("bad_state", len(users))
                continue
            if agg.add(update, len(users)) is not None:
                continue
            if self.ef_mode == "client":
                for u, e in extra.items():
                    self.client_store.put(u, e)
            elif self.ef_mode == "server":
                stats.residual = extra if stats.residual is None else stats.residual + extra
            stats.add_metrics(metrics, len(users))
            if stats.traceback is None:
                stats.traceback = _reply_traceback(msg)
        return stats

    def _report_code_failures(self, server_round: int, stats: RoundStats) -> None:
        """Show the first traceback of each kind of failing user code (terminal and
        `failure_log`), and stop the run before the noise when every sampled user whose reply
        arrived failed for a code reason: nothing but noise could be published."""
        if stats.traceback is not None:
            kind = stats.traceback.rstrip().splitlines()[-1] if stats.traceback.strip() else "error"
            if kind not in self.failures_shown:
                self.failures_shown = self.failures_shown | {kind}
                where = f" (also in {self.failure_log})" if self.failure_log is not None else ""
                _LOG.warning(
                    "round %d: a user's local training raised in your code%s; first traceback of %r:\n%s",
                    server_round,
                    where,
                    kind,
                    stats.traceback,
                )
                if self.failure_log is not None:
                    with open(self.failure_log, "a", encoding="utf-8") as f:
                        f.write(f"round {server_round}: {kind}\n{stats.traceback}\n")
        users = self.aggregator.accepted_users
        if users and stats.code_failed_users >= users:
            last = (stats.traceback or "").rstrip().splitlines()[-1:] or [
                "no traceback was sent (silos that withhold their records' statistics log it on their own side)"
            ]
            folder = self.failure_log.parent if self.failure_log is not None else "RUN_FOLDER"
            raise FedsimError(
                f"round {server_round}: every sampled user's local training failed in your code ({users} of "
                f"{users}): {last[0]}. The run stopped before adding noise; no privacy was spent on this round. "
                f"Fix the model, loss or client.local_update (the traceback is above"
                f"{' and in ' + str(self.failure_log) if self.failure_log is not None else ''}), "
                + (
                    f"then resume: `fedsim run --resume {folder}`."
                    if self.server.round > 0
                    else f"then start it again (no round was completed, nothing to resume: remove {folder} first)."
                )
            )

    def _require_enough_replies(self, server_round: int) -> None:
        """Stop the run before the noise when fewer than ``sim.min_valid_replies`` replies count."""
        agg = self.aggregator
        needed = min(self.min_valid_replies, len(self._assigned))
        if agg.accepted_replies < needed:
            raise FedsimError(
                f"round {server_round}: only {agg.accepted_replies} valid replies of {len(self._assigned)} "
                f"(sim.min_valid_replies = {self.min_valid_replies}; drops: "
                f"{ {k: v for k, v in agg.drop_counts().items() if v} }). The run stopped before adding "
                f"noise; no privacy was spent on this round. Fix the clients, then `fedsim run --resume`."
            )

    def _train_row(self, eps: float | None, c_t: float, stats: RoundStats) -> dict[str, Any]:
        """The round's training metrics (side statistics, :mod:`fedsim.reporting.metrics`)."""
        agg = self.aggregator
        silo = self.server.ledger.silo
        controller = self.server.clip_controller
        return {
            "epsilon": eps,
            "train_loss": float(np.mean(stats.losses)) if stats.losses and self.silo_statistics else None,
            "cohort_size": len(self._cohort),
            "accepted_updates": agg.accepted_users,
            "dropped_updates": agg.dropped_users,
            "dropped_replies": agg.dropped_replies,
            "drop_reasons": agg.drop_counts(),
            "server_reclipped": agg.server_clipped,
            "failed_users": stats.failed_users,
            "nonfinite_users": stats.nonfinite_users,
            "clipped_fraction": stats.clipped / agg.accepted_users if agg.accepted_users else None,
            "clip_norm": c_t,
            "client_evaluations_per_user": self.client_evaluations,
            "example_epsilon_max": None if silo is None else silo.max_epsilon,
            "unclipped_fraction_noisy": None if controller is None else controller.last_fraction,
            "train_examples": stats.examples if self.silo_statistics else None,
        }

    # --------------------------------------------------------------- evaluate
    def eval_due(self, server_round: int) -> bool:
        if not self.eval_users:
            return False
        if server_round == self.rounds:
            return True
        return self.eval_every > 0 and server_round % self.eval_every == 0

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        if not self.eval_due(server_round):
            return []
        self._eval_assigned = {}
        messages = []
        for node, users, sent in self._plan(self.eval_users, self.eval_costs, grid):
            self._eval_assigned[node] = users
            cfg = ConfigRecord({"task": self.task_json, "user_ids": sent, "max_examples": self.eval_max_examples})
            messages.append(
                Message(
                    RecordDict({protocol.ARRAYS: arrays, protocol.CONFIG: cfg}),
                    dst_node_id=node,
                    message_type=MessageType.EVALUATE,
                    group_id=f"evaluate-{server_round - 1}",
                )
            )
        return messages

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Sum the workers' evaluation counts (in canonical order) and derive ``eval_loss``
        (``loss_sum/loss_count``), ``eval_accuracy`` (``correct/count``), ``eval_examples`` and,
        for every ``<name>_correct``/``<name>_count`` pair, ``eval_<name>``."""
        failed = 0
        parts = []
        for msg in replies:
            node = msg.metadata.src_node_id
            m = None if msg.has_error() else msg.content.metric_records.get(protocol.METRICS)
            if (
                node not in self._eval_assigned
                or m is None
                or "count" not in m
                or "loss_sum" not in m
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in m.values())
            ):
                failed += 1
                continue
            parts.append((self._eval_assigned[node], m))
        sums: dict[str, float] = {}
        for _, m in sorted(parts, key=lambda p: p[0]):  # canonical order (bit-identical runs)
            for k in m:
                sums[k] = sums.get(k, 0.0) + _as_float(m[k])
        count = sums.get("count", 0.0)
        if count <= 0:  # no evaluated user holds a test sample: nothing to report, but the
            # replies that came back valid did not fail (None would count every one as failed)
            if not parts:
                return None
            return MetricRecord(
                {"eval_failed_replies": failed, "eval_failed_users": int(sums.get("failed_users", 0.0))}
            )
        out: dict[str, int | float | list[int] | list[float]] = {
            "eval_loss": sums["loss_sum"] / max(sums.get("loss_count", count), 1e-300),
            "eval_accuracy": sums.get("correct", 0.0) / count,
            "eval_examples": int(sums.get("examples", count)),
            "eval_failed_replies": failed,
            "eval_failed_users": int(sums.get("failed_users", 0.0)),
        }
        for k in sorted(sums):
            if k.endswith("_correct") and sums.get(k[: -len("_correct")] + "_count", 0.0) > 0:
                name = k[: -len("_correct")]
                out[f"eval_{name}"] = sums[k] / sums[name + "_count"]
        return MetricRecord(out)

    def summary(self) -> None:
        """Flower hook; the run folder holds fedsim's summary."""

    # -------------------------------------------------------------------- run
    def wait_for_nodes(self, grid: Grid, timeout: float = 300.0) -> None:
        """Block until ``min_nodes`` SuperNodes are connected (they register asynchronously)."""
        deadline = time.monotonic() + timeout
        while len(list(grid.get_node_ids())) < self.min_nodes and not self.stopping():
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"only {len(list(grid.get_node_ids()))} of {self.min_nodes} "
                    f"SuperNodes connected after {timeout:.0f} s"
                )
            time.sleep(0.05)

    def stopping(self) -> bool:
        """Whether a stop was requested (:mod:`fedsim.interrupt`)."""
        return self.stop is not None and self.stop.is_set()

    def exchange(self, grid: Grid, messages: list[Message]) -> list[Message] | None:
        """Push ``messages`` and pull their replies until all are in or ``round_timeout``
        seconds pass (Flower's ``send_and_receive``), polling the stop request between pulls:
        None when a stop was requested before every reply arrived. Between pulls it waits on
        ``reply_signal`` when the engine gives one, else sleeps from ``pull_interval_min``
        doubling to ``pull_interval`` (starting over after a reply)."""
        if not messages:
            return []
        self._destinations = {}
        if getattr(grid, "synchronous", False):  # the in-process grid computes replies as it pushes
            got = list(grid.send_and_receive(messages, timeout=self.round_timeout))
            return None if self.stopping() else got
        signal = self.reply_signal
        ids = list(grid.push_messages(messages))
        self._destinations = {mid: m.metadata.dst_node_id for mid, m in zip(ids, messages) if isinstance(m, Message)}
        pending = set(ids)
        if self.after_push is not None:
            self.after_push()
        deadline = time.monotonic() + self.round_timeout
        replies: list[Message] = []
        wait = self.pull_interval_min
        while True:
            if signal is not None:
                signal.clear()  # a reply stored from here on ends the wait below
            got = list(grid.pull_messages(pending))
            replies.extend(got)
            pending.difference_update(m.metadata.reply_to_message_id for m in got)
            if not pending or time.monotonic() >= deadline:
                return replies
            if self.stopping():
                return None
            if signal is not None:
                signal.wait(self.pull_interval)
                continue
            wait = self.pull_interval_min if got else min(2 * wait, self.pull_interval)
            time.sleep(wait)

    def _dispatching(self, server_round: int) -> None:
        """Before round ``server_round``'s train messages go: record the silos asked to train
        (example-level DP) and tell ``on_dispatch``."""
        users = [u for us in self._assigned.values() for u in us]
        if self.server.ledger.silo is not None:  # every silo asked to train spends budget
            self.server.ledger.silo.record(users)
        if self.on_dispatch is not None:
            self.on_dispatch(server_round, users)

    def run(self, grid: Grid) -> None:
        """Run rounds ``server.round .. rounds−1`` (resumes where the server state is). On a stop
        request the round in flight is abandoned before aggregation and the loop returns, with
        the server state at the last completed round and ``abandoned_round`` set."""
        self.wait_for_nodes(grid)
        empty = ConfigRecord()
        while self.server.round < self.rounds:
            t0 = time.perf_counter()
            server_round = self.server.round + 1
            if self.stopping():
                self.abandoned_round = server_round
                return
            arrays = self._params_record()
            messages = list(self.configure_train(server_round, arrays, empty, grid))
            self._dispatching(server_round)
            self.server.prefetch_noise()  # ξ_t, unless already drawing since the last round's end
            replies = self.exchange(grid, messages)
            if replies is None or self.stopping():  # no aggregation, so no noise and no ε for this round
                self.abandoned_round = server_round
                return
            self.aggregate_train(server_round, replies)
            if self.server.round < self.rounds:
                # the next round's ξ is drawn while this round's metrics, checkpoint and the next
                # dispatch run, when the workers are idle, rather than while they train
                self.server.prefetch_noise()
            row: dict[str, Any] = {"round": server_round, **self._last_train, "eval_loss": None, "eval_accuracy": None}
            if self.before_publish is not None:  # x_t has not left the server yet
                self.before_publish({**row, "seconds": time.perf_counter() - t0})
            ev_msgs = list(self.configure_evaluate(server_round, self._params_record(), empty, grid))
            if ev_msgs:
                ev_replies = self.exchange(grid, ev_msgs)  # None on a stop: this round is not evaluated
                ev = None if ev_replies is None else self.aggregate_evaluate(server_round, ev_replies)
                if ev is not None:  # failed evaluation replies are shown (and make the round irregular)
                    row.update({k: ev[k] for k in ev if k != "eval_failed_replies" or ev[k]})
                else:  # no reply counted: every evaluation reply failed (or a stop cut the wait)
                    row["eval_failed_replies"] = len(ev_msgs)
            row["seconds"] = time.perf_counter() - t0
            if self.on_round_end is not None:
                self.on_round_end(row, self)


def census(
    grid: Grid, data_spec_json: str, timeout: float = 600.0, plugins: list[dict[str, str]] | None = None
) -> dict[int, dict[str, Any]]:
    """Deployment: ask every connected node which users it holds (see
    :mod:`fedsim.deploy.nodes`); returns ``{node_id: {"names", "num_train", "num_test", "dims",
    "task"}}``. ``plugins``: the run's plugin manifest (:func:`fedsim.plugins.manifest`), which
    each node loads first. A node that does not answer, or answers with an error, stops the run:
    the population must be known before any privacy is spent."""
    import json

    nodes = sorted(grid.get_node_ids())
    asked: dict[str, Any] = {"data": data_spec_json}
    if plugins:
        asked["plugins"] = json.dumps(plugins)
    msgs = [
        Message(
            RecordDict({protocol.CONFIG: ConfigRecord(asked)}),
            dst_node_id=n,
            message_type=MessageType.QUERY,
            group_id="census",
        )
        for n in nodes
    ]
    out: dict[int, dict[str, Any]] = {}
    for reply in grid.send_and_receive(msgs, timeout=timeout):
        node = reply.metadata.src_node_id
        if reply.has_error():
            reason = str(reply.error.reason)
            fix = "" if "plugin" in reason else "; check its --node-config data-root and user-shard"
            raise FedsimError(f"census: node {node} failed to load its data ({reason}){fix}")
        m, c = reply.content.metric_records[protocol.METRICS], reply.content.config_records[protocol.CONFIG]
        names, num_train, num_test = c["names"], records.int_list(m["num_train"]), records.int_list(m["num_test"])
        if not isinstance(names, list) or num_train is None or num_test is None:
            raise FedsimError(
                f"census: node {node} sent a malformed census (names, num_train, num_test); "
                f"check that it runs this fedsim version"
            )
        out[node] = {
            "names": [str(n) for n in names],
            "num_train": num_train,
            "num_test": num_test,
            "dims": json.loads(str(c["dims"])),
            "task": str(c["task"]),
            "selection": str(c["selection"]) if "selection" in c else "",
        }
    missing = [n for n in nodes if n not in out]
    if missing:
        raise FedsimError(f"census: no answer from node(s) {missing} within {timeout:.0f} s")
    return out
