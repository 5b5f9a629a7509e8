"""Run an experiment: the runner. It builds the run (:func:`fedsim.runner.build.build_run`),
executes it on an engine (:mod:`fedsim.runner.engines`: Flower's simulation engine on Ray, the
in-process grid, or a deployment's grid) with its callbacks (:mod:`fedsim.runner.callbacks`), and
leaves a run folder.

Run folder (``--out DIR``, default ``runs/<timestamp>-<name>``):

- ``config.toml``   the resolved config (defaults filled in, δ resolved)
- ``metrics.jsonl`` one JSON object per round
- ``ledger.json``   the privacy ledger (spec + ε after every round)
- ``summary.json``  final numbers (accuracy, ε, δ, z, model hash, wall time, …)
- ``checkpoint/checkpoint.pt`` every stateful piece (model, optimizer, noise, sampler, ledger)
- ``plots/``        ``accuracy.png`` and ``epsilon.png``
"""

from __future__ import annotations

import json
import math
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from fedsim.attacks.population import AuditView
from fedsim.config import Config
from fedsim.errors import FedsimError, writing
from fedsim.interrupt import RunInterrupted, StopRequest
from fedsim.privacy.accounting import RELATION_LABELS
from fedsim.privacy.cost import describe_cost
from fedsim.privacy.display import format_delta
from fedsim.privacy.plan import noise_cost_of
from fedsim.reporting.metrics import SIDE_STATISTICS_NOTE
from fedsim.runner.build import Deployment, Run, SyntheticUsers, build_run, model_sha256
from fedsim.runner.callbacks import (
    Callbacks,
    Checkpointer,
    LedgerFile,
    MetricsFile,
    Plots,
    Progress,
    RunCallback,
    Tracking,
)
from fedsim.runner.engines import execute, quiet_flower


def default_run_dir(cfg: Config) -> Path:
    """``runs/<timestamp>-<name>``."""
    return Path("runs") / f"{datetime.now().strftime('%Y%m%d-%H%M%S')}-{cfg.name}"


def run_experiment(
    cfg: Config,
    out_dir: str | Path | None = None,
    progress: bool = True,
    client_app: Any = None,
    resume: bool = False,
    synthetic: SyntheticUsers | None = None,
    deployment: Deployment | None = None,
    callbacks: list[RunCallback] | None = None,
    view: AuditView | None = None,
) -> dict[str, Any]:
    """Run ``cfg`` and write the run folder.

    Parameters
    ----------
    cfg : the validated experiment config.
    out_dir : run folder (default ``runs/<timestamp>-<name>``); must not hold a run.
    progress : print the header and the live progress line. Default True.
    client_app : the Flower ClientApp to run (default ``clients.client_app.app``; tests
        pass a fault-injecting one).
    resume : continue the run in ``out_dir`` from its checkpoint. The caller has checked the
        config against the checkpoint (:func:`fedsim.runner.resume.resume_config`); ε is computed
        from the checkpoint's spec. Rows of ``metrics.jsonl`` after the checkpoint are discarded
        and recomputed; the result is bit-identical to an uninterrupted run.
    synthetic : simulated users (the gradient audit's canaries) that join the sampled and
        accounted population; see :class:`fedsim.runner.build.SyntheticUsers`.
    deployment : execute on a Deployment Engine instead of the simulation engine
        (:class:`fedsim.runner.build.Deployment`: the ServerApp's grid, the census population, the
        owners, the nodes to wait for, and the OS-drawn privacy key).
    callbacks : more callbacks, called after the built-in ones (metrics file, checkpoints,
        ledger, progress line, plots and the config's tracking). Default none.
    view : an audit's population (canary users added, held-out users removed;
        :class:`fedsim.attacks.population.AuditView`). Default None.

    Returns the summary dict (also written to ``summary.json``).

    The run folder is checked and locked (:mod:`fedsim.runner.runfolder`) before any data is
    loaded; a second process on the same folder is refused with the holder's PID.
    """
    from fedsim.runner.runfolder import prepare_out_dir

    t_start = time.perf_counter()
    wanted = Path(out_dir) if out_dir is not None else default_run_dir(cfg)
    fresh = not wanted.exists()
    out = prepare_out_dir(wanted)
    try:
        return _locked_run(
            cfg, out, t_start, progress, client_app, resume, synthetic, deployment, callbacks or [], view
        )
    finally:
        if fresh and out.is_dir() and not any(out.iterdir()):  # a start that failed before writing anything
            out.rmdir()


