"""How ε and δ are written for people: rounded up, never down.

A printed (ε, δ) is a claim that the run is at least that private. Rounding to nearest can print
a number below the accounted one (ε = 8.8434 as ``8.843``, δ = 0.01726 as ``1.7e-02``), which
claims more privacy than was accounted. So every ε or δ fedsim prints or logs as a rounded number
goes through :func:`format_epsilon` / :func:`format_delta` (rounded up at the shown precision)
or :func:`epsilon_float32` (the least float32 not below it, for tools that store float32).
"""

from __future__ import annotations

import math
from decimal import ROUND_CEILING, Decimal

import numpy as np


def format_epsilon(eps: float | str | None, digits: int = 3, style: str = "f", none: str = "–") -> str:
    """``eps`` rounded up to ``digits`` places, as text.

    Parameters
    ----------
    eps : the ε (a float; ``"inf"`` or ``math.inf`` print as ``inf``; a string is printed as it
        is; None prints ``none``).
    digits : decimal places (``style = "f"``), significant digits (``"g"``) or mantissa decimals
        (``"e"``). Default 3.
    style : ``"f"`` (fixed point, as ``format(x, ".3f")``), ``"g"`` (significant digits, as
        ``format(x, ".3g")``) or ``"e"`` (as ``format(x, ".1e")``). Default ``"f"``.
    none : the text for a missing ε. Default ``"–"``.

    The result, read back as a number, is never below ``eps`` (the decimal value of the float,
    exactly: ``Decimal`` sees its shortest round-trip digits).
    """
    if eps is None:
        return none
    if isinstance(eps, str):
        return eps
    x = float(eps)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if style not in ("f", "g", "e"):
        raise ValueError(f"style must be 'f', 'g' or 'e', got {style!r}")
    d = Decimal(repr(x))
    if x == 0:
        return format(0.0, f".{digits}{style}")
    if style == "f":
        q = d.quantize(Decimal(1).scaleb(-digits), rounding=ROUND_CEILING)
        return format(q, "f")
    sig = digits if style == "g" else digits + 1
    q = d.quantize(Decimal(1).scaleb(d.adjusted() - sig + 1), rounding=ROUND_CEILING)
    return format(float(q), f".{digits}{style}")


def format_delta(delta: float | None, digits: int = 3, style: str = "g", none: str = "–") -> str:
    """``delta`` rounded up to ``digits`` significant digits (``style = "g"``, default) or
    mantissa decimals (``"e"``), as text; see :func:`format_epsilon`."""
    return format_epsilon(delta, digits, style, none)


def epsilon_float32(eps: float) -> float:
    """The least float32 value not below ``eps`` (what a float32 store keeps of an upper bound
    without lowering it); inf and nan pass through."""
    x = float(eps)
    if not math.isfinite(x):
        return x
    f = np.float32(x)
    if float(f) < x:
        f = np.nextafter(f, np.float32(np.inf))
    return float(f)
