"""What every noise mechanism is made of (docs/algorithms.md §3; docs/mechanisms.md).

A mechanism is registered once (:mod:`fedsim.privacy.mechanisms.registry`) as a
:class:`Mechanism`: its name, its options (a pydantic model holding the ``[privacy]`` keys that
belong to it, so a key of another mechanism cannot be written) and how it turns the run's
workload ``A`` and participation scheme into a :class:`Strategy`.

A :class:`Strategy` is the typed, frozen description of a strategy matrix ``C`` — a BLT's
``(θ, ω)``, a banded matrix's band, a dense ``C`` — with

- :meth:`Strategy.materialize`: ``C`` itself (float64, ``m × n``);
- :meth:`Strategy.noising`: ``M`` with per-round noise ``n_t = (M·Z)_t`` (``C⁻¹`` when ``C`` is
  square);
- :meth:`Strategy.sensitivity`: ``sens(C)`` under a participation scheme, and whether it is exact;
- :meth:`Strategy.stream`: the :class:`~fedsim.privacy.stream.NoiseStream` that produces
  ``n_t`` round by round with explicit, serialisable state.

Independent Gaussian noise is the identity strategy with an unbounded number of rounds: it
has no matrix, and its stream is ``n_t = ξ_t``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from fedsim.errors import FedsimError
from fedsim.privacy.factorizations import Factorization
from fedsim.privacy.participation import GroupScheme, ParticipationScheme
from fedsim.privacy.sensitivity import num_bands, sensitivity
from fedsim.privacy.stream import NoiseStream

#: what an optimised factorization minimises: the total squared error or the maximum per round.
Objective = Literal["total", "max"]


class MechanismOptions(BaseModel):
    """The ``[privacy]`` keys that belong to one mechanism.

    Each mechanism subclasses this with ``mechanism: Literal["<name>"]`` (the discriminator of
    the config's union of mechanisms) and its own keys. Unknown keys are errors, types are
    strict (TOML types are exact) and numbers must be finite.

    Parameters
    ----------
    mechanism : the mechanism's registered name.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=True, allow_inf_nan=False)

    mechanism: str


class MFOptions(MechanismOptions):
    """Options shared by every matrix-factorization mechanism.

    Parameters
    ----------
    workload : what the factorization is optimised for: ``prefix`` (the prefix sums of SGD,
        default) or ``momentum`` (SGD with the server's momentum β, ``server.momentum``).
    """

    workload: Literal["prefix", "momentum"] = Field(
        default="prefix", description="the workload A: prefix (SGD) or momentum (SGD with momentum β)"
    )


class Strategy(ABC):
    """A strategy matrix ``C``, described by its parameters (subclasses are frozen dataclasses).

    :attr:`rounds` (``n``) is the number of rounds it covers; ``info`` (a dict) says how it was
    obtained (solver iterations, seconds, cache use).
    """

    info: dict[str, Any]

    @property
    @abstractmethod
    def rounds(self) -> int:
        """``n``: the rounds (columns of ``C``) the strategy covers."""

    @abstractmethod
    def materialize(self) -> np.ndarray:
        """``C`` as a dense float64 matrix (``m × n``; lower-triangular when square)."""

    def noising(self) -> np.ndarray:
        """``M`` (``n × m``) with noise row ``n_t = (M·Z)_t``; ``C⁻¹`` for a square ``C``."""
        from scipy.linalg import solve_triangular

        C = self.materialize()
        return np.asarray(solve_triangular(C, np.eye(C.shape[0]), lower=True))

    def sensitivity(self, scheme: ParticipationScheme) -> tuple[float, bool]:
        """``(sens(C), exact)`` under ``scheme`` (docs/algorithms.md §3); ``exact`` is False when
        the value is a proven upper bound."""
        return sensitivity(
            self.materialize(),
            scheme.name,
            k=scheme.max_participations or 1,
            b=scheme.min_separation or self.rounds,
        )

    def stream(self, sens: float, name: str) -> NoiseStream:
        """The noise stream of this strategy (default: any noising matrix, row by row)."""
        from fedsim.privacy.noise import MatrixStream

        return MatrixStream(self.noising(), sens, name=name)


@dataclass(frozen=True, eq=False)
class DenseStrategy(Strategy):
    """A strategy given as a matrix: ``C`` (``m × n``) and its noising matrix ``M``.

    Parameters
    ----------
    C : the strategy, float64.
    M : the noising matrix (``C⁻¹``, or ``A⁻¹B`` for a non-square ``C`` such as the tree's).
    info : how it was obtained (iterations, seconds, …). Default empty.
    """

    C: np.ndarray
    M: np.ndarray
    info: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, f: Factorization) -> DenseStrategy:
        """The strategy of a computed factorization (``C``, its noising matrix, its report)."""
        return cls(f.C, f.noising_matrix(), dict(f.info))

    @property
    def rounds(self) -> int:
        return int(self.C.shape[1])

    def materialize(self) -> np.ndarray:
        return self.C

    def noising(self) -> np.ndarray:
        return self.M


