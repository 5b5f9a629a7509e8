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


def clip_vector(
    v: torch.Tensor, clip_norm: float, sent_as: torch.dtype | None = None, stability: float | None = None
) -> tuple[torch.Tensor, float]:
    """Return ``(clip(v, c), ‖v‖₂)``; with ``stability`` ``r``, automatic clipping
    ``c·v/(‖v‖ + r)`` instead (:func:`clip_scale`).

    The scale is computed in float64 and shrunk by a few ulps of ``v``'s dtype, so
    that the result's norm never exceeds ``clip_norm`` after rounding. A vector that is not
    finite (a NaN or an infinity anywhere) is mapped to zeros and its norm reported as ``inf``:
    it contributes nothing, and the caller can count it (:func:`is_finite_norm`).

    Parameters
    ----------
    v : flat tensor (any float dtype); not modified.
    clip_norm : ``c`` > 0, the L2 bound.
    sent_as : the dtype the result will be rounded to before it is summed (None: ``v``'s own).
        The margin is that of the coarser of the two, so a float64 result cast to float32
        still has norm at most ``c``. Default None.
    stability : ``r`` > 0 of automatic clipping (Bu et al., NeurIPS 2023): every vector is scaled
        to ``c·v/(‖v‖ + r)``, norm below ``c``, small ones scaled up. None (default): flat clipping.
    """
    if clip_norm <= 0:
        raise ValueError("clip_norm must be > 0")
    norm = l2_norm(v)
    # ‖v‖ is accumulated in float64, so it is finite exactly when every entry is: a NaN or an
    # infinity anywhere makes it NaN or inf, and float32/16 entries cannot overflow a float64
    # sum of squares. (An entrywise isfinite pass cost three times the norm: 9 ms on 4M floats.)
    if not math.isfinite(norm):
        return torch.zeros_like(v), math.inf
    scale = clip_scale(norm, clip_norm, v.dtype, sent_as, stability)
    if scale == 1.0:
        return v, norm
    return scaled(v, scale), norm


def scaled(v: torch.Tensor, scale: float) -> torch.Tensor:
    """``v · scale`` with every product correctly rounded in ``v``'s dtype.

    torch multiplies a tensor by a Python float in the tensor's own type. Where ``scale`` is
    below that type's smallest normal number (float32: 1.18e-38; ``c/‖v‖`` for entries near
    float32's maximum), the scale itself would be rounded to a subnormal with a relative error far
    above the clip's margin (measured: ‖sent‖ = 1.73·c at c = 1e-6). Only then is the product
    taken in float64 and rounded once to ``v``'s dtype.

    Parameters
    ----------
    v : the tensor (any float dtype); not modified.
    scale : the factor, in (0, 1].
    """
    if v.dtype != torch.float64 and scale < torch.finfo(v.dtype).tiny:
        return (v.to(torch.float64) * scale).to(v.dtype)
    return v * scale


def _eps(dtype: torch.dtype | None) -> float:
    return torch.finfo(dtype).eps if dtype is not None and dtype.is_floating_point else 2.0**-23


def clip_scale(
    norm: float,
    clip_norm: float,
    dtype: torch.dtype,
    sent_as: torch.dtype | None = None,
    stability: float | None = None,
) -> float:
    """The factor that clips a vector of finite float64 norm ``norm`` > ``clip_norm`` of entries of
    ``dtype``: ``(c / norm)`` shrunk by ``4·eps`` of the dtype (or of ``sent_as``, the dtype the
    result is later rounded to, where that is coarser), so that the product's norm stays at most
    ``c`` after that rounding (1.0 where nothing is clipped). Where ``sent_as`` is coarser, a
    vector within ``4·eps`` below ``c`` is scaled too: its rounding could carry it above ``c``.
    With ``stability`` ``r`` (automatic clipping) every vector is scaled, by ``c/(norm + r)``
    shrunk the same way: the product's norm ``c·norm/(norm + r)`` is below ``c``."""
    if norm == 0.0:
        return 1.0
    coarser = sent_as is not None and _eps(sent_as) > _eps(dtype)
    eps = _eps(sent_as) if coarser else _eps(dtype)
    if stability is not None:
        return (clip_norm / (norm + stability)) * (1.0 - 4.0 * eps)
    if norm <= clip_norm and not coarser:
        return 1.0
    return min(1.0, (clip_norm / norm) * (1.0 - 4.0 * eps))


