"""User inference: was this user's data used to train the model? (Kandpal, Pillutla, Oprea,
Kairouz, Choquette-Choo and Xu, 2023, "User Inference Attacks on Large Language Models".)

Method
------
The attacker holds *fresh* samples of a target user (samples the model was not trained on, but
from the same user) and scores the user by the mean log-likelihood ratio of those samples,

    T(u) = (1/n) Σ_j [log p_θ(x_j) − log p_ref(x_j)]    (natural log, nats),

``θ`` the trained model and ``ref`` a reference model. A user whose data shaped ``θ`` scores
higher. Here a user's fresh samples are their **test** samples (the held-out part of their own
text, never trained on), so both held-in and held-out users are scored on data the model did not
see; only held-in users' *other* data was trained on.

- :func:`split_users` chooses, by a seeded rule, ``n`` **held-out** users (hidden from training
  with :func:`fedsim.attacks.views.without_users` or the ``exclude`` of
  :func:`fedsim.attacks.canaries.with_canary_users`) and ``n`` **held-in** targets among the users
  that are trained on (the same rule and size, so the two groups are alike).
- :func:`user_statistic` computes ``T(u)``; a sample's log-likelihood is ``log p(y | x)`` of its
  label for one-label tasks (``char``: the next character) and the sum over non-pad positions of
  ``log p(y_t | x_≤t)`` for ``nwp`` (a sentence's log-likelihood). Tasks with multi-label float
  targets (``tag``) are not supported.
- :func:`user_inference_scores` scores both groups; the ROC, AUC and TPR at low FPR of
  "held-in vs held-out" come from :mod:`fedsim.attacks.stats`.

The **reference model** calibrates away how predictable a user's text is by itself. The
default choice is the **initial model** ``x_0`` (the model before training: cheap, and trained
on nobody). A stronger reference is a model trained the same way *without the target users*
(e.g. on a disjoint population); pass it as ``ref_model``. With ``ref_model = model`` every
statistic is exactly 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fedsim.attacks.views import check_seed, check_users
from fedsim.data import FederatedData
from fedsim.errors import FedsimError

#: Stream of numpy.random.default_rng([seed, stream]) for the split (analysis randomness).
_SPLIT = 0


@dataclass(frozen=True)
class UserSplit:
    """Held-out and held-in users, as indices of the full population (before hiding anyone).

    Parameters
    ----------
    held_out : users never trained on (hide them from training), sorted.
    held_in : targets among the trained users, sorted; as many as ``held_out``.
    population_size : the full population's size.
    seed : the seed of the split.
    """

    held_out: tuple[int, ...]
    held_in: tuple[int, ...]
    population_size: int
    seed: int


def split_users(population_size: int, n_held_out: int, seed: int, eligible: Sequence[int] | None = None) -> UserSplit:
    """Choose ``n_held_out`` held-out users and as many held-in targets by a seeded rule.

    The rule: a permutation of ``eligible`` drawn with ``numpy.random.default_rng([seed, 0])``
    (analysis randomness, not DP noise); its first ``n`` users are held out, the next ``n`` are
    the held-in targets. All other users are trained on too.

    Parameters
    ----------
    population_size : ``N``, the full population (users ``0..N−1``).
    n_held_out : ``n ≥ 1``, users per group.
    seed : the split's seed.
    eligible : users that may be chosen into either group (e.g. :func:`users_with_test_samples`);
        None: all. Default None.
    """
    pool = list(range(population_size)) if eligible is None else check_users(eligible, population_size, "eligible")
    if n_held_out < 1 or 2 * n_held_out > len(pool):
        raise FedsimError(
            f"user inference needs 1 ≤ n_held_out ≤ {len(pool) // 2} (half of the {len(pool)} eligible users), "
            f"got {n_held_out}; lower n_held_out"
        )
    if population_size - n_held_out < 2:
        raise FedsimError(f"holding out {n_held_out} of {population_size} users leaves fewer than 2 to train on")
    order = np.random.default_rng([check_seed(seed, "seed"), _SPLIT]).permutation(np.asarray(pool, dtype=np.int64))
    held_out = tuple(sorted(int(u) for u in order[:n_held_out]))
    held_in = tuple(sorted(int(u) for u in order[n_held_out : 2 * n_held_out]))
    return UserSplit(held_out, held_in, population_size, seed)


def users_with_test_samples(data: FederatedData) -> list[int]:
    """The users of ``data`` with at least one test sample (the ones user inference can score)."""
    return [u for u in range(data.population) if data.num_test(u) > 0]


def sample_log_likelihood(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Each sample's log-likelihood (nats, float64 ``[B]``) from model outputs ``out``.

    ``y`` of shape ``[B]`` (integer labels; ``out`` ``[B, C]``): ``log p(y_b)``. ``y`` of shape
    ``[B, L]`` (integer tokens, 0 = pad; ``out`` ``[B, L, C]``): the sum of ``log p(y_bt)`` over
    the non-pad positions.
    """
    if y.is_floating_point() or y.dim() not in (1, 2):
        raise FedsimError(
            f"user inference needs integer labels [B] or tokens [B, L]; got {y.dtype} of shape {tuple(y.shape)} "
            f"(multi-label tasks such as 'tag' are not supported)"
        )
    logp = torch.log_softmax(out.double(), dim=-1).gather(-1, y.unsqueeze(-1)).squeeze(-1)
    if y.dim() == 1:
        return logp
    return (logp * (y != 0)).sum(dim=1)


