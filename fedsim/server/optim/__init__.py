"""Server optimizers on flat tensors (Reddi et al. 2021, "Adaptive federated optimization").

Every optimizer takes the pseudo-gradient ``g = −ĝ_t`` (ĝ_t: the noisy, filtered
mean model delta) and updates the flat parameters in place:

- ``sgd``:      ``x ← x − η g``   (FedAvg when η = 1)
- ``momentum``: ``m ← β m + g``; ``x ← x − η m``   (FedAvgM)
- ``adam``:     ``m ← β1 m + (1−β1) g``; ``v ← β2 v + (1−β2) g²``;
  with bias correction ``m̂ = m/(1−β1^{t+1})``, ``v̂ = v/(1−β2^{t+1})`` (else m̂ = m, v̂ = v);
  ``x ← x − η m̂ / (√v̂ + τ)``   (FedAdam; τ = ``eps``)
- ``yogi``:     as ``adam`` but ``v ← v − (1−β2) g² sign(v − g²)``, ``v_{−1} = τ²``   (FedYogi)
- ``adambc``:   DP-AdamBC (docs/algorithms.md §7): ``φ_t = β2 φ_{t−1} + (1−β2) Φ_t``;
  ``v̂ = max((v_t − φ_t)/(1−β2^{t+1}), γ′_t)``; ``x ← x − η m̂ / √v̂`` (no additive ε)
- ``lp_adam``:  DOPPLER's LP-Adam (paper 001, App. C.2, Alg. 3): ``m̂`` is the filter's output
  ``g`` itself (no β1 EMA); ``v ← β2 v + (1−β2) r²`` from the UNFILTERED pseudo-gradient
  ``r = −ĝ_t`` (before the filter); ``x ← x − η g / max(√(v/(1−β2^{t+1})), ε)``
- ``lp_adambc``: LP-Adam with DP-AdamBC's correction: ``φ_t`` from ``Φ_t`` of the unfiltered
  noise; ``v̂ = max((v_t − φ_t)/(1−β2^{t+1}), γ′_t)``; ``x ← x − η g / √v̂``

The LP variants read both vectors: :meth:`ServerOptimizer.step` takes the unfiltered
pseudo-gradient as ``raw`` (:class:`fedsim.server.step.DPServer` passes it to optimizers with
``uses_raw``; every other optimizer ignores it).

All are post-processing of the DP release: they never change ε.
"""

from __future__ import annotations

import math
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from fedsim.errors import FedsimError
from fedsim.registry import ChoiceOptions, Registry, validate_options

if TYPE_CHECKING:
    import torch
else:
    from fedsim._lazy import torch