def _locked_run(
    cfg: Config,
    out: Path,
    t_start: float,
    progress: bool,
    client_app: Any,
    resume: bool,
    synthetic: SyntheticUsers | None,
    deployment: Deployment | None,
    callbacks: list[RunCallback],
    view: AuditView | None,
) -> dict[str, Any]:
    """:func:`run_experiment` inside the locked run folder ``out``."""
    from fedsim.runner.runfolder import RunFolderLock

    with RunFolderLock(out):
        if not resume and (out / "metrics.jsonl").exists():
            hint = (
                f"--resume it (fedsim run --resume {out})"
                if (out / "checkpoint" / "checkpoint.pt").exists()
                else "remove it first (it has no checkpoint to resume from)"
            )
            raise FedsimError(f"run folder {out} already holds a run; choose another --out, or {hint}")
        ckpt: dict[str, Any] = {}
        resumed_spec = None
        if resume:
            from fedsim.checkpoint import load_checkpoint
            from fedsim.runner.resume import checkpointed_spec

            ckpt = load_checkpoint(out / "checkpoint")
            resumed_spec = checkpointed_spec(ckpt, out)
        run = build_run(cfg, resumed_spec=resumed_spec, synthetic=synthetic, deployment=deployment, view=view)
        if resume:
            check_resumed_run(run, ckpt, out)
        (out / "config.toml").write_text(run.resolved.to_toml(), encoding="utf-8")
        if resume:
            Checkpointer.restore(run, ckpt, out)
            # the wall time spent before the checkpoint counts towards the run's
            t_start -= float(ckpt.get("wall_seconds", 0.0))
            # A finished run extended with more rounds is no longer finished: its summary (the
            # old ε, rounds and model) would outlive a stop or failure of the extension.
            (out / "summary.json").unlink(missing_ok=True)
        return _execute_run(run, out, t_start, progress, client_app, resume, callbacks)


def check_resumed_run(run: Run, ckpt: dict[str, Any], out: Path) -> None:
    """Refuse to resume a run on another engine than the one that wrote its checkpoint, or on
    another population (checkpoints from before these were recorded are not checked)."""
    from fedsim.runner.callbacks import population_sha256, run_engine

    was, now = ckpt.get("engine"), run_engine(run)
    if was is not None and (was == "deployment") != (now == "deployment"):
        if was == "deployment":
            raise FedsimError(
                f"--resume {out}: this run ran on a Deployment Engine, on the SuperNodes' own data; resuming it in "
                f"simulation would train its remaining rounds on this machine's copy of the data. Resume it where "
                f"it ran: flwr run . <connection> --run-config 'resume=true out-dir=\"{out}\"' (README 'Deploy')"
            )
        raise FedsimError(
            f"resume of {out}: this run ran in simulation ({was}); resume it with fedsim run --resume {out}"
        )
    digest = ckpt.get("population_sha256")
    if digest is not None and digest != population_sha256(run.data.names):
        raise FedsimError(
            f"resume of {out}: the users are not the ones the run started with ({run.data.population} now); the "
            f"sampler's and the accountant's population cannot change mid-run. Bring back the same users (every "
            f"node with its data and shard), or start a new run"
        )


def _standard_callbacks(
    run: Run, progress: bool, t_start: float | None = None
) -> tuple[MetricsFile, Progress, list[RunCallback]]:
    """The built-in callbacks of ``run``, in the order they are called (``t_start``: the
    ``time.perf_counter()`` the run's wall time counts from, for the checkpoints)."""
    metrics, line, ledger = MetricsFile(), Progress(progress), LedgerFile()
    # the checkpoint first: a row is published only after any checkpoint of its round
    cbs: list[RunCallback] = [Checkpointer(ledger, t_start), ledger, metrics, line, Plots()]
    trackers = run.trackers()
    if trackers:
        cbs.append(Tracking(trackers, warn=lambda text: line.notice(f"fedsim: warning: {text}")))
    return metrics, line, cbs


