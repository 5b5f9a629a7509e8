"""Server optimizers on flat tensors (Reddi et al. 2021, "Adaptive federated optimization").

Every optimizer takes the pseudo-gradient ``g = −ĝ_t`` (ĝ_t: the noisy, filtered
mean model delta) and updates the flat parameters in place:

- ``sgd``:      ``x ← x − η g``   (FedAvg when η = 1)
- ``momentum``: ``m ← β m + g``; ``x ← x − η m``   (FedAvgM)
- ``adam``:     ``m ← β1 m + (1−β1) g``; ``v ← β2 v + (1−β2) g²``;
  with bias correction ``m̂ = m/(1−β1^{t+1})``, ``v̂ = v/(1−β2^{t+1})`` (else m̂ = m, v̂ = v);
  ``x ← x − η m̂ / (√v̂ + τ)``   (FedAdam; τ = ``eps``)

All are post-processing of the DP release: they never change ε.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch

from fedsim.errors import FedsimError


class ServerOptimizer(ABC):
    """Base class. ``step(x, g)`` updates ``x`` in place; ``t`` counts steps taken."""

    name = "base"

    def __init__(self, lr: float) -> None:
        if lr <= 0:
            raise FedsimError(f"server.lr must be > 0 (got {lr})")
        self.lr = float(lr)
        self.t = 0

    def step(self, params: torch.Tensor, grad: torch.Tensor) -> None:
        self._step(params, grad)
        self.t += 1

    @abstractmethod
    def _step(self, params: torch.Tensor, grad: torch.Tensor) -> None:
        """Update ``params`` in place from the pseudo-gradient ``grad``."""

    def _tensors(self) -> dict[str, torch.Tensor | None]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {"name": self.name, "t": self.t, **{k: (None if v is None else v.clone()) for k, v in self._tensors().items()}}

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

    def __init__(self, lr: float, beta1: float = 0.9, beta2: float = 0.99, eps: float = 1e-3,
                 bias_correction: bool = True) -> None:
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


def make_optimizer(name: str, lr: float, momentum: float = 0.9, beta1: float = 0.9,
                   beta2: float = 0.99, eps: float = 1e-3, bias_correction: bool = True) -> ServerOptimizer:
    """The server optimizer called ``name`` (``sgd`` | ``momentum`` | ``adam``)."""
    if name == "sgd":
        return SGD(lr)
    if name == "momentum":
        return Momentum(lr, momentum)
    if name == "adam":
        return Adam(lr, beta1, beta2, eps, bias_correction)
    raise FedsimError(f"server.optimizer = {name!r}: allowed are sgd, momentum, adam")
