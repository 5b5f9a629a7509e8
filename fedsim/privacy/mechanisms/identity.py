"""``identity``: ``C = I``, ``B = A`` — DP-SGD without amplification, as a factorization
(accounted as one Gaussian mechanism over the run, under any bounded scheme)."""

from __future__ import annotations

from typing import Literal

import numpy as np

from fedsim.privacy.factorizations import Factorization, check_workload
from fedsim.privacy.mechanisms.base import DenseStrategy, Mechanism, MechanismOptions, MFOptions, Strategy
from fedsim.privacy.mechanisms.registry import register
from fedsim.privacy.participation import ParticipationScheme
from fedsim.privacy.stream import NoiseStream


def identity(A: np.ndarray) -> Factorization:
    """DP-SGD without amplification: ``C = I``, ``B = A``.

    Parameters
    ----------
    A : np.ndarray
        The ``n×n`` lower-triangular workload.

    Returns
    -------
    Factorization
        With ``loss = ‖A‖_F²`` (``n(n+1)/2`` for the prefix sum).
    """
    A = check_workload(A)
    n = A.shape[0]
    return Factorization("identity", A, np.eye(n), A.copy(), {})


class IdentityOptions(MFOptions):
    """``privacy.mechanism = "identity"``: only the shared ``workload``."""

    mechanism: Literal["identity"] = "identity"


class IdentityStrategy(DenseStrategy):
    """``C = I``; its noise is ``n_t = ξ_t`` (streamed as a one-band matrix)."""

    def stream(self, sens: float, name: str) -> NoiseStream:
        from fedsim.privacy.mechanisms.banded import BandedStream

        return BandedStream(self.C, sens, name=name)


@register
class Identity(Mechanism):
    name = "identity"
    options = IdentityOptions
    summary = "C = I: DP-SGD without amplification, under any bounded scheme"

    def strategy(self, opts: MechanismOptions, A: np.ndarray, scheme: ParticipationScheme) -> Strategy:
        return IdentityStrategy.of(identity(A))