class ServerOptimizer(ABC):
    """Base class. ``step(x, g)`` updates ``x`` in place; ``t`` counts steps taken.

    ``uses_raw``: whether the optimizer also reads the unfiltered pseudo-gradient ``raw`` (the
    DOPPLER LP variants); the server computes and passes it only to those."""

    name = "base"
    uses_raw = False

    def __init__(self, lr: float) -> None:
        if lr <= 0:
            raise FedsimError(f"server.lr must be > 0 (got {lr})")
        self.lr = float(lr)
        self.t = 0

    def step(self, params: torch.Tensor, grad: torch.Tensor, raw: torch.Tensor | None = None) -> None:
        """Update ``params`` in place from the pseudo-gradient ``grad`` (``−ĝ_t`` after any filter).

        ``raw`` is ``−ĝ_t`` before the filter; only optimizers with ``uses_raw`` read it (for
        them None means "no filter": ``raw`` is ``grad``). Neither tensor is modified."""
        if self.uses_raw:
            self._step_raw(params, grad, grad if raw is None else raw)
        else:
            self._step(params, grad)
        self.t += 1

    def _step_raw(self, params: torch.Tensor, grad: torch.Tensor, raw: torch.Tensor) -> None:
        """Update ``params`` from ``grad`` and the unfiltered ``raw`` (optimizers with ``uses_raw``)."""
        raise NotImplementedError(f"{self.name} does not read the unfiltered pseudo-gradient")

    @abstractmethod
    def _step(self, params: torch.Tensor, grad: torch.Tensor) -> None:
        """Update ``params`` in place from the pseudo-gradient ``grad``."""

    def _tensors(self) -> dict[str, torch.Tensor | None]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "t": self.t,
            **{k: (None if v is None else v.clone()) for k, v in self._tensors().items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("name") != self.name:
            raise FedsimError(f"checkpoint optimizer is {state.get('name')!r}, this run uses {self.name!r}")
        self.t = int(state["t"])
        for k in self._tensors():
            v = state.get(k)
            setattr(self, k, None if v is None else v.clone())


class SGD(ServerOptimizer):
    name = "sgd"

    def _step(self, params: torch.Tensor, grad: torch.Tensor) -> None:
        params.add_(grad, alpha=-self.lr)


class Momentum(ServerOptimizer):
    name = "momentum"

    def __init__(self, lr: float, momentum: float = 0.9) -> None:
        super().__init__(lr)
        self.beta = float(momentum)
        self.m: torch.Tensor | None = None

    def _tensors(self) -> dict[str, torch.Tensor | None]:
        return {"m": self.m}

    def _step(self, params: torch.Tensor, grad: torch.Tensor) -> None:
        if self.m is None:
            self.m = torch.zeros_like(params)
        self.m.mul_(self.beta).add_(grad)
        params.add_(self.m, alpha=-self.lr)


class Adam(ServerOptimizer):
    name = "adam"

    def __init__(
        self, lr: float, beta1: float = 0.9, beta2: float = 0.99, eps: float = 1e-3, bias_correction: bool = True
    ) -> None:
        super().__init__(lr)
        self.beta1, self.beta2, self.eps = float(beta1), float(beta2), float(eps)
        self.bias_correction = bool(bias_correction)
        self.m: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def _tensors(self) -> dict[str, torch.Tensor | None]:
        return {"m": self.m, "v": self.v}

    def _step(self, params: torch.Tensor, grad: torch.Tensor) -> None:
        if self.m is None or self.v is None:
            self.m = torch.zeros_like(params)
            self.v = torch.zeros_like(params)
        self.m.mul_(self.beta1).add_(grad, alpha=1 - self.beta1)
        self.v.mul_(self.beta2).addcmul_(grad, grad, value=1 - self.beta2)
        m_hat, v_hat = self.m, self.v
        if self.bias_correction:
            k = self.t + 1
            m_hat = self.m / (1 - self.beta1**k)
            v_hat = self.v / (1 - self.beta2**k)
        params.addcdiv_(m_hat, v_hat.sqrt().add_(self.eps), value=-self.lr)


class Yogi(ServerOptimizer):
    """FedYogi (Reddi et al. 2021, "Adaptive federated optimization", Algorithm 2).

    ``m ← β1 m + (1−β1) g``; ``v ← v − (1−β2) g² sign(v − g²)``;
    ``x ← x − η m̂ / (√v̂ + τ)`` with, under ``bias_correction``,
    ``m̂ = m/(1−β1^{t+1})`` and ``v̂ = v/(1−β2^{t+1})`` (else ``m̂ = m``, ``v̂ = v``).

    Parameters
    ----------
    lr : float
        Server learning rate η (> 0).
    beta1, beta2 : float
        Moment decay rates, in ``[0, 1)``.
    eps : float
        The adaptivity constant τ (> 0), added to ``√v̂``.
    bias_correction : bool
        Divide the moments by ``1−β^{t+1}`` as Adam does (default on, matching ``Adam``).
    v0 : float or None
        Initial value of every coordinate of ``v`` (``v_{−1}``). The paper requires
        ``v_{−1} ≥ τ²``; the default ``None`` uses exactly ``τ²``. ``m_{−1} = 0``.

    Notes
    -----
    ``sign(0) = 0`` (torch semantics): a coordinate with ``v = g²`` keeps ``v``. With
    bias correction on, the ``τ²`` start is divided by ``1−β2^{t+1}`` too, which only
    matters while ``v`` is of order ``τ²``.
    """

    name = "yogi"

    def __init__(
        self,
        lr: float,
        beta1: float = 0.9,
        beta2: float = 0.99,
        eps: float = 1e-3,
        bias_correction: bool = True,
        v0: float | None = None,
    ) -> None:
        super().__init__(lr)
        _check_betas(beta1, beta2)
        if not eps > 0:
            raise FedsimError(f"server.eps (Yogi's τ) must be > 0 (got {eps})")
        self.beta1, self.beta2, self.eps = float(beta1), float(beta2), float(eps)
        self.bias_correction = bool(bias_correction)
        self.v0 = self.eps**2 if v0 is None else float(v0)
        if not (math.isfinite(self.v0) and self.v0 >= 0):
            raise FedsimError(f"Yogi's v0 must be finite and >= 0 (got {v0})")
        self.m: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def _tensors(self) -> dict[str, torch.Tensor | None]:
        return {"m": self.m, "v": self.v}

    def _step(self, params: torch.Tensor, grad: torch.Tensor) -> None:
        if self.m is None or self.v is None:
            self.m = torch.zeros_like(params)
            self.v = torch.full_like(params, self.v0)
        g2 = grad * grad
        self.m.mul_(self.beta1).add_(grad, alpha=1 - self.beta1)
        self.v.sub_(g2 * torch.sign(self.v - g2), alpha=1 - self.beta2)
        m_hat, v_hat = self.m, self.v
        if self.bias_correction:
            k = self.t + 1
            m_hat = self.m / (1 - self.beta1**k)
            v_hat = self.v / (1 - self.beta2**k)
        params.addcdiv_(m_hat, v_hat.sqrt().add_(self.eps), value=-self.lr)


#: ``γ′`` used when ``Φ_t = 0`` (no DP noise at that step), so that ``√v̂ > 0`` always.
GAMMA_FLOOR_MIN = 1e-30


class AdamBC(ServerOptimizer):
    """DP-AdamBC (the DP-AdamBC paper (Tang et al.), Algorithm 1; docs/algorithms.md §7).

    With ``Φ_t = noise_variance(t)`` (``t`` = 0-based step index)::

        m_t = β1 m + (1−β1) g
        v_t = β2 v + (1−β2) g²
        φ_t = β2 φ_{t−1} + (1−β2) Φ_t            (φ_{−1} = 0)
        γ′_t = max(gamma_frac · Φ_t, 1e-30)
        v̂  = max((v_t − φ_t)/(1−β2^{t+1}), γ′_t)
        x ← x − η · (m_t/(1−β1^{t+1})) / √v̂      (no additive ε)

    ``φ_t/(1−β2^{t+1})`` is exactly the expected DP-noise contribution to the
    bias-corrected ``v_t``, also when ``Φ_t`` varies over time (MF noise, filters).

    Parameters
    ----------
    lr : float
        Server learning rate η (> 0).
    noise_variance : Callable[[int], float]
        ``t ↦ Φ_t``, the exact per-coordinate variance of the DP noise inside the
        pseudo-gradient given to step ``t`` (after any filter). Must return a finite
        value ``>= 0``; it comes from the noise mechanism, never a user constant.
    beta1, beta2 : float
        Moment decay rates, in ``[0, 1)``.
    gamma_frac : float
        The floor ``γ′_t`` as a fraction of ``Φ_t`` (> 0, default 0.01). When
        ``Φ_t = 0`` the floor is ``1e-30`` instead (then ``v̂`` is the plain Adam
        estimate, floored away from zero). ``gamma_frac >= 1`` means ``γ′ ≥ Φ``: the floor
        then dominates ``v̂`` and AdamBC becomes momentum SGD with step ``η/√γ′``; this
        warns (``UserWarning``, once, at construction).
    bias_correct : bool
        True (default): DP-AdamBC as above. False: the uncorrected DP-Adam baseline,
        ``v̂ = max(v_t/(1−β2^{t+1}), γ′_t)`` — the same code path without subtracting
        ``φ_t`` (still floored by ``γ′_t`` so it never divides by zero; ``φ`` is still
        tracked). Used for comparisons: when ``Φ`` dominates the signal, this variant is
        momentum SGD with step ≈ ``η/√Φ``.

    Notes
    -----
    ``phi`` (``φ_t``, a 0-d float64 tensor) is part of the state dict with ``m`` and ``v``.
    """

    name = "adambc"

    def __init__(
        self,
        lr: float,
        noise_variance: Callable[[int], float],
        beta1: float = 0.9,
        beta2: float = 0.99,
        gamma_frac: float = 0.01,
        bias_correct: bool = True,
    ) -> None:
        super().__init__(lr)
        _check_betas(beta1, beta2)
        if noise_variance is None or not callable(noise_variance):
            raise FedsimError(
                "adambc needs the noise mechanism's per-coordinate variance Φ_t as a "
                "callable noise_variance(t) -> float"
            )
        gamma_frac = float(gamma_frac)
        if not (math.isfinite(gamma_frac) and gamma_frac > 0):
            raise FedsimError(f"server.gamma_frac must be finite and > 0 (got {gamma_frac})")
        if gamma_frac >= 1:
            warnings.warn(
                f"server.gamma_frac = {gamma_frac} >= 1 makes AdamBC's floor γ′ ≥ Φ: v̂ is "
                "then (almost) always γ′ and AdamBC silently becomes momentum SGD; "
                "use gamma_frac < 1 (default 0.01)",
                UserWarning,
                stacklevel=2,
            )
        self.noise_variance = noise_variance
        self.beta1, self.beta2 = float(beta1), float(beta2)
        self.gamma_frac = gamma_frac
        self.bias_correct = bool(bias_correct)
        self.m: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.phi: torch.Tensor = torch.zeros((), dtype=torch.float64)

    def _tensors(self) -> dict[str, torch.Tensor | None]:
        return {"m": self.m, "v": self.v, "phi": self.phi}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if self.phi is None:
            self.phi = torch.zeros((), dtype=torch.float64)

    def noise_var(self, t: int) -> float:
        """``Φ_t`` from the callable, checked to be finite and ``>= 0``."""
        phi_t = float(self.noise_variance(t))
        if not (math.isfinite(phi_t) and phi_t >= 0):
            raise FedsimError(f"adambc: noise variance Φ_{t} = {phi_t} must be finite and >= 0")
        return phi_t

    def gamma(self, phi_t: float) -> float:
        """The floor ``γ′_t = max(gamma_frac · Φ_t, 1e-30)``."""
        return max(self.gamma_frac * phi_t, GAMMA_FLOOR_MIN)

    def v_hat(self, t: int | None = None) -> torch.Tensor:
        """The floored second-moment estimate ``v̂`` used by the most recent step
        (``t`` = its 0-based index, default ``self.t − 1``)."""
        if self.v is None:
            raise FedsimError("adambc: no step taken yet, v̂ is undefined")
        t = self.t - 1 if t is None else t
        bias = 1 - self.beta2 ** (t + 1)
        num = self.v - float(self.phi) if self.bias_correct else self.v
        return (num / bias).clamp_(min=self.gamma(self.noise_var(t)))

    def _step(self, params: torch.Tensor, grad: torch.Tensor) -> None:
        if self.m is None or self.v is None:
            self.m = torch.zeros_like(params)
            self.v = torch.zeros_like(params)
        t = self.t
        phi_t = self.noise_var(t)
        self.m.mul_(self.beta1).add_(grad, alpha=1 - self.beta1)
        self.v.mul_(self.beta2).addcmul_(grad, grad, value=1 - self.beta2)
        self.phi = self.phi * self.beta2 + (1 - self.beta2) * phi_t
        v_hat = self.v_hat(t)
        m_hat = self.m / (1 - self.beta1 ** (t + 1))
        params.addcdiv_(m_hat, v_hat.sqrt_(), value=-self.lr)


class LPAdam(ServerOptimizer):
    """DOPPLER's LP-Adam (the DOPPLER paper, App. C.2, Algorithm 3; docs/algorithms.md §7).

    The low-pass filter before the optimizer *is* the first moment; the second moment comes
    from the unfiltered noisy pseudo-gradient ``r_t = −ĝ_t``::

        m̂_t = g_t                                  (the filter's normalised output; no β1 EMA)
        v_t  = β2 v_{t−1} + (1−β2) r_t²             (v_{−1} = 0)
        v̂_t = v_t / (1−β2^{t+1})
        x   ← x − η · m̂_t / max(√v̂_t, ε)

    Without a filter ``g_t = r_t`` and this is Adam with ``β1 = 0`` and ``ε`` as a floor of
    ``√v̂`` (the paper's "SGD" row of its filter table, ``b = 1``).

    Parameters
    ----------
    lr : float
        Server learning rate η (> 0).
    beta2 : float
        Second-moment decay, in ``[0, 1)``.
    eps : float
        Floor of ``√v̂`` (> 0): the paper's ``max{√v̂, ε}``, not Adam's additive τ.
    """

    name = "lp_adam"
    uses_raw = True

    def __init__(self, lr: float, beta2: float = 0.99, eps: float = 1e-3) -> None:
        super().__init__(lr)
        _check_betas(0.0, beta2)
        if not (math.isfinite(eps) and eps > 0):
            raise FedsimError(f"server.eps must be finite and > 0 (got {eps})")
        self.beta2, self.eps = float(beta2), float(eps)
        self.v: torch.Tensor | None = None

    def _tensors(self) -> dict[str, torch.Tensor | None]:
        return {"v": self.v}

    def _step(self, params: torch.Tensor, grad: torch.Tensor) -> None:
        self._step_raw(params, grad, grad)

    def v_hat(self) -> torch.Tensor:
        """``v̂`` of the most recent step: ``v_t/(1−β2^{t+1})``."""
        if self.v is None:
            raise FedsimError(f"{self.name}: no step taken yet, v̂ is undefined")
        return self.v / (1 - self.beta2**self.t)

    def _step_raw(self, params: torch.Tensor, grad: torch.Tensor, raw: torch.Tensor) -> None:
        if self.v is None:
            self.v = torch.zeros_like(params)
        self.v.mul_(self.beta2).addcmul_(raw, raw, value=1 - self.beta2)
        v_hat = self.v / (1 - self.beta2 ** (self.t + 1))
        params.addcdiv_(grad, v_hat.sqrt_().clamp_(min=self.eps), value=-self.lr)


class LPAdamBC(AdamBC):
    """LP-AdamBC: :class:`LPAdam` with DP-AdamBC's bias correction of the second moment.

    With ``Φ_t = noise_variance(t)``, the DP-noise variance of the UNFILTERED pseudo-gradient
    ``r_t`` (the stream ``v`` is built from, so no filter in it)::

        m̂_t = g_t                                   (the filter's output)
        v_t  = β2 v_{t−1} + (1−β2) r_t²
        φ_t  = β2 φ_{t−1} + (1−β2) Φ_t              (φ_{−1} = 0)
        v̂_t = max((v_t − φ_t)/(1−β2^{t+1}), γ′_t),  γ′_t = max(gamma_frac·Φ_t, 1e-30)
        x   ← x − η · m̂_t / √v̂_t                    (no ε)

    Parameters are :class:`AdamBC`'s without ``beta1`` (there is no first-moment EMA), and
    ``bias_correct`` is always on; ``m`` stays None.
    """

    name = "lp_adambc"
    uses_raw = True

    def __init__(
        self, lr: float, noise_variance: Callable[[int], float], beta2: float = 0.99, gamma_frac: float = 0.01
    ) -> None:
        super().__init__(lr, noise_variance, beta1=0.0, beta2=beta2, gamma_frac=gamma_frac)

    def _tensors(self) -> dict[str, torch.Tensor | None]:
        return {"v": self.v, "phi": self.phi}

    def _step(self, params: torch.Tensor, grad: torch.Tensor) -> None:
        self._step_raw(params, grad, grad)

    def _step_raw(self, params: torch.Tensor, grad: torch.Tensor, raw: torch.Tensor) -> None:
        if self.v is None:
            self.v = torch.zeros_like(params)
        t = self.t
        phi_t = self.noise_var(t)
        self.v.mul_(self.beta2).addcmul_(raw, raw, value=1 - self.beta2)
        self.phi = self.phi * self.beta2 + (1 - self.beta2) * phi_t
        params.addcdiv_(grad, self.v_hat(t).sqrt_(), value=-self.lr)


def _check_betas(beta1: float, beta2: float) -> None:
    for nm, b in (("beta1", beta1), ("beta2", beta2)):
        if not 0 <= b < 1:
            raise FedsimError(f"server.{nm} must be in [0, 1) (got {b})")


class OptimizerOptions(ChoiceOptions):
    """Base of every server optimizer's options (the ``[server]`` keys that belong to it);
    ``optimizer`` is the discriminator, a ``Literal`` of the registered name in each subclass."""

    optimizer: str


class SGDOptions(OptimizerOptions):
    """``server.optimizer = "sgd"``: no options besides ``server.lr``."""

    optimizer: Literal["sgd"] = "sgd"


class MomentumOptions(OptimizerOptions):
    """``server.optimizer = "momentum"`` (FedAvgM).

    Parameters
    ----------
    momentum : β. Default 0.9.
    """

    optimizer: Literal["momentum"] = "momentum"
    momentum: float = Field(default=0.9, ge=0, lt=1)


class _Moments(OptimizerOptions):
    """Adam's moment decays: ``beta1``, ``beta2`` (defaults 0.9, 0.99)."""

    beta1: float = Field(default=0.9, ge=0, lt=1)
    beta2: float = Field(default=0.99, ge=0, lt=1)


class AdamOptions(_Moments):
    """``server.optimizer = "adam"`` (FedAdam).

    Parameters
    ----------
    beta1, beta2 : moment decays. Defaults 0.9, 0.99.
    eps : the adaptivity τ added to √v. Default 1e-3.
    bias_correction : bias-correct both moments. Default True.
    """

    optimizer: Literal["adam"] = "adam"
    eps: float = Field(default=1e-3, gt=0)
    bias_correction: bool = True


class YogiOptions(_Moments):
    """``server.optimizer = "yogi"`` (FedYogi).

    Parameters
    ----------
    beta1, beta2 : moment decays. Defaults 0.9, 0.99.
    eps : the adaptivity τ (also ``√v_{−1}``). Default 1e-3.
    bias_correction : bias-correct both moments. Default True.
    """

    optimizer: Literal["yogi"] = "yogi"
    eps: float = Field(default=1e-3, gt=0)
    bias_correction: bool = True


class AdamBCOptions(_Moments):
    """``server.optimizer = "adambc"`` (DP-AdamBC: the DP-noise variance Φ_t, computed exactly from
    the noise mechanism and filter, removed from the second moment; no additive ε).

    Parameters
    ----------
    beta1, beta2 : moment decays. Defaults 0.9, 0.99.
    gamma_frac : the floor γ′ as a fraction of Φ_t. Default 0.01.
    """

    optimizer: Literal["adambc"] = "adambc"
    gamma_frac: float = Field(default=0.01, gt=0)


class LPAdamOptions(OptimizerOptions):
    """``server.optimizer = "lp_adam"`` (DOPPLER's LP-Adam: the filter's output is the first
    moment, the second moment comes from the unfiltered noisy update).

    Parameters
    ----------
    beta2 : second-moment decay. Default 0.99.
    eps : floor of √v̂ (``max{√v̂, ε}``). Default 1e-3.
    """

    optimizer: Literal["lp_adam"] = "lp_adam"
    beta2: float = Field(default=0.99, ge=0, lt=1)
    eps: float = Field(default=1e-3, gt=0)


class LPAdamBCOptions(OptimizerOptions):
    """``server.optimizer = "lp_adambc"`` (LP-Adam with DP-AdamBC's correction: Φ_t of the unfiltered
    noisy update removed from the second moment; no ε).

    Parameters
    ----------
    beta2 : second-moment decay. Default 0.99.
    gamma_frac : the floor γ′ as a fraction of Φ_t. Default 0.01.
    """

    optimizer: Literal["lp_adambc"] = "lp_adambc"
    beta2: float = Field(default=0.99, ge=0, lt=1)
    gamma_frac: float = Field(default=0.01, gt=0)


@dataclass(frozen=True)
class OptimizerKind:
    """A registered server optimizer.

    Parameters
    ----------
    name : ``server.optimizer``.
    options : its options model.
    build : ``(options, lr, noise_variance)`` → a fresh optimizer (``noise_variance``: ``t ↦ Φ_t``,
        None when the run has no noise).
    summary : one line for the docs and ``--help``.
    noise_variance : which ``Φ_t`` ``build`` needs: ``None`` (none), ``"filtered"`` (the noise in
        the vector after the server filter, ``adambc``) or ``"unfiltered"`` (before it, the LP
        variants' second moment).
    """

    name: str
    options: type[OptimizerOptions]
    build: Callable[[Any, float, Callable[[int], float] | None], ServerOptimizer]
    summary: str
    noise_variance: Literal["filtered", "unfiltered"] | None = None


#: The server optimizers, by ``server.optimizer``.
OPTIMIZERS: Registry[OptimizerKind] = Registry("server optimizer", "server.optimizer")


def _adambc(o: AdamBCOptions, lr: float, noise_variance: Callable[[int], float] | None) -> ServerOptimizer:
    if noise_variance is None:
        raise FedsimError(
            "server.optimizer = 'adambc' needs the noise mechanism's per-coordinate "
            "variance Φ_t (noise_variance); it is computed from the DP noise, so "
            "adambc requires a DP run with noise"
        )
    return AdamBC(lr, noise_variance, o.beta1, o.beta2, o.gamma_frac)


def _lp_adambc(o: LPAdamBCOptions, lr: float, noise_variance: Callable[[int], float] | None) -> ServerOptimizer:
    if noise_variance is None:
        raise FedsimError(
            "server.optimizer = 'lp_adambc' needs the noise mechanism's per-coordinate "
            "variance Φ_t of the unfiltered update (noise_variance); it is computed from the DP "
            "noise, so lp_adambc requires a DP run with noise"
        )
    return LPAdamBC(lr, noise_variance, o.beta2, o.gamma_frac)


for _kind in (
    OptimizerKind("sgd", SGDOptions, lambda o, lr, _: SGD(lr), "x ← x − η g (FedAvg when η = 1)"),
    OptimizerKind(
        "momentum", MomentumOptions, lambda o, lr, _: Momentum(lr, o.momentum), "heavy-ball momentum (FedAvgM)"
    ),
    OptimizerKind(
        "adam", AdamOptions, lambda o, lr, _: Adam(lr, o.beta1, o.beta2, o.eps, o.bias_correction), "FedAdam"
    ),
    OptimizerKind(
        "yogi", YogiOptions, lambda o, lr, _: Yogi(lr, o.beta1, o.beta2, o.eps, o.bias_correction), "FedYogi"
    ),
    OptimizerKind(
        "adambc", AdamBCOptions, _adambc, "DP-AdamBC: Adam with the DP noise variance Φ_t removed", "filtered"
    ),
    OptimizerKind(
        "lp_adam",
        LPAdamOptions,
        lambda o, lr, _: LPAdam(lr, o.beta2, o.eps),
        "DOPPLER's LP-Adam: m = the filter's output, v from the unfiltered update",
    ),
    OptimizerKind(
        "lp_adambc",
        LPAdamBCOptions,
        _lp_adambc,
        "LP-Adam with the unfiltered DP noise variance Φ_t removed from v",
        "unfiltered",
    ),
):
    OPTIMIZERS.add(_kind.name, _kind, options=_kind.options)


def make_optimizer(
    name: str, lr: float, *, noise_variance: Callable[[int], float] | None = None, **options: Any
) -> ServerOptimizer:
    """The registered server optimizer called ``name``.

    Parameters
    ----------
    name : ``sgd`` | ``momentum`` | ``adam`` | ``yogi`` | ``adambc`` | ``lp_adam`` | ``lp_adambc``
        (:data:`OPTIMIZERS`).
    lr : the server step size η.
    noise_variance : ``t ↦ Φ_t`` from the noise mechanism; required for ``adambc`` (after the
        filter) and ``lp_adambc`` (before it).
    **options : the optimizer's options (its options model: ``momentum``; ``beta1``, ``beta2``,
        ``eps``, ``bias_correction``; ``gamma_frac``); None values take the defaults.

    Raises
    ------
    FedsimError
        Unknown name, an option the optimizer does not take, bad hyperparameters, or ``adambc`` /
        ``lp_adambc`` without ``noise_variance``.
    """
    kind = OPTIMIZERS.get_part(name)
    opts = validate_options(kind.options, {"optimizer": name, **options}, f"server optimizer {name!r}", "server")
    return kind.build(opts, lr, noise_variance)