def _mean_log_likelihoods(
    models: tuple[nn.Module, nn.Module], data: FederatedData, user: int, max_examples: int | None, batch_size: int
) -> tuple[float, float]:
    """Mean log-likelihood of ``user``'s test samples under each of the two models."""
    if data.num_test(user) == 0 or max_examples == 0:
        raise FedsimError(
            f"user {user} ({data.names[user]!r}) has no test samples to score; choose targets among "
            f"users_with_test_samples(data) (split_users(..., eligible=...)), and keep max_examples ≥ 1"
        )
    x, y = data.test_samples(user, max_examples)
    sums = [0.0, 0.0]
    for i, m in enumerate(models):
        dev = next(iter(m.parameters()), torch.empty(0)).device
        for s in range(0, len(y), batch_size):
            xb, yb = x[s : s + batch_size].to(dev), y[s : s + batch_size].to(dev)
            sums[i] += float(sample_log_likelihood(m(xb), yb).sum())
    return sums[0] / len(y), sums[1] / len(y)


def user_statistic(
    model: nn.Module,
    ref_model: nn.Module,
    data: FederatedData,
    user: int,
    max_examples: int | None = None,
    batch_size: int = 256,
) -> float:
    """``T(user)``: mean over the user's test samples of ``log p_θ(x) − log p_ref(x)`` (nats).

    Parameters
    ----------
    model : the trained model ``θ``.
    ref_model : the reference model (module docstring; default choice: the initial model).
    data : a dataset holding ``user`` (indices as in it; the full population, not the training view).
    user : the target user.
    max_examples : test samples used (evenly spaced or the first ones, as the dataset's
        ``test_samples`` picks); None: all. Default None.
    batch_size : samples per forward pass. Default 256.
    """
    return user_inference_scores(model, ref_model, data, [user], [], max_examples, batch_size)[0][0].item()


def user_inference_scores(
    model: nn.Module,
    ref_model: nn.Module,
    data: FederatedData,
    held_in: Sequence[int],
    held_out: Sequence[int],
    max_examples: int | None = None,
    batch_size: int = 256,
) -> tuple[np.ndarray, np.ndarray]:
    """The statistic ``T`` of every held-in and every held-out user: ``(scores_in, scores_out)``,
    float64 arrays in the users' order. Feed them to :func:`fedsim.attacks.stats.roc_auc`
    (held-in = members).

    Parameters
    ----------
    model, ref_model : the trained and the reference model (both put in eval mode for the call).
    data : the dataset holding all targets (the full population that ``split_users`` split).
    held_in, held_out : the targets (:class:`UserSplit`'s groups).
    max_examples : test samples per user; None: all. Default None.
    batch_size : samples per forward pass. Default 256.
    """
    check_users(list(held_in) + list(held_out), data.population, "held_in + held_out")
    modes = (model.training, ref_model.training)
    model.eval()
    ref_model.eval()
    try:
        with torch.no_grad():
            groups = []
            for users in (held_in, held_out):
                pairs = [
                    _mean_log_likelihoods((model, ref_model), data, int(u), max_examples, batch_size) for u in users
                ]
                groups.append(np.array([a - b for a, b in pairs], dtype=np.float64))
    finally:
        model.train(modes[0])
        ref_model.train(modes[1])
    return groups[0], groups[1]
