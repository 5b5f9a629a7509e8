"""Run an experiment: the runner. It builds the run (:func:`fedsim.build.build_run`), runs it
on an engine (Flower's simulation engine on Ray, the in-process grid, or a deployment's grid)
and leaves a run folder.

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
import logging
import math
import os
import sys
import time
import warnings
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedsim.build import (  # noqa: F401 - re-exported: the runner's public names
    SYNTHETIC_ID_PREFIX,
    Prepared,
    Run,
    build_run,
    count_releases_per_user,
    make_server_filter,
    make_server_optimizer,
    model_sha256,
    note_max_users,
    num_workers,
    prepare,
    privacy_report,
    resolve_clipping,
    resolve_engine,
    resolve_privacy,
    resolve_vectorize,
    scheme_of,
)
from fedsim.checkpoint import save_checkpoint
from fedsim.config import Config
from fedsim.errors import FedsimError
from fedsim.interrupt import RunInterrupted, StopRequest, descendants, kill_descendants, stop_on_signals
from fedsim.metrics import SIDE_STATISTICS_NOTE, MetricsWriter, ProgressLine, public_row
from fedsim.privacy.accounting import RELATION_LABELS
from fedsim.resume import privacy_digest


def default_run_dir(cfg: Config) -> Path:
    return Path("runs") / f"{datetime.now().strftime('%Y%m%d-%H%M%S')}-{cfg.name}"


class _DropDeprecationBanner(logging.Filter):
    """fedsim drives Flower's simulation engine through ``run_simulation`` on purpose
    (no ``flwr run`` local mode, which installs dependencies at run time); its
    deprecation banner is not actionable for a fedsim user."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return "DEPRECATED FEATURE" not in msg and "deprecated feature" not in msg


def _start_ray(init_args: dict[str, Any]) -> None:
    """Start (or join) Ray in the main thread, as Flower's Ray backend would: the workers get
    this process's import path. Flower's backend then finds Ray running and uses it."""
    import ray

    if ray.is_initialized():
        return
    pythonpath = os.pathsep.join(sys.path)
    if os.environ.get("PYTHONPATH"):
        pythonpath = f"{pythonpath}{os.pathsep}{os.environ['PYTHONPATH']}"
    os.environ["PYTHONPATH"] = pythonpath
    ray.init(runtime_env={"env_vars": {"PYTHONPATH": pythonpath}}, **init_args)


def _stop_ray() -> None:
    """Shut Ray down if it is still up (Flower's backend shuts it down after a normal run)."""
    import ray

    if ray.is_initialized():
        ray.shutdown()


def _quiet_flower() -> None:
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    flwr_logger = logging.getLogger("flwr")
    flwr_logger.setLevel(logging.WARNING)
    if not any(isinstance(f, _DropDeprecationBanner) for f in flwr_logger.filters):
        flwr_logger.addFilter(_DropDeprecationBanner())
    warnings.filterwarnings("ignore", category=DeprecationWarning)


def _truncate_lines(path: Path, keep: int) -> list[dict[str, Any]]:
    lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()] if path.exists() else []
    if len(lines) < keep:
        raise FedsimError(f"{path} has {len(lines)} rows but the checkpoint is after round {keep}")
    tmp = path.with_name(".metrics.jsonl.tmp")
    tmp.write_text("".join(ln + "\n" for ln in lines[:keep]), encoding="utf-8")
    os.replace(tmp, path)
    return [json.loads(ln) for ln in lines[:keep]]


