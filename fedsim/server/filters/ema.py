"""EMA filter and the DiSK server side (the DiSK paper (Zhang et al.), Algorithm 3; docs/algorithms.md §6).

Both run the same server recursion on the noisy mean update::

    g̃_0 = ĝ_0,    g̃_t = (1 − κ)·g̃_{t−1} + κ·ĝ_t    (t ≥ 1)

DiSK additionally defines the client-side two-point evaluation (``two_point``) or its
single-evaluation variant (``lookahead``); :class:`DiskFilter` exposes the constants and
helpers for those.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import Field, model_validator

from fedsim.errors import FedsimError
from fedsim.server.filters.base import Filter, FilterKind, FilterOptions, _check_update, register_filter

if TYPE_CHECKING:
    import torch
else:
    from fedsim._lazy import torch

DEFAULT_KAPPA = 0.7
DEFAULT_GAMMA = 0.5
DISK_MODES = ("two_point", "lookahead", "ema")


def _check_kappa(kappa: float) -> float:
    try:
        k = float(kappa)
    except (TypeError, ValueError) as exc:
        raise FedsimError(f"filter.kappa must be a number in (0, 1], got {kappa!r}") from exc
    if not (math.isfinite(k) and 0.0 < k <= 1.0):
        raise FedsimError(f"filter.kappa = {kappa!r} must lie in (0, 1]; e.g. the default 0.7")
    return k


class EMAFilter(Filter):
    """Exponential moving average ``g̃_t = (1−κ)·g̃_{t−1} + κ·ĝ_t`` with ``g̃_0 = ĝ_0``.

    Parameters
    ----------
    kappa : κ, the weight of the newest update, in ``(0, 1]``; ``κ = 1`` is no filtering.
        Default 0.7.
    """

    name = "ema"

    def __init__(self, kappa: float = DEFAULT_KAPPA) -> None:
        super().__init__()
        self.kappa = _check_kappa(kappa)
        self._state: torch.Tensor | None = None

    def step(self, update: torch.Tensor) -> torch.Tensor:
        """Filter one round (see :meth:`Filter.step`)."""
        _check_update(update)
        x = update.detach()
        if self._state is None:
            out = x.clone()
        else:
            prev = self._state.to(device=x.device, dtype=x.dtype)
            out = prev * (1.0 - self.kappa)
            out.add_(x, alpha=self.kappa)
        self._state = out.clone()
        self.t += 1
        return out

    def impulse_response(self, n: int) -> np.ndarray:
        """``H[t, 0] = (1−κ)^t`` and ``H[t, s] = κ(1−κ)^{t−s}`` for ``1 ≤ s ≤ t``
        (see :meth:`Filter.impulse_response`)."""
        n = int(n)
        if n < 0:
            raise FedsimError(f"impulse_response needs n >= 0, got {n}")
        idx = np.arange(n)
        lag = idx[:, None] - idx[None, :]
        decay = (1.0 - self.kappa) ** np.clip(lag, 0, None)
        h = np.where(lag >= 0, self.kappa * decay, 0.0)
        if n:
            h[:, 0] = decay[:, 0]
        return h

    def _settings(self) -> dict[str, Any]:
        return {"kappa": self.kappa}

    def state_dict(self) -> dict[str, Any]:
        """See :meth:`Filter.state_dict`: κ, the round and ``g̃_{t−1}``."""
        return {
            "name": self.name,
            **self._settings(),
            "t": self.t,
            "g_tilde": None if self._state is None else self._state.clone(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """See :meth:`Filter.load_state_dict`; the settings must match this filter's."""
        self._check_state(state, self._settings())
        self.t = int(state["t"])
        g = state["g_tilde"]
        self._state = None if g is None else g.clone()


#: The largest mixing weight ``|a| = (1−κ)/(κ|γ|)`` DiSK accepts: a larger one would multiply the
#: difference of a user's two local updates by more than this before the clip.
MAX_MIX = 100.0


