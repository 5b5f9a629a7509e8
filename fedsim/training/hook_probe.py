"""A check of a registered local update before it trains anyone: it must keep no state between
calls.

fedsim gives every call of a hook a fresh copy of the built model, its own settings and the
user's own batches (`fedsim.training.isolation`), so nothing fedsim hands it can carry one user's
data to the next. What fedsim cannot reset is the hook's own state: a module-level optimizer, a
running average, a cache in a closure. Before a worker's first user, fedsim therefore trains that
user twice from the same start with the same seeds; an honest hook gives the same update both
times (bit for bit on a CPU, to 1e-5 relative on a GPU, whose kernels need not be deterministic).
One whose second update differs kept something from the first call, and is refused: every user of
that worker is reported as failed in code with the reason, and the server stops the run before
the round's noise (`fedsim.strategies.user_dp`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

#: (model object, hook name) pairs already probed in this process.
_PROBED: set[tuple[int, str]] = set()


def stateful_hook(
    train: Callable[..., tuple[torch.Tensor, float, int]],
    model: nn.Module,
    x0: torch.Tensor,
    data: Any,
    user: int,
    round_index: int,
    seed: int,
    spec: Any,
) -> str | None:
    """None when ``spec.local_update`` gives ``user`` the same update twice in a row (or was
    probed already in this process, or the user's own training raises: that is met and reported
    when the user trains); otherwise the reason to refuse it.

    Parameters
    ----------
    train : one user's local training, `fedsim.training.local.local_delta` (passed in: this module
        and that one do not import each other).
    model : the worker's model.
    x0 : the broadcast parameters, flat.
    data : the worker's data.
    user : the user trained twice (the worker's first of the round).
    round_index : the round (0-based), for the user's seeded batches.
    seed : the run's seed.
    spec : the `LocalTraining` settings; ``spec.local_update`` names the hook.
    """
    key = (id(model), str(spec.local_update))
    if spec.local_update is None or key in _PROBED:
        return None
    _PROBED.add(key)
    deltas = []
    try:
        for _ in range(2):
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(0)  # the hook's own randomness (dropout) the same both times
                deltas.append(train(model, x0, data, user, round_index, seed, spec)[0].detach().cpu())
    except Exception:
        return None
    first, second = deltas
    if first.device.type == "cpu" and x0.device.type == "cpu":
        same = torch.equal(first, second)
    else:
        same = torch.allclose(first, second, rtol=1e-5, atol=0.0)
    if same:
        return None
    gap = float((first.double() - second.double()).norm())
    return (
        f"client.local_update = {spec.local_update!r} keeps state between calls: trained twice from the same "
        f"model and batches it gave updates {gap:.3g} apart (L2). A hook must create everything it uses "
        f"(optimizer, running statistics, caches) inside the call; state kept across calls would carry one "
        f"user's data into another user's update. fedsim refused it before any user was trained."
    )