def is_finite_norm(norm: float) -> bool:
    """Whether :func:`clip_vector` saw a finite vector (it reports ``inf`` for one that was not)."""
    return math.isfinite(norm)


def row_norms(rows: torch.Tensor) -> torch.Tensor:
    """The float64 L2 norm of each row of a ``(U, d)`` tensor, as :func:`l2_norm` computes it
    for one row: rows shorter than :data:`NORM_BLOCK` are widened and reduced together, as many
    at a time as fit one block (so the float64 copy stays as small as :func:`l2_norm`'s), longer
    rows one by one."""
    d = rows.shape[1]
    if d > NORM_BLOCK:
        return torch.tensor([l2_norm(r) for r in rows], dtype=torch.float64)
    per_block = max(1, NORM_BLOCK // max(1, d))
    flat = rows.detach()
    parts = [
        torch.linalg.vector_norm(flat[i : i + per_block].to(torch.float64), dim=1)
        for i in range(0, flat.shape[0], per_block)
    ]
    return torch.cat(parts).cpu() if parts else torch.zeros(0, dtype=torch.float64)


def clip_rows(
    rows: torch.Tensor, clip_norm: float, sent_as: torch.dtype | None = None, stability: float | None = None
) -> tuple[torch.Tensor, list[float]]:
    """:func:`clip_vector` on each row of a ``(U, d)`` tensor at once: ``(clipped rows, norms)``.

    Each row gets the scale :func:`clip_vector` would give it (computed in float64 from the
    row's own norm, shrunk by ``4·eps`` of the dtype), so every clipped row's norm is at most
    ``clip_norm`` after rounding; a row that is not finite becomes zeros with norm ``inf``.
    The rows are scaled together (one multiplication instead of ``U``), which is what makes this
    cheaper than a loop for many small rows.

    Parameters
    ----------
    rows : ``(U, d)`` float tensor, one flat vector per row (on any device); not modified.
    clip_norm : ``c`` > 0, the L2 bound.
    sent_as : as in :func:`clip_vector`. Default None.
    stability : as in :func:`clip_vector` (automatic clipping). Default None.
    """
    if clip_norm <= 0:
        raise ValueError("clip_norm must be > 0")
    norms = row_norms(rows).tolist()
    scales = [clip_scale(n, clip_norm, rows.dtype, sent_as, stability) if math.isfinite(n) else 0.0 for n in norms]
    # A Python-float scale multiplies a row in the row's arithmetic type (float32 for float32
    # and the half types, which torch computes in float32 and rounds back; float64 for float64):
    # the scales are cast the same way, so each row gets clip_vector's bits.
    wide = torch.float64 if rows.dtype == torch.float64 else torch.float32
    factor = torch.tensor(scales, dtype=torch.float64).to(wide).to(rows.device).unsqueeze(1)
    out = (rows.to(wide) * factor).to(rows.dtype) if rows.dtype != wide else rows * factor
    for i, f in enumerate(scales):  # a factor below the type's smallest normal: as `scaled` does it
        if 0.0 < f < 1.0 and f < torch.finfo(rows.dtype).tiny:
            out[i] = scaled(rows[i], f)
    bad = [i for i, n in enumerate(norms) if not math.isfinite(n)]
    if bad:  # NaN·0 is NaN: a non-finite row is set to zeros, not scaled
        out[bad] = 0.0
    return out, [n if math.isfinite(n) else math.inf for n in norms]