def gamma_problem(gamma: float, kappa: float) -> str | None:
    """Why DiSK's ``γ`` cannot be used with ``κ`` (None when it can): γ = 0 has no mixing weight
    ``a = (1−κ)/(κγ)``, and ``|a|`` may not exceed :data:`MAX_MIX`."""
    if kappa >= 1.0 and gamma != 0.0:
        return None
    bound = (1.0 - kappa) / (MAX_MIX * kappa)
    if gamma == 0.0 or abs(gamma) < bound:
        return (
            f"filter.gamma = {gamma:g} makes DiSK's mixing weight a = (1−κ)/(κγ) "
            f"{'undefined' if gamma == 0.0 else f'= {(1.0 - kappa) / (kappa * gamma):.4g}'}; |γ| must be at least "
            f"(1−κ)/({MAX_MIX:g}·κ) = {bound:.4g} (negative γ, e.g. −1, is the STORM-like correction)"
        )
    return None


class DiskFilter(EMAFilter):
    """DiSK server side: the EMA recursion plus the constants of the client evaluations.

    Parameters
    ----------
    mode : ``two_point`` (faithful: clients evaluate at ``x_t`` and ``x_t + γ·d_{t−1}`` and
        send ``clip(a·Δ' + (1−a)·Δ)``), ``lookahead`` (single evaluation at
        ``y_t = x_t + γ·d_{t−1}``, ``a = 1``) or ``ema`` (server EMA only). Default
        ``two_point``. The server side (this filter's ``step``) is the same EMA in every mode.
    kappa : κ in ``(0, 1]``. Default 0.7.
    gamma : γ ≠ 0, the look-ahead step. Default 0.5. Negative γ is the paper's STORM-like
        correction (its Corollary 1 uses γ = −1): ``a`` is then negative and the mix extrapolates,
        still clipped once, so the sensitivity stays ``c``. ``|a|`` may not exceed
        :data:`MAX_MIX` (``|γ| ≥ (1−κ)/(MAX_MIX·κ)``). In ``lookahead`` mode γ is always
        derived as ``(1−κ)/κ`` (that is what makes ``a = 1``) and the given value is
        **overridden** (the config always passes its default 0.5); the value actually used is
        :attr:`gamma`, and the one given is kept in :attr:`gamma_given`.

    Attributes
    ----------
    a : the mixing weight: ``(1−κ)/(κγ)`` for ``two_point`` and ``ema``, 1 for ``lookahead``.

    Notes
    -----
    The noise σ is the same as the unfiltered run: it is **not** rescaled by ``√(a² + (1−a)²)``.
    """

    name = "disk"

    def __init__(
        self, mode: str = "two_point", kappa: float = DEFAULT_KAPPA, gamma: float | None = DEFAULT_GAMMA
    ) -> None:
        super().__init__(kappa)
        if mode not in DISK_MODES:
            raise FedsimError(f"filter.mode = {mode!r} is unknown; use one of {', '.join(DISK_MODES)}")
        self.mode = mode
        if gamma is None:
            gamma = DEFAULT_GAMMA
        try:
            g = float(gamma)
        except (TypeError, ValueError) as exc:
            raise FedsimError(f"filter.gamma must be a number, got {gamma!r}") from exc
        problem = gamma_problem(g, self.kappa) if mode != "lookahead" else None
        if problem is not None or not math.isfinite(g):
            raise FedsimError(problem or f"filter.gamma = {gamma!r} must be a finite number; e.g. the default 0.5")
        self.gamma_given = g
        if mode == "lookahead":
            self.gamma = (1.0 - self.kappa) / self.kappa
            self.a = 1.0
        else:
            self.gamma = g
            self.a = (1.0 - self.kappa) / (self.kappa * g)

    def lookahead_point(self, x_t: torch.Tensor, d_prev: torch.Tensor | None) -> torch.Tensor:
        """The second evaluation point ``x_t + γ·d_{t−1}``.

        Parameters
        ----------
        x_t : the current flat model ``x_t``.
        d_prev : the previous server step ``d_{t−1} = x_t − x_{t−1}``; None (default at
            ``t = 0``) means ``d_{−1} = 0``.

        Returns
        -------
        torch.Tensor
            A new tensor (``x_t``'s dtype and device); inputs are not modified.
        """
        _check_update(x_t)
        y = x_t.detach().clone()
        if d_prev is not None:
            y.add_(d_prev.to(device=y.device, dtype=y.dtype), alpha=self.gamma)
        return y

    def mix(self, delta_x: torch.Tensor, delta_y: torch.Tensor) -> torch.Tensor:
        """Mix a client's two local updates **before** clipping: ``a·Δ' + (1−a)·Δ``.

        Parameters
        ----------
        delta_x : ``Δ``, the local update computed at ``x_t``.
        delta_y : ``Δ'``, the local update computed at ``x_t + γ·d_{t−1}`` (same data,
            order and seed).

        Returns
        -------
        torch.Tensor
            ``a·delta_y + (1−a)·delta_x``, a new tensor with ``delta_x``'s dtype and device.
        """
        _check_update(delta_x)
        _check_update(delta_y)
        if delta_x.shape != delta_y.shape:
            raise FedsimError(
                f"DiSK mix needs two updates of the same shape, got {tuple(delta_x.shape)} and "
                f"{tuple(delta_y.shape)}; compute both local updates on the same model"
            )
        out = delta_x.detach() * (1.0 - self.a)
        out.add_(delta_y.detach().to(device=out.device, dtype=out.dtype), alpha=self.a)
        return out

    def _settings(self) -> dict[str, Any]:
        return {"mode": self.mode, "kappa": self.kappa, "gamma": self.gamma}


