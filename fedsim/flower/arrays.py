"""A Flower model (an ``ArrayRecord``) as one flat float32 vector, and back.

The DP step works on the flat vector ``x`` of the model's floating-point arrays, in the record's
order. Arrays that are not floating point (integer buffers such as a batch-norm step counter) are
not trained by federated averaging; they are held at the values of the model the server
broadcast, so no client can move them (they would be a channel outside the clipped update).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from flwr.app import Array, ArrayRecord

from fedsim.errors import FedsimError


@dataclass(frozen=True)
class Layout:
    """Where each floating-point array of a model lives in the flat vector.

    names : the record's keys, in order.
    shapes / dtypes : each array's shape and numpy dtype.
    floating : whether each array is floating point (part of the DP update).
    """

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[np.dtype, ...]
    floating: tuple[bool, ...]

    @classmethod
    def of(cls, record: ArrayRecord) -> Layout:
        arrays = record.to_numpy_ndarrays()
        return cls(
            tuple(record.keys()),
            tuple(tuple(a.shape) for a in arrays),
            tuple(a.dtype for a in arrays),
            tuple(bool(np.issubdtype(a.dtype, np.floating)) for a in arrays),
        )

    @property
    def dim(self) -> int:
        """``d``: the number of floating-point parameters."""
        return int(sum(int(np.prod(s)) for s, f in zip(self.shapes, self.floating) if f))

    def flatten(self, record: ArrayRecord) -> np.ndarray | None:
        """The record's floating-point arrays as one float32 vector of length :attr:`dim`, or
        None when the record does not have this layout (other keys or shapes, a floating array
        turned into an integer one) — a malformed reply, dropped by the caller."""
        if tuple(record.keys()) != self.names:
            return None
        parts = []
        for a, shape, floating in zip(record.to_numpy_ndarrays(), self.shapes, self.floating):
            if tuple(a.shape) != shape:
                return None
            if floating:
                if not np.issubdtype(a.dtype, np.floating):
                    return None
                with np.errstate(over="ignore", invalid="ignore"):
                    parts.append(np.asarray(a, dtype=np.float32).ravel())
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)

    def unflatten(self, flat: torch.Tensor | np.ndarray, like: ArrayRecord) -> ArrayRecord:
        """An ``ArrayRecord`` with this layout: the floating arrays from ``flat`` (cast back to
        each array's dtype), every other array copied from ``like`` in this layout's dtype
        (FedAvg's averaging turns an integer buffer into float64; the layout keeps the first)."""
        v = flat.detach().cpu().numpy() if isinstance(flat, torch.Tensor) else np.asarray(flat)
        if v.shape != (self.dim,):
            raise FedsimError(f"a flat model of {v.shape} does not fit this layout of {self.dim} parameters")
        base = like.to_numpy_ndarrays()
        out: dict[str, Array] = {}
        i = 0
        for name, shape, dtype, floating, b in zip(self.names, self.shapes, self.dtypes, self.floating, base):
            if floating:
                n = int(np.prod(shape))
                out[name] = Array(np.ascontiguousarray(v[i : i + n].reshape(shape).astype(dtype)))
                i += n
            else:
                out[name] = Array(np.array(b, dtype=dtype, copy=True))  # the wrapped strategy may cast it
        return ArrayRecord(out)