def run_experiment(
    cfg: Config,
    out_dir: str | Path | None = None,
    progress: bool = True,
    client_app: Any = None,
    resume: bool = False,
    synthetic: Any = None,
    deployment: Any = None,
) -> dict[str, Any]:
    """Run ``cfg`` in Flower's simulation engine on Ray and write the run folder.

    Parameters
    ----------
    cfg : the validated experiment config.
    out_dir : run folder (default ``runs/<timestamp>-<name>``); must not hold a run.
    progress : print the header and the live progress line.
    client_app : the Flower ClientApp to run (default ``clients.client_app.app``; tests
        pass a fault-injecting one).
    resume : continue the run in ``out_dir`` from its checkpoint (the caller has checked
        the config with :func:`fedsim.resume.resume_config`; ε comes from the checkpoint's spec). Rows of ``metrics.jsonl`` after the
        checkpoint are discarded and recomputed; the result is bit-identical to an
        uninterrupted run. The caller has checked the config against the checkpoint
        (:func:`fedsim.resume.resume_config`); ε is computed from the checkpoint's spec.
    synthetic : optional simulated users (``count`` of them, ids ``N..N+count−1``, with
        ``update_sum``), e.g. the audit's canaries; they are sampled and accounted as part of
        the population (see :class:`strategies.user_dp.UserLevelDPStrategy`). Before the run,
        ``synthetic.bind(first_id=N, dim=d)`` tells them their ids and the model size.
    deployment : run on a Deployment Engine instead of the simulation engine: a
        :class:`fedsim.deploy.runconfig.Deployment` with the ServerApp's ``grid``, the census
        population ``data`` and ``owners``, the number of nodes to wait for, and the secret
        seeds of the noise and the sampler (drawn from the OS CSPRNG, never written anywhere
        but the checkpoint's state).

    Returns the summary dict (also written to ``summary.json``).

    The run folder is checked and locked (:mod:`fedsim.runfolder`) before any data is loaded; a
    second process on the same folder is refused with the holder's PID.
    """
    from fedsim.runfolder import RunFolderLock, prepare_out_dir

    t_start = time.perf_counter()
    out = prepare_out_dir(Path(out_dir) if out_dir is not None else default_run_dir(cfg))
    with RunFolderLock(out):
        if not resume and (out / "metrics.jsonl").exists():
            raise FedsimError(f"run folder {out} already holds a run; choose another --out or --resume it")
        return _run_locked(cfg, out, t_start, progress, client_app, resume, synthetic, deployment)


