"""DOPPLER: a low-pass IIR filter of the noisy updates (the DOPPLER paper (Zhang et al.), Algorithm 2;
docs/algorithms.md §6).

Per coordinate, with all histories starting at zero::

    m_t     = −Σ_{τ=1..n_a} a_τ m_{t−τ} + Σ_{τ=0..n_b} b_τ ĝ_{t−τ}
    c_{a,t} = −Σ_{τ=1..n_a} a_τ c_{a,t−τ} + Σ_{τ=0..min(t,n_b)} b_τ
    m̂_t    = m_t / c_{a,t}

i.e. ``scipy.signal.lfilter(b, [1, *a])`` divided by its own step response, so a constant
input passes unchanged from ``t = 0``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from fedsim.errors import FedsimError
from fedsim.server.filters.base import Filter, FilterKind, FilterOptions, _check_update, register_filter

if TYPE_CHECKING:
    import torch
else:
    from fedsim._lazy import torch

#: Presets of docs/algorithms.md §6 (paper Tables 2 and 4): name -> (b, a), ``a`` without the leading 1.
PRESETS: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "momentum": ((0.1,), (-0.9,)),
    "first_order_v1": ((1 / 11, 1 / 11), (-9 / 11,)),
    "first_order_v2": ((3 / 11, -1 / 11), (-9 / 11,)),
    "second_order": ((1 / 58, 2 / 58, 1 / 58), (-92 / 58, 38 / 58)),
    "f1": ((0.075, 0.025), (-0.9,)),
    "f2": ((0.025, 0.075), (-0.9,)),
    "f3": ((0.1, 0.1), (-0.8,)),
    "f4": ((0.2, 0.2), (-0.6,)),
    "f5": ((0.025, 0.05, 0.025), (-0.9,)),
    "f6": ((0.025, 0.025), (-1.8, 0.85)),
}

DEFAULT_PRESET = "first_order_v1"

#: Relative tolerance of the unit-DC-gain check.
DC_RTOL = 1e-9

#: Rounds of the step response checked at construction for a zero normaliser.
_STEP_CHECK = 4096


def _as_coeffs(values: Sequence[float] | np.ndarray, key: str) -> tuple[float, ...]:
    try:
        arr = np.asarray(values, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError) as exc:
        raise FedsimError(f"{key} must be a list of numbers, got {values!r}") from exc
    if not np.all(np.isfinite(arr)):
        raise FedsimError(f"{key} must hold finite numbers, got {values!r}")
    return tuple(float(v) for v in arr)


def validate_coefficients(b: Sequence[float], a: Sequence[float]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Check a DOPPLER filter ``(b, a)`` and return it as float tuples.

    Parameters
    ----------
    b : numerator ``[b_0, …, b_{n_b}]``; non-empty, ``b_0 ≠ 0``.
    a : denominator WITHOUT the leading 1, ``[a_1, …, a_{n_a}]`` (may be empty: FIR).

    Returns
    -------
    tuple
        ``(b, a)`` as tuples of floats.

    Raises
    ------
    FedsimError
        If the filter is unstable (a root of ``z^{n_a} + a_1 z^{n_a−1} + … + a_{n_a}`` has
        ``|z| ≥ 1``), its DC gain ``Σb / (1 + Σa)`` is not 1 (relative 1e-9), ``b_0 = 0``,
        or its step response (the normaliser ``c_{a,t}``) vanishes.
    """
    bt = _as_coeffs(b, "filter.b")
    at = _as_coeffs(a, "filter.a")
    if not bt:
        raise FedsimError("filter.b must not be empty; give at least b_0 (or pick a filter.preset)")
    if bt[0] == 0.0:
        raise FedsimError(
            "filter.b[0] must be non-zero: the step-response normaliser c_{a,0} = b_0 would be 0 "
            "(drop leading zeros from filter.b)"
        )
    if at:
        roots = np.roots(np.array((1.0, *at)))
        rmax = float(np.max(np.abs(roots))) if roots.size else 0.0
        if not rmax < 1.0:
            raise FedsimError(
                f"filter.a = {list(at)} gives an unstable filter: a root of z^n_a + a_1 z^(n_a-1) + … + a_n_a "
                f"has |z| = {rmax:.6g} >= 1; change filter.a (every pole must lie inside the unit circle) "
                "or use a filter.preset"
            )
    den = 1.0 + sum(at)
    num = sum(bt)
    if den == 0.0 or not math.isclose(num / den, 1.0, rel_tol=DC_RTOL, abs_tol=0.0):
        gain = float("inf") if den == 0.0 else num / den
        raise FedsimError(
            f"filter.b = {list(bt)}, filter.a = {list(at)} have DC gain sum(b)/(1+sum(a)) = {gain:.12g}, "
            "not 1; rescale filter.b so that sum(b) = 1 + sum(a) (or use a filter.preset)"
        )
    from scipy.signal import lfilter  # imported when used: scipy.signal costs every command ~0.5 s to import

    step = lfilter(np.array(bt), np.array((1.0, *at)), np.ones(_STEP_CHECK))
    if np.min(np.abs(step)) < 1e-12:
        raise FedsimError(
            f"filter.b = {list(bt)}, filter.a = {list(at)}: the step response c_(a,t) reaches 0, "
            "so the DOPPLER normalisation is undefined; change filter.b/filter.a"
        )
    return bt, at


