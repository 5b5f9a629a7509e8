"""fedsim.privacy — the DP core: pure functions and small stateful objects, no Flower.

Notation (docs/algorithms.md; names in code follow the right-hand column):

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

Modules: ``participation`` (schemes shared by sampler and accountant),
``accounting`` (ε ↔ z with dp-accounting), ``ledger`` (the per-round privacy
record), ``noise`` (streaming noise mechanisms), ``clipping``.
"""

from fedsim.privacy.accounting import (
    AccountingSpec,
    EpsilonCurve,
    calibrate_noise_multiplier,
    default_delta,
    epsilon,
)
from fedsim.privacy.clipping import clip_vector, l2_norm
from fedsim.privacy.ledger import Ledger
from fedsim.privacy.noise import GaussianNoise, NoiseMechanism, ZeroNoise, make_noise_mechanism
from fedsim.privacy.participation import FixedScheme, ParticipationScheme, PoissonScheme, make_scheme

__all__ = [
    "AccountingSpec",
    "EpsilonCurve",
    "FixedScheme",
    "GaussianNoise",
    "Ledger",
    "NoiseMechanism",
    "ParticipationScheme",
    "PoissonScheme",
    "ZeroNoise",
    "calibrate_noise_multiplier",
    "clip_vector",
    "default_delta",
    "epsilon",
    "l2_norm",
    "make_noise_mechanism",
    "make_scheme",
]
