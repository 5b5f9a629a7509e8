"""A model's parameters as one flat vector: the unit the server, the noise and the clipping
work in (a vector of ``d`` float32 entries, in ``model.parameters()`` order)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["load_flat_"]


def load_flat_(params: Sequence[torch.Tensor], flat: torch.Tensor) -> None:
    """Copy the flat vector ``flat`` into ``params`` in place.

    (``torch.nn.utils.vector_to_parameters`` would make the parameters *views* of
    ``flat``, so training would silently modify the caller's vector.)
    """
    total = sum(p.numel() for p in params)
    if flat.numel() != total:
        raise ValueError(f"flat vector has {flat.numel()} entries, the model {total}")
    offset = 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            p.copy_(flat[offset : offset + n].view_as(p))
            offset += n
