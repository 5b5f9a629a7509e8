"""Callbacks of a run: what happens around the rounds, one object per concern.

The runner (:mod:`fedsim.runner.runner`) calls every callback of a run, in order:

- :meth:`RunCallback.on_start` once the run is built (``resumed``: continuing from a checkpoint,
  whose state the :class:`Checkpointer` has already restored);
- :meth:`RunCallback.on_round_end` after every round, with the round's metrics row (the full
  row; what is written anywhere is :func:`fedsim.reporting.metrics.public_row` of it);
- :meth:`RunCallback.on_stop` when the first Ctrl-C/SIGTERM arrives (:mod:`fedsim.interrupt`);
- :meth:`RunCallback.on_end` with the summary (None after a stop) and a status
  (``finished``, ``stopped`` or ``failed``), then :meth:`RunCallback.close` whatever happened.

Built in: :class:`MetricsFile` (``metrics.jsonl``), :class:`Checkpointer` (``checkpoint/``),
:class:`LedgerFile` (``ledger.json``), :class:`Progress` (the header's progress line),
:class:`Plots` (``plots/``) and :class:`Tracking` (TensorBoard / MLflow, :mod:`fedsim.reporting.tracking`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedsim.checkpoint import save_checkpoint
from fedsim.errors import FedsimError, writing
from fedsim.privacy.accounting import RELATION_LABELS
from fedsim.reporting.metrics import MetricsWriter, ProgressLine, public_row
from fedsim.runner.build import Run, model_sha256
from fedsim.runner.releases import ReleaseLog
from fedsim.runner.resume import privacy_digest


class RunCallback:
    """Hooks around a run's rounds; every method is optional (the defaults do nothing)."""

    def on_start(self, run: Run, out: Path, resumed: bool) -> None:
        """The run is built and about to execute; ``out`` is its run folder."""

    def on_round_end(self, row: dict[str, Any]) -> None:
        """Round ``row["round"]`` finished; ``row`` is its full metrics row."""

    def on_stop(self, signal_name: str) -> None:
        """The first stop signal arrived: the round in flight is abandoned."""

    def on_end(self, summary: dict[str, Any] | None, status: str) -> None:
        """The run ended: ``finished`` (with the summary), ``stopped`` or ``failed`` (None)."""

    def close(self) -> None:
        """Release files and handles (always called, after :meth:`on_end` when it ran)."""


def _truncate_lines(path: Path, keep: int) -> list[dict[str, Any]]:
    lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()] if path.exists() else []
    if len(lines) < keep:
        raise FedsimError(f"{path} has {len(lines)} rows but the checkpoint is after round {keep}")
    tmp = path.with_name(".metrics.jsonl.tmp")
    tmp.write_text("".join(ln + "\n" for ln in lines[:keep]), encoding="utf-8")
    os.replace(tmp, path)
    return [json.loads(ln) for ln in lines[:keep]]


def _eval_metrics(row: dict[str, Any]) -> dict[str, float]:
    """The evaluation metrics of a metrics row (without the counts)."""
    return {
        k: row[k]
        for k in sorted(row)
        if k.startswith("eval_") and k not in ("eval_examples", "eval_failed_users") and row[k] is not None
    }


