"""Helpers the dense-family solvers share: the lower-triangular factor of a strategy's Gram
matrix, and the torch device a solver runs on."""

from __future__ import annotations

from typing import Any

import numpy as np

from fedsim.errors import FedsimError


def lower_factor(X: np.ndarray) -> np.ndarray:
    """Lower-triangular ``C`` with ``CᵀC = X``: ``C = J·Lᵀ·J`` with ``L = chol(J·X·J)``."""
    JXJ = X[::-1, ::-1]
    JXJ = 0.5 * (JXJ + JXJ.T)
    try:
        L = np.linalg.cholesky(JXJ)
    except np.linalg.LinAlgError as exc:  # pragma: no cover - only for singular workloads
        raise FedsimError(
            "the optimal strategy is numerically singular (the workload is too "
            "ill-conditioned); use fewer rounds or a better-conditioned schedule"
        ) from exc
    return np.tril(L.T[::-1, ::-1])


def torch_device(device: str) -> Any:
    """The ``torch.device`` of ``privacy.factorize_device``; a clear error for a name torch does not
    know or for ``cuda`` without a GPU."""
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise FedsimError(f"factorization device {device!r} is not a torch device; use 'cpu' or 'cuda'") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise FedsimError(
            f"factorization device {device!r} asked for, but torch sees no CUDA GPU; "
            "leave the device unset (numpy on the CPU) or run on a GPU machine"
        )
    return dev
