"""Flat L2 clipping: ``clip(v, c) = v · min(1, c / ‖v‖₂)`` on the whole vector."""

from __future__ import annotations

import math

import torch

#: elements per float64 block of :func:`l2_norm`: a 2 MiB buffer that stays in cache.
NORM_BLOCK = 1 << 18


def l2_norm(v: torch.Tensor) -> float:
    """L2 norm of a tensor's entries, accumulated in float64 (exact enough to certify a bound).

    The entries are widened block by block into one reused float64 buffer of
    :data:`NORM_BLOCK` entries, not all at once: a 4M-entry update would otherwise allocate and
    fill a 32 MB copy for every user and every reply. The sum of squares is NaN or infinite
    exactly when an entry is (float32 squares cannot overflow a float64 sum)."""
    flat = v.detach().reshape(-1)
    if flat.numel() <= NORM_BLOCK:
        return float(torch.linalg.vector_norm(flat.to(torch.float64)))
    buf = torch.empty(NORM_BLOCK, dtype=torch.float64, device=flat.device)
    total = torch.zeros((), dtype=torch.float64, device=flat.device)
    for start in range(0, flat.numel(), NORM_BLOCK):
        part = flat[start : start + NORM_BLOCK]
        block = buf[: part.numel()]
        block.copy_(part)
        total += torch.dot(block, block)
    return float(total.sqrt())


def clip_vector(v: torch.Tensor, clip_norm: float) -> tuple[torch.Tensor, float]:
    """Return ``(clip(v, c), ‖v‖₂)``.

    The scale is computed in float64 and shrunk by a few ulps of ``v``'s dtype, so
    that the result's norm never exceeds ``clip_norm`` after rounding. A vector that is not
    finite (a NaN or an infinity anywhere) is mapped to zeros and its norm reported as ``inf``:
    it contributes nothing, and the caller can count it (:func:`is_finite_norm`).

    Parameters
    ----------
    v : flat tensor (any float dtype); not modified.
    clip_norm : ``c`` > 0, the L2 bound.
    """
    if clip_norm <= 0:
        raise ValueError("clip_norm must be > 0")
    norm = l2_norm(v)
    # ‖v‖ is accumulated in float64, so it is finite exactly when every entry is: a NaN or an
    # infinity anywhere makes it NaN or inf, and float32/16 entries cannot overflow a float64
    # sum of squares. (An entrywise isfinite pass cost three times the norm: 9 ms on 4M floats.)
    if not math.isfinite(norm):
        return torch.zeros_like(v), math.inf
    if norm <= clip_norm or norm == 0.0:
        return v, norm
    eps = torch.finfo(v.dtype).eps if v.dtype.is_floating_point else 2.0**-23
    scale = (clip_norm / norm) * (1.0 - 4.0 * eps)
    return v * scale, norm


def is_finite_norm(norm: float) -> bool:
    """Whether :func:`clip_vector` saw a finite vector (it reports ``inf`` for one that was not)."""
    return math.isfinite(norm)