def _run_locked(
    cfg: Config,
    out: Path,
    t_start: float,
    progress: bool,
    client_app: Any,
    resume: bool,
    synthetic: Any,
    deployment: Any,
) -> dict[str, Any]:
    """:func:`run_experiment` once the run folder ``out`` is checked and locked."""
    ckpt: dict[str, Any] = {}
    resumed_spec = None
    if resume:
        from fedsim.checkpoint import load_checkpoint
        from fedsim.resume import checkpointed_spec

        ckpt = load_checkpoint(out / "checkpoint")
        resumed_spec = checkpointed_spec(ckpt, out)
    run = build_run(cfg, resumed_spec=resumed_spec, synthetic=synthetic, deployment=deployment)
    (out / "config.toml").write_text(run.resolved.to_toml(), encoding="utf-8")
    rec = RunRecorder(run, out, progress)
    if resume:
        rec.restore(ckpt)
    rec.open()
    stop = StopRequest(notice=rec.stopping)
    strategy = make_strategy(run, rec.on_round_end, stop)
    _quiet_flower()
    if progress:
        _print_header(run, out, deployment is not None)
    try:
        _execute(run, strategy, client_app, deployment, stop, f"fedsim run --resume {out}")
    finally:
        rec.close()
    if stop.requested:
        if rec.saved != run.server.round:  # the state after the last completed round
            rec.save(run.server.round)
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
    rec.write_ledger()
    run.server.write_trace(out / "filter_trace.npz")
    summary = make_summary(run, rec, time.perf_counter() - t_start, deployment is not None)
    (out / "summary.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    from fedsim.report import plot_run

    plot_run(out)
    return summary


def _eval_metrics(row: dict[str, Any]) -> dict[str, float]:
    """The evaluation metrics of a metrics row (without the counts)."""
    return {
        k: row[k]
        for k in sorted(row)
        if k.startswith("eval_") and k not in ("eval_examples", "eval_failed_users") and row[k] is not None
    }


class RunRecorder:
    """The run's callbacks: metrics rows, checkpoints, the ledger file and the progress line.

    Parameters
    ----------
    run : the built run. out : the run folder. progress : show the progress line.
    """

    def __init__(self, run: Run, out: Path, progress: bool) -> None:
        self.run = run
        self.out = out
        self.last_eval: float | None = None
        self.last_eval_metrics: dict[str, float] | None = None
        #: the round of the last checkpoint written by this process (None: none yet).
        self.saved: int | None = None
        self._truncate_to: int | None = None
        self.writer: MetricsWriter | None = None  # opened by :meth:`open`, after a resume's truncation
        self.line = ProgressLine(
            run.cfg.rounds, enabled=progress, relation=RELATION_LABELS[run.spec.neighboring_relation]
        )
        self._flwr_level = logging.getLogger("flwr").level

    def restore(self, ckpt: dict[str, Any]) -> None:
        """Load the checkpoint's state into the run and drop the metrics rows after it."""
        run, out = self.run, self.out
        run.server.load_state_dict(ckpt["server"])
        run.ledger.planned_rounds = run.cfg.rounds  # a Gaussian run may have been extended (fedsim.resume)
        run.sampler.load_state_dict(ckpt["sampler"])
        if run.client_store is not None:
            run.client_store.load_state_dict(ckpt["client_state"])
        done = int(ckpt["metrics_rows"])
        if done != run.server.round:
            raise FedsimError(f"checkpoint in {out} is inconsistent (rows {done}, round {run.server.round})")
        if done >= run.cfg.rounds:
            raise FedsimError(f"the run in {out} is already complete ({done} of {run.cfg.rounds} rounds)")
        for row in _truncate_lines(out / "metrics.jsonl", done):
            self._note_eval(row)

    def open(self) -> None:
        """Open ``metrics.jsonl`` for appending (after :meth:`restore` on resume)."""
        self.writer = MetricsWriter(self.out / "metrics.jsonl")

    def _note_eval(self, row: dict[str, Any]) -> None:
        if row.get("eval_accuracy") is not None:
            self.last_eval = row["eval_accuracy"]
            self.last_eval_metrics = _eval_metrics(row)

    def write_ledger(self) -> None:
        tmp = self.out / ".ledger.json.tmp"
        tmp.write_text(json.dumps(self.run.ledger.to_json(), indent=1), encoding="utf-8")
        os.replace(tmp, self.out / "ledger.json")

    def save(self, r: int) -> None:
        """Checkpoint the state after round ``r`` and write the ledger."""
        run = self.run
        save_checkpoint(
            self.out / "checkpoint",
            {
                "format": "fedsim.checkpoint/2",
                "spec": run.spec.to_dict(),
                "privacy_digest": privacy_digest(run.resolved),
                "server": run.server.state_dict(),
                "sampler": run.sampler.state_dict(),
                "client_state": None if run.client_store is None else run.client_store.state_dict(),
                "metrics_rows": r,
                "config": run.resolved.model_dump(mode="json"),
            },
        )
        self.saved = r
        self.write_ledger()

    def on_round_end(self, row: dict[str, Any], strategy: Any) -> None:
        """After each round: the metrics row, the checkpoint when due, the progress line."""
        assert self.writer is not None, "RunRecorder.open() comes first"
        self.writer.write(public_row(row, self.run.publish))
        self._note_eval(row)
        r = row["round"]
        if r % self.run.cfg.checkpoint.every == 0 or r == self.run.cfg.rounds:
            self.save(r)
        self.line.update(public_row(row, self.run.publish))

    def stopping(self, name: str) -> None:
        """The first stop signal arrived (:mod:`fedsim.interrupt`)."""
        # workers that got the same signal die mid-round: Flower's logs of that are expected now
        logging.getLogger("flwr").setLevel(logging.CRITICAL + 1)
        self.line.notice(
            f"fedsim: {name}: abandoning the round in flight (no noise is drawn for it), writing the "
            f"checkpoint and stopping the workers; {'press Ctrl-C' if name == 'SIGINT' else 'signal'} "
            f"again to quit at once"
        )

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        logging.getLogger("flwr").setLevel(self._flwr_level)


def make_strategy(run: Run, on_round_end: Any, stop: StopRequest) -> Any:
    """The Flower strategy of ``run``, with every setting given at construction."""
    from strategies.user_dp import UserLevelDPStrategy

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
    )


