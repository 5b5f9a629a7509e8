"""Your own local training: a registered local update that fedsim runs inside its per-user
isolation and clipping (`client.local_update = "name"`).

A local update is a function `update(model, batches, loss, spec) -> float`:

- `model`: the task's `torch.nn.Module`, already holding the broadcast model `x_t`;
  train it in place (any optimizer, loss or number of steps);
- `batches`: an iterable of this user's `(x, y)` training batches — the same seeded batches
  fedsim's own local SGD takes (`client.batch_size`, `client.max_examples`,
  `client.local_epochs`), and nothing of any other user;
- `loss`: the dataset's loss, `loss(model(x), y)`;
- `spec`: `fedsim.training.local.LocalTraining` (`lr`, `epochs`, … as configured);
- returns the mean training loss (for the metrics; any float).

fedsim then takes `Δ = x_local − x_t` and treats it as it treats its own: a `Δ` that is not
finite contributes zero and is counted (`nonfinite_users`), one that raises contributes zero and
is counted (`failed_users`), and every other one is clipped to `client.clip_norm` before it is
summed.

Each call gets a fresh copy of the model as the worker built it (`fedsim.training.isolation`):
broadcast parameters, gradients None, the built buffers, training mode. Nothing the hook leaves
on the model (gradients, buffers, attributes, an optimizer) reaches the next user. So through
what fedsim hands it, a hook can only change what its own user sends, within the clip, and ε
does not depend on it. What fedsim cannot see into stays the hook's own responsibility: it must
keep no state of its own between calls (module globals, closures, files), since that would carry
one user's data into another's update (docs/threat-model.md, "What user code is trusted with").
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any

import torch

from fedsim.registry import Registry

#: `(model, batches, loss, spec) -> mean loss`
LocalUpdate = Callable[[torch.nn.Module, Iterable[tuple[torch.Tensor, torch.Tensor]], Callable[..., Any], Any], float]

#: The registered local updates, by `client.local_update`.
LOCAL_UPDATES: Registry[LocalUpdate] = Registry("local update", "client.local_update")


def register_local_update(name: str, update: LocalUpdate) -> LocalUpdate:
    """Register `update` as `client.local_update = name` (see the module docstring).

    Parameters
    ----------
    name : str
        The name a config gives as `client.local_update`.
    update : callable
        `update(model, batches, loss, spec) -> float` (see the module docstring); anything else is
        refused with a `FedsimError` before any run.

    Returns
    -------
    callable
        `update`, registered.
    """
    from fedsim.errors import FedsimError

    if not isinstance(name, str) or not name:
        raise FedsimError(f"register_local_update: the name must be a non-empty string, not {name!r}")
    if not callable(update):
        raise FedsimError(
            f"register_local_update({name!r}, …): {type(update).__name__} {update!r} is not callable; pass a "
            f"function update(model, batches, loss, spec) -> float"
        )
    try:
        inspect.signature(update).bind(None, None, None, None)
    except TypeError:
        raise FedsimError(
            f"register_local_update({name!r}, …): {getattr(update, '__name__', update)!r} cannot be called as "
            f"update(model, batches, loss, spec) (its signature is {inspect.signature(update)}); give it those "
            f"four parameters"
        ) from None
    except ValueError:  # a builtin without a signature: it is called and fails loudly if it does not fit
        pass
    return LOCAL_UPDATES.add(name, update)
