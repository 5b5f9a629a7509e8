"""The shared machinery of matrix factorizations ``A = B·C`` (MF-DP-FTRL).

docs/algorithms.md §3 is the specification. A workload ``A`` (``n×n``,
lower-triangular, see :mod:`fedsim.privacy.workloads`) is factorized into a strategy
(encoder) ``C`` and a decoder ``B`` with ``B·C = A``. The server adds
``c · z · sens(C) · n_t`` to round ``t``'s summed update, where ``n_t`` is row ``t`` of
``A⁻¹·B·Z`` (:meth:`Factorization.noising_matrix`; this is ``C⁻¹·Z`` when ``C`` is
square) and ``Z`` holds i.i.d. standard normals. Everything here is float64
numpy/scipy; nothing touches torch.

This module holds what the families share: the :class:`Factorization` result, the checks of a
workload, and the on-disk cache of the iterative families. The families themselves are one
module each in :mod:`fedsim.privacy.mechanisms` (``identity``, ``tree``, ``sqrt``, ``dense``,
``dpmf_plus``, ``banded``, ``blt``, ``bsr``, ``bisr``); all satisfy ``B·C = A`` to ~1e-12
relative (tests demand 1e-8). The on-disk cache stores only the iterative families; closed
forms are cheaper to rebuild than to read.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import scipy.linalg

from fedsim.errors import FedsimError

__all__ = [
    "CACHE_STATS",
    "CODE_VERSION",
    "Factorization",
    "cache_dir",
    "cache_key",
    "cached",
    "check_workload",
    "right_divide_lower",
]

#: Bump when any construction below changes its output: it is part of every cache key.
CODE_VERSION = "1"


#: Counters of the on-disk cache in this process (``hits``, ``misses``, ``writes``).
CACHE_STATS: dict[str, int] = {"hits": 0, "misses": 0, "writes": 0}


# --------------------------------------------------------------------------- result type


@dataclass(eq=False)
class Factorization:
    """A factorization ``A = B·C`` and how it was obtained.

    Parameters
    ----------
    name : str
        Mechanism that produced it (``"identity"``, ``"tree"``, ``"sqrt"``, ``"dense"``,
        ``"dpmf_plus"``).
    A : np.ndarray
        The ``n×n`` workload.
    C : np.ndarray
        The ``m×n`` strategy (encoder); ``m = n`` except for ``tree`` (``m = 2n − 1``).
    B : np.ndarray
        The ``n×m`` decoder, with ``B·C = A``.
    info : dict
        Construction details, JSON-serialisable (e.g. ``iterations``, ``seconds``,
        ``converged``, ``tolerance``, ``estimator``, ``tau``, ``cache``). Default empty.
    """

    name: str
    A: np.ndarray
    C: np.ndarray
    B: np.ndarray
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def n(self) -> int:
        """Number of rounds (rows of ``A``)."""
        return int(self.A.shape[0])

    def column_norms(self) -> np.ndarray:
        """L2 norms of the columns of ``C`` (length ``n``)."""
        return np.asarray(np.linalg.norm(self.C, axis=0))

    def sensitivity(self) -> float:
        """Single-participation sensitivity ``max_j ‖C[:, j]‖``."""
        return float(np.max(self.column_norms()))

    def noising_matrix(self) -> np.ndarray:
        """``A⁻¹·B`` (``n×m``): the per-round noise is ``n_t = (A⁻¹·B·Z)_t``, ``Z`` ``m×d``.

        Equals ``C⁻¹`` when ``C`` is square. With it, running the unchanged optimizer on
        ``ĝ_t = g_t + n_t`` releases ``A·G + B·Z``.
        """
        if np.array_equal(self.A, np.tril(self.A)):
            return np.asarray(scipy.linalg.solve_triangular(self.A, self.B, lower=True))
        return np.linalg.solve(self.A, self.B)

    def _sens2(self, sens: float | None) -> float:
        s = self.sensitivity() if sens is None else float(sens)
        return s * s

    def loss(self, sens: float | None = None) -> float:
        """Total squared error of all releases, ``sens² · ‖B‖_F²``, in units of ``(c·z)²``.

        Parameters
        ----------
        sens : float or None, optional
            Sensitivity of ``C`` under the run's participation scheme. Default ``None``
            uses the single-participation sensitivity :meth:`sensitivity`.
        """
        return self._sens2(sens) * float(np.sum(self.B * self.B))

    def max_error(self, sens: float | None = None) -> float:
        """Worst single-release squared error, ``sens² · max_t ‖B[t, :]‖²``.

        Parameters
        ----------
        sens : float or None, optional
            Sensitivity of ``C``; default ``None`` = single participation.
        """
        return self._sens2(sens) * float(np.max(np.sum(self.B * self.B, axis=1)))

    def final_error(self, sens: float | None = None) -> float:
        """Squared error of the last release, ``sens² · ‖B[n−1, :]‖²`` (DP-MF+'s target).

        Parameters
        ----------
        sens : float or None, optional
            Sensitivity of ``C``; default ``None`` = single participation.
        """
        return self._sens2(sens) * float(np.sum(self.B[-1] * self.B[-1]))

    def residual(self) -> float:
        """Relative reconstruction error ``‖B·C − A‖_F / ‖A‖_F``."""
        return float(np.linalg.norm(self.B @ self.C - self.A) / np.linalg.norm(self.A))


# --------------------------------------------------------------------------- helpers


def check_workload(A: np.ndarray) -> np.ndarray:
    """Validate a workload: square, finite, lower-triangular, invertible. Returns float64."""
    try:
        arr = np.asarray(A, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise FedsimError(
            f"the workload A must be a numeric n×n matrix ({exc}); build it with fedsim.privacy.workloads.make_workload"
        ) from exc
    if arr.ndim != 2 or arr.shape[0] != arr.shape[1] or arr.shape[0] < 1:
        raise FedsimError(f"the workload A must be a non-empty square n×n matrix, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise FedsimError("the workload A contains NaN or infinite entries; fix its parameters")
    if np.any(np.triu(arr, 1) != 0.0):
        raise FedsimError(
            "the workload A must be lower-triangular (round t may only use gradients of "
            "rounds ≤ t); build it with fedsim.privacy.workloads.make_workload"
        )
    if np.any(np.diag(arr) == 0.0):
        raise FedsimError(
            "the workload A is singular (a zero on its diagonal, e.g. a zero learning "
            "rate); give every round a non-zero learning rate"
        )
    return arr


def right_divide_lower(A: np.ndarray, C: np.ndarray) -> np.ndarray:
    """``A·C⁻¹`` for lower-triangular ``C`` by a triangular solve (``Cᵀ·Bᵀ = Aᵀ``)."""
    return np.asarray(scipy.linalg.solve_triangular(C, A.T, trans="T", lower=True).T)


# --------------------------------------------------------------------------- disk cache


def cache_dir() -> Path:
    """Folder of cached factorizations: ``$FEDSIM_CACHE/factorizations``.

    ``$FEDSIM_CACHE`` defaults to ``~/.cache/fedsim``; read at every call.
    """
    root = os.environ.get("FEDSIM_CACHE") or str(Path.home() / ".cache" / "fedsim")
    return Path(root) / "factorizations"


def _key_part(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        arr = np.ascontiguousarray(value)
        return {
            "dtype": arr.dtype.str,
            "shape": list(arr.shape),
            "sha256": hashlib.sha256(arr.tobytes()).hexdigest(),
        }
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return value.item()
    if isinstance(value, float):
        return repr(value)  # exact, so 1e-10 and 1.0000000001e-10 differ
    return value


def cache_key(name: str, **key: Any) -> str:
    """Hex digest identifying a computation: ``name``, every ``key`` item and ``CODE_VERSION``.

    Parameters
    ----------
    name : str
        Mechanism name.
    **key
        Every input of the computation; arrays are hashed by dtype, shape and bytes,
        floats by their exact ``repr``.
    """
    payload = {"name": name, "code_version": CODE_VERSION}
    payload.update({k: _key_part(v) for k, v in key.items()})
    blob = json.dumps(payload, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()


def _json_default(value: Any) -> Any:
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return value.item()
    return str(value)


def cached(
    name: str,
    compute_fn: Callable[[], Factorization],
    **key: Any,
) -> Factorization:
    """Return ``compute_fn()``, memoised on disk under :func:`cache_dir`.

    The file is ``<name>-<digest>.npz`` with the digest from :func:`cache_key`; it is
    written to a temporary file in the same folder and moved into place with
    ``os.replace`` (atomic). An unreadable file is recomputed and overwritten; an
    unwritable folder only warns. ``info["cache"]`` is ``"hit"`` or ``"miss"`` and
    :data:`CACHE_STATS` counts both.

    Parameters
    ----------
    name : str
        Mechanism name (part of the key and the file name).
    compute_fn : callable
        Computes the factorization on a miss; takes no arguments.
    **key
        Every input that determines the result (workload, ``tol``, ``tau``, ...).
    """
    digest = cache_key(name, **key)
    folder = cache_dir()
    path = folder / f"{name}-{digest[:32]}.npz"
    if path.exists():
        try:
            with np.load(path, allow_pickle=False) as data:
                info = json.loads(str(data["info"]))
                fact = Factorization(str(data["name"]), data["A"].copy(), data["C"].copy(), data["B"].copy(), info)
            if info.get("cache_key") == digest:
                CACHE_STATS["hits"] += 1
                fact.info["cache"] = "hit"
                fact.info["cache_file"] = str(path)
                return fact
        except Exception as exc:  # corrupt or foreign file: recompute
            warnings.warn(f"ignoring unreadable cache file {path}: {exc}", stacklevel=2)
    CACHE_STATS["misses"] += 1
    fact = compute_fn()
    fact.info["cache_key"] = digest
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}-", suffix=".npz.tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                np.savez(
                    fh,
                    name=np.array(fact.name),
                    A=fact.A,
                    C=fact.C,
                    B=fact.B,
                    info=np.array(json.dumps(fact.info, default=_json_default)),
                )
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
            CACHE_STATS["writes"] += 1
            fact.info["cache_file"] = str(path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except OSError as exc:
        warnings.warn(f"could not write factorization cache {path}: {exc}", stacklevel=2)
    fact.info["cache"] = "miss"
    return fact
