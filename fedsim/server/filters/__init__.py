"""Server-side filters of the noisy mean update ``ĝ_t`` (docs/algorithms.md §6).

Every filter registers itself in :data:`FILTERS` with its options model; use :func:`make_filter`
(by name) or a :class:`FilterKind`'s ``build`` (from validated options). Every filter has
``step(update)``, ``impulse_response(n)``, ``variance_gain(n)``, ``variance_gain_row(t)``,
``state_dict()`` and ``load_state_dict()``.
"""

from __future__ import annotations

from typing import Any

from fedsim.registry import validate_options
from fedsim.server.filters.base import FILTERS, Filter, FilterKind, FilterOptions, IdentityFilter, register_filter
from fedsim.server.filters.doppler import DEFAULT_PRESET, PRESETS, DopplerFilter, validate_coefficients
from fedsim.server.filters.ema import DISK_MODES, DiskFilter, EMAFilter

__all__ = [
    "DEFAULT_PRESET",
    "DISK_MODES",
    "FILTERS",
    "PRESETS",
    "DiskFilter",
    "DopplerFilter",
    "EMAFilter",
    "Filter",
    "FilterKind",
    "FilterOptions",
    "IdentityFilter",
    "make_filter",
    "register_filter",
    "validate_coefficients",
]


def make_filter(name: str, **params: Any) -> Filter:
    """Build a registered server-side filter by name.

    Parameters
    ----------
    name : a registered filter (``none``, ``ema``, ``doppler``, ``disk``, …).
    **params : the filter's options; parameters given as None take their defaults.

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
    kind = FILTERS.get_part(name)
    values = {k: list(v) if isinstance(v, tuple) or getattr(v, "ndim", 0) > 0 else v for k, v in params.items()}
    opts = validate_options(kind.options, {"name": name, **values}, f"filter {name!r}", "filter")
    return kind.build(opts)
