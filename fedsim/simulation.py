"""Run an experiment: resolve privacy, build the pieces, run Flower's simulation on Ray,
and leave a run folder.

Run folder (``--out DIR``, default ``runs/<timestamp>-<name>``):

- ``config.toml``   the resolved config (defaults filled in, δ resolved)
- ``metrics.jsonl`` one JSON object per round
- ``ledger.json``   the privacy ledger (spec + ε after every round)
- ``summary.json``  final numbers (accuracy, ε, δ, z, model hash, wall time, …)
- ``checkpoint/checkpoint.pt`` every stateful piece (model, optimizer, noise, sampler, ledger)
- ``plots/``        ``accuracy.png`` and ``epsilon.png``
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import sys
import time
import warnings
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn.utils import parameters_to_vector

from fedsim.checkpoint import save_checkpoint
from fedsim.config import Config
from fedsim.data import DataSpec, FederatedData, load_federated
from fedsim.errors import FedsimError
from fedsim.interrupt import RunInterrupted, StopRequest, descendants, kill_descendants, stop_on_signals
from fedsim.metrics import SIDE_STATISTICS_NOTE, MetricsWriter, ProgressLine, public_row
from fedsim.models import make_model, num_parameters
from fedsim.optim import make_optimizer
from fedsim.privacy.accounting import (
    RELATION_LABELS,
    AccountingSpec,
    calibrate_noise_multiplier,
    default_delta,
    epsilon,
)
from fedsim.privacy.ledger import Ledger
from fedsim.privacy.mechanisms import MFPlan, make_noise, plan_mf
from fedsim.privacy.participation import GroupScheme, ParticipationScheme, make_scheme
from fedsim.privacy.rng import PrivacyKey
from fedsim.sampling import make_sampler
from fedsim.seeding import derive_seed
from fedsim.server import DPServer
from fedsim.resume import privacy_digest
from fedsim.training import LocalTraining


#: Stable ids of simulated users (the audit's canaries), which join the sampled population.
SYNTHETIC_ID_PREFIX = "__fedsim_synthetic_user_"


def scheme_of(cfg: Config, population: int) -> ParticipationScheme:
    """The participation scheme ``cfg`` asks for, checked against the run length."""
    s = cfg.sampling
    return make_scheme(s.scheme, population, s.cohort_size, min_sep=s.min_sep,
                       max_participations=s.max_participations,
                       poisson_within_group=s.poisson_within_group, rounds=cfg.rounds,
                       assignment=s.assignment)


def note_max_users(cfg: Config, population: int) -> None:
    """Say (on stderr) when ``data.max_users`` exceeds the dataset's users, instead of clamping silently."""
    if cfg.data.max_users is not None and cfg.data.max_users > population:
        import sys

        print(f"fedsim: note: data.max_users = {cfg.data.max_users} exceeds the {population} users of "
              f"{cfg.data.name}; using all {population}", file=sys.stderr, flush=True)


def resolve_privacy(cfg: Config, population: int) -> AccountingSpec:
    """The accounting spec of ``cfg`` for a population of ``population`` users:
    δ defaulted to ``1/N^1.1`` and ``z`` calibrated when a target ε is given."""
    cfg.validate_population(population)
    scheme = scheme_of(cfg, population)
    p = cfg.privacy
    delta = p.delta if p.delta is not None else default_delta(population)
    if delta >= 1.0 / population and not p.delta_reason:
        raise FedsimError(f"privacy.delta = {delta:g} is not below 1/N = {1.0 / population:.3g}: a δ that large allows "
                          f"releasing one user's data outright. Lower it (the default is 1/N^1.1 = "
                          f"{default_delta(population):.3g}), or say why in privacy.delta_reason = \"…\"")
    amplified = isinstance(scheme, GroupScheme) and scheme.poisson_within_group
    spec = AccountingSpec(mechanism=p.mechanism, scheme=cfg.sampling.scheme, population=population,
                          cohort_size=scheme.expected_cohort, noise_multiplier=p.noise_multiplier or 0.0,
                          delta=delta, accountant=p.accountant,
                          min_sep=scheme.min_separation or 1, amplified=amplified,
                          no_guarantee=cfg.client.error_feedback == "server",
                          assignment=scheme.assignment)
    if p.mechanism != "none" and p.target_epsilon is not None:
        z = calibrate_noise_multiplier(spec, cfg.rounds, p.target_epsilon)
        spec = replace(spec, noise_multiplier=z)
    return spec


