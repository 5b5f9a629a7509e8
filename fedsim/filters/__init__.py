"""Server-side filters of the noisy mean update ``ĝ_t`` (docs/algorithms.md §6).

Use :func:`make_filter`; every filter has ``step(update)``, ``impulse_response(n)``,
``variance_gain(n)``, ``variance_gain_row(t)``, ``state_dict()`` and ``load_state_dict()``.
"""

from __future__ import annotations

from typing import Any

from fedsim.errors import FedsimError
from fedsim.filters.base import Filter, IdentityFilter
from fedsim.filters.doppler import DEFAULT_PRESET, PRESETS, DopplerFilter, validate_coefficients
from fedsim.filters.ema import DISK_MODES, DiskFilter, EMAFilter

__all__ = [
    "DEFAULT_PRESET",
    "DISK_MODES",
    "FILTERS",
    "PRESETS",
    "DiskFilter",
    "DopplerFilter",
    "EMAFilter",
    "Filter",
    "IdentityFilter",
    "make_filter",
    "validate_coefficients",
]

#: Filter names accepted by :func:`make_filter` and the parameters each takes.
FILTERS: dict[str, tuple[type[Filter], tuple[str, ...]]] = {
    "none": (IdentityFilter, ()),
    "ema": (EMAFilter, ("kappa",)),
    "doppler": (DopplerFilter, ("preset", "b", "a")),
    "disk": (DiskFilter, ("mode", "kappa", "gamma")),
}


def make_filter(name: str, **params: Any) -> Filter:
    """Build a server-side filter by name.

    Parameters
    ----------
    name : ``none`` (identity), ``ema``, ``doppler`` or ``disk``.
    **params : the filter's settings; parameters given as None take their defaults.

        - ``ema``: ``kappa`` (default 0.7).
        - ``doppler``: ``preset`` (default ``first_order_v1``), or ``b`` and ``a``
          (``a`` without the leading 1).
        - ``disk``: ``mode`` (``two_point`` default, ``lookahead``, ``ema``), ``kappa``
          (0.7), ``gamma`` (0.5; derived as ``(1−κ)/κ`` in ``lookahead``).

    Returns
    -------
    Filter
        A fresh filter with zero history.

    Raises
    ------
    FedsimError
        For an unknown name, a parameter the filter does not take, or invalid settings.
    """
    if name not in FILTERS:
        raise FedsimError(f"filter.name = {name!r} is unknown; use one of {', '.join(FILTERS)}")
    cls, allowed = FILTERS[name]
    extra = sorted(set(params) - set(allowed))
    if extra:
        raise FedsimError(
            f"filter {name!r} does not take {', '.join(extra)}; its parameters are "
            f"{', '.join(allowed) if allowed else 'none'}"
        )
    kwargs = {k: v for k, v in params.items() if v is not None}
    if name == "doppler" and "b" in kwargs:
        kwargs.pop("preset", None)
    return cls(**kwargs)
