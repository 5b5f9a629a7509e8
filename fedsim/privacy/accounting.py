"""Privacy accounting with ``dp-accounting`` (docs/algorithms.md §4).

Sensitivity: dp-accounting's noise multiplier is the noise std divided by the L2
sensitivity of the released sum *under the event's adjacency*. Under add/remove-one
a user changes the sum of clipped updates by at most ``c``, so the multiplier is
``z``. Under replace-one (``fixed`` sampling) one user's update ``u`` becomes ``u'``,
so the sum changes by up to ``‖u − u'‖ ≤ 2c``, and the multiplier is ``z/2``.

No RDP or PLD is hand-rolled here: every ε comes from dp-accounting, for the
DP events the sampler really produces. A round is one event; a run of ``t``
rounds is the ``t``-fold self-composition of it.

=============  ============  ======================================================
mechanism      scheme        event of one round
=============  ============  ======================================================
``gaussian``   ``poisson``   ``PoissonSampledDpEvent(q, GaussianDpEvent(z))``;
                             PLD (default) or RDP; add/remove-one adjacency
``gaussian``   ``fixed``     ``SampledWithoutReplacementDpEvent(N, K,
                             GaussianDpEvent(z/2))``; RDP; replace-one adjacency
``none``       any           ``NonPrivateDpEvent`` (ε = ∞)
MF (any of     ``single``,   the whole run is one ``GaussianDpEvent(z)`` (sensitivity 1:
``identity``,  ``epochs``,   ``sens(C)`` is inside the noise); ε does not grow with
``tree``, …)   ``min_sep``   rounds, and the ledger reports the full-run ε from round 1
MF, amplified  ``min_sep``   ``⌈t/b⌉``-fold ``PoissonSampledDpEvent(p, GaussianDpEvent(z))``
(≤ b bands)    + thinning    after ``t`` rounds (Choquette-Choo et al. 2023)
=============  ============  ======================================================
"""

from __future__ import annotations

import functools
import logging
import math
import threading
from concurrent.futures import Future
from dataclasses import asdict, dataclass, replace
from typing import Any

import dp_accounting
from dp_accounting import dp_event
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

from fedsim.errors import FedsimError
from fedsim.privacy import calibration_memo
from fedsim.privacy.background import worker
from fedsim.privacy.mechanisms.registry import is_correlated
from fedsim.privacy.participation import MF_SCHEMES as MF_SCHEMES  # re-exported

#: PLD discretization (dp-accounting's PLDAccountant default).
PLD_DISCRETIZATION = 1e-4


#: How each neighbouring relation is printed next to an ε.
RELATION_LABELS = {
    "add_or_remove_one": "add/remove one user",
    "replace_one": "replace one user",
    "zero_out": "zero-out of one user",
}


def default_delta(population: int) -> float:
    """δ = 1 / N^1.1 (smaller than 1/N, as is customary)."""
    return float(1.0 / float(population) ** 1.1)