class MetricsFile(RunCallback):
    """``metrics.jsonl``: one public row per round (on resume, the rows after the checkpoint are
    dropped first, to be recomputed). Keeps the last evaluation for the summary."""

    def __init__(self) -> None:
        self.writer: MetricsWriter | None = None
        self.publish = True
        self.last_eval: float | None = None
        self.last_eval_metrics: dict[str, float] | None = None
        #: the summary's warnings about the rows (training that diverged)
        self.warnings: list[str] = []
        self.diverged_above = math.inf

    def _note_eval(self, row: dict[str, Any]) -> None:
        if row.get("eval_accuracy") is not None:
            self.last_eval = row["eval_accuracy"]
            self.last_eval_metrics = _eval_metrics(row)
        loss = row.get("train_loss")
        if loss is not None and not self.warnings and not float(loss) <= self.diverged_above:
            self.warnings.append(
                f"training diverged: the train loss is {float(loss):.3g} in round {row['round']}, over "
                f"{self.diverged_above:.3g} (100 × ln(classes), a hundred times a uniform guess's loss); the model "
                f"is not learning: lower client.lr (or server.lr), or check the data's scale"
            )

    def on_start(self, run: Run, out: Path, resumed: bool) -> None:
        self.publish = run.publish
        self.diverged_above = 100 * math.log(max(int(getattr(run.data, "vocab_size", 2)), 2))
        if resumed:
            for row in _truncate_lines(out / "metrics.jsonl", run.server.round):
                self._note_eval(row)
        self.writer = MetricsWriter(out / "metrics.jsonl")

    def on_round_end(self, row: dict[str, Any]) -> None:
        assert self.writer is not None, "on_start comes first"
        self.writer.write(public_row(row, self.publish))
        self._note_eval(row)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class LedgerFile(RunCallback):
    """``ledger.json``: the privacy ledger, rewritten atomically with every checkpoint and at the
    end (:meth:`write`)."""

    def __init__(self) -> None:
        self.run: Run | None = None
        self.out: Path | None = None

    def on_start(self, run: Run, out: Path, resumed: bool) -> None:
        self.run, self.out = run, out

    def write(self, settle: bool = False) -> None:
        """Rewrite ``ledger.json``; ``settle``: with ε after the last recorded round even where
        ``privacy.account_every`` skipped it (at a stop: what the run has spent so far)."""
        assert self.run is not None and self.out is not None, "on_start comes first"
        tmp = self.out / ".ledger.json.tmp"
        with writing(self.out / "ledger.json"):
            tmp.write_text(json.dumps(self.run.ledger.to_json(settle=settle), indent=1), encoding="utf-8")
            os.replace(tmp, self.out / "ledger.json")

    def on_end(self, summary: dict[str, Any] | None, status: str) -> None:
        if status == "finished":
            self.write()
        elif status == "failed" and self.run is not None and self.run.ledger.silo is not None:
            # the silos of a round stopped by too few valid replies trained and replied: the
            # ledger file says so now, not only at the next checkpoint (a stop is settled by
            # the Checkpointer)
            self.write(settle=True)


def run_engine(run: Run) -> str:
    """Where ``run`` executes: ``deployment`` (SuperNodes with their own data) or the simulation
    engine (``ray``, ``inprocess``); recorded in every checkpoint."""
    return "deployment" if run.deployment is not None else run.engine


def population_sha256(names: Sequence[str]) -> str:
    """SHA-256 of the users' names in the run's order: a resume must run on the same population."""
    import hashlib

    return hashlib.sha256("\n".join(map(str, names)).encode()).hexdigest()


def irregular(row: dict[str, Any]) -> bool:
    """Whether round ``row`` aggregated inputs that a re-run of it might not reproduce: a reply
    was dropped (a timeout, a node's error, a malformed reply), a user's training failed (its data
    could not be read) or an evaluation reply failed. In a reproducible run
    (:attr:`fedsim.runner.build.Run.reproducible`) everything else about a round (cohort, training,
    noise) is a function of the checkpoint and the key, so a re-run gives the same row."""
    return bool(row.get("dropped_replies") or row.get("failed_users") or row.get("eval_failed_replies"))


def _has_evaluation(row: dict[str, Any]) -> bool:
    return row.get("eval_accuracy") is not None or bool(row.get("eval_failed_replies"))


