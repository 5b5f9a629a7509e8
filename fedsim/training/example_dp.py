"""Example-level DP inside clients with Opacus (``privacy.unit = "example"``).

For cross-silo federations where each node (a "user" in fedsim's vocabulary) holds many
people's records: each silo trains its local update with DP-SGD from Opacus — Poisson
sampled batches (rate ``q = 1/⌈n_i/B⌉``, as Opacus's ``DPDataLoader``), per-sample clipping to
``example_clip_norm`` and Gaussian noise of multiplier ``example_noise_multiplier``
(Opacus's ``DPOptimizer`` with the noise of :class:`KeyedDPOptimizer`), per-sample gradients of
the LSTM through Opacus's ``DPLSTM``.

Randomness: both DP streams — the Poisson batch coins and the DP-SGD noise — come from the keyed
CSPRNG of :mod:`fedsim.privacy.rng` under the silo's own key, :func:`silo_key`: 256 bits drawn from
the OS once per silo process, never written anywhere and never sent (not in the task, not in any
message). Nobody outside the silo, the server included, can regenerate the noise from anything
public. The price: example-level runs are not bit-reproducible from the config seed, and a resumed
run continues with fresh silo keys.

Every step's Poisson batch is drawn from all ``n_i`` of the silo's records; ``client.max_examples``
(``m``) bounds the work, not the data: a participation takes ``epochs·⌈min(n_i, m)/B⌉`` steps at
rate ``q_i = 1/⌈n_i/B⌉``. (A capped subset of records would break the guarantee: chosen by a draw
over ``n_i`` records, or by position, one added record changes which other records are in it,
so neighbouring silo datasets would be trained on sets that differ in many records.) As in
Opacus, ``n_i`` is treated as public.

The silo's own guarantee is computed with Opacus's RDP accountant over all of the silo's
participations: ``k_i`` participations × ``epochs·⌈min(n_i, m)/B⌉`` steps at rate ``q_i``. The
ledger records the largest such ε over silos (and the per-silo counts, so it can be
recomputed), next to the server-side user-level ε when that is on too; the two protect
different units and do not compose into one number.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from fedsim.privacy.rng import PrivacyKey, gaussians, uniforms

_SILO_KEY: PrivacyKey | None = None


def silo_key() -> PrivacyKey:
    """This silo process's secret key for example-level DP (drawn from the OS on first use; it
    lives only in this process's memory)."""
    global _SILO_KEY
    if _SILO_KEY is None:
        _SILO_KEY = PrivacyKey.generate()
    return _SILO_KEY