@dataclass(frozen=True)
class AccountingSpec:
    """Everything the accountant needs, and nothing else.

    Parameters
    ----------
    mechanism : a registered mechanism name (:mod:`fedsim.privacy.mechanisms`).
    scheme : the participation scheme's name.
    population : ``N``, number of users (after any ``data.max_users`` subset).
    cohort_size : ``K̄`` (expected cohort; exactly ``K`` for ``fixed``).
    assignment : ``keyed`` or ``shuffle`` group/bucket assignment of the bounded schemes; decides
        the neighbouring relation the ε holds for (:attr:`neighboring_relation`).
    noise_multiplier : ``z`` (ignored for ``none``).
    delta : target δ.
    accountant : ``pld`` | ``rdp`` (``fixed`` always uses ``rdp``).
    min_sep : ``b`` of a group scheme (amplified banded MF composes ``⌈t/b⌉`` times).
    amplified : Poisson thinning inside ``min_sep`` groups with a ≤ ``b``-banded ``C``;
        ``sampling_rate`` is then ``p = K̄/⌊N/b⌋``.
    no_guarantee : the run releases something no DP argument bounds (server-side error
        feedback feeds unclipped residuals into the releases): ε is ∞ whatever the noise.
    """

    mechanism: str
    scheme: str
    population: int
    cohort_size: float
    noise_multiplier: float
    delta: float
    accountant: str = "pld"
    min_sep: int = 1
    amplified: bool = False
    no_guarantee: bool = False
    assignment: str = "keyed"

    def __post_init__(self) -> None:
        if is_correlated(self.mechanism) and self.scheme not in MF_SCHEMES:
            raise FedsimError(
                f"privacy.mechanism = '{self.mechanism}' (matrix factorization) needs a bounded "
                f"participation scheme: set sampling.scheme to one of {', '.join(MF_SCHEMES)}"
            )
        if self.mechanism == "gaussian" and self.scheme not in ("poisson", "fixed"):
            raise FedsimError(
                f"privacy.mechanism = 'gaussian' is amplified by sampling and needs sampling.scheme = "
                f"'poisson' or 'fixed'; with '{self.scheme}' use privacy.mechanism = 'identity' "
                f"(independent noise, no amplification)"
            )
        if self.amplified and not (is_correlated(self.mechanism) and self.scheme == "min_sep"):
            raise FedsimError("amplified MF accounting needs sampling.scheme = 'min_sep' with an MF mechanism")

    @property
    def is_mf(self) -> bool:
        """Matrix-factorization (correlated) noise: one Gaussian mechanism over the run."""
        return is_correlated(self.mechanism)

    @property
    def sampling_rate(self) -> float:
        if self.amplified:  # p = K̄ / group size: N/b expected (keyed) or ⌊N/b⌋ (shuffle)
            group = self.population / self.min_sep if self.assignment == "keyed" else self.population // self.min_sep
            return self.cohort_size / group
        if self.scheme in ("epochs", "min_sep"):
            return 1.0
        return self.cohort_size / self.population

    @property
    def effective_accountant(self) -> str:
        """The accountant actually used (``fixed`` sampling needs RDP)."""
        if self.mechanism == "none" or self.no_guarantee:
            return "none"
        return "rdp" if self.scheme == "fixed" else self.accountant

    @property
    def neighboring_relation(self) -> str:
        """``replace_one`` (fixed sampling), ``zero_out`` (shuffle assignment: a new user can
        displace another) or ``add_or_remove_one`` (Poisson; keyed single/epochs/min_sep)."""
        if self.scheme == "fixed":
            return "replace_one"
        if self.scheme in MF_SCHEMES and self.assignment == "shuffle":
            return "zero_out"
        return "add_or_remove_one"

    @property
    def sensitivity_in_c(self) -> float:
        """L2 sensitivity of the sum of clipped updates, in units of ``c``, under the
        scheme's adjacency: 1 for add/remove-one, 2 for replace-one."""
        return 2.0 if self.neighboring_relation == "replace_one" else 1.0

    def round_event(self) -> dp_event.DpEvent:
        """The DP event that is self-composed (see :meth:`compositions`)."""
        if self.mechanism == "none" or self.no_guarantee:
            return dp_event.NonPrivateDpEvent()
        if self.is_mf:
            g = dp_event.GaussianDpEvent(self.noise_multiplier)
            return dp_event.PoissonSampledDpEvent(self.sampling_rate, g) if self.amplified else g
        if self.mechanism != "gaussian":
            raise FedsimError(f"privacy.mechanism = {self.mechanism!r} has no accountant")
        if self.scheme == "poisson":
            g = dp_event.GaussianDpEvent(self.noise_multiplier / self.sensitivity_in_c)
            return dp_event.PoissonSampledDpEvent(self.sampling_rate, g)
        if self.scheme == "fixed":
            g = dp_event.GaussianDpEvent(self.noise_multiplier / self.sensitivity_in_c)
            return dp_event.SampledWithoutReplacementDpEvent(self.population, self.cohort_size, g)
        raise FedsimError(f"sampling.scheme = {self.scheme!r} has no accountant yet")

    def compositions(self, rounds: int) -> int:
        """How many times :meth:`round_event` is composed after ``rounds`` rounds."""
        if self.is_mf:
            return -(-rounds // self.min_sep) if self.amplified else 1
        return rounds

    def run_event(self, rounds: int) -> dp_event.DpEvent:
        """The DP event of ``rounds`` rounds."""
        return dp_event.SelfComposedDpEvent(self.round_event(), self.compositions(rounds))

    def describe_events(self) -> str:
        """Human-readable account of how ε is computed."""
        if self.no_guarantee:
            return (
                "NonPrivateDpEvent (no guarantee: server-side error feedback releases unclipped "
                "residuals, epsilon = inf)"
            )
        if self.mechanism == "none":
            return "NonPrivateDpEvent (no noise: epsilon = inf)"
        if self.is_mf and not self.amplified:
            return f"{self.round_event()} once for the whole run (matrix factorization: sens(C) is inside the noise)"
        return f"SelfComposedDpEvent({self.round_event()}, count) with count = {self.compositions(1)} per " + (
            f"{self.min_sep} rounds" if self.amplified else "round"
        )

    def make_accountant(self) -> dp_accounting.PrivacyAccountant:
        """A fresh dp-accounting accountant of the right kind and adjacency."""
        if self.effective_accountant == "rdp":
            rel = (
                dp_accounting.NeighboringRelation.REPLACE_ONE
                if self.scheme == "fixed"
                else dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
            )
            return dp_accounting.rdp.RdpAccountant(neighboring_relation=rel)
        return dp_accounting.pld.PLDAccountant(value_discretization_interval=PLD_DISCRETIZATION)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["sampling_rate"] = self.sampling_rate
        d["effective_accountant"] = self.effective_accountant
        d["neighboring_relation"] = self.neighboring_relation
        d["sensitivity_in_c"] = self.sensitivity_in_c
        return d


@functools.lru_cache(maxsize=128)
def epsilon(spec: AccountingSpec, rounds: int) -> float:
    """ε at ``spec.delta`` after ``rounds`` rounds, straight from a dp-accounting accountant
    (remembered in this process: the same spec and rounds give the same float)."""
    if rounds <= 0:
        return 0.0
    if spec.mechanism == "none" or spec.no_guarantee:
        return math.inf
    acc = spec.make_accountant()
    acc.compose(spec.run_event(rounds))
    return float(acc.get_epsilon(spec.delta))


class EpsilonCurve:
    """ε after each round, cheaply, and equal to :func:`epsilon`.

    - PLD (Poisson-like events): the one-round privacy loss distribution is built once, from
      the spec's own :meth:`AccountingSpec.round_event`, and each round self-composes it ``t``
      times onto the identity, exactly the calls ``PLDAccountant`` makes for
      ``SelfComposedDpEvent(PoissonSampledDpEvent(q, GaussianDpEvent(z)), t)``: the same float
      as a fresh accountant's (tested bit for bit).
    - RDP: dp-accounting's ``RdpAccountant`` adds ``count × RDP(event)`` at every order, so the
      RDP vector of ``t`` compositions is ``t`` times that of one; it is computed once (the
      costly part: about 0.2 s for sampling without replacement) and each round only converts
      ``t · RDP₁`` to ε with dp-accounting's own ``compute_epsilon``. The result is the same
      floating-point number as a fresh accountant's (tested bit-for-bit); if a future
      dp-accounting drops the attributes this reads, every round falls back to a fresh
      accountant.

    A PLD composition costs 0.05–0.6 s whatever ``t`` is, so :meth:`prefetch` starts the next
    accounted round's in a background thread while the round trains (the way the noise row is
    prefetched): the same computation, so the same float, off the round's critical path.
    """

    def __init__(self, spec: AccountingSpec) -> None:
        self.spec = spec
        self._pld: Any = None
        self._rdp_one: tuple[Any, Any] | None = None  # (orders, RDP of one composition)
        self._cache: dict[int, float] = {}
        #: compositions being computed in the background (:meth:`prefetch`); not state.
        self._pending: dict[int, Future[float]] = {}
        self._lock = threading.Lock()  # one computation at a time (the PLD is built lazily)
        poisson_like = (spec.mechanism == "gaussian" and spec.scheme == "poisson") or spec.amplified
        self._use_pld = poisson_like and spec.effective_accountant == "pld"
        self._use_rdp = spec.effective_accountant == "rdp" and spec.mechanism != "none" and not spec.no_guarantee

    def __call__(self, rounds: int) -> float:
        if rounds <= 0:
            return 0.0
        count = self.spec.compositions(rounds)
        if count not in self._cache:
            ahead = self._pending.pop(count, None)
            self._cache[count] = ahead.result() if ahead is not None else self._compute(count, rounds)
        return self._cache[count]

    def prefetch(self, rounds: int) -> None:
        """Start computing ε after ``rounds`` rounds in a background thread, where it is a PLD
        composition (the costly case; RDP and the one-off events are computed when asked); the
        next call for those rounds waits for it. Asking again, or for a computed ε, is free."""
        if rounds <= 0 or not self._use_pld:
            return
        count = self.spec.compositions(rounds)
        if count not in self._cache and count not in self._pending:
            self._pending[count] = worker("fedsim-epsilon").submit(self._compute, count, rounds)

    def _compute(self, count: int, rounds: int) -> float:
        """ε of ``count`` compositions (``rounds`` rounds), computed now."""
        with self._lock:
            if self._use_pld and self._one_round_pld() is not None:
                identity = pld_lib.identity(value_discretization_interval=PLD_DISCRETIZATION)
                composed = identity.compose(self._pld.self_compose(count))  # as PLDAccountant composes
                return float(composed.get_epsilon_for_delta(self.spec.delta))
            if self._use_rdp and self._rdp_vector() is not None:
                orders, rdp_one = self._rdp_vector()  # type: ignore[misc]
                eps, _ = rdp_lib.compute_epsilon(orders, count * rdp_one, self.spec.delta)
                return float(eps)
            return epsilon(self.spec, rounds)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without the background work and the lock (a copy computes afresh)."""
        state = dict(self.__dict__)
        state["_pending"], state["_lock"] = {}, None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _one_round_pld(self) -> Any:
        """The PLD of one :meth:`AccountingSpec.round_event` (a Poisson-sampled Gaussian: its
        noise multiplier and sampling probability are read from the event, never restated), built
        on first use (about a second) with the arguments ``PLDAccountant`` passes; None where the
        accountant builds none (no sampling, no noise, another event), so that every round asks
        a fresh accountant (:func:`epsilon`)."""
        if self._pld is not None:
            return self._pld
        event = self.spec.round_event()
        if not (
            isinstance(event, dp_event.PoissonSampledDpEvent)
            and isinstance(event.event, dp_event.GaussianDpEvent)
            and event.sampling_probability > 0
            and event.event.noise_multiplier > 0
        ):
            self._use_pld = False
            return None
        relation = self.spec.make_accountant().neighboring_relation
        self._pld = pld_lib.from_gaussian_mechanism(
            standard_deviation=event.event.noise_multiplier,
            value_discretization_interval=PLD_DISCRETIZATION,
            sampling_prob=event.sampling_probability,
            neighboring_relation=relation,
        )
        return self._pld

    def _rdp_vector(self) -> tuple[Any, Any] | None:
        """(orders, RDP of one :meth:`AccountingSpec.round_event`), from a dp-accounting
        ``RdpAccountant`` composed once; None when that accountant does not expose them."""
        if self._rdp_one is None:
            acc = self.spec.make_accountant()
            acc.compose(self.spec.round_event(), 1)
            orders, rdp = getattr(acc, "_orders", None), getattr(acc, "_rdp", None)
            if orders is None or rdp is None:
                self._use_rdp = False
                return None
            self._rdp_one = (orders, rdp.copy())
        return self._rdp_one


def calibrate_noise_multiplier(spec: AccountingSpec, rounds: int, target_epsilon: float) -> float:
    """The smallest ``z`` (to dp-accounting's bisection tolerance) whose ε after
    ``rounds`` rounds is at most ``target_epsilon``; ``spec.noise_multiplier`` is ignored.

    The search's result is remembered across processes (`fedsim.privacy.calibration_memo`); a
    remembered ``z`` is returned only when ε at it, computed afresh, is at most the target."""
    _check_calibratable(spec, target_epsilon)
    key = calibration_memo.memo_key(spec.to_dict(), rounds, target_epsilon)
    z = calibration_memo.recall(key)
    if z is not None and epsilon(replace(spec, noise_multiplier=z), rounds) <= target_epsilon:
        return z
    z = _search_noise_multiplier(spec, rounds, target_epsilon)
    calibration_memo.remember(key, z)
    return z


def _check_calibratable(spec: AccountingSpec, target_epsilon: float) -> None:
    if spec.mechanism == "none":
        raise FedsimError("privacy.target_epsilon needs a DP mechanism, not 'none'")
    if spec.no_guarantee:
        raise FedsimError(
            "this configuration has no finite ε to calibrate for (no guarantee); "
            "set privacy.noise_multiplier instead of privacy.target_epsilon"
        )
    if target_epsilon <= 0:
        raise FedsimError("privacy.target_epsilon must be > 0")


def _search_noise_multiplier(spec: AccountingSpec, rounds: int, target_epsilon: float) -> float:
    """dp-accounting's bracketed search for the smallest ``z`` with ε ≤ ``target_epsilon``."""

    def make_event(z: float) -> dp_event.DpEvent:
        return replace(spec, noise_multiplier=float(z)).run_event(rounds)

    def rdp_accountant() -> dp_accounting.PrivacyAccountant:
        return replace(spec, accountant="rdp").make_accountant()

    # RDP's "order excluded" warnings at extreme z are expected during the search.
    logging.getLogger("absl").setLevel(logging.ERROR)
    try:
        # RDP upper-bounds ε and is cheap at any z: its calibrated z is feasible for
        # PLD too and brackets the search from above without huge PLDs at tiny z.
        z_hi = float(
            dp_accounting.calibrate_dp_mechanism(
                rdp_accountant,
                make_event,
                target_epsilon,
                spec.delta,
                bracket_interval=dp_accounting.LowerEndpointAndGuess(1e-3, 1.0),
                tol=1e-4,
            )
        )
        if spec.effective_accountant == "rdp":
            return z_hi
        z_lo = 0.5 * z_hi
        while epsilon(replace(spec, noise_multiplier=z_lo), rounds) <= target_epsilon:
            z_hi, z_lo = z_lo, 0.5 * z_lo
        z = dp_accounting.calibrate_dp_mechanism(
            spec.make_accountant,
            make_event,
            target_epsilon,
            spec.delta,
            bracket_interval=dp_accounting.ExplicitBracketInterval(z_lo, z_hi),
            tol=1e-4,
        )
    except MemoryError:
        raise FedsimError(
            f"cannot calibrate privacy.noise_multiplier for target ε = {target_epsilon}: the PLD "
            "at the needed tiny z is too large; use privacy.accountant = 'rdp' or a smaller target"
        ) from None
    except (ValueError, RuntimeError) as e:  # dp-accounting's errors when no bracket exists
        raise FedsimError(
            f"cannot calibrate privacy.noise_multiplier for target ε = {target_epsilon} at "
            f"δ = {spec.delta:g} over {rounds} rounds ({e}); raise the target or lower rounds"
        ) from None
    return float(z)
