"""fedsim.privacy — the DP core: pure functions and small stateful objects, no Flower.

Notation (docs/algorithms.md; the full table is docs/notation.md; names in code follow the
right-hand column):

=====================  ==========================  ==========================================
math                   code                        meaning
=====================  ==========================  ==========================================
``n``                  ``rounds``                  number of rounds, ``t = 0..n-1``
``N``                  ``population``              number of users
``K̄``                  ``cohort_size``             expected cohort size; the fixed denominator
``q``                  ``sampling_rate``           ``K̄ / N`` for Poisson sampling
``c``                  ``clip_norm``               L2 bound on one user's flattened delta
``z``                  ``noise_multiplier``        noise std on the summed update is ``c·z·sens``
``δ``                  ``delta``                   target δ; default ``1 / N^1.1``
``sens(C)``            ``sensitivity``             sensitivity of the strategy matrix (1 for
                                                   independent Gaussian noise)
``n_t``                ``NoiseMechanism.row(t)``   standardized noise row of round ``t``
``ĝ_t``                ``noisy_mean``              ``(U_t + c·z·sens·n_t) / K̄``
=====================  ==========================  ==========================================

Modules: ``participation`` (schemes shared by sampler and accountant), ``mechanisms`` (the
registry of noise mechanisms, one module per family: options, strategy ``C``, sensitivity and
noise stream), ``factorizations`` (what the families share), ``sensitivity``, ``workloads``,
``stream`` and ``noise`` (the one streaming-noise abstraction and the one noise class),
``accounting`` (ε ↔ z with dp-accounting), ``ledger`` (the per-round privacy record),
``adaptive_clip``, ``clipping`` and ``rng`` (the keyed CSPRNG).
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedsim.privacy.accounting import (
        AccountingSpec,
        EpsilonCurve,
        calibrate_noise_multiplier,
        default_delta,
        epsilon,
    )
    from fedsim.privacy.clipping import clip_vector, l2_norm
    from fedsim.privacy.ledger import Ledger
    from fedsim.privacy.mechanisms import (
        MECHANISMS,
        Mechanism,
        MechanismOptions,
        MFPlan,
        Strategy,
        factorization_quality,
        get_mechanism,
        make_noise,
        mechanism_names,
        options_of,
        plan_mf,
        workload_matrix,
    )
    from fedsim.privacy.noise import NoiseMechanism, gaussian_noise, zero_noise
    from fedsim.privacy.participation import FixedScheme, ParticipationScheme, PoissonScheme, make_scheme
    from fedsim.privacy.rng import PrivacyKey
    from fedsim.privacy.stream import NoiseStream

#: public name → the submodule that defines it. Imported on first use (PEP 562), so that a
#: process that needs one light submodule (a ClientApp: ``rng``, ``clipping``) does not import
#: dp-accounting and SciPy with the accountant (about 70 MB and 0.8 s per process).
_WHERE = {
    "AccountingSpec": "fedsim.privacy.accounting",
    "EpsilonCurve": "fedsim.privacy.accounting",
    "calibrate_noise_multiplier": "fedsim.privacy.accounting",
    "default_delta": "fedsim.privacy.accounting",
    "epsilon": "fedsim.privacy.accounting",
    "clip_vector": "fedsim.privacy.clipping",
    "l2_norm": "fedsim.privacy.clipping",
    "Ledger": "fedsim.privacy.ledger",
    "MECHANISMS": "fedsim.privacy.mechanisms",
    "Mechanism": "fedsim.privacy.mechanisms",
    "MechanismOptions": "fedsim.privacy.mechanisms",
    "MFPlan": "fedsim.privacy.mechanisms",
    "Strategy": "fedsim.privacy.mechanisms",
    "factorization_quality": "fedsim.privacy.mechanisms",
    "get_mechanism": "fedsim.privacy.mechanisms",
    "make_noise": "fedsim.privacy.mechanisms",
    "mechanism_names": "fedsim.privacy.mechanisms",
    "options_of": "fedsim.privacy.mechanisms",
    "plan_mf": "fedsim.privacy.mechanisms",
    "workload_matrix": "fedsim.privacy.mechanisms",
    "NoiseMechanism": "fedsim.privacy.noise",
    "gaussian_noise": "fedsim.privacy.noise",
    "zero_noise": "fedsim.privacy.noise",
    "FixedScheme": "fedsim.privacy.participation",
    "ParticipationScheme": "fedsim.privacy.participation",
    "PoissonScheme": "fedsim.privacy.participation",
    "make_scheme": "fedsim.privacy.participation",
    "PrivacyKey": "fedsim.privacy.rng",
    "NoiseStream": "fedsim.privacy.stream",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


__all__ = [
    "MECHANISMS",
    "AccountingSpec",
    "EpsilonCurve",
    "FixedScheme",
    "Ledger",
    "MFPlan",
    "Mechanism",
    "MechanismOptions",
    "NoiseMechanism",
    "NoiseStream",
    "ParticipationScheme",
    "PoissonScheme",
    "PrivacyKey",
    "Strategy",
    "calibrate_noise_multiplier",
    "clip_vector",
    "default_delta",
    "epsilon",
    "factorization_quality",
    "gaussian_noise",
    "get_mechanism",
    "l2_norm",
    "make_noise",
    "make_scheme",
    "mechanism_names",
    "options_of",
    "plan_mf",
    "workload_matrix",
    "zero_noise",
]
