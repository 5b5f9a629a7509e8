"""Build a run from a config, without running anything: the runner's first half.

:func:`prepare` loads the data and resolves privacy (population, scheme, accounting spec,
factorization, the initial model); :func:`build_run` then builds every stateful piece of the
round — the noise, the server (filter, optimizer, clipping, ledger), the cohort sampler, the
clients' task and the evaluation users — into a :class:`Run`. Nothing here imports Flower or
Ray, writes a file or starts a process, so a run can be built and inspected in a test; the
runner (:mod:`fedsim.runner.runner`) executes it on an engine.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, cast

import numpy as np
import torch
from torch.nn.utils import parameters_to_vector

from fedsim.attacks.population import AuditView, ordinary_users
from fedsim.config import Config
from fedsim.data import load_federated
from fedsim.data.base import Population
from fedsim.errors import FedsimError
from fedsim.models import make_model, num_parameters
from fedsim.plugins import manifest as plugin_manifest
from fedsim.privacy.accounting import AccountingSpec
from fedsim.privacy.ledger import Ledger
from fedsim.privacy.mechanisms import MFPlan, make_noise
from fedsim.privacy.noise import MatrixStream
from fedsim.privacy.participation import ParticipationScheme
from fedsim.privacy.plan import mf_plan, note_max_users, resolve_clipping, resolve_privacy, scheme_of
from fedsim.privacy.rng import PrivacyKey
from fedsim.protocol import Task
from fedsim.seeding import derive_seed
from fedsim.server.sampling import CohortSampler, make_sampler
from fedsim.server.step import DPServer
from fedsim.training.local import LocalTraining

#: Stable ids of simulated users (the audit's canaries), which join the sampled population.
SYNTHETIC_ID_PREFIX = "__fedsim_synthetic_user_"


def model_sha256(params: torch.Tensor) -> str:
    """SHA-256 of the flat float32 parameters (little-endian bytes)."""
    return hashlib.sha256(params.detach().cpu().to(torch.float32).contiguous().numpy().tobytes()).hexdigest()


def _device(cfg: Config) -> torch.device:
    if cfg.sim.device == "cuda" and not torch.cuda.is_available():
        raise FedsimError("sim.device = 'cuda' but no CUDA device is available; use 'auto' or 'cpu'")
    if cfg.sim.device == "cpu":
        return torch.device("cpu")
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


#: Ray workers per CPU of this machine beyond which a local Ray is refused: each worker is a
#: process with its own model and data, and Ray is told it has ``num_workers·client_cpus`` CPUs.
MAX_WORKERS_PER_CPU = 4


def num_workers(cfg: Config) -> int:
    """Workers (SuperNodes / Ray actors): ``sim.num_workers`` or CPUs / ``sim.client_cpus``.
    On a local Ray, more than :data:`MAX_WORKERS_PER_CPU` per CPU is refused (1000 workers on
    2 CPUs started processes until the machine stalled, and round 1 never finished)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    n = cfg.sim.num_workers
    if n is None:
        return max(1, int(cpus // cfg.sim.client_cpus))
    local_ray = cfg.sim.ray_address is None and resolve_engine(cfg, n) == "ray"
    if local_ray and n > MAX_WORKERS_PER_CPU * cpus:
        raise FedsimError(
            f"sim.num_workers = {n}: each Ray worker is a process with its own model and data, and this machine "
            f"has {cpus} CPUs; more than {MAX_WORKERS_PER_CPU} workers per CPU ({MAX_WORKERS_PER_CPU * cpus}) "
            f"only adds processes that wait. Lower sim.num_workers (unset: {max(1, int(cpus // cfg.sim.client_cpus))} "
            f"here), use sim.engine = 'inprocess', or join a Ray cluster with sim.ray_address"
        )
    return n


def resolve_vectorize(
    cfg: Config, model_ok: bool, disk_client: bool, recurrent: bool = False, num_params: int = 0
) -> bool:
    """Whether workers train their users together (``sim.vectorize``; :mod:`fedsim.training.vectorized`).

    ``model_ok``: the model can be (:func:`fedsim.training.vectorized.vectorizable`). ``auto`` also asks
    that it pays off: never for a model with LSTM layers (``recurrent``; the fused kernel user by
    user was measured faster on the CPU and on an H200 GPU), any other only up to
    :data:`~fedsim.training.vectorized.MAX_PARAMS` parameters (``num_params``). ``on`` batches both."""
    from fedsim.training.vectorized import MAX_PARAMS

    other = (
        disk_client
        or cfg.client.error_feedback != "none"
        or cfg.privacy.unit == "example"
        or cfg.client.local_update is not None
    )
    if cfg.sim.vectorize == "off":
        return False
    if cfg.sim.vectorize == "on" and (not model_ok or other):
        raise FedsimError(
            f"sim.vectorize = 'on': model.name = '{cfg.model.name}' "
            f"{'has recurrent layers other than nn.LSTM' if not model_ok else 'is fine, but'}"
            f"{'' if not other else ' DiSK client evaluation, error feedback, example-level DP or a local update hook is on'};"
            f" use sim.vectorize = 'auto' or 'off'"
        )
    if cfg.sim.vectorize == "auto" and (recurrent or num_params > MAX_PARAMS):
        return False
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
    data: Population
    spec: AccountingSpec
    scheme: ParticipationScheme
    plan: MFPlan | None
    x0: torch.Tensor
    num_params: int
    update_noise_multiplier: float
    budget_split: dict[str, Any] | None
    vectorizable: bool = False
    recurrent: bool = False


def _check_output_width(cfg: Config, data: Any, model: torch.nn.Module) -> None:
    """A classifier must emit one logit per class: more would train and evaluate silently over
    classes that do not exist, fewer fail inside the loss. Checked on one training sample of the
    first user that has one (a deployment's census has no samples: not checked there)."""
    from fedsim.data.base import TopOneClassification

    if not isinstance(data, TopOneClassification) or not hasattr(data, "train_samples"):
        return
    data = cast(Any, data)  # a FederatedData that is also a classifier (the mixin alone types neither)
    user = next((u for u in range(data.population) if data.num_train(u) > 0), None)
    if user is None:
        return
    x, _ = data.train_samples(user, np.zeros(1, dtype=np.int64))
    try:
        with torch.no_grad():
            width = model.eval()(x).shape[-1]
    except Exception:  # a model that fails on the data is reported where it trains
        return
    finally:
        model.train()
    if width != data.vocab_size:
        raise FedsimError(
            f"model.name = {cfg.model.name!r} emits {width} logits per sample, but the data have "
            f"{data.vocab_size} classes; build the output layer with the num_classes the model is given"
        )


def prepare(cfg: Config, extra_users: int = 0, data: Population | None = None) -> Prepared:
    """Load data, validate against the population and resolve privacy; raises
    :class:`FedsimError` before anything starts.

    ``extra_users`` simulated users (the audit's canaries) join the population that is
    sampled and accounted: ``N + extra_users``. ``data``: the population to use instead of
    loading ``cfg.data`` (deployment: the census of the nodes' users).
    """
    if data is None:
        data = load_federated(cfg.data)
        note_max_users(cfg, data.population)
    spec = resolve_privacy(cfg, data.population + extra_users)
    scheme = scheme_of(cfg, data.population + extra_users)
    z_update, split = resolve_clipping(cfg, spec, scheme)
    plan = mf_plan(cfg, spec, scheme)
    model = make_model(
        cfg.model.name, data.model_dims(), seed=derive_seed(cfg.seed, "model"), dp_layers=cfg.privacy.unit == "example"
    )
    _check_output_width(cfg, data, model)
    x0 = parameters_to_vector(model.parameters()).detach().to(torch.float32)
    if cfg.client.error_feedback == "client":
        from fedsim.training.error_feedback import check_memory

        check_memory(data.population, x0.numel(), cfg.client.error_feedback_memory_mb)
    from fedsim.training.vectorized import recurrent, vectorizable

    return Prepared(
        cfg, data, spec, scheme, plan, x0, num_parameters(model), z_update, split, vectorizable(model), recurrent(model)
    )


def make_server_filter(cfg: Config) -> Any:
    """The server-side filter of ``cfg.filter`` (None for ``none``)."""
    if cfg.filter.name == "none":
        return None
    from fedsim.server.filters import FILTERS

    return FILTERS.get_part(cfg.filter.name).build(cfg.filter.filter_options())


def make_server_optimizer(
    cfg: Config, noise_std: float | Any, plan: MFPlan | None, filt: Any, expected_cohort: float | None = None
) -> Any:
    """The server optimizer; for ``adambc`` with ``Φ_t`` computed exactly from the noise
    mechanism (its noising matrix) pushed through the filter's impulse response, for
    ``lp_adambc`` the same without the filter (its second moment reads the unfiltered update).
    ``noise_std`` is ``c·z·sens`` or, with adaptive clipping, a function of the round;
    ``expected_cohort`` is ``K̄`` (default ``sampling.cohort_size``)."""
    from fedsim.server.optim import OPTIMIZERS

    if expected_cohort is None:
        expected_cohort = float(cfg.sampling.cohort_size or 0) or 1.0
    s = cfg.server
    kind = OPTIMIZERS.get_part(s.optimizer)
    phi = None
    if kind.noise_variance is not None:
        from fedsim.server.step import noise_variance_fn

        filtered = kind.noise_variance == "filtered" and filt is not None
        impulse = filt.impulse_response(cfg.rounds) if filtered else None
        phi = noise_variance_fn(noise_std, expected_cohort, None if plan is None else plan.noising, impulse)
    return kind.build(s.optimizer_options(), s.lr, phi)


class SyntheticUsers(Protocol):
    """Simulated users that join the sampled and accounted population (the gradient audit's
    canaries, :class:`fedsim.runner.audit.Canaries`): ``count`` of them, with ids ``first_id..``."""

    count: int
    first_id: int | None

    def bind(self, first_id: int, dim: int) -> None:
        """Learn the first id and the model size (called by :func:`build_run`)."""

    def update_sum(self, user_ids: list[int], t: int, clip_norm: float, dim: int) -> torch.Tensor:
        """The sum of the clipped updates of ``user_ids`` in round ``t``."""


@dataclass(frozen=True)
class Deployment:
    """What a run needs to execute on a Deployment Engine (:mod:`fedsim.deploy.runconfig`).

    Parameters
    ----------
    grid : the Flower grid the deployed ServerApp was given.
    data : the census population (names and counts of the nodes' users; no samples).
    owners : user index → (node id, the user's index on that node).
    min_nodes : SuperNodes to wait for.
    privacy_key : the root of every privacy stream, from the OS CSPRNG; never logged or sent.
    """

    grid: Any
    data: Population
    owners: dict[int, tuple[int, int]]
    min_nodes: int
    privacy_key: PrivacyKey


@dataclass
class Run:
    """Everything a run needs, built and not yet started (:func:`build_run`).

    cfg / resolved : the config as given, and with δ resolved (what ``config.toml`` holds).
    prep : data, accounting spec, participation scheme, factorization and initial model.
    device : where the server's tensors live. n_workers : Ray workers, in-process workers or
        SuperNodes to wait for. engine : ``ray`` or ``inprocess`` (a deployment has its own grid).
    noise / server / ledger / sampler : the DP pieces (the server owns noise, filter, optimizer,
        clip controller and ledger).
    task : what every worker is told (data, model, local training, DiSK, error feedback).
    client_store : users' error-feedback states (``client.error_feedback = "client"``), else None.
    ef : ``client.error_feedback``. update_clip : the bound of replies when it differs from the
        noise's norm (server error feedback: ``c₁``), else None.
    client_evaluations : local-training passes per user (2 for DiSK's two-point estimate).
    eval_users / eval_costs / train_costs : who is evaluated, and each user's expected cost.
    baseline : the majority-class accuracy of the evaluation users (None when not published).
    notes : lines printed and recorded with the ledger. publish : side statistics are published.
    synthetic : simulated users (the audit's canaries) or None. deployment : where a deployed
        run executes (its grid, census and key), or None in simulation.
    """

    cfg: Config
    resolved: Config
    prep: Prepared
    device: torch.device
    n_workers: int
    engine: str
    noise: Any
    server: DPServer
    ledger: Ledger
    sampler: CohortSampler
    task: Task
    client_store: Any
    ef: str
    update_clip: float | None
    client_evaluations: int
    eval_users: list[int]
    eval_costs: np.ndarray
    train_costs: np.ndarray
    baseline: float | None
    publish: bool
    notes: list[str] = field(default_factory=list)
    synthetic: SyntheticUsers | None = None
    deployment: Deployment | None = None

    def trackers(self) -> list[Any]:
        """The experiment trackers ``tracking.*`` asks for (:mod:`fedsim.reporting.tracking`), not started."""
        from fedsim.reporting.tracking import make_trackers

        t = self.cfg.tracking
        return list(make_trackers(tensorboard=t.tensorboard, mlflow_uri=t.mlflow_uri))

    @property
    def reproducible(self) -> bool:
        """Whether a re-run of a round from a checkpoint computes the same bits: user-level DP
        in simulation on CPUs. Not under example-level DP (each silo's DP-SGD is keyed from the
        OS, per process), in a deployment (the nodes' processes and data are outside the run)
        or with GPUs (their reductions are not deterministic). Every round of a run that is not
        reproducible is checkpointed before its model leaves the server
        (:class:`fedsim.runner.callbacks.Checkpointer`)."""
        return (
            self.cfg.privacy.unit == "user"
            and self.deployment is None
            and self.device.type == "cpu"
            and not self.task.use_gpu
        )

    @property
    def owners(self) -> dict[int, tuple[int, int]] | None:
        """Deployment: user → (node, local index); None in simulation."""
        return None if self.deployment is None else self.deployment.owners

    @property
    def spec(self) -> AccountingSpec:
        return self.prep.spec

    @property
    def data(self) -> Population:
        return self.prep.data


def server_clip_norm(cfg: Config) -> float:
    """The norm the noise scales with: ``c₁``; ``c₁ + c₂`` bounds a client-EF message; the
    server variant uses the DiceSGD theorem's ``√(c₁² + 2c₂²)``."""
    ef, c1, c2 = cfg.client.error_feedback, cfg.client.clip_norm, cfg.client.c2
    if ef == "client":
        return c1 + c2
    if ef == "server":
        from fedsim.training.error_feedback import server_noise_norm

        return server_noise_norm(c1, c2)
    return c1


def _build_server(
    cfg: Config, prep: Prepared, noise: Any, key: PrivacyKey, ledger: Ledger, device: torch.device
) -> DPServer:
    """The DP server: noise, filter, optimizer (with ``Φ_t`` for DP-AdamBC), clipping control."""
    z_eff = prep.update_noise_multiplier
    filt = make_server_filter(cfg)
    server_clip = server_clip_norm(cfg)
    server_ef = None
    if cfg.client.error_feedback == "server":
        from fedsim.training.error_feedback import ServerErrorFeedback

        server_ef = ServerErrorFeedback(prep.num_params, cfg.client.c2, device)
    noise_std: Any = server_clip * z_eff * noise.sensitivity
    clip_ctl = None
    if prep.budget_split is not None:
        from fedsim.privacy.adaptive_clip import AdaptiveClip

        clip_ctl = AdaptiveClip(
            cfg.client.clip_norm,
            cfg.clipping.target_quantile,
            cfg.clipping.lr,
            prep.budget_split["count_stddev"],
            prep.scheme.expected_cohort,
            key.derive("clip-count"),
        )

        def noise_std(tau: int, _c: Any = clip_ctl, _s: float = z_eff * noise.sensitivity) -> float:
            return float((_c.history + [_c.clip_norm])[tau] * _s)

    optimizer = make_server_optimizer(
        cfg, noise_std=noise_std, plan=prep.plan, filt=filt, expected_cohort=prep.scheme.expected_cohort
    )
    server = DPServer(
        prep.x0.to(device),
        noise,
        optimizer,
        ledger,
        server_clip,
        z_eff,
        prep.scheme.expected_cohort,
        filter=filt,
        clip_controller=clip_ctl,
        error_feedback=server_ef,
    )
    if cfg.filter.trace_coordinates:
        server.enable_trace(cfg.filter.trace_coordinates, derive_seed(cfg.seed, "filter-trace"))
    return server


def noise_table_note(stream: MatrixStream) -> str:
    """What a noise table costs, said before round 1 (the run's header): its disk, its memory and a
    CPU estimate at the rates measured on a 2-core CI machine (about 30 ns a Gaussian, 20 GFLOP/s
    for the float64 product on one core; docs/benchmarks.md, "Scale").

    Parameters
    ----------
    stream : the run's correlated stream, bound to the model's dimension.
    """
    n, m = stream.noising.shape
    flops = (1.0 if n == m else 2.0) * n * m * stream.dim  # triangular M: half a general product
    minutes = (m * stream.dim * 30e-9 + flops / 20e9) / 60
    return (
        f"{stream.name} noise: Z's {m} rows of {stream.dim:,} ({m * stream.dim * 4 / 2**30:.1f} GiB) exceed "
        f"privacy.noise_memory_mib, so every noise row is computed once, at round 1, into a "
        f"{stream.table_bytes() / 1e9:.1f} GB table in the run's checkpoint/ (owner-only, deleted when the run "
        f"ends; {stream.memory_budget / 2**20:.0f} MiB of memory, about {minutes:.0f} CPU-minutes); a round "
        f"then reads one row"
    )


def check_noise_fits(cfg: Config, prep: Prepared) -> None:
    """Refuse, before round 1, a mechanism whose noise state does not fit this machine's available
    memory (`fedsim.privacy.cost`: the state its own stream holds, scaled to the model's size),
    naming the mechanisms that hold a few rows of d."""
    from fedsim.privacy.plan import noise_cost_of
    from fedsim.resources import available_memory_bytes

    cost = noise_cost_of(cfg, prep.spec, prep.plan, prep.num_params)
    if not cost["fits_memory"]:
        raise FedsimError(
            f"privacy.mechanism = '{prep.spec.mechanism}': its noise state needs {cost['state_bytes'] / 2**30:.1f} GiB "
            f"of memory at d = {prep.num_params:,} and {available_memory_bytes() / 2**30:.1f} GiB are available; use "
            f"privacy.mechanism = 'blt' (a few rows of d) or 'banded' with fewer bands, or lower "
            f"privacy.noise_memory_mib"
        )


def dp_server(
    cfg: Config, prep: Prepared, key: PrivacyKey, device: torch.device, notes: list[str]
) -> tuple[DPServer, Any]:
    """The server's whole DP step for ``prep``: the noise stream under ``key.derive("noise")``,
    the ledger, and the :class:`DPServer` (fixed denominator, filter, optimizer, clipping
    control). fedsim's own runs and the Flower wrapper (:mod:`fedsim.flower`) both build theirs
    here. Returns the server and the example-level DP settings (None for user-level DP)."""
    check_noise_fits(cfg, prep)
    noise = make_noise(prep.spec.mechanism, prep.num_params, key.derive("noise"), device, prep.plan)
    if isinstance(noise.stream, MatrixStream):  # its history: privacy.noise_memory_mib
        noise.stream.memory_budget = cfg.privacy.noise_memory_mib << 20
    ledger, example_dp = _build_ledger(cfg, prep, notes)
    if isinstance(noise.stream, MatrixStream) and cfg.privacy.noise_table and noise.stream.table_bytes():
        notes.append(noise_table_note(noise.stream))  # the header's cost line (not the ledger's notes)
    return _build_server(cfg, prep, noise, key, ledger, device), example_dp


def prepare_without_data(cfg: Config, population: int, x0: torch.Tensor) -> Prepared:
    """What :func:`prepare` resolves, for a population of ``population`` users known only by
    count (the Flower wrapper's nodes) and the model ``x0`` (flat float32) instead of
    ``cfg.model``: the accounting spec (``z`` calibrated to a target ε), the scheme, the MF plan
    and the clipping budget split. Raises :class:`FedsimError` for what a run would refuse."""
    spec = resolve_privacy(cfg, population)
    scheme = scheme_of(cfg, population)
    z_update, split = resolve_clipping(cfg, spec, scheme)
    plan = mf_plan(cfg, spec, scheme)
    x0 = x0.detach().to(torch.float32).flatten()
    return Prepared(cfg, None, spec, scheme, plan, x0, int(x0.numel()), z_update, split)  # type: ignore[arg-type]


def _build_ledger(cfg: Config, prep: Prepared, notes: list[str]) -> tuple[Ledger, Any]:
    """The privacy ledger (with the silos' example-level ledger for ``privacy.unit = "example"``)
    and the example-level DP settings (None for user-level DP)."""
    ledger = Ledger(
        prep.spec,
        cfg.rounds,
        budget_split=prep.budget_split,
        notes=notes,
        account_every=cfg.privacy.account_every,
        side_statistics=cfg.privacy.publish_side_statistics,
    )
    if cfg.privacy.unit != "example":
        return ledger, None
    from fedsim.training.example_dp import ExampleDP, SiloLedger, steps_and_rate

    data = prep.data
    z_example = cfg.privacy.example_noise_multiplier
    assert z_example is not None  # the config requires it for unit = "example"
    example_dp = ExampleDP(float(z_example), cfg.privacy.example_clip_norm)
    n_train = [data.num_train(u) for u in range(data.population)]
    ex_delta = cfg.privacy.example_delta or 1.0 / max(n_train) ** 1.1
    ledger.silo = SiloLedger(
        example_dp,
        ex_delta,
        {
            u: steps_and_rate(n, cfg.client.batch_size, cfg.client.local_epochs, cfg.client.max_examples)
            for u, n in enumerate(n_train)
        },
    )
    return ledger, example_dp


def _build_task(cfg: Config, prep: Prepared, server: DPServer, example_dp: Any, deployed: bool = False) -> Task:
    """What every worker is told: data, model, local training, DiSK, error feedback."""
    ef = cfg.client.error_feedback
    local = LocalTraining(
        cfg.client.local_epochs,
        cfg.client.batch_size,
        cfg.client.lr,
        cfg.client.max_examples,
        cfg.client.clip_norm,
        fused_softmax=cfg.sim.fused_softmax == "auto",
        cuda_graphs=cfg.sim.cuda_graphs == "auto",
        clip_stability=cfg.clipping.stability if cfg.clipping.mode == "automatic" else None,
        local_update=cfg.client.local_update,
    )
    disk = None
    if server.track_step:
        from fedsim.training.local import DiskClient

        filt = server.filter
        disk = DiskClient(filt.mode, filt.gamma, filt.a)
    return Task(
        cfg.data,
        cfg.model.name,
        derive_seed(cfg.seed, "model"),
        cfg.seed,
        local,
        threads=max(1, int(cfg.sim.client_cpus)),
        use_gpu=cfg.sim.client_gpus > 0 and cfg.sim.device != "cpu",
        disk=disk,
        error_feedback=ef,
        ef_clip=cfg.client.c2 if ef != "none" else 0.0,
        example_dp=example_dp,
        vectorize=resolve_vectorize(cfg, prep.vectorizable, disk is not None, prep.recurrent, prep.num_params),
        allocator=cfg.sim.allocator,
        record_statistics=cfg.sends_silo_statistics,
        deployed=deployed,
        plugins=plugin_manifest(cfg.plugins),
    )


def choose_eval_users(cfg: Config, population: int) -> list[int]:
    """The users whose held-out data is evaluated: none when side statistics are not published
    (evaluation on users' data is one) or silos withhold statistics of their records
    (``privacy.silo_statistics``), ``eval.max_users`` of them (a seeded choice), or all."""
    if not cfg.privacy.publish_side_statistics or not cfg.sends_silo_statistics:
        return []
    if cfg.eval.max_users is not None and cfg.eval.max_users < population:
        rng = np.random.default_rng(derive_seed(cfg.seed, "eval-users"))
        return sorted(rng.choice(population, size=cfg.eval.max_users, replace=False).tolist())
    return list(range(population))


def _population(cfg: Config, deployment: Deployment | None, view: AuditView | None) -> Population | None:
    """The population when it is not ``cfg.data`` as loaded: a deployment's census, or an audit's
    view of the loaded data (None: load ``cfg.data`` in :func:`prepare`)."""
    if view is None:
        return None if deployment is None else deployment.data
    if deployment is not None:
        raise FedsimError("an audit's population (canary or held-out users) runs in simulation only")
    loaded = load_federated(cfg.data)
    note_max_users(cfg, loaded.population)
    return view.apply(loaded)


#: The note of a run whose users hold no held-out rows.
NO_TEST_ROWS = (
    "no test rows: nothing evaluated (no user holds a held-out row: data.test_fraction = 0, or one row per "
    "user); raise data.test_fraction, or give users more rows, to get an eval accuracy"
)


def _run_notes(cfg: Config, observed: int, deployment: Deployment | None) -> list[str]:
    """The caveats printed in the header and kept with every ε of the ledger; ``observed``: the
    users the data hold (canaries included)."""
    notes = []
    if cfg.client.error_feedback == "server":
        from fedsim.training.error_feedback import SERVER_EF_LABEL

        notes.append(SERVER_EF_LABEL)
    if deployment is not None and cfg.data.max_users is not None:
        notes.append(
            f"data.max_users = {cfg.data.max_users} does not apply in deployment: the population is the "
            f"{observed} users the SuperNodes hold (config.toml records data.max_users unset)"
        )
    partitioner = getattr(cfg.data, "partitioner", None)  # data.name = "table" only
    if partitioner is not None:
        notes.append(partition_note(partitioner))
    if cfg.privacy.population is not None and observed != cfg.privacy.population:
        notes.append(
            f"privacy.population = {cfg.privacy.population} is the N of q, δ and the groups; the data hold "
            f"{observed} users"
        )
    return notes


def partition_note(partitioner: str) -> str:
    """What ε means when the users are partitions of a table (``data.partitioner``): nothing for
    the people or rows in it. A partitioner cuts the whole table, so removing one row moves other
    rows between partitions (tests/data/test_partition_guarantee.py measures it); the accounting
    takes the partitions as fixed, and they are not.

    Parameters
    ----------
    partitioner : ``data.partitioner`` (``iid``, ``dirichlet`` or ``pathological``).
    """
    return (
        f"NO GUARANTEE for the people or rows of the table: users are {partitioner} partitions made by "
        f"Flower Datasets from the whole table, so removing one row can change many partitions; ε is computed "
        f"as if the partitions were fixed users, which they are not. For a guarantee, name each row's person "
        f"with data.user_column"
    )


def build_run(
    cfg: Config,
    *,
    resumed_spec: AccountingSpec | None = None,
    synthetic: SyntheticUsers | None = None,
    deployment: Deployment | None = None,
    view: AuditView | None = None,
) -> Run:
    """Build every piece of a run of ``cfg``; nothing runs and nothing is written.

    Parameters
    ----------
    cfg : the validated experiment config.
    resumed_spec : on resume, the accounting spec the run started with (from the checkpoint):
        ε always comes from it, never from an edited config. Default None (a new run).
    synthetic : simulated users that join the sampled and accounted population (the audit's
        canaries): ``count`` of them, ids ``N..N+count−1``; ``bind(first_id, dim)`` is called here.
    deployment : a :class:`Deployment` (census population, owners, SuperNodes to wait for, the
        OS-drawn privacy key), or None for a simulation.
    view : an audit's population (:class:`fedsim.attacks.population.AuditView`: canary users
        added, held-out users removed); the sampler, the accountant and every worker use it, and
        only its real users are evaluated. Simulation only. Default None.
    """
    population = _population(cfg, deployment, view)
    prep = prepare(cfg, extra_users=0 if synthetic is None else int(synthetic.count), data=population)
    if resumed_spec is not None:  # ε always comes from the spec the run started with
        z_update, split = resolve_clipping(cfg, resumed_spec, prep.scheme)
        prep = replace(prep, spec=resumed_spec, update_noise_multiplier=z_update, budget_split=split)
    data, spec = prep.data, prep.spec
    resolved = cfg.model_copy(deep=True)
    resolved.privacy.delta = spec.delta
    device = _device(cfg)
    n_workers = num_workers(cfg) if deployment is None else deployment.min_nodes
    # The key of everything privacy rests on (noise, cohort sampling, the clip count's noise):
    # derived from the config's seed in simulation (reproducible studies, not secret), 256 bits
    # from the OS CSPRNG in deployment (never logged, written to the config or sent).
    key = PrivacyKey.from_seed(cfg.seed) if deployment is None else deployment.privacy_key
    ef = cfg.client.error_feedback
    notes = _run_notes(cfg, data.population + (0 if synthetic is None else int(synthetic.count)), deployment)
    if deployment is not None:  # config.toml records what ran (data.max_users does not apply)
        resolved.data = resolved.data.model_copy(update={"max_users": None})
    server, example_dp = dp_server(cfg, prep, key, device, notes)
    noise, ledger = server.noise, server.ledger
    user_ids = list(data.names) + (
        [] if synthetic is None else [f"{SYNTHETIC_ID_PREFIX}{k}" for k in range(int(synthetic.count))]
    )
    sampler = make_sampler(prep.scheme, key.derive("sampling"), user_ids)
    task = _build_task(cfg, prep, server, example_dp, deployed=deployment is not None)
    if view is not None:
        task = replace(task, view=view.to_json())
    client_store = None
    if ef == "client":
        from fedsim.training.error_feedback import ClientStateStore

        client_store = ClientStateStore(
            prep.num_params,
            data.population,
            cfg.client.error_feedback_memory_mb,
            bound=cfg.client.ef_state_bound,
            decay=cfg.client.ef_decay,
        )
    pop = data.population
    if synthetic is not None:
        synthetic.bind(first_id=pop, dim=prep.num_params)
    eval_users = choose_eval_users(cfg, pop if view is None else len(ordinary_users(data)))
    majority = data.majority_baseline(eval_users, cfg.eval.max_examples_per_user) if eval_users else None
    if eval_users and deployment is None and not any(data.num_test(u) for u in eval_users):
        notes.append(NO_TEST_ROWS)  # say so, rather than print an empty accuracy and a 0 % baseline
        majority = None
    return Run(
        cfg=cfg,
        resolved=resolved,
        prep=prep,
        device=device,
        n_workers=n_workers,
        engine=resolve_engine(cfg, n_workers),
        noise=noise,
        server=server,
        ledger=ledger,
        sampler=sampler,
        task=task,
        client_store=client_store,
        ef=ef,
        update_clip=cfg.client.clip_norm if ef == "server" else None,
        client_evaluations=1 if task.disk is None else task.disk.evaluations,
        eval_users=eval_users,
        eval_costs=np.array([min(data.num_test(u), cfg.eval.max_examples_per_user) for u in range(pop)]),
        train_costs=np.minimum(data.examples_per_user(), cfg.client.max_examples) * cfg.client.local_epochs,
        baseline=None if majority is None else majority[1],
        publish=cfg.privacy.publish_side_statistics,
        notes=notes,
        synthetic=synthetic,
        deployment=deployment,
    )