def _print_header(run: Run, out: Path, deployed: bool) -> None:
    cfg, spec, prep = run.cfg, run.spec, run.prep
    workers = "SuperNodes" if deployed else "Ray workers" if run.engine == "ray" else "in-process workers"
    print(
        f"fedsim: {cfg.name}: {run.data.population} users, {prep.num_params:,} parameters, {cfg.rounds} rounds, "
        f"{spec.mechanism} noise z = {spec.noise_multiplier:.4g}, δ = {spec.delta:.3g}, ε for "
        f"{RELATION_LABELS[spec.neighboring_relation]} ({spec.scheme} sampling, K̄ = {spec.cohort_size:.4g}), "
        f"{run.n_workers} {workers} → {out}",
        flush=True,
    )
    for note in run.notes:
        print(f"fedsim: {note}", flush=True)
    print(
        f"fedsim: note: {SIDE_STATISTICS_NOTE}"
        if run.publish
        else "fedsim: side statistics are not published (privacy.publish_side_statistics = false); no evaluation runs",
        flush=True,
    )


def _ray_backend_config(run: Run) -> tuple[dict[str, Any], dict[str, Any]]:
    """Ray's ``init`` arguments and Flower's backend config for ``run``'s workers."""
    cfg, n = run.cfg, run.n_workers
    gpus = cfg.sim.client_gpus if torch.cuda.is_available() else 0.0
    init_args: dict[str, Any] = {
        "num_cpus": int(math.ceil(n * cfg.sim.client_cpus)),
        "num_gpus": int(math.ceil(n * gpus)),
        "include_dashboard": False,
        "logging_level": logging.ERROR,
        "log_to_driver": True,
    }
    if cfg.sim.ray_address:  # join a running cluster: its resources, not ours
        init_args = {"address": cfg.sim.ray_address, "logging_level": logging.ERROR, "log_to_driver": True}
    return init_args, {"client_resources": {"num_cpus": cfg.sim.client_cpus, "num_gpus": gpus}, "init_args": init_args}


def _execute(run: Run, strategy: Any, client_app: Any, deployment: Any, stop: StopRequest, resume_hint: str) -> None:
    """Run the strategy's rounds on the engine, with the stop signals handled
    (:mod:`fedsim.interrupt`); on a stop, every process this run started is gone on return."""
    if client_app is None:
        from clients.client_app import app as client_app
    ray_engine = deployment is None and run.engine == "ray"
    ours = set(descendants())  # processes that are not this run's (kept on a stop)
    try:
        if ray_engine:
            init_args, backend_config = _ray_backend_config(run)
            _start_ray(init_args)  # here, so that the stop handlers below replace Ray's own
        with stop_on_signals(stop, resume_hint, spare=ours):
            if deployment is not None:
                strategy.run(deployment.grid)
            elif run.engine == "inprocess":
                from fedsim.engine import InProcessGrid, task_identity

                with task_identity():
                    strategy.run(InProcessGrid(client_app, run.n_workers, stop=stop.event))
            else:
                from flwr.simulation import run_simulation

                from strategies.server_app import make_server_app

                run_simulation(
                    server_app=make_server_app(strategy),
                    client_app=client_app,
                    num_supernodes=run.n_workers,
                    backend_config=backend_config,
                )
    finally:
        if ray_engine:
            _stop_ray()
    if stop.requested and deployment is None:
        kill_descendants(grace=3.0, spare=ours)


def make_summary(run: Run, rec: RunRecorder, wall_seconds: float, deployed: bool) -> dict[str, Any]:
    """``summary.json``: the run's final numbers and what its ε covers."""
    cfg, spec, prep, server = run.cfg, run.spec, run.prep, run.server
    eps = run.ledger.epsilon
    ex = run.data.examples_per_user()
    summary = {
        "name": cfg.name,
        "final_eval_accuracy": rec.last_eval,
        "final_eval_metrics": rec.last_eval_metrics,
        "majority_baseline_accuracy": run.baseline,
        "epsilon": eps if math.isfinite(eps) else "inf",
        "delta": spec.delta,
        "noise_multiplier": spec.noise_multiplier,
        "update_noise_multiplier": prep.update_noise_multiplier,
        "final_clip_norm": server.clip_norm,
        "error_feedback": run.ef,
        "unit": cfg.privacy.unit,
        "example_epsilon_max": None if run.ledger.silo is None else run.ledger.silo.max_epsilon,
        "notes": run.notes,
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
        "engine": "deployment" if deployed else run.engine,
        "vectorized": run.task.vectorize,
        "device": str(run.device),
        "guarantee": "none: epsilon = inf"
        if spec.no_guarantee
        else ("none: no noise" if spec.mechanism == "none" else "user-level (ε, δ)-DP of every released model"),
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