class Checkpointer(RunCallback):
    """``checkpoint/``: every stateful piece after round ``r`` when ``r`` is a multiple of
    ``checkpoint.every``, the last round, or :func:`irregular`, and after the last completed round
    on a stop; the ledger file is rewritten with it. :meth:`restore` loads a checkpoint into a
    built run.

    A round's noise is a function of the key and the round, so a crashed run that re-ran a
    released round from an earlier checkpoint would release it twice with the same noise; if the
    round's inputs differed (a reply that timed out the first time arrives the second; a silo's
    DP-SGD, keyed from the OS per process, trains afresh), the difference of the two releases is
    the difference of the inputs, noise-free. So :meth:`before_publish`, called by the strategy
    after the round's noise and before its model leaves the server (evaluation, the next round's
    messages, the row), checkpoints the round when a re-run might not reproduce it: an
    :func:`irregular` round, and every round of a run that is not
    :attr:`~fedsim.runner.build.Run.reproducible` (example-level DP, a deployment, a GPU). Such a
    round is never re-run. The other rounds between checkpoints re-run to the bits already
    released: the model's SHA-256 is recorded in the append-only
    :class:`~fedsim.runner.releases.ReleaseLog` before it is sent, and a re-run that differs (a
    resume with another ``sim.num_workers`` regroups the float32 sums) stops the run before
    sending it. The checkpoint keeps its round's row, which :meth:`restore` appends to
    ``metrics.jsonl`` when the run stopped between the checkpoint and the row. The silo ledger
    is counted at dispatch (:meth:`on_dispatch`) in the same log, which no resume rolls back.

    Parameters
    ----------
    ledger : the run's ledger file, written with every checkpoint.
    t_start : the ``time.perf_counter()`` value the run's wall time counts from (moved back by
        the time a resumed run had spent before its checkpoint); each checkpoint stores the wall
        time up to it as ``wall_seconds``. Default None: the time this object is made.
    """

    def __init__(self, ledger: LedgerFile, t_start: float | None = None) -> None:
        self.ledger = ledger
        self.t_start = time.perf_counter() if t_start is None else float(t_start)
        self.run: Run | None = None
        self.out: Path | None = None
        #: the round of the last checkpoint written by this process (None: none yet).
        self.saved: int | None = None
        self.releases: ReleaseLog | None = None
        #: :func:`population_sha256` of the run's users, computed once in :meth:`on_start` (the
        #: population cannot change mid-run, so no checkpoint hashes it again).
        self.population_digest: str | None = None

    @staticmethod
    def restore(run: Run, ckpt: dict[str, Any], out: Path) -> None:
        """Load the checkpoint's state into ``run`` (before :meth:`on_start`); the silo ledger
        counts every training in the release log, also those after the checkpoint."""
        run.server.load_state_dict(ckpt["server"])
        if run.ledger.silo is not None:
            run.ledger.silo.count_at_least(ReleaseLog(out / "checkpoint").silo_trainings())
        run.ledger.planned_rounds = run.cfg.rounds  # a Gaussian run may have been extended (fedsim.runner.resume)
        run.sampler.load_state_dict(ckpt["sampler"])
        if run.client_store is not None:
            run.client_store.load_state_dict(ckpt["client_state"])
        done = int(ckpt["metrics_rows"])
        if done != run.server.round:
            raise FedsimError(f"checkpoint in {out} is inconsistent (rows {done}, round {run.server.round})")
        if done >= run.cfg.rounds:
            raise FedsimError(f"the run in {out} is already complete ({done} of {run.cfg.rounds} rounds)")
        row = ckpt.get("row")
        path = out / "metrics.jsonl"
        if row is not None and row.get("round") == done and path.exists():
            lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
            if len(lines) == done - 1:  # stopped after the checkpoint, before its row was written
                writer = MetricsWriter(path)
                writer.write(public_row(row, run.publish))
                writer.close()

    def on_start(self, run: Run, out: Path, resumed: bool) -> None:
        self.run, self.out = run, out
        self.releases = ReleaseLog(out / "checkpoint")
        self.population_digest = population_sha256(run.data.names)

    def on_dispatch(self, r: int, users: list[int]) -> None:
        """Round ``r`` asks ``users`` to train (called before the messages go): with example-level
        DP, the silos' trainings are appended to the release log and the ledger file rewritten."""
        assert self.run is not None and self.releases is not None, "on_start comes first"
        if self.run.ledger.silo is not None:
            self.releases.record_training(r, users)
            self.ledger.write(settle=True)

    def before_publish(self, row: dict[str, Any]) -> None:
        """Round ``row["round"]``'s noise is added and its model is about to leave the server:
        refuse to send a model that differs from the one already sent for this round, checkpoint
        the round when a re-run might not reproduce it, and record the model's hash."""
        run, log = self.run, self.releases
        assert run is not None and log is not None, "on_start comes first"
        r = int(row["round"])
        sha = model_sha256(run.server.params)
        sent = log.sent(r)
        if sent is not None:
            if sent != sha:
                raise FedsimError(
                    f"round {r} re-ran to a different model than the one already sent (SHA-256 {sent[:12]}… "
                    f"then, {sha[:12]}… now): sending it would release round {r} twice under the same noise, "
                    f"so the run stops here and nothing of it is sent. A resume re-runs the rounds after the "
                    f"last checkpoint; they reproduce only with the settings they first ran with — restore "
                    f"sim.num_workers, sim.vectorize, sim.engine and sim.device to those in the checkpoint's "
                    f"config and resume again, or start a new run"
                )
            return
        if not run.reproducible or irregular(row):
            self.save(r, row=row)
        log.record_model(r, sha)

    def save(self, r: int, settle: bool = False, row: dict[str, Any] | None = None) -> None:
        """Checkpoint the state after round ``r`` and write the ledger (``settle``: with ε after
        round ``r`` even where ``privacy.account_every`` skipped it; :meth:`LedgerFile.write`).
        ``row``: round ``r``'s metrics row, kept with it (see the class docstring)."""
        run, out = self.run, self.out
        assert run is not None and out is not None, "on_start comes first"
        save_checkpoint(
            out / "checkpoint",
            {
                "format": "fedsim.checkpoint/2",
                "spec": run.spec.to_dict(),
                "privacy_digest": privacy_digest(run.resolved),
                "server": run.server.state_dict(),
                "sampler": run.sampler.state_dict(),
                "client_state": None if run.client_store is None else run.client_store.state_dict(),
                "metrics_rows": r,
                "row": row,
                "wall_seconds": time.perf_counter() - self.t_start,
                "config": run.resolved.model_dump(mode="json"),
                "engine": run_engine(run),
                "population_sha256": self.population_digest,
            },
        )
        self.saved = r
        self.ledger.write(settle=settle)

    def on_round_end(self, row: dict[str, Any]) -> None:
        """Checkpoint round ``row["round"]`` when it is due, and add the checkpoint's time to the
        row's ``seconds`` (this callback runs before any that writes the row)."""
        assert self.run is not None
        r = row["round"]
        t0 = time.perf_counter()
        if self.saved == r:  # checkpointed before its model left the server
            if _has_evaluation(row):  # keep the row with its evaluation
                self.save(r, row=row)
        elif r % self.run.cfg.checkpoint.every == 0 or r == self.run.cfg.rounds or irregular(row):
            self.save(r, row=row)
        if "seconds" in row:
            row["seconds"] = float(row["seconds"]) + (time.perf_counter() - t0)

    def on_end(self, summary: dict[str, Any] | None, status: str) -> None:
        if status == "stopped" and self.run is not None:
            if self.saved != self.run.server.round:
                self.save(self.run.server.round, settle=True)  # the state after the last completed round
            else:  # the checkpoint is current; the ledger file says what was spent up to it
                self.ledger.write(settle=True)


