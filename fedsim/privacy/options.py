"""Checks of the options shared by the factorization optimisers (banded, BLT)."""

from __future__ import annotations

from fedsim.errors import FedsimError


def check_optimizer_options(objective: str, tol: float, max_iter: int) -> None:
    """Raise :class:`FedsimError` unless ``objective`` is ``"total"`` or ``"max"``, ``tol`` is a
    positive number and ``max_iter`` an integer ≥ 1."""
    if objective not in ("total", "max"):
        raise FedsimError(f'objective must be "total" or "max" (got {objective!r})')
    if not (isinstance(tol, (int, float)) and tol > 0):
        raise FedsimError(f"tol must be a positive number (got {tol!r})")
    if isinstance(max_iter, bool) or int(max_iter) != max_iter or int(max_iter) < 1:
        raise FedsimError(f"max_iter must be an integer ≥ 1 (got {max_iter!r})")