def _keyed_optimizer_class() -> type:
    from opacus.optimizers import DPOptimizer

    class KeyedDPOptimizer(DPOptimizer):
        """Opacus's ``DPOptimizer`` with the Gaussian noise drawn from the keyed CSPRNG: step ``s``,
        parameter ``j`` gets ``σ·C·ξ`` with ``ξ = gaussians(key.derive(s, j))`` (float64 Box–Muller,
        cast to the parameter's dtype) — the same std as Opacus's own ``add_noise``."""

        def __init__(self, *args: Any, key: PrivacyKey, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._key = key
            self._noise_step = 0

        def add_noise(self) -> None:
            from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed

            std = self.noise_multiplier * self.max_grad_norm
            for j, p in enumerate(self.params):
                _check_processed_flag(p.summed_grad)
                ref = p.summed_grad
                noise = gaussians(
                    self._key.derive("noise", self._noise_step, j), ref.numel(), dtype=ref.dtype, device=ref.device
                ).view_as(ref)
                p.grad = (ref + noise.mul_(std)).view_as(p)
                _mark_as_processed(p.summed_grad)
            self._noise_step += 1

    return KeyedDPOptimizer


def poisson_batches(n: int, rate: float, steps: int, key: PrivacyKey) -> list[np.ndarray]:
    """Opacus's Poisson batches for ``steps`` steps over ``n`` examples: each example joins step
    ``s`` independently with probability ``rate``, from the keyed CSPRNG (``key.derive(s)``).
    Empty batches are kept (they still take a noise-only step)."""
    return [np.flatnonzero(uniforms(key.derive("batch", s), n).numpy() < rate) for s in range(steps)]


@dataclass(frozen=True)
class ExampleDP:
    """DP-SGD settings of every silo.

    Parameters
    ----------
    noise_multiplier : σ of Opacus's per-step Gaussian noise (relative to ``clip_norm``).
    clip_norm : per-sample gradient clip norm (Opacus ``max_grad_norm``).
    """

    noise_multiplier: float
    clip_norm: float


def steps_and_rate(
    num_examples: int, batch_size: int, epochs: int, max_examples: int | None = None
) -> tuple[int, float]:
    """DP-SGD steps per participation and the Poisson rate of one silo with ``n`` examples:
    ``(epochs·⌈min(n, m)/B⌉, 1/⌈n/B⌉)``. The rate is Opacus's ``DPDataLoader`` convention over
    all ``n`` examples; ``max_examples`` (``m``, None: no bound) shortens the epoch to the steps
    that ``m`` examples would take, and never changes the rate."""
    batches = max(1, math.ceil(num_examples / batch_size))
    per_epoch = batches if max_examples is None else max(1, math.ceil(min(num_examples, max_examples) / batch_size))
    return epochs * per_epoch, 1.0 / batches


def silo_epsilon(noise_multiplier: float, sample_rate: float, steps: int, delta: float) -> float:
    """ε of one silo after ``steps`` DP-SGD steps, from Opacus's RDP accountant."""
    if steps <= 0:
        return 0.0
    from opacus.accountants import RDPAccountant

    acc = RDPAccountant()
    acc.history = [(float(noise_multiplier), float(sample_rate), int(steps))]
    return float(acc.get_epsilon(delta=delta))


def local_delta_example_dp(
    model: nn.Module,
    x0: torch.Tensor,
    samples: tuple[torch.Tensor, torch.Tensor],
    round_index: int,
    user: int,
    seed: int,
    lr: float,
    batch_size: int,
    epochs: int,
    dp: ExampleDP,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = nn.functional.cross_entropy,
    key: PrivacyKey | None = None,
    max_examples: int | None = None,
) -> tuple[torch.Tensor, float, int]:
    """One silo's DP-SGD local training from ``x0``; returns ``(Δ, mean loss, examples seen)``.

    ``samples``: every one of the silo's training records (:func:`silo_samples`); each step's
    Poisson batch is drawn from all of them. ``model`` must be built with ``dp_layers=True``;
    its parameters are overwritten. ``loss_fn``: the batch loss, a mean over examples of
    per-example losses (what Opacus's ``mean`` reduction assumes). Default: cross-entropy.
    ``seed`` is public and drives no DP draw; ``key`` is the silo's key (default
    :func:`silo_key`), from which this round's and user's batch coins and noise are derived.
    ``max_examples``: the epoch's steps are those of this many records
    (:func:`steps_and_rate`; None: all of them). Default None.
    """
    from opacus import GradSampleModule

    from fedsim.training.isolation import reset_for_user

    params = list(model.parameters())
    dev = params[0].device
    x0 = x0.to(dev)
    reset_for_user(model, x0)  # nothing of the previous silo: gradients, buffers, mode
    X, Y = samples
    k = (key if key is not None else silo_key()).derive("example-dp", int(round_index), int(user))
    steps_per_epoch, rate = steps_and_rate(len(Y), batch_size, 1, max_examples)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Opacus warns about secure_mode and hooks
        gsm = GradSampleModule(model)
        opt = _keyed_optimizer_class()(
            torch.optim.SGD(gsm.parameters(), lr=lr),
            noise_multiplier=dp.noise_multiplier,
            max_grad_norm=dp.clip_norm,
            expected_batch_size=batch_size,
            key=k.derive("noise"),
        )
        loss_sum, steps, seen = 0.0, 0, 0
        try:
            for epoch in range(epochs):
                for idx in poisson_batches(len(Y), rate, steps_per_epoch, k.derive("batches", epoch)):
                    sel = torch.from_numpy(idx)
                    xb, yb = X[sel], Y[sel]
                    xb, yb = xb.to(dev), yb.to(dev)
                    opt.zero_grad()
                    out = gsm(xb)
                    # An empty Poisson batch still takes a (noise-only) step: skipping it would
                    # reveal that the batch was empty.
                    loss = loss_fn(out, yb) if len(yb) else out.sum() * 0.0
                    loss.backward()
                    opt.step()
                    if len(yb):
                        loss_sum += float(loss.detach())
                    steps += 1
                    seen += len(yb)
        finally:
            gsm._close()
    with torch.no_grad():
        delta = torch.cat([p.detach().reshape(-1) for p in params]) - x0
    return delta, loss_sum / max(steps, 1), seen


class SiloLedger:
    """Per-silo example-level ε (Opacus RDP), recomputable from its own contents.

    Parameters
    ----------
    dp : the silos' DP-SGD settings.
    delta : δ of each silo's guarantee.
    steps_rate : ``{silo: (steps per participation, sampling rate)}``.
    """

    def __init__(self, dp: ExampleDP, delta: float, steps_rate: dict[int, tuple[int, float]]) -> None:
        self.dp = dp
        self.delta = float(delta)
        self.steps_rate = steps_rate
        self.participations: dict[int, int] = {}
        self.epsilons: dict[int, float] = {}

    def record(self, silos: list[int]) -> float:
        """Count one participation for each silo; return the largest silo ε so far."""
        for s in silos:
            k = self.participations.get(int(s), 0) + 1
            self.participations[int(s)] = k
            steps, q = self.steps_rate[int(s)]
            self.epsilons[int(s)] = silo_epsilon(self.dp.noise_multiplier, q, steps * k, self.delta)
        return self.max_epsilon

    def count_at_least(self, trainings: dict[int, int]) -> None:
        """Raise each silo's participations to at least ``trainings[silo]`` (the release log's
        count, :class:`fedsim.runner.releases.ReleaseLog`, which a resume cannot roll back)."""
        for s, n in trainings.items():
            k = max(self.participations.get(int(s), 0), int(n))
            if k and k != self.participations.get(int(s)):
                self.participations[int(s)] = k
                steps, q = self.steps_rate[int(s)]
                self.epsilons[int(s)] = silo_epsilon(self.dp.noise_multiplier, q, steps * k, self.delta)

    @property
    def max_epsilon(self) -> float:
        return max(self.epsilons.values(), default=0.0)

    def to_json(self, per_silo: bool = True) -> dict[str, Any]:
        """The example-level record; ``per_silo = False`` leaves out each silo's participations
        and ε (they reveal which silos were sampled: a side statistic outside the user-level ε)."""
        out: dict[str, Any] = {
            "unit": "example",
            "accountant": "opacus.accountants.RDPAccountant",
            "noise_multiplier": self.dp.noise_multiplier,
            "clip_norm": self.dp.clip_norm,
            "delta": self.delta,
        }
        if per_silo:
            out["max_silo_epsilon"] = self.max_epsilon
            out["silos"] = {
                str(s): {
                    "participations": k,
                    "steps_per_participation": self.steps_rate[s][0],
                    "sample_rate": self.steps_rate[s][1],
                    "epsilon": self.epsilons[s],
                }
                for s, k in sorted(self.participations.items())
            }
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"participations": dict(self.participations), "epsilons": dict(self.epsilons)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.participations = {int(k): int(v) for k, v in state["participations"].items()}
        self.epsilons = {int(k): float(v) for k, v in state["epsilons"].items()}


def silo_samples(data: Any, user: int) -> tuple[torch.Tensor, torch.Tensor]:
    """All of silo ``user``'s training records, in order: DP-SGD's Poisson batches are drawn
    from every one of them (the ledger's rate is over ``data.num_train(user)``). A source that
    returns another number of records raises ``ValueError`` (the silo fails alone)."""
    n = int(data.num_train(user))
    X, Y = data.train_samples(user, np.arange(n))
    if len(X) != n or len(Y) != n:
        raise ValueError(f"silo {user}: asked for its {n} training records, got {len(Y)}")
    return X, Y