class EMAOptions(FilterOptions):
    """``filter.name = "ema"``.

    Parameters
    ----------
    kappa : κ, the weight of the newest update, in ``(0, 1]``. Default 0.7.
    """

    name: Literal["ema"] = "ema"
    kappa: float = Field(default=DEFAULT_KAPPA, gt=0, le=1)


class DiskOptions(FilterOptions):
    """``filter.name = "disk"`` (DiSK; docs/algorithms.md §6).

    Parameters
    ----------
    mode : ``two_point`` (default; faithful: each client trains twice, at ``x_t`` and at
        ``x_t + γ·d_{t−1}``, and mixes before clipping: 2× client compute, the previous server step
        on the downlink), ``lookahead`` (one evaluation at ``x_t + γ·d_{t−1}`` with
        ``γ = (1−κ)/κ``) or ``ema`` (server-side EMA only).
    kappa : κ. Default 0.7.
    gamma : γ (``two_point``), non-zero: negative is the STORM-like correction of the paper's
        Corollary 1 (``γ = −1``), with ``|a| = (1−κ)/(κ|γ|) ≤ 100``. Default 0.5; ``lookahead``
        derives ``γ = (1−κ)/κ`` and refuses another value.
    """

    name: Literal["disk"] = "disk"
    mode: Literal["two_point", "lookahead", "ema"] = "two_point"
    kappa: float = Field(default=DEFAULT_KAPPA, gt=0, le=1)
    gamma: float | None = Field(default=None, ge=-100, le=100)

    @model_validator(mode="after")
    def _lookahead_gamma(self) -> DiskOptions:
        if self.mode != "lookahead" and self.gamma is not None:
            problem = gamma_problem(self.gamma, self.kappa)
            if problem is not None:
                raise ValueError(problem)
        if self.mode == "lookahead" and self.gamma is not None:
            want = (1.0 - self.kappa) / self.kappa
            if abs(self.gamma - want) > 1e-9 * max(1.0, want):
                raise ValueError(
                    f"filter.mode = 'lookahead' uses γ = (1−κ)/κ = {want:.6g} (that makes a = 1); "
                    f"remove filter.gamma or use filter.mode = 'two_point'"
                )
        return self


register_filter(
    FilterKind(
        "ema", EMAOptions, lambda o: EMAFilter(o.kappa), "exponential moving average `g̃_t = (1−κ)g̃_{t−1} + κĝ_t`"
    )
)
register_filter(
    FilterKind(
        "disk",
        DiskOptions,
        lambda o: DiskFilter(o.mode, o.kappa, o.gamma),
        "DiSK: the EMA with clients' two-point (or look-ahead) evaluation",
    )
)
