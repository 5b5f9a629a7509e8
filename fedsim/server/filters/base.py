"""The common interface of server-side filters (docs/algorithms.md §6).

A filter post-processes the stream of noisy mean updates ``ĝ_0, ĝ_1, …`` one round at a
time, independently per coordinate. Every filter here is linear, so its whole effect on
the stream is captured by a lower-triangular matrix ``H`` with
``output_t = Σ_{s ≤ t} H[t, s] · input_s``; the server uses ``H`` to compute the exact
variance of the DP noise after the filter (DP-AdamBC's ``Φ_t``). Filtering is
post-processing: ε is unchanged.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from fedsim.errors import FedsimError
from fedsim.registry import ChoiceOptions, Registry

if TYPE_CHECKING:
    import torch
else:
    from fedsim._lazy import torch


def _check_update(update: torch.Tensor) -> None:
    if not isinstance(update, torch.Tensor) or not torch.is_floating_point(update):
        raise FedsimError(
            f"a filter needs a floating-point torch.Tensor update, got {type(update).__name__}"
            + (f" of dtype {update.dtype}" if isinstance(update, torch.Tensor) else "")
            + "; pass the flat float update ĝ_t"
        )


class Filter(ABC):
    """A linear, per-coordinate, causal filter of the update stream.

    Subclasses implement :meth:`step`, :meth:`impulse_response`, :meth:`state_dict` and
    :meth:`load_state_dict`. ``name`` identifies the filter in checkpoints.
    """

    name: str = "filter"

    def __init__(self) -> None:
        #: Number of updates consumed so far (the next call to :meth:`step` is round ``t``).
        self.t = 0

    @abstractmethod
    def step(self, update: torch.Tensor) -> torch.Tensor:
        """Filter one round's update.

        Parameters
        ----------
        update : the flat update ``ĝ_t`` of this round (any floating dtype, any device).
            It is not modified.

        Returns
        -------
        torch.Tensor
            The filtered update, a new tensor with the same shape, dtype and device.
        """

    @abstractmethod
    def impulse_response(self, n: int) -> np.ndarray:
        """The filter as a matrix on the first ``n`` rounds.

        Parameters
        ----------
        n : number of rounds (``n ≥ 0``).

        Returns
        -------
        np.ndarray
            ``H``, shape ``(n, n)``, float64, lower-triangular, with
            ``output_t = Σ_{s ≤ t} H[t, s] · input_s`` for every coordinate, counted from
            the filter's initial (zero-history) state.
        """

    def variance_gain(self, n: int) -> np.ndarray:
        """White-noise variance gain per round: ``Σ_s H[t, s]²`` for ``t < n``.

        Parameters
        ----------
        n : number of rounds.

        Returns
        -------
        np.ndarray
            Shape ``(n,)`` float64: the variance of ``output_t`` when the inputs are i.i.d.
            with unit variance.
        """
        h = self.impulse_response(n)
        return np.einsum("ts,ts->t", h, h)

    def variance_gain_row(self, t: int, noise_rows: np.ndarray | None = None) -> float:
        """Variance multiplier of round ``t``'s output for (possibly correlated) noise.

        Parameters
        ----------
        t : the round (``t ≥ 0``).
        noise_rows : ``M`` with the input noise ``n = M·Z`` (``Z`` i.i.d. unit variance),
            shape ``(≥ t+1, m)``; default None means independent unit noise (``M = I``).

        Returns
        -------
        float
            ``‖(H·M)[t, :]‖²``, the per-coordinate variance of the filtered noise at ``t``.
        """
        if t < 0:
            raise FedsimError(f"variance_gain_row needs a round t >= 0, got {t}")
        h = self.impulse_response(t + 1)[t]
        if noise_rows is None:
            return float(h @ h)
        row = h @ np.asarray(noise_rows, dtype=np.float64)[: t + 1]
        return float(row @ row)

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume the filter exactly (tensors are cloned)."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state from :meth:`state_dict`.

        Parameters
        ----------
        state : a dict produced by :meth:`state_dict` of a filter with the same settings.
        """

    def _check_state(self, state: dict[str, Any], expect: dict[str, Any]) -> None:
        if not isinstance(state, dict) or state.get("name") != self.name:
            got = state.get("name") if isinstance(state, dict) else type(state).__name__
            raise FedsimError(
                f"the checkpoint holds filter state for {got!r} but the config asks for {self.name!r}; "
                "resume with the same filter.name"
            )
        for key, value in expect.items():
            if state.get(key) != value:
                raise FedsimError(
                    f"the checkpoint's filter has {key} = {state.get(key)!r} but the config gives {value!r}; "
                    "resume with the same filter settings"
                )


class IdentityFilter(Filter):
    """``none``: passes the update through unchanged (``H = I``)."""

    name = "none"

    def step(self, update: torch.Tensor) -> torch.Tensor:
        """Return a copy of ``update`` (see :meth:`Filter.step`)."""
        _check_update(update)
        self.t += 1
        return update.clone()

    def impulse_response(self, n: int) -> np.ndarray:
        """The identity matrix (see :meth:`Filter.impulse_response`)."""
        return np.eye(int(n), dtype=np.float64)

    def state_dict(self) -> dict[str, Any]:
        """See :meth:`Filter.state_dict`."""
        return {"name": self.name, "t": self.t}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """See :meth:`Filter.load_state_dict`."""
        self._check_state(state, {})
        self.t = int(state["t"])


class FilterOptions(ChoiceOptions):
    """Base of every filter's options (the ``[filter]`` keys that belong to it); ``name`` is the
    discriminator, a ``Literal`` of the filter's registered name in each subclass."""

    name: str


@dataclass(frozen=True)
class FilterKind:
    """A registered server filter.

    Parameters
    ----------
    name : ``filter.name``.
    options : its options model.
    build : options → a fresh filter with zero history.
    summary : one line for the docs and ``--help``.
    """

    name: str
    options: type[FilterOptions]
    build: Callable[[Any], Filter]
    summary: str


#: The server filters, by ``filter.name``.
FILTERS: Registry[FilterKind] = Registry("server filter", "filter.name")


def register_filter(kind: FilterKind) -> FilterKind:
    """Register ``kind`` (its options' ``name`` must default to ``kind.name``)."""
    return FILTERS.add(kind.name, kind, options=kind.options)


class NoFilterOptions(FilterOptions):
    """``filter.name = "none"``: no options."""

    name: Literal["none"] = "none"


register_filter(FilterKind("none", NoFilterOptions, lambda o: IdentityFilter(), "no filter (the identity)"))
