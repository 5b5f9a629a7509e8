"""The experiment config: one typed pydantic model, loaded from TOML.

Every key has a type, a default and an allowed range. Unknown keys, wrong types
and out-of-range values raise :class:`fedsim.FedsimError` naming the dotted key
and what is allowed, before anything starts. ``--set a.b=v`` overrides are
applied to the raw TOML table first and validated together with it.

Conventions: learning rates are unitless step sizes; ``clip_norm`` is an L2 norm
on the whole flattened model delta; ``cohort_size`` is the expected cohort
``K̄`` (the fixed denominator of docs/algorithms.md §1).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union, cast

import tomli_w
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)

from fedsim import plugins as _plugins

_plugins.load_startup()  # $FEDSIM_PLUGINS and installed plugins register before the schema is built

from fedsim.config_file import DEFAULT_EXPERIMENT, parse_override, read_config_file, read_experiment  # noqa: E402, F401
from fedsim.data.registry import DATASETS, DataOptions, data_spec  # noqa: E402
from fedsim.errors import FedsimError  # noqa: E402
from fedsim.models import MODELS  # noqa: E402
from fedsim.privacy.mechanisms.base import MechanismOptions  # noqa: E402
from fedsim.privacy.mechanisms.registry import MECHANISMS  # noqa: E402
from fedsim.server.filters.base import FILTERS, FilterOptions  # noqa: E402
from fedsim.server.optim import OPTIMIZERS, OptimizerOptions  # noqa: E402
from fedsim.shipped import REPO_ROOT, experiments_dir, resolve_experiment, shipped_experiments  # noqa: E402, F401


class _Section(BaseModel):
    """Base for every config table: unknown keys are errors, assignments validate."""

    # strict: TOML types are exact ("10" is not an int, true is not 1); ints are accepted for floats.
    # allow_inf_nan: an infinite or NaN number is a config error naming the key, never a run.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False, strict=True, allow_inf_nan=False)


#: ``[data]`` for each registered dataset: the dataset's options model (its own keys and the
#: keys every dataset has: ``max_users``, ``subset_seed``, ``cache_dir``; :mod:`fedsim.data`).
DATA_MODELS: dict[str, type[BaseModel]] = {name: kind.options for name, kind in DATASETS.items()}

if TYPE_CHECKING:
    DataConfig = DataOptions
else:
    DataConfig = Annotated[Union[tuple(DATA_MODELS.values())], Field(discriminator="name")]  # noqa: UP007


class ModelConfig(_Section):
    """The model: a registered name (:mod:`fedsim.models`; README "Configuration" lists them with
    the datasets they fit), e.g. ``shakespeare_lstm_small`` (default) for Shakespeare."""

    if TYPE_CHECKING:
        name: str = "shakespeare_lstm_small"
    else:
        name: Literal[tuple(MODELS)] = "shakespeare_lstm_small"


class ClientConfig(_Section):
    """Local training of one user (not private by itself; the user is the unit).

    Parameters
    ----------
    local_epochs : passes over the user's (capped) samples. Default 1.
    batch_size : samples per local SGD step. Default 8.
    lr : local SGD step size. Default 1.0.
    clip_norm : ``c``, L2 bound on each user's flattened model delta. Default 1.0.
    max_examples : at most this many training samples per user per epoch, drawn
        without replacement with a seed derived from (seed, round, user). With
        ``privacy.unit = "example"`` it bounds a silo's DP-SGD steps per epoch
        (``⌈min(n, max_examples)/B⌉``) instead; the Poisson batches come from all its records.
        Default 64.
    error_feedback : clipping error feedback (DiceSGD; docs/algorithms.md §8): ``none``
        (default), ``client`` (each user keeps its clipping error across participations and
        sends ``clip(Δ, c₁) + clip(e, c₂)``; the noise then scales with ``c₁ + c₂``) or
        ``server`` (NO PRIVACY GUARANTEE: the paper's Algorithm 2; residuals reach the server
        unclipped, so ε = ∞; needs ``privacy.allow_no_guarantee = true``, Gaussian or no noise,
        simulation only).
    ef_clip_norm : ``c₂``, clip norm of the fed-back error; default ``clip_norm`` (``c₁``);
        must be ``≥ c₁`` (the bias-free fixed point needs it).
    ef_state_bound : ``client`` error feedback only: ``B``, each user keeps ``clip(e_new, B)``
        instead of its whole new error (opt-in; default unset: no bound). A message is still
        ``clip(Δ, c₁) + clip(e, c₂)``, so the noise and ε are unchanged.
    ef_decay : ``client`` error feedback only: ``β`` in ``(0, 1]``, each user keeps ``β·e_new``
        (with ``ef_state_bound``: ``clip(β·e_new, B)``); opt-in, default unset (``β = 1``).
    error_feedback_memory_mb : ``client`` error feedback keeps one vector per user; runs whose
        worst case (``N·d`` float32) exceeds this many MiB are refused. Default 2048.
    local_update : a registered local update (:mod:`fedsim.training.local_updates`, from a plugin) that
        trains each user instead of fedsim's local SGD; fedsim still isolates each user and clips
        the result. Default unset (local SGD).
    """

    local_epochs: int = Field(default=1, ge=1, le=1000)
    batch_size: int = Field(default=8, ge=1)
    lr: float = Field(default=1.0, gt=0)
    clip_norm: float = Field(default=1.0, gt=0)
    max_examples: int = Field(default=64, ge=1)
    error_feedback: Literal["none", "client", "server"] = "none"
    ef_clip_norm: float | None = Field(default=None, gt=0)
    ef_state_bound: float | None = Field(default=None, gt=0)
    ef_decay: float | None = Field(default=None, gt=0, le=1)
    error_feedback_memory_mb: float = Field(default=2048.0, gt=0)
    local_update: str | None = None

    @field_validator("local_update")
    @classmethod
    def _registered_update(cls, value: str | None) -> str | None:
        if value is not None:
            from fedsim.training.local_updates import LOCAL_UPDATES

            LOCAL_UPDATES.get_part(value)  # a FedsimError listing the registered ones
        return value

    @model_validator(mode="after")
    def _c2_at_least_c1(self) -> ClientConfig:
        if self.ef_clip_norm is not None and self.ef_clip_norm < self.clip_norm:
            raise ValueError(
                f"client.ef_clip_norm = {self.ef_clip_norm} is below client.clip_norm = {self.clip_norm}; "
                "error feedback needs c₂ ≥ c₁ for its bias-free fixed point (omit it for c₂ = c₁)"
            )
        return self

    @model_validator(mode="after")
    def _state_options_need_client_ef(self) -> ClientConfig:
        if self.error_feedback != "client":
            given = [k for k in ("ef_state_bound", "ef_decay") if getattr(self, k) is not None]
            if given:
                raise ValueError(
                    f"client.{given[0]} applies to the users' error states of client.error_feedback = 'client', "
                    f"not to error_feedback = '{self.error_feedback}'; set error_feedback = 'client' or drop it"
                )
        return self

    @property
    def c2(self) -> float:
        """``c₂`` resolved (default ``c₁``)."""
        return self.ef_clip_norm if self.ef_clip_norm is not None else self.clip_norm


class ClippingConfig(_Section):
    """How a user's delta is bounded: flat or automatic clipping, and adaptive clipping to a
    target quantile (Andrew et al. 2021; docs/algorithms.md §5).

    ``client.clip_norm`` is the first round's ``c_0``; with ``adaptive`` the server moves
    ``c_t`` towards the ``target_quantile`` of the users' delta norms, from a noisy count
    that takes a share of the privacy budget (the ledger records the split; ε is unchanged).

    Parameters
    ----------
    mode : ``flat`` (default: ``Δ·min(1, c/‖Δ‖)``) or ``automatic`` (Bu et al., "Automatic
        clipping", NeurIPS 2023, as DiSK and DOPPLER run every experiment: every delta is
        normalised to ``c·Δ/(‖Δ‖ + r)``, so small deltas are scaled up; the norm stays below
        ``c`` and so does the sensitivity). Not with ``adaptive`` or error feedback, which read
        what flat clipping cut off.
    stability : ``r`` of automatic clipping, in the delta's norm units. Default 0.01.
    adaptive : turn adaptive clipping on. Default False (fixed ``c``).
    target_quantile : ``γ``, fraction of users whose delta should fit under ``c``. Default 0.5.
    lr : ``η_c``, geometric step size of ``c``. Default 0.2.
    count_stddev : ``σ_b``, noise std on the count of unclipped users (in users).
        Default ``K̄/20`` (``sampling.cohort_size / 20``).
    """

    mode: Literal["flat", "automatic"] = "flat"
    stability: float = Field(default=0.01, gt=0, le=1e6)
    adaptive: bool = False
    target_quantile: float = Field(default=0.5, gt=0, lt=1)
    lr: float = Field(default=0.2, gt=0, le=10)
    count_stddev: float | None = Field(default=None, gt=0)


class SamplingConfig(_Section):
    """Participation scheme (docs/algorithms.md §2; :mod:`fedsim.privacy.participation`).

    Parameters
    ----------
    scheme : ``poisson`` (each user with probability ``cohort_size / N``), ``fixed``
        (exactly ``cohort_size`` without replacement), ``single`` (each user at most once),
        ``epochs`` (``min_sep`` fixed groups cycled in order), ``min_sep`` (the same groups,
        optionally Poisson-thinned).
    cohort_size : ``K̄``, the expected cohort and fixed denominator (``K`` users per round for
        ``fixed``; the bucket size ``K`` for ``single``). Default: 40 for ``poisson``/``fixed``/
        ``single``; for ``epochs``/``min_sep`` without thinning the expected group size ``N/b``
        (keyed) or ``⌊N/b⌋`` (shuffle), derived from the population — set it only to fix another
        constant denominator. Thinned ``min_sep`` needs it (``≤ N/b``).
    min_sep : ``b``, the number of groups = the minimum separation between a user's
        rounds (``epochs``/``min_sep``; default ``rounds``, i.e. one participation).
    max_participations : ``k`` (default ``⌈rounds / b⌉``).
    poisson_within_group : ``min_sep`` only: sample each group member with
        ``p = cohort_size / (N/b)`` (amplified banded MF).
    assignment : how ``single``/``epochs``/``min_sep`` put users into buckets or groups:
        ``keyed`` (default: a keyed pseudo-random function of each user's own id, so adding or
        removing a user changes nobody else's rounds — ε for add/remove adjacency) or ``shuffle``
        (a seeded permutation of positions, where a new user can displace another — ε only for
        zero-out adjacency, and every output says so).
    """

    scheme: Literal["poisson", "fixed", "single", "epochs", "min_sep"] = "poisson"
    cohort_size: float | None = Field(default=None, gt=0)
    min_sep: int | None = Field(default=None, ge=1)
    max_participations: int | None = Field(default=None, ge=1)
    poisson_within_group: bool = False
    assignment: Literal["keyed", "shuffle"] = "keyed"


class PrivacyCommon(_Section):
    """Noise mechanism and privacy target: the ``[privacy]`` keys every mechanism has. The
    mechanism's own keys come from its options model (``fedsim.privacy.mechanisms``; README
    "Configuration" lists them), so a key of another mechanism cannot be written.

    Parameters
    ----------
    mechanism : a registered noise mechanism (``fedsim factorize --help`` and docs/mechanisms.md
        list them): ``none`` (no noise, ε = ∞), ``gaussian`` (independent Gaussian noise,
        amplified by ``poisson``/``fixed`` sampling), or a matrix-factorization mechanism
        (correlated noise; needs ``single``/``epochs``/``min_sep``). Default ``gaussian``.
    noise_multiplier : ``z``; noise std on the summed update is ``c·z``. Give this or
        ``target_epsilon``, not both.
    target_epsilon : calibrate ``z`` by bisection so that ε after all rounds is at
        most this.
    delta : δ; default ``1 / N^1.1`` with ``N`` the population.
    accountant : ``pld`` (default, tight) or ``rdp``; ``fixed`` sampling always uses RDP.
    account_every : compute ε after every this many rounds (and always after the last one);
        the ledger records every round, with ε null in between. Default 1 (every round). A
        PLD composition costs about 0.1–0.3 s, which dominates rounds of small models: sweeps
        can raise it. The final ε is the same. (The next accounted round's composition runs in
        a background thread while the round trains.)
    noise_memory_mib : memory, in MiB, that the correlated noise of ``tree``, ``sqrt``, ``dense``
        and ``dp_mf_plus`` may hold for its history: all ``m`` rows of ``Z`` (``m·d·4`` bytes)
        when they fit, else the blocks of the noise table's product. Default 1024 (1 GiB).
    noise_table : past ``noise_memory_mib``, compute every noise row ``M·Z`` once, at the first
        round, into a table in the run's ``checkpoint/`` (owner-only, where the key is; ``n·d·4``
        bytes of disk, 33 GB at n = 2,048 and d = 4.05M), deleted when the run ends: a round then
        reads one row instead of drawing ``ξ_0 … ξ_t`` again (``O(t·d)``). Default True; false
        redraws every round and writes nothing.
    unit : ``user`` (default: the server-side mechanism above protects each user) or
        ``example`` (cross-silo: each user is a silo of many people's records and trains with
        Opacus DP-SGD; the ledger adds each silo's example-level ε from Opacus's RDP
        accountant, next to the user-level ε when ``mechanism`` is not ``none``).
    example_noise_multiplier : ``unit = "example"``: σ of the per-step DP-SGD noise.
    example_clip_norm : ``unit = "example"``: per-sample gradient clip norm. Default 1.0.
    example_delta : ``unit = "example"``: δ of each silo's guarantee (default
        ``1/n_max^1.1`` with ``n_max`` the largest silo's training-set size).
    delta_reason : δ must be below ``1/N`` (a δ of ``1/N`` allows leaking one user's data
        outright); a larger ``delta`` is refused unless this key says why, in words (recorded in
        the config). Default unset.
    allow_no_guarantee : run a configuration that has no finite ε (today: server-side error
        feedback, ``client.error_feedback = "server"``) as a non-private research mode; every
        output then says ε = ∞. Default False (such configurations are refused).
    population : ``N``, the public population size the guarantee is stated for, fixed in the
        config instead of read from the data: ``q = K̄/N``, the keyed groups and buckets, the
        expected cohort of ``epochs``/``min_sep`` and the default δ use it, so adding or removing
        one user changes none of them. The data must hold at most ``N`` users (exactly ``N``
        for ``sampling.scheme = 'fixed'`` and ``sampling.assignment = 'shuffle'``, whose
        neighbouring relation keeps the count), checked before anything runs. Default unset:
        ``N`` is the number of users in the data (or in a deployment's census).
    silo_statistics : ``unit = "example"``: whether silos send the server statistics of their
        records that no DP-SGD noise covers — the training loss, the number of examples their
        Poisson batches took, and evaluation on their held-out records. ``withhold`` (the default
        when unset: the server is outside the silos' trust boundary; replies carry only the
        DP-SGD update and counts that are functions of it, and no evaluation runs) or ``send``
        (the server is trusted with them).
    publish_side_statistics : write the statistics computed from users' data outside the DP
        mechanism — realised cohort sizes, accepted/dropped/failed counts, clipped fraction, train
        loss and examples, evaluation on users' held-out data, the majority baseline, examples per
        user, per-silo participations — to ``metrics.jsonl``, ``summary.json``, ``ledger.json``, the
        progress line and the plots. ε does not cover them. ``false`` drops them all (no evaluation
        is run; the final model is in the checkpoint) so that every published number is a DP
        output or a configured constant. Default True (research runs), and every output says
        they are outside ε.
    """

    if TYPE_CHECKING:  # a field of every mechanism's options model (the union's discriminator)
        mechanism: str

    def mechanism_options(self) -> MechanismOptions:
        """This table as the mechanism's options model (every ``[privacy]`` table is one)."""
        assert isinstance(self, MechanismOptions)
        return self

    noise_multiplier: float | None = Field(default=None, ge=0, le=1e4)
    target_epsilon: float | None = Field(default=None, gt=0, le=1e3)
    delta: float | None = Field(default=None, gt=0, lt=1)
    accountant: Literal["pld", "rdp"] = "pld"
    account_every: int = Field(default=1, ge=1)
    noise_memory_mib: int = Field(default=1024, ge=1)
    noise_table: bool = True
    unit: Literal["user", "example"] = "user"
    example_noise_multiplier: float | None = Field(default=None, gt=0, le=1e3)
    example_clip_norm: float = Field(default=1.0, gt=0)
    example_delta: float | None = Field(default=None, gt=0, lt=1)
    delta_reason: str | None = Field(default=None, min_length=1)
    allow_no_guarantee: bool = False
    publish_side_statistics: bool = True
    population: int | None = Field(default=None, ge=1)
    silo_statistics: Literal["withhold", "send"] | None = None

    @model_validator(mode="after")
    def _noise_multiplier_range(self) -> PrivacyCommon:
        z = self.noise_multiplier
        if z is not None and 0 < z < 0.1:
            raise ValueError(
                f"privacy.noise_multiplier = {z:g} is below 0.1: so little noise gives no meaningful "
                "privacy and overflows the accountant; use privacy.mechanism = 'none' for no noise, "
                "or a larger z"
            )
        return self

    @model_validator(mode="after")
    def _example_unit(self) -> PrivacyCommon:
        if self.unit == "example" and self.example_noise_multiplier is None:
            raise ValueError(
                "privacy.unit = 'example' needs privacy.example_noise_multiplier (σ of each "
                "silo's DP-SGD noise), e.g. 1.0"
            )
        if self.unit == "user" and self.example_noise_multiplier is not None:
            raise ValueError("privacy.example_noise_multiplier applies only with privacy.unit = 'example'")
        if self.unit == "user" and self.silo_statistics is not None:
            raise ValueError(
                "privacy.silo_statistics applies only with privacy.unit = 'example' (under user-level DP the "
                "server is trusted with the users' updates); remove it"
            )
        return self

    @model_validator(mode="after")
    def _one_of_z_or_target(self) -> PrivacyCommon:
        if self.mechanism == "none":
            if self.noise_multiplier not in (None, 0.0) or self.target_epsilon is not None:
                raise ValueError(
                    "privacy.mechanism = 'none' adds no noise: remove privacy.noise_multiplier "
                    "(or set it to 0) and privacy.target_epsilon, or set privacy.mechanism = 'gaussian'"
                )
        else:
            if (self.noise_multiplier is None) == (self.target_epsilon is None):
                raise ValueError(
                    "give exactly one of privacy.noise_multiplier or privacy.target_epsilon "
                    f"for privacy.mechanism = '{self.mechanism}'"
                )
            if self.noise_multiplier is not None and self.noise_multiplier <= 0:
                raise ValueError(
                    "privacy.noise_multiplier must be > 0 for a DP mechanism "
                    "(use privacy.mechanism = 'none' for a non-private run)"
                )
        return self


def _with_common(common: type[_Section], member: type[BaseModel], name: str) -> type[BaseModel]:
    """A config table model: the keys every choice has (``common``) and one choice's own keys."""
    return create_model(name, __base__=(common, member), __module__=__name__)


#: ``[privacy]`` for each registered mechanism: the common keys and the mechanism's options.
PRIVACY_MODELS: dict[str, type[BaseModel]] = {
    name: _with_common(PrivacyCommon, mech.options, f"PrivacyConfig_{name}") for name, mech in MECHANISMS.items()
}

if TYPE_CHECKING:
    PrivacyConfig = PrivacyCommon
else:
    PrivacyConfig = Annotated[Union[tuple(PRIVACY_MODELS.values())], Field(discriminator="mechanism")]  # noqa: UP007


class FilterCommon(_Section):
    """Server-side filter of the noisy mean update ``ĝ_t`` (docs/algorithms.md §6);
    post-processing, so ε is unchanged. ``name`` chooses a registered filter (``none`` default,
    ``ema``, ``doppler``, ``disk``); its own keys come from its options model
    (:mod:`fedsim.server.filters`).

    Parameters
    ----------
    trace_coordinates : log this many fixed (seeded) coordinates of the noisy aggregate ``ĝ_t``
        before and after the filter, every round, to ``filter_trace.npz`` (``fedsim report``
        draws their power spectral density, as in the DOPPLER paper's Fig. 2). These are DP
        outputs, so logging them costs no privacy. Default 0 (off).
    """

    if TYPE_CHECKING:  # the discriminator, a field of every filter's options model
        name: str

    trace_coordinates: int = Field(default=0, ge=0, le=4096)

    def filter_options(self) -> FilterOptions:
        """This table as the filter's options model."""
        assert isinstance(self, FilterOptions)
        return self


class ServerCommon(_Section):
    """Server optimizer on the pseudo-gradient ``g = −ĝ_t`` (Reddi et al. 2021). ``optimizer``
    chooses a registered optimizer (``sgd`` default: FedAvg when lr = 1; ``momentum``: FedAvgM;
    ``adam``: FedAdam; ``yogi``: FedYogi; ``adambc``: DP-AdamBC); its own keys come from its
    options model (:mod:`fedsim.server.optim`).

    Parameters
    ----------
    lr : server step size η. Default 1.0.
    """

    if TYPE_CHECKING:  # the discriminator, a field of every optimizer's options model
        optimizer: str

    lr: float = Field(default=1.0, gt=0)

    def optimizer_options(self) -> OptimizerOptions:
        """This table as the optimizer's options model."""
        assert isinstance(self, OptimizerOptions)
        return self


#: ``[filter]`` for each registered filter; ``[server]`` for each registered optimizer.
FILTER_MODELS: dict[str, type[BaseModel]] = {
    name: _with_common(FilterCommon, kind.options, f"FilterConfig_{name}") for name, kind in FILTERS.items()
}
SERVER_MODELS: dict[str, type[BaseModel]] = {
    name: _with_common(ServerCommon, kind.options, f"ServerConfig_{name}") for name, kind in OPTIMIZERS.items()
}

if TYPE_CHECKING:
    FilterConfig = FilterCommon
    ServerConfig = ServerCommon
else:
    FilterConfig = Annotated[Union[tuple(FILTER_MODELS.values())], Field(discriminator="name")]  # noqa: UP007
    ServerConfig = Annotated[Union[tuple(SERVER_MODELS.values())], Field(discriminator="optimizer")]  # noqa: UP007


class EvalConfig(_Section):
    """Federated evaluation of the global model on the users' held-out text.

    Parameters
    ----------
    every : evaluate every this many rounds (0 = only after the last round). Default 10.
    max_users : evaluate on a fixed seeded subset of this many users (None = all).
    max_examples_per_user : at most this many evenly spaced test samples per user.
    """

    every: int = Field(default=10, ge=0)
    max_users: int | None = Field(default=None, ge=1)
    max_examples_per_user: int = Field(default=64, ge=1)


class SimConfig(_Section):
    """Simulation resources.

    Parameters
    ----------
    num_workers : Flower SuperNodes (one message per worker per round); default =
        CPUs available / client_cpus, at least 1.
    client_cpus : CPUs reserved per Ray actor (also its torch threads). Default 1.
    client_gpus : GPUs (fractional) per Ray actor; used when CUDA is present. Default 0.
    device : server device for noise and optimizer: ``auto`` (CUDA if present), ``cpu``, ``cuda``.
    round_timeout : seconds to wait for the workers' replies in one round.
    engine : ``ray`` (Flower's simulation engine on Ray: workers in parallel, multi-node
        capable), ``inprocess`` (a Grid that calls the ClientApp in this process, one message
        after the other: no Ray start, for tests, debugging and small sweeps) or ``auto``
        (``inprocess`` for one worker, else ``ray``). Same results for the same seed.
    vectorize : train a worker's users together under ``torch.func.vmap``
        (:mod:`fedsim.training.vectorized`; models with ``nn.LSTM`` layers through their step-by-step twin):
        ``auto`` (models without recurrent layers, up to 2M parameters: torch's fused LSTM
        kernel user by user was measured faster than batched users on the CPU and on an H200
        GPU), ``on`` (any size, LSTM users batched too), ``off``. Never for other recurrent layers (Opacus's
        ``DPLSTM``, GRUs), DiSK client evaluation, error feedback or example-level DP (``on``
        refuses them). Equal to sequential training up to float rounding.
    ray_address : join an existing Ray cluster (``"HOST:PORT"`` of its head, as printed by
        ``ray start --head``) instead of starting a local Ray; the cluster's resources decide
        where the workers run. Default None (local).
    allocator : ``tuned`` (default): every process that trains, and the server's, keeps the
        memory it frees for its next step instead of mapping fresh pages (glibc's ``malloc``
        settings; :mod:`fedsim.training.allocator`): a character-LSTM step 18 % faster on the
        development CPU, same results; each process may keep up to 256 MiB of freed memory.
        ``system``: the C library's defaults. No effect without glibc.
    fused_softmax : ``auto`` (default): where the training loss is a softmax cross-entropy over
        the model's linear output layer (the Stack Overflow next-word model) and users train on a
        CPU, compute the layer and the loss together in cache-sized row blocks, over the rows
        whose target is not padding only (:mod:`fedsim.models.softmax_head`): a Stack Overflow
        user's local update about 13 % faster on the development CPU (27 % of the generated data's
        targets are padding), keeping neither logits nor log-probabilities, equal up to float
        rounding. ``off``: the layer, then ``cross_entropy``.
    cuda_graphs : ``auto`` (default): where users train on a CUDA device and the model is
        recurrent (without dropout), each distinct batch shape's local SGD step is captured once
        as a CUDA graph and replayed (:mod:`fedsim.training.step_graphs`): the host queues the step's
        hundreds of small kernels with one call instead of one by one, which is what limits an
        LSTM step on a GPU. The same kernels on the same values as eager steps. Each captured
        shape keeps its own device memory for the step's intermediate values (tens of MB for
        the Stack Overflow LSTM). No effect on a CPU. ``off``: eager steps.
    """

    engine: Literal["auto", "ray", "inprocess"] = "auto"
    vectorize: Literal["auto", "on", "off"] = "auto"
    allocator: Literal["tuned", "system"] = "tuned"
    fused_softmax: Literal["auto", "off"] = "auto"
    cuda_graphs: Literal["auto", "off"] = "auto"
    ray_address: str | None = None
    num_workers: int | None = Field(default=None, ge=1, le=1024)
    client_cpus: float = Field(default=1.0, gt=0)
    client_gpus: float = Field(default=0.0, ge=0)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    round_timeout: float = Field(default=3600.0, gt=0)
    min_valid_replies: int = Field(default=1, ge=0)


class TrackingConfig(_Section):
    """Experiment tracking (optional extras: ``pip install fedsim[tracking]``; :mod:`fedsim.reporting.tracking`).

    Parameters
    ----------
    tensorboard : write every metrics row as TensorBoard scalars to ``<run>/tensorboard/``.
        Default False.
    mlflow_uri : log params, per-round metrics and the run folder (not the checkpoint) to this
        local MLflow store, a ``file:`` URI (e.g. ``"file:./mlruns"``). Default unset (off).
    """

    tensorboard: bool = False
    mlflow_uri: str | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _local_store(self) -> TrackingConfig:
        if self.mlflow_uri is not None:
            from fedsim.reporting.tracking import local_store_uri

            try:
                local_store_uri(self.mlflow_uri)
            except FedsimError as e:
                raise ValueError(str(e)) from None
        return self


class CheckpointConfig(_Section):
    """Checkpoint every this many rounds (and always after the last, and after a round with a
    dropped reply, a failed user or a failed evaluation reply, before its row is published: such
    a round is never re-run with the same noise by a resume)."""

    every: int = Field(default=1, ge=1)


class Config(_Section):
    """A whole experiment. See each section's docstring for its keys."""

    name: str = Field(default="experiment", min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.-]+$")
    #: user code that registers parts (module names or .py paths, :mod:`fedsim.plugins`); loaded
    #: before the config is validated, recorded absolute, and loaded again by a resume
    plugins: list[str] | None = None
    seed: int = Field(default=0, ge=0, lt=2**63)
    rounds: int = Field(default=100, ge=1, le=1_000_000)
    data: DataConfig = Field(default_factory=lambda: data_spec("shakespeare"))
    model: ModelConfig = ModelConfig()
    client: ClientConfig = ClientConfig()
    clipping: ClippingConfig = ClippingConfig()
    sampling: SamplingConfig = SamplingConfig()
    privacy: PrivacyConfig = Field(
        default_factory=lambda: cast(PrivacyCommon, PRIVACY_MODELS["gaussian"](noise_multiplier=1.0))
    )
    filter: FilterConfig = Field(default_factory=lambda: cast(FilterCommon, FILTER_MODELS["none"]()))
    server: ServerConfig = Field(default_factory=lambda: cast(ServerCommon, SERVER_MODELS["sgd"]()))
    eval: EvalConfig = EvalConfig()
    sim: SimConfig = SimConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    tracking: TrackingConfig = TrackingConfig()

    @field_validator("data", "privacy", "filter", "server", mode="before")
    @classmethod
    def _default_choice(cls, value: Any, info: ValidationInfo) -> Any:
        """A choice table without its choosing key takes the default: ``[privacy]`` →
        ``mechanism = "gaussian"``, ``[filter]`` → ``name = "none"``, ``[server]`` →
        ``optimizer = "sgd"``."""
        which, default = CHOICE_DEFAULTS[str(info.field_name)]
        if isinstance(value, dict) and which not in value:
            return {which: default, **value}
        return value

    @field_validator("plugins")
    @classmethod
    def _plugins_loaded(cls, value: list[str] | None) -> list[str] | None:
        """Every plugin imported (those the entry points read first are already; a new one here
        can register nothing once the schema is built, and says so)."""
        return None if value is None else _plugins.load(value, "the config's plugins")

    @model_validator(mode="after")
    def _local_update_fits(self) -> Config:
        if self.client.local_update is not None and self.privacy.unit == "example":
            raise ValueError(
                "client.local_update with privacy.unit = 'example': silos train with Opacus DP-SGD, "
                "not a local update hook; drop one of them"
            )
        return self

    @model_validator(mode="after")
    def _model_fits_data(self) -> Config:
        task = DATASETS[self.data.name].task
        if MODELS[self.model.name].task != task:
            fits = [m for m, kind in MODELS.items() if kind.task == task]
            raise ValueError(
                f"model.name = '{self.model.name}' does not fit data.name = '{self.data.name}'; "
                f"use one of {', '.join(fits)}"
            )
        if self.privacy.unit == "example" and task == "nwp":
            raise ValueError(
                "privacy.unit = 'example' with next-word prediction is not supported (its loss "
                "averages over tokens, not examples, which Opacus's per-example clipping "
                "assumes); use privacy.unit = 'user'"
            )
        return self

    @model_validator(mode="after")
    def _mechanism_fits_scheme(self) -> Config:
        """The accountant's rules that need no population, checked at load time (fail fast)."""
        from fedsim.privacy.participation import MF_SCHEMES

        mech, scheme = self.privacy.mechanism, self.sampling.scheme
        if MECHANISMS[mech].correlated and scheme not in MF_SCHEMES:
            raise ValueError(
                f"privacy.mechanism = '{mech}' (matrix factorization) needs a bounded participation scheme: "
                f"set sampling.scheme to one of {', '.join(MF_SCHEMES)}"
            )
        if mech == "gaussian" and scheme not in ("poisson", "fixed"):
            raise ValueError(
                f"privacy.mechanism = 'gaussian' is amplified by sampling and needs sampling.scheme = "
                f"'poisson' or 'fixed'; with '{scheme}' use privacy.mechanism = 'identity' "
                f"(independent noise, no amplification)"
            )
        return self

    @model_validator(mode="after")
    def _filter_fits(self) -> Config:
        """A filter is a momentum already, and DiSK's client evaluation has no example-level DP."""
        if self.filter.name != "none" and self.server.optimizer == "momentum":
            raise ValueError(
                f"filter.name = '{self.filter.name}' already is a momentum (low-pass) filter: do not stack "
                "server.optimizer = 'momentum' on it; use server.optimizer = 'sgd' (or 'adambc')"
            )
        disk_client = self.filter.name == "disk" and getattr(self.filter, "mode", None) in ("two_point", "lookahead")
        if self.privacy.unit == "example" and disk_client:
            raise ValueError(
                "privacy.unit = 'example' with DiSK's client evaluation is not supported; use "
                "filter.mode = 'ema' or another filter"
            )
        return self

    @model_validator(mode="after")
    def _error_feedback_fits(self) -> Config:
        """Error feedback against adaptive clipping, MF noise, and the guarantee it lacks on the server."""
        ef = self.client.error_feedback
        if self.clipping.mode == "automatic" and (ef != "none" or self.clipping.adaptive):
            raise ValueError(
                "clipping.mode = 'automatic' normalises every delta; "
                + ("error feedback" if ef != "none" else "adaptive clipping")
                + " reads what flat clipping cuts off and does not apply to it: use clipping.mode = 'flat'"
            )
        if ef != "none" and self.clipping.adaptive:
            raise ValueError(
                f"client.error_feedback = '{ef}' with clipping.adaptive = true is not supported "
                "(both move the clip bound); turn one of them off"
            )
        if ef != "server":
            return self
        if MECHANISMS[self.privacy.mechanism].correlated:
            raise ValueError(
                "client.error_feedback = 'server' is experimental and refused with matrix-factorization "
                f"noise (privacy.mechanism = '{self.privacy.mechanism}'); use client.error_feedback = "
                "'client' or privacy.mechanism = 'gaussian'"
            )
        if not self.privacy.allow_no_guarantee:
            raise ValueError(
                "client.error_feedback = 'server' has no privacy guarantee (ε = ∞: the unclipped residuals "
                "reach the releases); use client.error_feedback = 'client' (DP), or set "
                "privacy.allow_no_guarantee = true to run it as a non-private research mode"
            )
        if self.privacy.target_epsilon is not None:
            raise ValueError(
                "client.error_feedback = 'server' has no finite ε to calibrate for: replace "
                "privacy.target_epsilon with privacy.noise_multiplier"
            )
        return self

    @model_validator(mode="after")
    def _privacy_fits(self) -> Config:
        """The momentum workload models the server's momentum; adaptive clipping needs noise."""
        if getattr(self.privacy, "workload", "prefix") == "momentum" and self.server.optimizer != "momentum":
            raise ValueError(
                "privacy.workload = 'momentum' factorizes SGD with the server's momentum β, so it needs "
                f"server.optimizer = 'momentum' (got '{self.server.optimizer}'); use privacy.workload = 'prefix'"
            )
        if self.clipping.adaptive and self.privacy.mechanism == "none":
            raise ValueError(
                "clipping.adaptive = true needs a DP mechanism (its count is noised with a share "
                "of the budget); set privacy.mechanism or clipping.adaptive = false"
            )
        return self

    def to_toml(self) -> str:
        """The resolved config as TOML (None values are omitted: they mean 'default')."""
        return tomli_w.dumps(_drop_none(self.model_dump(mode="json")))

    @property
    def sends_silo_statistics(self) -> bool:
        """Whether silos send non-private statistics of their records (``privacy.silo_statistics``):
        always under user-level DP (the server is trusted), only with ``send`` under example-level."""
        return self.privacy.unit == "user" or self.privacy.silo_statistics == "send"

    def validate_population(self, population: int) -> None:
        """Checks that need the population ``N``; raise before the run starts."""
        if population < 2:
            raise FedsimError(f"data: the dataset has {population} users; at least 2 are needed")
        if self.sampling.cohort_size is not None and self.sampling.cohort_size > population:
            raise FedsimError(
                f"sampling.cohort_size = {self.sampling.cohort_size:g} exceeds the population "
                f"N = {population}; lower sampling.cohort_size{self._more_users_advice()}"
            )

    def _more_users_advice(self) -> str:
        """How this config's dataset gets more users, for the cohort-size error: its own size key
        (synthetic users, table partitions), or data.max_users when that is what limits it."""
        for key in ("num_clients", "num_partitions"):
            if getattr(self.data, key, None) is not None:
                return f" or raise data.{key}"
        if self.data.max_users is not None:
            return f" or raise data.max_users (now {self.data.max_users})"
        return ""


def _drop_none(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _drop_none(v) for k, v in d.items() if v is not None}
    return d


#: table → (the key that chooses, its default).
CHOICE_DEFAULTS = {
    "data": ("name", "shakespeare"),
    "privacy": ("mechanism", "gaussian"),
    "filter": ("name", "none"),
    "server": ("optimizer", "sgd"),
}


def choice_tables() -> dict[str, tuple[str, dict[str, type[BaseModel]]]]:
    """The config tables that are a choice among registered kinds: table → (the key that
    chooses, kind name → that kind's table model)."""
    return {
        "data": ("name", DATA_MODELS),
        "privacy": ("mechanism", PRIVACY_MODELS),
        "filter": ("name", FILTER_MODELS),
        "server": ("optimizer", SERVER_MODELS),
    }


def _strip_tags(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """A pydantic error location without the union tags (``privacy.blt.bands`` → ``privacy.bands``)."""
    tables = choice_tables()
    out = list(loc)
    if len(out) >= 2 and out[0] in tables and out[1] in tables[out[0]][1]:
        del out[1]
    return tuple(out)


def _format_validation_error(err: ValidationError) -> str:
    lines = []
    tables = choice_tables()
    for e in err.errors():
        loc = tuple(e["loc"])
        key = ".".join(str(p) for p in _strip_tags(loc) if not isinstance(p, int)) or "(config)"
        kind = e["type"]
        if kind == "extra_forbidden":
            chosen = ""
            if len(loc) >= 3 and loc[0] in tables and loc[1] in tables[loc[0]][1]:
                chosen = f" with {loc[0]}.{tables[loc[0]][0]} = '{loc[1]}'"
            lines.append(f"unknown key '{key}'{chosen}; allowed keys here: {', '.join(_allowed_keys(loc))}")
        elif kind in ("union_tag_invalid", "union_tag_not_found") and key in tables:
            which, models = tables[key]
            got = e.get("input", {}).get(which) if isinstance(e.get("input"), dict) else None
            lines.append(f"{key}.{which} = {got!r} is not one of {', '.join(models)}")
        else:
            msg = e["msg"]
            if msg.startswith("Value error, "):
                msg = msg[len("Value error, ") :]
            got = e.get("input")
            got_s = "" if isinstance(got, dict) else f" (got {got!r})"
            lines.append(f"{key}: {msg}{got_s}")
    return "invalid config: " + "; ".join(lines)


def _allowed_keys(loc: tuple[Any, ...]) -> list[str]:
    """The keys allowed in the table holding the unknown key at ``loc`` (union tags included)."""
    model: type[BaseModel] = Config
    tables = choice_tables()
    parts = [p for p in loc[:-1] if not isinstance(p, int)]
    i = 0
    while i < len(parts):
        part = parts[i]
        if i == 0 and part in tables and i + 1 < len(parts) and parts[i + 1] in tables[part][1]:
            model = tables[part][1][parts[i + 1]]
            i += 2
            continue
        field = model.model_fields.get(str(part))
        if field is None or not isinstance(field.annotation, type) or not issubclass(field.annotation, BaseModel):
            return []
        model = field.annotation
        i += 1
    return sorted(model.model_fields)


#: Keys that are alternatives to each other: ``--set`` of one replaces the other from the
#: file (unless both are set on the command line, which is then an error).
ALTERNATIVES: dict[tuple[str, ...], tuple[str, ...]] = {
    ("privacy", "noise_multiplier"): ("privacy", "target_epsilon"),
    ("privacy", "target_epsilon"): ("privacy", "noise_multiplier"),
}


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of the raw TOML table with ``--set`` overrides applied.

    Setting ``privacy.noise_multiplier`` drops a ``privacy.target_epsilon`` that came
    from the file, and vice versa (they are alternatives); ``privacy.mechanism=none``
    drops both; ``sampling.scheme=poisson|fixed|single`` drops the group-scheme keys
    (``min_sep``, ``max_participations``, ``poisson_within_group``) from the file.
    Setting both of a pair with ``--set`` is left for validation to reject.
    """
    out = copy.deepcopy(raw)
    parsed = [parse_override(item) for item in overrides]
    set_keys = {tuple(p) for p, _ in parsed}
    for path, value in parsed:
        others = list(ALTERNATIVES.get(tuple(path), ()) and [ALTERNATIVES[tuple(path)]])
        if tuple(path) == ("privacy", "mechanism") and value == "none":
            others = [("privacy", "noise_multiplier"), ("privacy", "target_epsilon")]
        if tuple(path) == ("sampling", "scheme") and value in ("poisson", "fixed", "single"):
            others = [("sampling", k) for k in ("min_sep", "max_participations", "poisson_within_group")]
        for other in others:
            if other not in set_keys and isinstance(out.get(other[0]), dict):
                out[other[0]].pop(other[1], None)
    for item, (path, value) in zip(overrides, parsed):
        node = out
        for part in path[:-1]:
            nxt = node.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise FedsimError(f"--set {item!r}: '{part}' is a value, not a table")
            node = nxt
        node[path[-1]] = value
    _drop_foreign_keys(out, raw, set_keys)
    return out


def _drop_foreign_keys(out: dict[str, Any], raw: dict[str, Any], set_keys: set[tuple[str, ...]]) -> None:
    """After ``--set`` switched a choice table to another kind (e.g. ``privacy.mechanism``), drop
    the keys that came from the file and that the new kind does not have (e.g. the old
    mechanism's ``buffers``); keys set on the command line stay, for validation to judge."""
    for table, (which, models) in choice_tables().items():
        node, old = out.get(table), raw.get(table)
        if (table, which) not in set_keys or not isinstance(node, dict) or not isinstance(old, dict):
            continue
        model = models.get(node.get(which))  # type: ignore[arg-type]
        if model is None or old.get(which) == node.get(which):
            continue
        for key in [k for k in node if k not in model.model_fields and (table, k) not in set_keys]:
            node.pop(key)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Load a config from TOML (default: the bundled default experiment) and apply
    ``--set`` overrides. Raises :class:`FedsimError` naming every bad key."""
    return config_from_dict(apply_overrides(read_experiment(path)[1], overrides or []))


def config_from_dict(raw: dict[str, Any]) -> Config:
    """Validate a raw table into a :class:`Config`."""
    try:
        return Config.model_validate(raw)
    except ValidationError as e:
        raise FedsimError(_format_validation_error(e)) from None


for _registry in (MODELS, DATASETS, FILTERS, OPTIMIZERS, MECHANISMS):
    _registry.freeze()  # the choices above are built: a later registration could not be named
