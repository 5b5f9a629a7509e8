"""A config's privacy before any training: the population and δ, the participation scheme,
the accounting spec (with `z` calibrated for a target ε), the MF plan and its checks, the
adaptive-clipping budget split, and the report `fedsim privacy` prints.

A light module (torch is imported only if a mechanism's checks run its noise stream), so that
`fedsim privacy` answers without the training stack; `fedsim.runner` re-exports its names.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from fedsim.config import Config
from fedsim.errors import FedsimError
from fedsim.privacy.accounting import AccountingSpec, calibrate_noise_multiplier, default_delta, epsilon
from fedsim.privacy.mechanisms import MFPlan, check_independent_mechanism, plan_mf
from fedsim.privacy.mechanisms.registry import is_shipped
from fedsim.privacy.participation import GroupScheme, ParticipationScheme, make_scheme


def public_population(cfg: Config, observed: int) -> int:
    """``N`` of the accounting and the sampler: ``privacy.population`` when the config states it
    (checked against the ``observed`` users: at most ``N``, exactly ``N`` for ``fixed`` sampling
    and ``shuffle`` assignment), else ``observed``."""
    n = cfg.privacy.population
    if n is None:
        return observed
    exact = cfg.sampling.scheme == "fixed" or cfg.sampling.assignment == "shuffle"
    if observed > n or (exact and observed != n):
        why = (
            f"sampling.scheme = '{cfg.sampling.scheme}' with assignment '{cfg.sampling.assignment}' needs exactly N"
            if exact
            else "the guarantee is stated for populations of at most N users"
        )
        raise FedsimError(
            f"privacy.population = {n}, but the data hold {observed} users ({why}); correct "
            f"privacy.population, or select the users with data.max_users"
        )
    return n


def scheme_of(cfg: Config, population: int) -> ParticipationScheme:
    """The participation scheme ``cfg`` asks for, checked against the run length. ``population``
    is the users the data hold; ``privacy.population``, when set, takes its place
    (:func:`public_population`)."""
    s = cfg.sampling
    return make_scheme(
        s.scheme,
        public_population(cfg, population),
        s.cohort_size,
        min_sep=s.min_sep,
        max_participations=s.max_participations,
        poisson_within_group=s.poisson_within_group,
        rounds=cfg.rounds,
        assignment=s.assignment,
    )


def note_max_users(cfg: Config, population: int) -> None:
    """Say (on stderr) when ``data.max_users`` exceeds the dataset's users, instead of clamping silently."""
    if cfg.data.max_users is not None and cfg.data.max_users > population:
        import sys

        print(
            f"fedsim: note: data.max_users = {cfg.data.max_users} exceeds the {population} users of "
            f"{cfg.data.name}; using all {population}",
            file=sys.stderr,
            flush=True,
        )


def resolve_privacy(cfg: Config, population: int) -> AccountingSpec:
    """The accounting spec of ``cfg`` for a population of ``population`` users (or
    ``privacy.population`` when set, :func:`public_population`): δ defaulted to ``1/N^1.1`` and
    ``z`` calibrated when a target ε is given."""
    population = public_population(cfg, population)
    cfg.validate_population(population)
    scheme = scheme_of(cfg, population)
    p = cfg.privacy
    delta = p.delta if p.delta is not None else default_delta(population)
    if delta >= 1.0 / population and not p.delta_reason:
        raise FedsimError(
            f"privacy.delta = {delta:g} is not below 1/N = {1.0 / population:.3g}: a δ that large allows "
            f"releasing one user's data outright. Lower it (the default is 1/N^1.1 = "
            f'{default_delta(population):.3g}), or say why in privacy.delta_reason = "…"'
        )
    amplified = isinstance(scheme, GroupScheme) and scheme.poisson_within_group
    spec = AccountingSpec(
        mechanism=p.mechanism,
        scheme=cfg.sampling.scheme,
        population=population,
        cohort_size=scheme.expected_cohort,
        noise_multiplier=p.noise_multiplier or 0.0,
        delta=delta,
        accountant=p.accountant,
        min_sep=scheme.min_separation or 1,
        amplified=amplified,
        no_guarantee=cfg.client.error_feedback == "server",
        assignment=scheme.assignment,
    )
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


def resolve_clipping(
    cfg: Config, spec: AccountingSpec, scheme: ParticipationScheme
) -> tuple[float, dict[str, Any] | None]:
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


