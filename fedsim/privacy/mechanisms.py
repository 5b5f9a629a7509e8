"""From config to noise: build a run's :class:`~fedsim.privacy.noise.NoiseMechanism`.

For matrix-factorization mechanisms this computes the workload ``A`` for the run's
length, the strategy ``C`` (cached on disk by the factorization modules), its
sensitivity under the scheme the sampler enforces, and the streaming noise
generator. Incompatible combinations are refused with a message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from fedsim.errors import FedsimError
from fedsim.privacy.accounting import MF_MECHANISMS
from fedsim.privacy.noise import BandedNoise, BLTNoise, GaussianNoise, MatrixNoise, NoiseMechanism, ZeroNoise
from fedsim.privacy.participation import GroupScheme, ParticipationScheme
from fedsim.privacy.rng import PrivacyKey
from fedsim.privacy.sensitivity import num_bands, sensitivity


@dataclass
class MFPlan:
    """A factorization chosen for a run.

    Attributes
    ----------
    mechanism : family name.
    C : strategy matrix (float64).
    noising : ``M`` with per-round noise ``n_t = (M·Z)_t`` (``C⁻¹`` for square ``C``).
    sens : ``sens(C)`` under the scheme (max column norm when amplified).
    sens_exact : whether ``sens`` is exact (else a proven upper bound).
    info : solver report (iterations, seconds, loss, …).
    """

    mechanism: str
    C: np.ndarray
    noising: np.ndarray
    sens: float
    sens_exact: bool
    info: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        return {
            "mechanism": self.mechanism,
            "sensitivity": self.sens,
            "sensitivity_exact": self.sens_exact,
            **{k: v for k, v in self.info.items() if isinstance(v, (int, float, str, bool))},
        }


#: what a factorization minimises: the total (mean) squared error or the maximum per round.
Objective = Literal["total", "max"]


def workload_matrix(name: str, rounds: int, momentum: float = 0.9) -> np.ndarray:
    from fedsim.privacy.workloads import make_workload

    return make_workload(name, rounds, beta=momentum)


def _strategy(
    mechanism: str,
    A: np.ndarray,
    scheme: ParticipationScheme,
    *,
    bands: int | None,
    buffers: int,
    tau: int | None,
    objective: Objective,
    tree_estimator: str,
    device: str | None = None,
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    n = A.shape[0]
    k = scheme.max_participations or 1
    b = scheme.min_separation or n
    if mechanism in ("identity", "tree", "sqrt", "dense", "dpmf_plus"):
        from fedsim.privacy.factorizations import make_factorization

        f = make_factorization(
            mechanism, A, tau=tau if mechanism == "dpmf_plus" else None, estimator=tree_estimator, device=device
        )
        return f.C, f.noising_matrix(), dict(f.info)
    if mechanism == "banded":
        from fedsim.privacy.banded import optimize_banded

        nb = bands if bands is not None else min(b, n)
        if scheme.name == "min_sep" and nb > b:
            raise FedsimError(
                f"privacy.bands = {nb} exceeds sampling.min_sep = {b}: a banded C under min_sep needs "
                f"at most b bands; lower privacy.bands or raise sampling.min_sep"
            )
        C, info = optimize_banded(A, nb, max_participations=k if scheme.name == "min_sep" else 1, objective=objective)
        return C, np.linalg.inv(C), dict(info)
    if mechanism == "blt":
        from fedsim.privacy.blt import blt_coefficients, optimize_blt

        if A.shape != (n, n) or not np.allclose(A, np.tril(np.ones((n, n)))):
            raise FedsimError(
                "privacy.mechanism = 'blt' is optimised for the prefix-sum workload; set privacy.workload = 'prefix'"
            )
        theta, omega, info = optimize_blt(
            n, buffers, max_participations=k, min_sep=b if k > 1 else None, objective=objective
        )
        c = blt_coefficients(theta, omega, n)
        from scipy.linalg import solve_triangular, toeplitz

        C = np.tril(toeplitz(c))
        info = dict(info, theta=theta, omega=omega)
        return C, solve_triangular(C, np.eye(n), lower=True), info
    raise FedsimError(f"privacy.mechanism = {mechanism!r} is not a matrix-factorization mechanism")


def plan_mf(
    mechanism: str,
    scheme: ParticipationScheme,
    rounds: int,
    *,
    workload: str = "prefix",
    momentum: float = 0.9,
    bands: int | None = None,
    buffers: int = 4,
    tau: int | None = None,
    objective: Objective = "total",
    tree_estimator: str = "online",
    factorize_device: str | None = None,
) -> MFPlan:
    """Factorize the run's workload and compute ``sens(C)`` under ``scheme``.

    ``factorize_device`` is the torch device of the ``dense``/``dpmf_plus`` optimiser
    (``"cuda"``: the GPU path); ``None`` (default) runs it in numpy on the CPU.
    """
    if mechanism not in MF_MECHANISMS:
        raise FedsimError(f"{mechanism!r} is not one of {', '.join(MF_MECHANISMS)}")
    from fedsim.resources import check_factorization_fits

    check_factorization_fits(mechanism, rounds, factorize_device)  # before any n×n allocation
    A = workload_matrix(workload, rounds, momentum)
    C, M, info = _strategy(
        mechanism,
        A,
        scheme,
        bands=bands,
        buffers=buffers,
        tau=tau,
        objective=objective,
        tree_estimator=tree_estimator,
        device=factorize_device,
    )
    amplified = isinstance(scheme, GroupScheme) and scheme.poisson_within_group
    if amplified:
        assert isinstance(scheme, GroupScheme)
        if C.shape[0] != C.shape[1] or num_bands(C, tol=1e-12) > scheme.min_sep:
            raise FedsimError(
                "sampling.poisson_within_group (amplified MF) needs a C with at most sampling.min_sep bands: "
                "use privacy.mechanism = 'banded' (or 'identity')"
            )
        sens, exact = sensitivity(C, "single")
        info["sensitivity_note"] = "amplified: per-participation column norm; rounds composed ⌈n/b⌉ times"
    elif mechanism == "blt" and scheme.name == "min_sep" and (scheme.max_participations or 1) > 1:
        from fedsim.privacy.blt import blt_sensitivity_squared

        # Exact for BLT with non-negative, non-increasing coefficients (checked inside;
        # anything else is refused there): worst pattern starts at 0 with gaps of b.
        sens = float(
            np.sqrt(
                blt_sensitivity_squared(
                    info["theta"],
                    info["omega"],
                    rounds,
                    max_participations=scheme.max_participations or 1,
                    min_sep=scheme.min_separation,
                )
            )
        )
        exact = True
    else:
        sens, exact = sensitivity(C, scheme.name, k=scheme.max_participations or 1, b=scheme.min_separation or rounds)
    return MFPlan(mechanism, C, M, sens, exact, info)


def make_noise(
    mechanism: str, dim: int, seed: PrivacyKey | int, device: str | torch.device, plan: MFPlan | None = None
) -> NoiseMechanism:
    """The streaming noise generator for ``mechanism`` (``plan`` for MF mechanisms)."""
    if mechanism == "none":
        return ZeroNoise(dim, seed, device)
    if mechanism == "gaussian":
        return GaussianNoise(dim, seed, device)
    if plan is None:
        raise FedsimError(f"privacy.mechanism = {mechanism!r} needs a factorization plan")
    square = plan.C.shape[0] == plan.C.shape[1]
    if square and mechanism in ("banded", "identity"):
        return BandedNoise(dim, seed, device, plan.C, plan.sens, label=mechanism)
    if mechanism == "blt":
        return BLTNoise(dim, seed, device, plan.info["theta"], plan.info["omega"], plan.sens)
    return MatrixNoise(dim, seed, device, plan.noising, plan.sens, label=mechanism)


def factorization_quality(plan: MFPlan, A: np.ndarray) -> dict[str, float]:
    """``loss``, ``max_error``, ``final_error`` of docs/algorithms.md §3, in units of ``(c·z)²``:
    ``sens²·‖B‖_F²``, ``sens²·max_t‖B[t,:]‖²``, ``sens²·‖B[n−1,:]‖²`` with ``B = A·M``
    (``M = A⁻¹B``, the noising matrix)."""
    B = A @ plan.noising
    rows = (B * B).sum(axis=1)
    s2 = plan.sens**2
    return {"loss": float(s2 * rows.sum()), "max_error": float(s2 * rows.max()), "final_error": float(s2 * rows[-1])}
