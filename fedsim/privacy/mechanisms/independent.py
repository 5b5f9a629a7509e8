"""Independent noise: ``gaussian`` (fresh ``ξ_t ~ N(0, I_d)`` every round, ``sens = 1``) and
``none`` (no noise, ε = ∞).

Independent Gaussian noise is the identity strategy over an unbounded number of rounds; unlike
the ``identity`` factorization it is accounted per round, amplified by the sampler
(``poisson`` or ``fixed``; docs/algorithms.md §4).
"""

from __future__ import annotations

from typing import Literal

from fedsim.privacy.mechanisms.base import Mechanism, MechanismOptions
from fedsim.privacy.mechanisms.registry import register
from fedsim.privacy.noise import IndependentStream, ZeroStream
from fedsim.privacy.stream import NoiseStream


class NoneOptions(MechanismOptions):
    """``privacy.mechanism = "none"``: no options."""

    mechanism: Literal["none"] = "none"


class GaussianOptions(MechanismOptions):
    """``privacy.mechanism = "gaussian"``: no options."""

    mechanism: Literal["gaussian"] = "gaussian"


@register
class NoNoise(Mechanism):
    """No noise: a non-private baseline (ε = ∞)."""

    name = "none"
    options = NoneOptions
    summary = "no noise (ε = ∞): a non-private baseline"
    correlated = False

    def independent_stream(self) -> NoiseStream:
        return ZeroStream()


@register
class Gaussian(Mechanism):
    """Independent Gaussian noise, amplified by ``poisson`` or ``fixed`` sampling."""

    name = "gaussian"
    options = GaussianOptions
    summary = "independent Gaussian noise each round (DP-FedAvg), amplified by poisson/fixed sampling"
    correlated = False

    def independent_stream(self) -> NoiseStream:
        return IndependentStream()