def mf_plan(cfg: Config, spec: AccountingSpec, scheme: ParticipationScheme, probe_stream: bool = True) -> MFPlan | None:
    """The matrix-factorization plan of a correlated-noise mechanism (None for independent
    noise). Raises :class:`FedsimError` for a factorization the participation scheme's ε does
    not hold for (e.g. amplified MF with more bands than ``sampling.min_sep``)."""
    if not spec.is_mf:
        check_independent_mechanism(spec.mechanism)  # before any ε of it is computed
        return None
    beta = float(getattr(cfg.server, "momentum", 0.9))  # the momentum workload needs server.momentum
    return plan_mf(cfg.privacy.mechanism_options(), scheme, cfg.rounds, momentum=beta, probe_stream=probe_stream)


def privacy_report(cfg: Config, population: int, dim: int | None = None) -> dict[str, Any]:
    """What ``fedsim privacy --json`` prints: ε after ``cfg.rounds`` rounds without training.

    The checks ``fedsim run`` makes before it starts are made here too (the MF plan included),
    so no ε is printed for a setup that a run would refuse; only the probe of a noise stream is
    left out for fedsim's own mechanisms, whose streams are tested (a plugin's is probed)."""
    spec = resolve_privacy(cfg, population)
    scheme = scheme_of(cfg, population)
    # no noise is drawn here: fedsim's own streams (tested) are not probed, a plugin's is
    plan = mf_plan(cfg, spec, scheme, probe_stream=not is_shipped(spec.mechanism))
    eps = epsilon(spec, cfg.rounds)
    cost = None if dim is None else noise_cost_of(cfg, spec, plan, dim)
    _, split = resolve_clipping(cfg, spec, scheme)
    notes = []
    if cfg.client.error_feedback == "server":
        from fedsim.training.error_feedback import SERVER_EF_LABEL

        notes.append(SERVER_EF_LABEL)
    return {
        "budget_split": split,
        "notes": notes,
        "epsilon": eps if math.isfinite(eps) else "inf",
        "delta": spec.delta,
        "noise_multiplier": spec.noise_multiplier,
        "rounds": cfg.rounds,
        "sampling_rate": spec.sampling_rate,
        "population": spec.population,
        "mechanism": spec.mechanism,
        "accountant": spec.effective_accountant,
        "scheme": spec.scheme,
        "cohort_size": spec.cohort_size,
        "neighboring_relation": spec.neighboring_relation,
        "assignment": spec.assignment,
        # one user's contribution to the noised sum, in units of c: the factorization's sens(C)
        # for MF noise, 1 (add/remove) or 2 (replace one) for independent noise
        "sensitivity_in_c": spec.sensitivity_in_c if plan is None else plan.sens,
        "sensitivity_exact": True if plan is None else plan.sens_exact,
        **({} if cost is None else {"noise_cost": cost}),
    }


def noise_cost_of(cfg: Config, spec: AccountingSpec, plan: MFPlan | None, dim: int) -> dict[str, Any]:
    """The noise's memory, disk and CPU for `cfg`'s run at `dim` parameters
    (`fedsim.privacy.cost.noise_cost`), with `fits_memory`: whether its state fits this
    machine's available memory (a note names the mechanisms whose state is a few rows)."""
    from fedsim.privacy.cost import noise_cost
    from fedsim.privacy.mechanisms import get_mechanism
    from fedsim.resources import available_memory_bytes

    if dim < 1:
        raise FedsimError(f"--dim {dim}: the model's number of parameters is at least 1")
    mech = get_mechanism(spec.mechanism)
    if plan is not None:
        cost = noise_cost(
            lambda: mech.stream(plan), cfg.rounds, dim, cfg.privacy.noise_memory_mib << 20, cfg.privacy.noise_table
        )
    elif spec.mechanism == "none":
        cost = {
            "dim": dim,
            "state_bytes": 0,
            "disk_bytes": 0,
            "row_cpu_ms": 0.0,
            "run_cpu_s": 0.0,
            "table_build_cpu_s": 0.0,
        }
    else:
        cost = noise_cost(mech.independent_stream, cfg.rounds, dim, cfg.privacy.noise_memory_mib << 20)
    cost["fits_memory"] = bool(cost["state_bytes"] <= available_memory_bytes())
    return cost
