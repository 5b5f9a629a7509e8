"""Each user's local training starts from a state that no other user's data has touched.

A worker trains its users in turn. Whatever one user's training leaves behind and the next
user's training reads is a channel from one user's data into another user's update, and so into
that user's clipped contribution: the sensitivity the accountant assumes (one user moves the sum
by at most ``c``) would then be false. The channels fedsim controls are closed here:

- parameters: loaded from the broadcast ``x_t``;
- gradients: every parameter's ``.grad`` is set to None (not to zeros a hook could accumulate
  into);
- buffers (BatchNorm running statistics, any registered buffer): restored to the values the
  model had when the worker built it, before any user's data reached it;
- train/eval mode: the model is put in training mode;
- a registered local update (``client.local_update``) gets a fresh copy of that pristine model
  for every user, so anything a hook leaves on the model object (attributes, forward hooks,
  replaced submodules, an optimizer stored on it) is gone before the next user.

What stays the user's responsibility is code fedsim cannot see into: a hook's own globals and
closures, files it writes, a model plugin's Python attributes that its ``forward`` both writes and
reads. docs/threat-model.md ("What user code is trusted with") says so.
"""

from __future__ import annotations

import copy
import weakref

import torch
from torch import nn

from fedsim.parameters import load_flat_

#: A pristine deep copy of each model, made the first time the model is seen here (the worker
#: builds the model and hands it to training before any user's data reaches it).
_PRISTINE: weakref.WeakKeyDictionary[nn.Module, nn.Module] = weakref.WeakKeyDictionary()


def remember_pristine(model: nn.Module) -> nn.Module:
    """Record ``model``'s current state as its pristine state (once per model object) and
    return the pristine copy.

    Parameters
    ----------
    model : the worker's model, before any user's data has reached it. Called again for a model
        already recorded, it changes nothing.
    """
    kept = _PRISTINE.get(model)
    if kept is None:
        with torch.no_grad():
            kept = copy.deepcopy(model).to("cpu")  # on the host: no second copy in GPU memory
        for p in kept.parameters():
            p.grad = None
        _PRISTINE[model] = kept
    return kept


def reset_for_user(model: nn.Module, x0: torch.Tensor) -> None:
    """Put ``model`` in the state a user's local training starts from: parameters ``x0``,
    gradients None, buffers as recorded by `remember_pristine`, training mode.

    Parameters
    ----------
    model : the worker's model (recorded as pristine on first use).
    x0 : the broadcast parameters, flat, on the model's device.
    """
    pristine = remember_pristine(model)
    params = list(model.parameters())
    load_flat_(params, x0)
    for p in params:
        p.grad = None
    own = dict(model.named_buffers())
    with torch.no_grad():
        for name, buf in pristine.named_buffers():
            mine = own.get(name)
            if mine is None or mine.shape != buf.shape:
                raise RuntimeError(
                    f"the model's buffer {name!r} was removed or reshaped during training; "
                    "a model must keep its buffers (fedsim restores them before every user)"
                )
            mine.copy_(buf.to(mine.device))
    model.train()


def fresh_copy(model: nn.Module, x0: torch.Tensor) -> nn.Module:
    """A new model object for one user's registered local update: the pristine copy of ``model``
    (`remember_pristine`) deep-copied again, with parameters ``x0``, no gradients, in training mode.

    Parameters
    ----------
    model : the worker's model.
    x0 : the broadcast parameters, flat, on the model's device.
    """
    pristine = remember_pristine(model)
    with torch.no_grad():
        mine = copy.deepcopy(pristine)
    dev = x0.device
    mine = mine.to(dev)
    load_flat_(list(mine.parameters()), x0)
    mine.train()
    return mine