class Progress(RunCallback):
    """The live progress line (rounds/s, ETA, ε with its neighbouring relation) and the notice of
    a stop. Off when ``enabled`` is False (the line then prints nothing).

    Parameters
    ----------
    enabled : show the line. Default True.
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.line: ProgressLine | None = None
        self.publish = True
        self._flwr_level = logging.getLogger("flwr").level

    def on_start(self, run: Run, out: Path, resumed: bool) -> None:
        self.publish = run.publish
        relation = RELATION_LABELS[run.spec.neighboring_relation]
        if run.spec.is_mf and not run.spec.amplified:  # one Gaussian mechanism over all rounds
            relation = f"{relation}; MF noise: the whole run's ε from round 1"
        self.line = ProgressLine(run.cfg.rounds, enabled=self.enabled, relation=relation)

    def on_round_end(self, row: dict[str, Any]) -> None:
        assert self.line is not None
        self.line.update(public_row(row, self.publish))

    def on_stop(self, signal_name: str) -> None:
        # workers that got the same signal die mid-round: Flower's logs of that are expected now
        logging.getLogger("flwr").setLevel(logging.CRITICAL + 1)
        if self.line is not None:
            self.line.notice(
                f"fedsim: {signal_name}: abandoning the round in flight (no noise is drawn for it), writing the "
                f"checkpoint and stopping the workers; {'press Ctrl-C' if signal_name == 'SIGINT' else 'signal'} "
                f"again to quit at once"
            )

    def notice(self, text: str) -> None:
        """Print ``text`` on its own line (clearing the progress line)."""
        if self.line is not None:
            self.line.notice(text)

    def close(self) -> None:
        logging.getLogger("flwr").setLevel(self._flwr_level)


class Plots(RunCallback):
    """``plots/``: accuracy and ε against rounds (and the filter's PSD), drawn at the end."""

    def __init__(self) -> None:
        self.out: Path | None = None

    def on_start(self, run: Run, out: Path, resumed: bool) -> None:
        self.out = out

    def on_end(self, summary: dict[str, Any] | None, status: str) -> None:
        if status == "finished" and self.out is not None:
            from fedsim.reporting.report import plot_run

            plot_run(self.out)


class Tracking(RunCallback):
    """Experiment tracking the user already has: every public metrics row to TensorBoard and/or
    MLflow (:mod:`fedsim.reporting.tracking`; ``tracking.tensorboard``, ``tracking.mlflow_uri``). A resumed
    run continues the same TensorBoard log and MLflow run.

    Parameters
    ----------
    trackers : the trackers (from :func:`fedsim.reporting.tracking.make_trackers`).
    warn : prints a warning line (a tracker that fails mid-run is dropped with one warning; the
        run goes on).
    """

    def __init__(self, trackers: list[Any], warn: Any = None) -> None:
        from fedsim.reporting.tracking import TrackerGroup

        self.group = TrackerGroup(trackers, warn=warn)
        self.publish = True
        self.done = False

    def on_start(self, run: Run, out: Path, resumed: bool) -> None:
        self.publish = run.publish
        spec = run.spec
        # what every logged ε holds for: δ, the neighbouring relation and the accountant that ran
        # (the config's privacy.accountant is a request: fixed cohorts are accounted with RDP)
        params = {
            "noise_multiplier": spec.noise_multiplier,
            "delta": spec.delta,
            "population": spec.population,
            "neighboring_relation": spec.neighboring_relation,
            "effective_accountant": spec.effective_accountant,
        }
        self.group.start(out, run.resolved.model_dump(mode="json"), params)

    def on_round_end(self, row: dict[str, Any]) -> None:
        self.group.log_row(public_row(row, self.publish))

    def on_end(self, summary: dict[str, Any] | None, status: str) -> None:
        self.done = True
        self.group.finish(summary, status={"finished": "FINISHED", "stopped": "KILLED"}.get(status, "FAILED"))

    def close(self) -> None:
        if not self.done:
            self.group.finish(None, status="FAILED")


class Callbacks(RunCallback):
    """A list of callbacks called in order (the runner's one callback)."""

    def __init__(self, callbacks: list[RunCallback]) -> None:
        self.callbacks = list(callbacks)

    def on_start(self, run: Run, out: Path, resumed: bool) -> None:
        for cb in self.callbacks:
            cb.on_start(run, out, resumed)

    def on_round_end(self, row: dict[str, Any]) -> None:
        for cb in self.callbacks:
            cb.on_round_end(row)

    def on_stop(self, signal_name: str) -> None:
        for cb in self.callbacks:
            cb.on_stop(signal_name)

    def on_end(self, summary: dict[str, Any] | None, status: str) -> None:
        for cb in self.callbacks:
            cb.on_end(summary, status)

    def close(self) -> None:
        for cb in self.callbacks:
            cb.close()
