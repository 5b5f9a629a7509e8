"""Noise mechanisms: one module per family, one registry, one way from config to noise.

Every family module defines its options (the ``[privacy]`` keys that belong to it), its
strategy object (the parameters of ``C``: :meth:`~base.Strategy.materialize`,
:meth:`~base.Strategy.sensitivity`, :meth:`~base.Strategy.stream`) and registers its
:class:`~base.Mechanism`; this package imports the families in the order the docs list them.

For a run, :func:`plan_mf` computes the workload ``A``, the strategy (cached on disk by the
iterative families), its sensitivity under the scheme the sampler enforces, and
:func:`make_noise` wraps the strategy's stream in the one noise class
(:class:`~fedsim.privacy.noise.NoiseMechanism`). Incompatible combinations are refused with a
message.

Adding a mechanism: write ``fedsim/privacy/mechanisms/<name>.py`` with its options, strategy and
``@register``-ed mechanism, and import it below (docs/architecture.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from fedsim.errors import FedsimError

# The families, in the order of the docs and the CLI (importing a family registers it).
# isort: off
from fedsim.privacy.mechanisms import independent, identity, tree, sqrt, dense, dpmf_plus  # noqa: F401
from fedsim.privacy.mechanisms import banded, blt  # noqa: F401
from fedsim.privacy.mechanisms import bsr, bisr  # noqa: F401

# isort: on
from fedsim.privacy.mechanisms.base import (
    Mechanism,
    MechanismOptions,
    MFOptions,
    MFPlan,
    Objective,
    Strategy,
    amplified_sensitivity,
)
from fedsim.privacy.mechanisms.checks import (
    check_independent_stream,
    check_strategy,
    check_stream,
    checked_sensitivity,
)
from fedsim.privacy.mechanisms.dense import DenseFamilyOptions
from fedsim.privacy.mechanisms.registry import (
    MECHANISMS,
    get_mechanism,
    is_correlated,
    mechanism_names,
    options_of,
    register,
)
from fedsim.privacy.noise import NoiseMechanism
from fedsim.privacy.participation import GroupScheme, ParticipationScheme
from fedsim.privacy.rng import PrivacyKey

if TYPE_CHECKING:
    import torch
else:
    from fedsim._lazy import torch

__all__ = [
    "MECHANISMS",
    "MFOptions",
    "MFPlan",
    "Mechanism",
    "MechanismOptions",
    "Objective",
    "Strategy",
    "check_independent_mechanism",
    "factorization_quality",
    "get_mechanism",
    "is_correlated",
    "make_noise",
    "mechanism_names",
    "options_of",
    "plan_mf",
    "register",
    "workload_matrix",
]


def workload_matrix(name: str, rounds: int, momentum: float = 0.9) -> np.ndarray:
    """The ``n × n`` workload ``A``: ``prefix`` (SGD) or ``momentum`` (SGD with momentum β)."""
    from fedsim.privacy.workloads import make_workload

    return make_workload(name, rounds, beta=momentum)


def plan_mf(
    mechanism: str | MechanismOptions,
    scheme: ParticipationScheme,
    rounds: int,
    *,
    momentum: float = 0.9,
    probe_stream: bool = True,
    **options: Any,
) -> MFPlan:
    """Factorize the run's workload and compute ``sens(C)`` under ``scheme``.

    Parameters
    ----------
    mechanism : the mechanism's options (:class:`MechanismOptions`), or its name with the
        options as keyword arguments (None values take the defaults).
    scheme : the participation scheme the sampler enforces.
    rounds : ``n``.
    momentum : β of the ``momentum`` workload (the server's momentum). Default 0.9.
    probe_stream : run the mechanism's noise stream against `M·Z` (`checks.check_stream`).
        Default True; `fedsim privacy`, which draws no noise, skips it for fedsim's own
        mechanisms (their streams are tested) and probes every plugin's.
    **options : the mechanism's options when ``mechanism`` is a name (e.g. ``bands=4``).
    """
    opts = options_of(mechanism, **options) if isinstance(mechanism, str) else mechanism
    mech = get_mechanism(opts.mechanism)
    if not mech.correlated:
        raise FedsimError(f"{opts.mechanism!r} is not one of {', '.join(mechanism_names(correlated=True))}")
    assert isinstance(opts, MFOptions)
    from fedsim.resources import check_factorization_fits

    participation = opts.participation(scheme, rounds) if isinstance(opts, DenseFamilyOptions) else None
    multi_epoch = opts.workload if participation is not None and participation[0] == "epochs" else None
    check_factorization_fits(opts.mechanism, rounds, getattr(opts, "factorize_device", None), multi_epoch)
    mech.check(opts, scheme, rounds)
    A = workload_matrix(opts.workload, rounds, momentum)
    strategy = mech.strategy(opts, A, scheme)
    # fedsim's own checks, whoever wrote the mechanism (checks.py): C, M·C = I, sens(C), the stream
    C, M = check_strategy(strategy, A.shape[0], opts.mechanism)
    info = dict(strategy.info)
    if isinstance(scheme, GroupScheme) and scheme.poisson_within_group:
        sens, exact = amplified_sensitivity(strategy, scheme)
        info["sensitivity_note"] = "amplified: per-participation column norm; rounds composed ⌈n/b⌉ times"
    else:
        sens, exact = checked_sensitivity(strategy, scheme)
    plan = MFPlan(opts.mechanism, strategy, sens, exact, info)
    if probe_stream:
        check_stream(mech.stream(plan), C, M, sens, opts.mechanism)
    return plan


def check_independent_mechanism(name: str) -> None:
    """fedsim's check of an independent (not matrix-factorization) mechanism before its ε is
    computed: other than ``none`` (no noise, ε = ∞), its stream must add ``ξ_t`` itself in round
    ``t`` with sensitivity 1 (`checks.check_independent_stream`); a `FedsimError` otherwise.

    Parameters
    ----------
    name : the mechanism's registered name.
    """
    mech = get_mechanism(name)
    if mech.correlated or name == "none":
        return
    check_independent_stream(mech.independent_stream(), name)


def make_noise(
    mechanism: str, dim: int, seed: PrivacyKey | int, device: str | torch.device, plan: MFPlan | None = None
) -> NoiseMechanism:
    """The streaming noise of ``mechanism`` (``plan`` for MF mechanisms, checked by `plan_mf`)
    under the run's key; an independent mechanism is checked here (`check_independent_mechanism`)."""
    if plan is None:
        check_independent_mechanism(mechanism)
    return NoiseMechanism(dim, seed, device, get_mechanism(mechanism).stream(plan))


def factorization_quality(plan: MFPlan, A: np.ndarray) -> dict[str, float]:
    """``loss``, ``max_error``, ``final_error`` of docs/algorithms.md §3, in units of ``(c·z)²``:
    ``sens²·‖B‖_F²``, ``sens²·max_t‖B[t,:]‖²``, ``sens²·‖B[n−1,:]‖²`` with ``B = A·M``
    (``M = A⁻¹B``, the noising matrix)."""
    B = A @ plan.noising
    rows = (B * B).sum(axis=1)
    s2 = plan.sens**2
    return {"loss": float(s2 * rows.sum()), "max_error": float(s2 * rows.max()), "final_error": float(s2 * rows[-1])}