def _execute_run(
    run: Run, out: Path, t_start: float, progress: bool, client_app: Any, resume: bool, extra: list[RunCallback]
) -> dict[str, Any]:
    """Execute a built run in its (locked) folder ``out``, with its callbacks."""
    cfg = run.cfg
    metrics, line, cbs = _standard_callbacks(run, progress, t_start)
    callbacks = Callbacks(cbs + extra)
    stop = StopRequest(notice=callbacks.on_stop)
    strategy = make_strategy(run, lambda row, _strategy: callbacks.on_round_end(row), stop)
    strategy.failure_log = out / "failures.log"  # the first traceback of each kind of failing user code
    checkpointer = next(cb for cb in cbs if isinstance(cb, Checkpointer))
    strategy.on_dispatch = checkpointer.on_dispatch
    strategy.before_publish = checkpointer.before_publish
    quiet_flower()
    if progress:
        print_header(run, out)
    status = "failed"
    if cfg.privacy.noise_table:  # a noise table is as secret as the key: next to it, deleted at the end
        run.server.noise.set_scratch(out / "checkpoint")
    try:
        callbacks.on_start(run, out, resume)
        execute(run, strategy, client_app, stop, f"fedsim run --resume {out}")
        if stop.requested:
            status = "stopped"
            callbacks.on_end(None, status)
            abandoned = strategy.abandoned_round
            raise RunInterrupted(
                stop.signum or 2,
                (
                    f"stopped by {stop.signal_name} after round {run.server.round} of {cfg.rounds}"
                    + (f" (round {abandoned} abandoned before its noise was drawn)" if abandoned else "")
                    + f"; resume with: fedsim run --resume {out}"
                ),
            )
        if run.server.round != cfg.rounds:
            raise RuntimeError(
                f"simulation stopped after {run.server.round} of {cfg.rounds} rounds; "
                f"the checkpoint in {out / 'checkpoint'} holds the last completed round"
            )
        run.server.write_trace(out / "filter_trace.npz")
        summary = make_summary(run, metrics, time.perf_counter() - t_start)
        summary["run_folder"] = str(out)
        with writing(out / "summary.json"):
            (out / "summary.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
        status = "finished"
        callbacks.on_end(summary, status)
        return summary
    except BaseException:
        if status == "failed":
            callbacks.on_end(None, status)
        raise
    finally:
        run.server.noise.close()
        callbacks.close()


def make_strategy(run: Run, on_round_end: Any, stop: StopRequest) -> Any:
    """The Flower strategy of ``run``, with every setting given at construction."""
    from fedsim.strategies.user_dp import UserLevelDPStrategy

    cfg = run.cfg
    return UserLevelDPStrategy(
        server=run.server,
        sampler=run.sampler,
        task_json=run.task.to_json(),
        train_costs=run.train_costs,
        rounds=cfg.rounds,
        eval_users=run.eval_users,
        eval_costs=run.eval_costs,
        eval_every=cfg.eval.every,
        eval_max_examples=cfg.eval.max_examples_per_user,
        round_timeout=cfg.sim.round_timeout,
        min_nodes=run.n_workers,
        min_valid_replies=cfg.sim.min_valid_replies,
        on_round_end=on_round_end,
        synthetic=run.synthetic,
        stop=stop.event,
        client_evaluations=run.client_evaluations,
        ef_mode=run.ef,
        client_store=run.client_store,
        update_clip=run.update_clip,
        owners=run.owners,
        silo_statistics=cfg.sends_silo_statistics,
    )


def print_header(run: Run, out: Path) -> None:
    """The run's first lines: population, model, noise, ε's relation, workers; notes."""
    cfg, spec, prep = run.cfg, run.spec, run.prep
    workers = (
        "SuperNodes" if run.deployment is not None else "Ray workers" if run.engine == "ray" else "in-process workers"
    )
    n_workers = run.n_workers if run.deployment is None else len({n for n, _ in run.deployment.owners.values()})
    print(
        f"fedsim: {cfg.name}: {run.data.population} users, {prep.num_params:,} parameters, {cfg.rounds} rounds, "
        f"{spec.mechanism} noise z = {spec.noise_multiplier:.4g}, δ = {format_delta(spec.delta)}, ε for "
        f"{RELATION_LABELS[spec.neighboring_relation]} ({spec.scheme} sampling, K̄ = {spec.cohort_size:.4g}), "
        f"{n_workers} {workers} → {out}",
        flush=True,
    )
    print(f"fedsim: {describe_cost(spec.mechanism, cfg.rounds, noise_cost_of(cfg, spec, prep.plan, prep.num_params))}")
    for note in run.notes:
        print(f"fedsim: {note}", flush=True)
    if cfg.privacy.unit == "example":
        print(f"fedsim: {silo_statistics_note(cfg)}", flush=True)
    print(
        f"fedsim: note: {SIDE_STATISTICS_NOTE}"
        if run.publish
        else "fedsim: side statistics are not published (privacy.publish_side_statistics = false); no evaluation runs",
        flush=True,
    )


def silo_statistics_note(cfg: Config) -> str:
    """What example-level silos send the server besides their DP-SGD update (the header line)."""
    if cfg.sends_silo_statistics:
        return (
            "example-level DP: silos send the server their training loss, the examples their batches took "
            "and evaluation on their held-out records (privacy.silo_statistics = 'send': the server is trusted "
            "with them; no DP-SGD noise covers them)"
        )
    return (
        "example-level DP: silos send the server only their DP-SGD update and counts computed from it "
        "(privacy.silo_statistics = 'withhold'): no training loss, no example counts, no evaluation"
    )


def make_summary(run: Run, metrics: MetricsFile, wall_seconds: float) -> dict[str, Any]:
    """``summary.json``: the run's final numbers and what its ε covers."""
    cfg, spec, prep, server = run.cfg, run.spec, run.prep, run.server
    eps = run.ledger.epsilon
    ex = run.data.examples_per_user()
    summary = {
        "name": cfg.name,
        "final_eval_accuracy": metrics.last_eval,
        "final_eval_metrics": metrics.last_eval_metrics,
        "majority_baseline_accuracy": run.baseline,
        "epsilon": eps if math.isfinite(eps) else "inf",
        "delta": spec.delta,
        "noise_multiplier": spec.noise_multiplier,
        "update_noise_multiplier": prep.update_noise_multiplier,
        "final_clip_norm": server.clip_norm,
        "error_feedback": run.ef,
        "unit": cfg.privacy.unit,
        "example_epsilon_max": None if run.ledger.silo is None else run.ledger.silo.max_epsilon,
        "notes": run.notes + metrics.warnings,
        "neighboring_relation": spec.neighboring_relation,
        "assignment": spec.assignment,
        "mechanism": spec.mechanism,
        "scheme": spec.scheme,
        "sensitivity": run.noise.sensitivity,
        "sensitivity_exact": True if prep.plan is None else prep.plan.sens_exact,
        "factorization": None if prep.plan is None else prep.plan.describe(),
        "accountant": spec.effective_accountant,
        "cohort_size": spec.cohort_size,
        "rounds_completed": server.round,
        "population": spec.population,
        "examples_per_user": {
            "mean": float(ex.mean()),
            "median": float(np.median(ex)),
            "min": int(ex.min()),
            "max": int(ex.max()),
        },
        "num_parameters": prep.num_params,
        "model_sha256": model_sha256(server.params),
        "wall_seconds": wall_seconds,
        "num_workers": run.n_workers,
        "engine": "deployment" if run.deployment is not None else run.engine,
        "vectorized": run.task.vectorize,
        "device": str(run.device),
        "guarantee": "none: epsilon = inf"
        if spec.no_guarantee
        else ("none: no noise" if spec.mechanism == "none" else "user-level (ε, δ)-DP of every released model"),
        "silo_statistics": None
        if cfg.privacy.unit != "example"
        else {"sent_to_server": cfg.sends_silo_statistics, "note": silo_statistics_note(cfg)},
        "side_statistics": {
            "published": run.publish,
            "covered_by_epsilon": False,
            "note": SIDE_STATISTICS_NOTE if run.publish else "not published",
        },
    }
    if not run.publish:  # computed from users' data outside the DP mechanism
        for key in (
            "final_eval_accuracy",
            "final_eval_metrics",
            "majority_baseline_accuracy",
            "example_epsilon_max",
            "examples_per_user",
        ):
            summary[key] = None
    return summary