class Mechanism:
    """A registered noise mechanism.

    Class attributes
    ----------------
    name : the registered name (``privacy.mechanism``).
    options : its options model (a :class:`MechanismOptions` subclass).
    summary : one line for the docs table and ``--help``.
    correlated : True for matrix-factorization mechanisms (correlated noise ``C⁻¹Z``, needs a
        scheme that bounds participation, accounted as one Gaussian mechanism over the run);
        False for independent noise (``gaussian``, ``none``).
    """

    name: ClassVar[str]
    options: ClassVar[type[MechanismOptions]]
    summary: ClassVar[str]
    correlated: ClassVar[bool] = True

    @property
    def correlated_label(self) -> str:
        """How the docs describe the family: correlated (MF) or independent noise."""
        if self.correlated:
            return "matrix factorization (correlated noise)"
        return "independent noise"

    def check(self, opts: MechanismOptions, scheme: ParticipationScheme, rounds: int) -> None:
        """Refuse options that cannot work with ``scheme`` before any factorization work."""

    def strategy(self, opts: MechanismOptions, A: np.ndarray, scheme: ParticipationScheme) -> Strategy:
        """Factorize the workload ``A`` (``n × n``) for ``scheme`` (correlated mechanisms only)."""
        raise FedsimError(f"privacy.mechanism = {self.name!r} is not a matrix-factorization mechanism")

    def independent_stream(self) -> NoiseStream:
        """The noise stream of an independent mechanism (``correlated = False`` only)."""
        raise FedsimError(f"privacy.mechanism = {self.name!r} needs a factorization plan")

    def stream(self, plan: MFPlan | None) -> NoiseStream:
        """The stream of a run: the plan's strategy for MF mechanisms, else independent noise."""
        if not self.correlated:
            return self.independent_stream()
        if plan is None:
            raise FedsimError(f"privacy.mechanism = {self.name!r} needs a factorization plan")
        return plan.strategy.stream(plan.sens, self.name)


@dataclass
class MFPlan:
    """A factorization chosen for a run.

    Attributes
    ----------
    mechanism : family name.
    strategy : the strategy object (parameters of ``C``).
    sens : ``sens(C)`` under the scheme (max column norm when amplified).
    sens_exact : whether ``sens`` is exact (else a proven upper bound).
    info : solver report (iterations, seconds, loss, …).
    """

    mechanism: str
    strategy: Strategy
    sens: float
    sens_exact: bool
    info: dict[str, Any] = field(default_factory=dict)

    @cached_property
    def C(self) -> np.ndarray:
        """The strategy matrix (float64)."""
        return self.strategy.materialize()

    @cached_property
    def noising(self) -> np.ndarray:
        """``M`` with per-round noise ``n_t = (M·Z)_t`` (``C⁻¹`` for square ``C``)."""
        return self.strategy.noising()

    def describe(self) -> dict[str, Any]:
        return {
            "mechanism": self.mechanism,
            "sensitivity": self.sens,
            "sensitivity_exact": self.sens_exact,
            **{k: v for k, v in self.info.items() if isinstance(v, (int, float, str, bool))},
        }


def amplified_sensitivity(strategy: Strategy, scheme: GroupScheme) -> tuple[float, bool]:
    """``sens(C)`` for amplified MF (Poisson thinning inside ``min_sep`` groups): the
    per-participation column norm; refuses a ``C`` with more than ``b`` bands."""
    C = strategy.materialize()
    if C.shape[0] != C.shape[1] or num_bands(C, tol=1e-12) > scheme.min_sep:
        raise FedsimError(
            "sampling.poisson_within_group (amplified MF) needs a C with at most sampling.min_sep bands: "
            "use privacy.mechanism = 'banded' (or 'identity')"
        )
    return sensitivity(C, "single")