def count_releases_per_user(spec: AccountingSpec, scheme: ParticipationScheme, rounds: int) -> int:
    """``k`` of the adaptive-clipping budget split (:mod:`fedsim.privacy.adaptive_clip`): 1 when
    the accountant composes per round or per participation, else the user's maximum number of
    participations (MF noise accounted as one Gaussian over the run)."""
    if not spec.is_mf or spec.amplified:
        return 1
    k = scheme.max_participations or 1
    b = scheme.min_separation or rounds
    return int(min(k, -(-rounds // b)))


def resolve_clipping(cfg: Config, spec: AccountingSpec, scheme: ParticipationScheme) -> tuple[float, dict[str, Any] | None]:
    """The update's noise multiplier and, with adaptive clipping, the budget split.

    Without adaptive clipping the update uses the whole ``z``. With it, the count takes
    ``σ_b`` and the update gets ``z_Δ = (z^{−2} − k·(2σ_b)^{−2})^{−1/2}``; raises
    :class:`FedsimError` when ``σ_b`` leaves nothing for the update.
    """
    z = spec.noise_multiplier if spec.mechanism != "none" else 0.0
    c = cfg.clipping
    if not c.adaptive:
        return z, None
    from fedsim.privacy.adaptive_clip import update_noise_multiplier

    sigma_b = c.count_stddev if c.count_stddev is not None else scheme.expected_cohort / 20.0
    k = count_releases_per_user(spec, scheme, cfg.rounds)
    z_update = update_noise_multiplier(z, sigma_b, k)
    return z_update, {
        "query": "adaptive clipping (Andrew et al. 2021): centred count of unclipped users",
        "noise_multiplier": z,
        "update_noise_multiplier": z_update,
        "count_stddev": sigma_b,
        "count_sensitivity": 0.5,
        "count_releases_per_user": k,
        "target_quantile": c.target_quantile,
        "clip_lr": c.lr,
        "initial_clip_norm": cfg.client.clip_norm,
    }


def privacy_report(cfg: Config, population: int) -> dict[str, Any]:
    """What ``fedsim privacy --json`` prints: ε after ``cfg.rounds`` rounds without training."""
    spec = resolve_privacy(cfg, population)
    eps = epsilon(spec, cfg.rounds)
    _, split = resolve_clipping(cfg, spec, scheme_of(cfg, population))
    notes = []
    if cfg.client.error_feedback == "server":
        from fedsim.error_feedback import SERVER_EF_LABEL

        notes.append(SERVER_EF_LABEL)
    return {
        "budget_split": split,
        "notes": notes,
        "epsilon": eps if math.isfinite(eps) else "inf",
        "delta": spec.delta,
        "noise_multiplier": spec.noise_multiplier,
        "rounds": cfg.rounds,
        "sampling_rate": spec.sampling_rate,
        "population": population,
        "mechanism": spec.mechanism,
        "accountant": spec.effective_accountant,
        "scheme": spec.scheme,
        "cohort_size": spec.cohort_size,
        "neighboring_relation": spec.neighboring_relation,
        "assignment": spec.assignment,
        "sensitivity_in_c": spec.sensitivity_in_c,
    }


def default_run_dir(cfg: Config) -> Path:
    return Path("runs") / f"{datetime.now().strftime('%Y%m%d-%H%M%S')}-{cfg.name}"


def model_sha256(params: torch.Tensor) -> str:
    """SHA-256 of the flat float32 parameters (little-endian bytes)."""
    return hashlib.sha256(params.detach().cpu().to(torch.float32).contiguous().numpy().tobytes()).hexdigest()


def _device(cfg: Config) -> torch.device:
    if cfg.sim.device == "cuda" and not torch.cuda.is_available():
        raise FedsimError("sim.device = 'cuda' but no CUDA device is available; use 'auto' or 'cpu'")
    if cfg.sim.device == "cpu":
        return torch.device("cpu")
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def num_workers(cfg: Config) -> int:
    """Workers (SuperNodes / Ray actors): ``sim.num_workers`` or CPUs / ``sim.client_cpus``."""
    if cfg.sim.num_workers is not None:
        return cfg.sim.num_workers
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, int(cpus // cfg.sim.client_cpus))


def resolve_vectorize(cfg: Config, model_ok: bool, disk_client: bool) -> bool:
    """Whether workers train their users together (``sim.vectorize``; :mod:`fedsim.vectorized`)."""
    other = disk_client or cfg.client.error_feedback != "none" or cfg.privacy.unit == "example"
    if cfg.sim.vectorize == "off":
        return False
    if cfg.sim.vectorize == "on" and (not model_ok or other):
        raise FedsimError(f"sim.vectorize = 'on': model.name = '{cfg.model.name}' "
                          f"{'has recurrent layers or more than 2M parameters' if not model_ok else 'is fine, but'}"
                          f"{'' if not other else ' DiSK client evaluation, error feedback or example-level DP is on'};"
                          f" use sim.vectorize = 'auto' or 'off'")
    return model_ok and not other


def resolve_engine(cfg: Config, n_workers: int) -> str:
    """``sim.engine``, with ``auto`` → ``inprocess`` for one worker, ``ray`` otherwise."""
    if cfg.sim.engine != "auto":
        return cfg.sim.engine
    return "inprocess" if n_workers == 1 else "ray"


@dataclass
class Prepared:
    """Everything built before the simulation starts (nothing has run yet)."""

    cfg: Config
    data: FederatedData
    spec: AccountingSpec
    scheme: ParticipationScheme
    plan: MFPlan | None
    x0: torch.Tensor
    num_params: int
    update_noise_multiplier: float
    budget_split: dict[str, Any] | None
    vectorizable: bool = False


def prepare(cfg: Config, extra_users: int = 0, data: FederatedData | None = None) -> Prepared:
    """Load data, validate against the population and resolve privacy; raises
    :class:`FedsimError` before anything starts.

    ``extra_users`` simulated users (the audit's canaries) join the population that is
    sampled and accounted: ``N + extra_users``. ``data``: the population to use instead of
    loading ``cfg.data`` (deployment: the census of the nodes' users).
    """
    if data is None:
        data = load_federated(DataSpec.from_config(cfg.data))
        note_max_users(cfg, data.population)
    spec = resolve_privacy(cfg, data.population + extra_users)
    scheme = scheme_of(cfg, data.population + extra_users)
    z_update, split = resolve_clipping(cfg, spec, scheme)
    plan = None
    if spec.is_mf:
        p = cfg.privacy
        plan = plan_mf(p.mechanism, scheme, cfg.rounds, workload=p.workload, momentum=cfg.server.momentum,
                       bands=p.bands, buffers=p.buffers, tau=p.tau, objective=p.objective,
                       tree_estimator=p.tree_estimator, factorize_device=p.factorize_device)
    model = make_model(cfg.model.name, data.model_dims(), seed=derive_seed(cfg.seed, "model"),
                       dp_layers=cfg.privacy.unit == "example")
    x0 = parameters_to_vector(model.parameters()).detach().to(torch.float32)
    if cfg.client.error_feedback == "client":
        from fedsim.error_feedback import check_memory

        check_memory(data.population, x0.numel(), cfg.client.error_feedback_memory_mb)
    from fedsim.vectorized import vectorizable

    return Prepared(cfg, data, spec, scheme, plan, x0, num_parameters(model), z_update, split,
                    vectorizable(model))


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


def make_server_filter(cfg: Config) -> Any:
    """The server-side filter of ``cfg.filter`` (None for ``none``)."""
    f = cfg.filter
    if f.name == "none":
        return None
    from fedsim.filters import make_filter

    if f.name == "doppler":
        kw: dict[str, Any] = {"b": f.b, "a": f.a} if f.b is not None or f.a is not None else {"preset": f.preset}
        return make_filter("doppler", **kw)
    if f.name == "ema":
        return make_filter("ema", kappa=f.kappa)
    return make_filter("disk", mode=f.mode, kappa=f.kappa, gamma=f.gamma)


def make_server_optimizer(cfg: Config, noise_std: float | Any, plan: MFPlan | None, filt: Any,
                          expected_cohort: float | None = None) -> Any:
    """The server optimizer; for ``adambc`` with ``Φ_t`` computed exactly from the noise
    mechanism (its noising matrix) pushed through the filter's impulse response.
    ``noise_std`` is ``c·z·sens`` or, with adaptive clipping, a function of the round;
    ``expected_cohort`` is ``K̄`` (default ``sampling.cohort_size``)."""
    if expected_cohort is None:
        expected_cohort = float(cfg.sampling.cohort_size or 0) or 1.0
    s = cfg.server
    if s.optimizer != "adambc":
        return make_optimizer(s.optimizer, s.lr, s.momentum, s.beta1, s.beta2, s.eps, s.bias_correction)
    from fedsim.server import noise_variance_fn

    impulse = None if filt is None else filt.impulse_response(cfg.rounds)
    phi = noise_variance_fn(noise_std, expected_cohort, None if plan is None else plan.noising, impulse)
    return make_optimizer("adambc", s.lr, s.momentum, s.beta1, s.beta2, s.eps, s.bias_correction,
                          noise_variance=phi, gamma_frac=s.gamma_frac)


def _truncate_lines(path: Path, keep: int) -> list[dict[str, Any]]:
    lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()] if path.exists() else []
    if len(lines) < keep:
        raise FedsimError(f"{path} has {len(lines)} rows but the checkpoint is after round {keep}")
    tmp = path.with_name(".metrics.jsonl.tmp")
    tmp.write_text("".join(ln + "\n" for ln in lines[:keep]), encoding="utf-8")
    os.replace(tmp, path)
    return [json.loads(ln) for ln in lines[:keep]]


def run_experiment(cfg: Config, out_dir: str | Path | None = None, progress: bool = True,
                   client_app: Any = None, resume: bool = False, synthetic: Any = None,
                   deployment: Any = None) -> dict[str, Any]:
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


def _run_locked(cfg: Config, out: Path, t_start: float, progress: bool, client_app: Any, resume: bool,
                synthetic: Any, deployment: Any) -> dict[str, Any]:
    """:func:`run_experiment` once the run folder ``out`` is checked and locked."""
    ckpt: dict[str, Any] = {}
    if resume:
        from fedsim.checkpoint import load_checkpoint
        from fedsim.resume import checkpointed_spec

        ckpt = load_checkpoint(out / "checkpoint")
        resumed_spec = checkpointed_spec(ckpt, out)
    prep = prepare(cfg, extra_users=0 if synthetic is None else int(synthetic.count),
                   data=None if deployment is None else deployment.data)
    if resume:  # ε always comes from the spec the run started with, never from an edited file
        z_update, split = resolve_clipping(cfg, resumed_spec, prep.scheme)
        prep = replace(prep, spec=resumed_spec, update_noise_multiplier=z_update, budget_split=split)
    data, spec = prep.data, prep.spec

    resolved = cfg.model_copy(deep=True)
    resolved.privacy.delta = spec.delta
    (out / "config.toml").write_text(resolved.to_toml(), encoding="utf-8")

    device = _device(cfg)
    n_workers = num_workers(cfg) if deployment is None else deployment.min_nodes
    engine = resolve_engine(cfg, n_workers)
    # The key of everything privacy rests on (noise, cohort sampling, the clip count's noise):
    # derived from the config's seed in simulation (reproducible studies, not secret), 256 bits
    # from the OS CSPRNG in deployment (never logged, written to the config or sent).
    privacy_key = PrivacyKey.from_seed(cfg.seed) if deployment is None else deployment.privacy_key
    noise = make_noise(spec.mechanism, prep.num_params, privacy_key.derive("noise"), device, prep.plan)
    z_eff = prep.update_noise_multiplier
    filt = make_server_filter(cfg)
    clip_ctl = None
    server_ef = None
    ef = cfg.client.error_feedback
    c1, c2 = cfg.client.clip_norm, cfg.client.c2
    # The norm the noise scales with: c₁ + c₂ bounds a client-EF message; the server variant
    # uses the DiceSGD theorem's √(c₁² + 2c₂²).
    server_clip = c1
    if ef == "client":
        server_clip = c1 + c2
    elif ef == "server":
        from fedsim.error_feedback import ServerErrorFeedback, server_noise_norm

        server_clip = server_noise_norm(c1, c2)
        server_ef = ServerErrorFeedback(prep.num_params, c2, device)
    noise_std: Any = server_clip * z_eff * noise.sensitivity
    if prep.budget_split is not None:
        from fedsim.privacy.adaptive_clip import AdaptiveClip

        clip_ctl = AdaptiveClip(cfg.client.clip_norm, cfg.clipping.target_quantile, cfg.clipping.lr,
                                prep.budget_split["count_stddev"], prep.scheme.expected_cohort,
                                privacy_key.derive("clip-count"))

        def noise_std(tau: int, _c=clip_ctl, _s=z_eff * noise.sensitivity) -> float:
            return (_c.history + [_c.clip_norm])[tau] * _s
    optimizer = make_server_optimizer(cfg, noise_std=noise_std, plan=prep.plan, filt=filt,
                                      expected_cohort=prep.scheme.expected_cohort)
    notes = []
    if ef == "server":
        from fedsim.error_feedback import SERVER_EF_LABEL

        notes.append(SERVER_EF_LABEL)
    publish = cfg.privacy.publish_side_statistics
    ledger = Ledger(spec, cfg.rounds, budget_split=prep.budget_split, notes=notes,
                    account_every=cfg.privacy.account_every, side_statistics=publish)
    example_dp = None
    if cfg.privacy.unit == "example":
        from fedsim.example_dp import ExampleDP, SiloLedger, steps_and_rate

        example_dp = ExampleDP(float(cfg.privacy.example_noise_multiplier), cfg.privacy.example_clip_norm)
        n_train = [data.num_train(u) for u in range(data.population)]
        ex_delta = cfg.privacy.example_delta or 1.0 / max(n_train) ** 1.1
        ledger.silo = SiloLedger(example_dp, ex_delta, {
            u: steps_and_rate(min(n, cfg.client.max_examples), cfg.client.batch_size, cfg.client.local_epochs)
            for u, n in enumerate(n_train)})
    server = DPServer(prep.x0.to(device), noise, optimizer, ledger, server_clip,
                      z_eff, prep.scheme.expected_cohort, filter=filt, clip_controller=clip_ctl,
                      error_feedback=server_ef)
    user_ids = list(data.names) + ([] if synthetic is None else
                                   [f"{SYNTHETIC_ID_PREFIX}{k}" for k in range(int(synthetic.count))])
    sampler = make_sampler(prep.scheme, privacy_key.derive("sampling"), user_ids)
    if cfg.filter.trace_coordinates:
        server.enable_trace(cfg.filter.trace_coordinates, derive_seed(cfg.seed, "filter-trace"))

    from fedsim.protocol import Task

    local = LocalTraining(cfg.client.local_epochs, cfg.client.batch_size, cfg.client.lr,
                          cfg.client.max_examples, cfg.client.clip_norm)
    disk = None
    if server.track_step:
        from fedsim.training import DiskClient

        disk = DiskClient(filt.mode, filt.gamma, filt.a)
    task = Task(DataSpec.from_config(cfg.data), cfg.model.name, derive_seed(cfg.seed, "model"), cfg.seed,
                local, threads=max(1, int(cfg.sim.client_cpus)),
                use_gpu=cfg.sim.client_gpus > 0 and cfg.sim.device != "cpu", disk=disk,
                error_feedback=ef, ef_clip=c2 if ef != "none" else 0.0, example_dp=example_dp,
                vectorize=resolve_vectorize(cfg, prep.vectorizable, disk is not None))
    client_store = None
    if ef == "client":
        from fedsim.error_feedback import ClientStateStore

        client_store = ClientStateStore(prep.num_params, data.population, cfg.client.error_feedback_memory_mb)
    train_costs = np.minimum(data.examples_per_user(), cfg.client.max_examples) * cfg.client.local_epochs
    pop = data.population
    if synthetic is not None:
        synthetic.bind(first_id=pop, dim=prep.num_params)
    if not publish:  # evaluation on users' held-out data is a side statistic: none is computed
        eval_users: list[int] = []
    elif cfg.eval.max_users is not None and cfg.eval.max_users < pop:
        rng = np.random.default_rng(derive_seed(cfg.seed, "eval-users"))
        eval_users = sorted(rng.choice(pop, size=cfg.eval.max_users, replace=False).tolist())
    else:
        eval_users = list(range(pop))
    eval_costs = np.array([min(data.num_test(u), cfg.eval.max_examples_per_user) for u in range(pop)])
    majority = data.majority_baseline(eval_users, cfg.eval.max_examples_per_user) if eval_users else None
    baseline = None if majority is None else majority[1]

    state: dict[str, Any] = {"last_eval": None, "last_eval_metrics": None, "saved": None}

    def eval_metrics(row: dict[str, Any]) -> dict[str, float]:
        return {k: row[k] for k in sorted(row) if k.startswith("eval_") and k not in ("eval_examples", "eval_failed_users")
                and row[k] is not None}
    if resume:
        server.load_state_dict(ckpt["server"])
        ledger.planned_rounds = cfg.rounds  # a Gaussian run may have been extended (fedsim.resume)
        sampler.load_state_dict(ckpt["sampler"])
        if client_store is not None:
            client_store.load_state_dict(ckpt["client_state"])
        done = int(ckpt["metrics_rows"])
        if done != server.round:
            raise FedsimError(f"checkpoint in {out} is inconsistent (rows {done}, round {server.round})")
        if done >= cfg.rounds:
            raise FedsimError(f"the run in {out} is already complete ({done} of {cfg.rounds} rounds)")
        for row in _truncate_lines(out / "metrics.jsonl", done):
            if row.get("eval_accuracy") is not None:
                state["last_eval"] = row["eval_accuracy"]
                state["last_eval_metrics"] = eval_metrics(row)
    writer = MetricsWriter(out / "metrics.jsonl")
    line = ProgressLine(cfg.rounds, enabled=progress, relation=RELATION_LABELS[spec.neighboring_relation])

    def write_ledger() -> None:
        tmp = out / ".ledger.json.tmp"
        tmp.write_text(json.dumps(ledger.to_json(), indent=1), encoding="utf-8")
        os.replace(tmp, out / "ledger.json")

    def save(r: int) -> None:
        save_checkpoint(out / "checkpoint", {
            "format": "fedsim.checkpoint/2",
            "spec": spec.to_dict(),
            "privacy_digest": privacy_digest(resolved),
            "server": server.state_dict(),
            "sampler": sampler.state_dict(),
            "client_state": None if client_store is None else client_store.state_dict(),
            "metrics_rows": r,
            "config": resolved.model_dump(mode="json"),
        })
        state["saved"] = r
        write_ledger()

    def on_round_end(row: dict[str, Any], strategy: Any) -> None:
        writer.write(public_row(row, publish))
        if row.get("eval_accuracy") is not None:
            state["last_eval"] = row["eval_accuracy"]
            state["last_eval_metrics"] = eval_metrics(row)
        r = row["round"]
        if r % cfg.checkpoint.every == 0 or r == cfg.rounds:
            save(r)
        line.update(public_row(row, publish))

    from strategies.server_app import make_server_app
    from strategies.user_dp import UserLevelDPStrategy

    flwr_level = logging.getLogger("flwr").level

    def on_stop(name: str) -> None:
        # workers that got the same signal die mid-round: Flower's logs of that are expected now
        logging.getLogger("flwr").setLevel(logging.CRITICAL + 1)
        line.notice(f"fedsim: {name}: abandoning the round in flight (no noise is drawn for it), writing the "
                    f"checkpoint and stopping the workers; {'press Ctrl-C' if name == 'SIGINT' else 'signal'} "
                    f"again to quit at once")

    stop = StopRequest(notice=on_stop)
    if client_app is None:
        from clients.client_app import app as client_app

    strategy = UserLevelDPStrategy(
        server=server, sampler=sampler, task_json=task.to_json(), train_costs=train_costs,
        rounds=cfg.rounds, eval_users=eval_users, eval_costs=eval_costs, eval_every=cfg.eval.every,
        eval_max_examples=cfg.eval.max_examples_per_user, round_timeout=cfg.sim.round_timeout,
        min_nodes=n_workers, min_valid_replies=cfg.sim.min_valid_replies, on_round_end=on_round_end,
        synthetic=synthetic, stop=stop.event)
    strategy.client_evaluations = 1 if disk is None else disk.evaluations
    if deployment is not None:
        strategy.owners = deployment.owners
    strategy.ef_mode = ef
    strategy.client_store = client_store
    strategy.update_clip = c1 if ef == "server" else None

    _quiet_flower()

    gpus = cfg.sim.client_gpus if torch.cuda.is_available() else 0.0
    init_args: dict[str, Any] = {
        "num_cpus": int(math.ceil(n_workers * cfg.sim.client_cpus)),
        "num_gpus": int(math.ceil(n_workers * gpus)),
        "include_dashboard": False,
        "logging_level": logging.ERROR,
        "log_to_driver": True,
    }
    if cfg.sim.ray_address:  # join a running cluster: its resources, not ours
        init_args = {"address": cfg.sim.ray_address, "logging_level": logging.ERROR, "log_to_driver": True}
    backend_config = {"client_resources": {"num_cpus": cfg.sim.client_cpus, "num_gpus": gpus}, "init_args": init_args}
    if progress:
        print(f"fedsim: {cfg.name}: {pop} users, {prep.num_params:,} parameters, {cfg.rounds} rounds, "
              f"{spec.mechanism} noise z = {spec.noise_multiplier:.4g}, δ = {spec.delta:.3g}, ε for "
              f"{RELATION_LABELS[spec.neighboring_relation]} ({spec.scheme} sampling, K̄ = {spec.cohort_size:.4g}), "
              f"{n_workers} {'SuperNodes' if deployment is not None else 'Ray workers' if engine == 'ray' else 'in-process workers'}"
              f" → {out}", flush=True)
        for note in notes:
            print(f"fedsim: {note}", flush=True)
        print(f"fedsim: note: {SIDE_STATISTICS_NOTE}" if publish else
              "fedsim: side statistics are not published (privacy.publish_side_statistics = false); "
              "no evaluation runs", flush=True)
    resume_hint = f"fedsim run --resume {out}"
    ours = set(descendants())  # processes that are not this run's (kept on a stop)
    try:
        if deployment is None and engine == "ray":
            _start_ray(init_args)  # here, so that the stop handlers below replace Ray's own
        with stop_on_signals(stop, resume_hint, spare=ours):
            if deployment is not None:
                strategy.run(deployment.grid)
            elif engine == "inprocess":
                from fedsim.engine import InProcessGrid, task_identity

                with task_identity():
                    strategy.run(InProcessGrid(client_app, n_workers, stop=stop.event))
            else:
                from flwr.simulation import run_simulation

                run_simulation(server_app=make_server_app(strategy), client_app=client_app,
                               num_supernodes=n_workers, backend_config=backend_config)
    finally:
        writer.close()
        if deployment is None and engine == "ray":
            _stop_ray()
        logging.getLogger("flwr").setLevel(flwr_level)
    if stop.requested:
        if state["saved"] != server.round:  # the state after the last completed round
            save(server.round)
        if deployment is None:
            kill_descendants(grace=3.0, spare=ours)
        abandoned = strategy.abandoned_round
        raise RunInterrupted(stop.signum or 2, (
            f"stopped by {stop.signal_name} after round {server.round} of {cfg.rounds}"
            + (f" (round {abandoned} abandoned before its noise was drawn)" if abandoned else "")
            + f"; resume with: {resume_hint}"))
    if server.round != cfg.rounds:
        raise RuntimeError(f"simulation stopped after {server.round} of {cfg.rounds} rounds; "
                           f"the checkpoint in {out / 'checkpoint'} holds the last completed round")
    write_ledger()
    server.write_trace(out / "filter_trace.npz")
    eps = ledger.epsilon
    ex = data.examples_per_user()
    summary = {
        "name": cfg.name,
        "final_eval_accuracy": state["last_eval"],
        "final_eval_metrics": state["last_eval_metrics"],
        "majority_baseline_accuracy": baseline,
        "epsilon": eps if math.isfinite(eps) else "inf",
        "delta": spec.delta,
        "noise_multiplier": spec.noise_multiplier,
        "update_noise_multiplier": z_eff,
        "final_clip_norm": server.clip_norm,
        "error_feedback": ef,
        "unit": cfg.privacy.unit,
        "example_epsilon_max": None if ledger.silo is None else ledger.silo.max_epsilon,
        "notes": notes,
        "neighboring_relation": spec.neighboring_relation,
        "assignment": spec.assignment,
        "mechanism": spec.mechanism,
        "scheme": spec.scheme,
        "sensitivity": noise.sensitivity,
        "sensitivity_exact": True if prep.plan is None else prep.plan.sens_exact,
        "factorization": None if prep.plan is None else prep.plan.describe(),
        "accountant": spec.effective_accountant,
        "cohort_size": spec.cohort_size,
        "rounds_completed": server.round,
        "population": spec.population,
        "examples_per_user": {"mean": float(ex.mean()), "median": float(np.median(ex)),
                              "min": int(ex.min()), "max": int(ex.max())},
        "num_parameters": prep.num_params,
        "model_sha256": model_sha256(server.params),
        "wall_seconds": time.perf_counter() - t_start,
        "num_workers": n_workers,
        "engine": "deployment" if deployment is not None else engine,
        "vectorized": task.vectorize,
        "device": str(device),
        "guarantee": "none: epsilon = inf" if spec.no_guarantee else (
            "none: no noise" if spec.mechanism == "none" else "user-level (ε, δ)-DP of every released model"),
        "side_statistics": {"published": publish, "covered_by_epsilon": False,
                            "note": SIDE_STATISTICS_NOTE if publish else "not published"},
    }
    if not publish:  # computed from users' data outside the DP mechanism
        for key in ("final_eval_accuracy", "final_eval_metrics", "majority_baseline_accuracy",
                    "example_epsilon_max", "examples_per_user"):
            summary[key] = None
    (out / "summary.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    try:
        from fedsim.report import plot_run

        plot_run(out)
    except ImportError:  # pragma: no cover - report module is part of the package
        pass
    return summary