class DopplerFilter(Filter):
    """DOPPLER low-pass filter with step-response normalisation.

    Parameters
    ----------
    preset : one of :data:`PRESETS` (``momentum``, ``first_order_v1``, ``first_order_v2``,
        ``second_order``, ``f1``..``f6``). Default ``first_order_v1``. Ignored when ``b`` is given.
    b : custom numerator ``[b_0, …, b_{n_b}]``. Default None (use ``preset``).
    a : custom denominator without the leading 1, ``[a_1, …, a_{n_a}]``. Default None, which
        with ``b`` given means an FIR filter (``a = []``). Must not be given without ``b``.

    Notes
    -----
    Only ``n_b`` past inputs and ``n_a`` past (unnormalised) outputs are kept, plus the
    ``n_a`` past scalars of ``c_{a,t}``. The arithmetic runs in the update's dtype on its device.
    """

    name = "doppler"

    def __init__(
        self, preset: str | None = DEFAULT_PRESET, b: Sequence[float] | None = None, a: Sequence[float] | None = None
    ) -> None:
        super().__init__()
        if b is None:
            if a is not None:
                raise FedsimError("filter.a was given without filter.b; give both (or neither and a filter.preset)")
            preset = DEFAULT_PRESET if preset is None else preset
            if preset not in PRESETS:
                raise FedsimError(
                    f"filter.preset = {preset!r} is unknown; use one of {', '.join(PRESETS)} "
                    "or give filter.b and filter.a"
                )
            b, a = PRESETS[preset]
            self.preset: str | None = preset
        else:
            self.preset = None
        self.b, self.a = validate_coefficients(b, () if a is None else a)
        self._x_hist: deque[torch.Tensor] = deque(maxlen=max(len(self.b) - 1, 0) or None)
        self._m_hist: deque[torch.Tensor] = deque(maxlen=len(self.a) or None)
        self._c_hist: deque[float] = deque(maxlen=len(self.a) or None)

    @property
    def n_b(self) -> int:
        """Order of the numerator (``len(b) − 1``)."""
        return len(self.b) - 1

    @property
    def n_a(self) -> int:
        """Order of the denominator (``len(a)``)."""
        return len(self.a)

    def _normaliser(self) -> float:
        """``c_{a,t}`` for the current round from the stored ``c`` history."""
        t = self.t
        c = sum(self.b[: min(t, self.n_b) + 1])
        for tau, a_tau in enumerate(self.a, start=1):
            if tau <= len(self._c_hist):
                c -= a_tau * self._c_hist[-tau]
        return c

    def step(self, update: torch.Tensor) -> torch.Tensor:
        """Filter one round (see :meth:`Filter.step`): returns ``m̂_t = m_t / c_{a,t}``."""
        _check_update(update)
        x = update.detach()
        m = x * self.b[0]
        for tau in range(1, self.n_b + 1):
            if tau <= len(self._x_hist):
                m.add_(self._x_hist[-tau].to(device=x.device, dtype=x.dtype), alpha=self.b[tau])
        for tau, a_tau in enumerate(self.a, start=1):
            if tau <= len(self._m_hist):
                m.add_(self._m_hist[-tau].to(device=x.device, dtype=x.dtype), alpha=-a_tau)
        c = self._normaliser()
        if abs(c) < 1e-12:
            raise FedsimError(
                f"filter.b/filter.a: the DOPPLER normaliser c_(a,{self.t}) = {c:.3g} is ~0; change the filter"
            )
        if self.n_b:
            self._x_hist.append(x.clone())
        if self.n_a:
            self._m_hist.append(m.clone())
            self._c_hist.append(c)
        self.t += 1
        return m / c

    def impulse_response(self, n: int) -> np.ndarray:
        """``H[t, s] = k_{t−s} / c_{a,t}`` with ``k`` the IIR impulse response and ``c_{a,t}``
        the step response (see :meth:`Filter.impulse_response`)."""
        n = int(n)
        if n < 0:
            raise FedsimError(f"impulse_response needs n >= 0, got {n}")
        from scipy.signal import lfilter

        den = np.array((1.0, *self.a))
        num = np.array(self.b)
        k = lfilter(num, den, np.eye(1, n, 0).ravel()) if n else np.zeros(0)
        c = lfilter(num, den, np.ones(n))
        idx = np.arange(n)
        lag = idx[:, None] - idx[None, :]
        h = np.where(lag >= 0, k[np.clip(lag, 0, None)], 0.0)
        return h / c[:, None]

    def state_dict(self) -> dict[str, Any]:
        """See :meth:`Filter.state_dict`: coefficients, round and the three histories."""
        return {
            "name": self.name,
            "b": list(self.b),
            "a": list(self.a),
            "t": self.t,
            "x_hist": [x.clone() for x in self._x_hist],
            "m_hist": [m.clone() for m in self._m_hist],
            "c_hist": list(self._c_hist),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """See :meth:`Filter.load_state_dict`; the coefficients must match this filter's."""
        self._check_state(state, {"b": list(self.b), "a": list(self.a)})
        self.t = int(state["t"])
        self._x_hist.clear()
        self._x_hist.extend(x.clone() for x in state["x_hist"])
        self._m_hist.clear()
        self._m_hist.extend(m.clone() for m in state["m_hist"])
        self._c_hist.clear()
        self._c_hist.extend(float(c) for c in state["c_hist"])


class DopplerOptions(FilterOptions):
    """``filter.name = "doppler"``.

    Parameters
    ----------
    preset : DOPPLER preset (``first_order_v1`` default; ``momentum``, ``first_order_v2``,
        ``second_order``, ``f1``..``f6``); ignored when ``b`` and ``a`` are given.
    b, a : a custom DOPPLER IIR filter (``a`` without the leading 1): unit DC gain, stable.
    """

    name: Literal["doppler"] = "doppler"
    preset: str = DEFAULT_PRESET
    b: list[float] | None = None
    a: list[float] | None = None


register_filter(
    FilterKind(
        "doppler",
        DopplerOptions,
        lambda o: DopplerFilter(preset=o.preset, b=o.b, a=o.a),
        "DOPPLER: a low-pass IIR filter of the noisy updates (presets or custom b, a)",
    )
)
