"""The one streaming-noise abstraction: a mechanism is a :class:`NoiseStream`.

A stream turns the standard normal rows ``ξ_0, ξ_1, …`` of ``Z`` into the mechanism's noise
rows ``n_t = (M·Z)_t`` (``M = C⁻¹`` for a square strategy ``C``), one round at a time. It never
draws randomness itself: it asks ``draw(j)`` for ``ξ_j`` (the wrapper,
:class:`fedsim.privacy.noise.NoiseMechanism`, derives it from the run's key), so the same
stream with the same draws gives the same rows, bit for bit. Its state is explicit:
:meth:`NoiseStream.state_dict` holds everything needed to continue mid-stream.

Families: independent Gaussian and no noise (:mod:`fedsim.privacy.noise`), any noising matrix
(tree, sqrt, dense, DP-MF+; :class:`fedsim.privacy.noise.MatrixStream`), banded
(:class:`fedsim.privacy.mechanisms.banded.BandedStream`, a ring of ``b − 1`` rows) and BLT
(:class:`fedsim.privacy.mechanisms.blt.BLTStream`, ``m`` buffers). Each mechanism's strategy
object makes its stream (:meth:`fedsim.privacy.mechanisms.base.Strategy.stream`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
else:
    from fedsim._lazy import torch


#: ``draw(j)``: the standard normal row ``ξ_j`` of ``Z`` (float32, shape ``(d,)``, on the
#: stream's device), a pure function of the run's key and ``j``.
Draw = Callable[[int], "torch.Tensor"]


class NoiseStream(ABC):
    """A mechanism's noise, streamed.

    Parameters
    ----------
    sens : ``sens(C)``, the L2 sensitivity of the strategy under the run's scheme (1 for
        independent noise).
    name : the mechanism's name (checkpoints and messages).
    """

    #: whether rounds must be drawn in order ``0, 1, …`` (streams that keep past rows).
    in_order: bool = False

    def __init__(self, sens: float = 1.0, name: str = "stream") -> None:
        self.sensitivity = float(sens)
        self.name = name
        self.dim = 0
        self.device = torch.device("cpu")

    def bind(self, dim: int, device: torch.device) -> None:
        """Fix the row length ``d`` and the device the rows live on (before the first step)."""
        self.dim, self.device = int(dim), device

    def next_round(self) -> int | None:
        """The round the next :meth:`step` must be (None: any round, for streams without state)."""
        return None

    @abstractmethod
    def step(self, t: int, draw: Draw) -> torch.Tensor:
        """Noise row ``n_t`` (float32, shape ``(d,)``); advances the state of in-order streams."""

    def row_variance(self, t: int) -> float:
        """Per-coordinate variance of ``n_t``: ``‖row_t(M)‖²`` (1 for independent noise)."""
        return 1.0

    def draws_ahead(self) -> bool:
        """Whether the next round will ask for a new row of ``Z`` (worth drawing in the
        background while the round trains). Default True."""
        return True

    def set_scratch(self, folder: Path | None) -> None:
        """Where the stream may keep working files as secret as the key (a noise table,
        :class:`fedsim.privacy.noise.MatrixStream`); streams that keep none ignore it."""
        del folder

    def close(self) -> None:  # noqa: B027 - a hook; most streams keep no files
        """Delete any working files (the run ended); streams that keep none do nothing."""

    def state_dict(self) -> dict[str, Any]:
        """The stream's state (besides the key, which the wrapper keeps)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict` (after :meth:`bind`); streams without state ignore it."""
        del state
