"""Server-side guard and running sum of client replies (docs/algorithms.md §1, step 2–3).

A reply whose error-feedback payload (client states or residual sum) is missing or
malformed is dropped as ``bad_state``. These are node-level protocol faults: fedsim's own client
isolates its users (a failing or non-finite user contributes zero and is counted), so one user's
data never makes a reply invalid. Each reply carries the sum of the clipped updates of the ``m`` users the server
assigned to that node. The server never trusts it: a reply that is missing, not a
floating-point vector of length ``d``, or not finite is dropped and counted; a
reply whose norm exceeds ``m·c`` is re-clipped to ``m·c``. Only a running sum is
kept, never the individual replies.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import torch

from fedsim.privacy.clipping import clip_vector

#: Drop reasons counted in ``metrics.jsonl``.
DROP_REASONS = (
    "client_error",
    "missing",
    "dtype",
    "shape",
    "nonfinite",
    "unexpected_users",
    "stale",
    "duplicate",
    "bad_state",
)


class UpdateAggregator:
    """Validates replies and keeps ``U_t``, the running sum of accepted updates.

    Parameters
    ----------
    dim : ``d``, the flat parameter length.
    clip_norm : ``c``; a reply for ``m`` users is bounded by ``m·c``.
    device : device of the running sum.
    """

    def __init__(self, dim: int, clip_norm: float, device: str | torch.device = "cpu") -> None:
        self.dim = int(dim)
        self.clip_norm = float(clip_norm)
        self.device = torch.device(device)
        self.reset()

    def reset(self) -> None:
        self.total = torch.zeros(self.dim, dtype=torch.float32, device=self.device)
        self.accepted_users = 0
        self.accepted_replies = 0
        self.dropped_users = 0
        self.dropped_replies = 0
        self.server_clipped = 0
        self.reasons: Counter[str] = Counter()

    def drop(self, reason: str, users: int) -> None:
        """Count a reply for ``users`` users as dropped for ``reason``."""
        self.reasons[reason] += 1
        self.dropped_replies += 1
        self.dropped_users += int(users)

    def add(self, update: Any, users: int) -> str | None:
        """Validate one reply for ``users`` users and add it; return the drop reason or None.

        The reply is cast to float32 first and every check runs on that float32 array, the one
        that is summed: a float64 ``1e39`` becomes ``inf`` in the cast and the reply is dropped
        as ``nonfinite``, never summed."""
        reason = self._check(update)
        if reason is None:
            with np.errstate(over="ignore", invalid="ignore"):
                update = np.asarray(update, dtype=np.float32)
            if not np.all(np.isfinite(update)):
                reason = "nonfinite"
        if reason is not None:
            self.drop(reason, users)
            return reason
        v = torch.as_tensor(update, device=self.device)
        bound = users * self.clip_norm
        v, norm = clip_vector(v, bound)
        if norm > bound:
            self.server_clipped += 1
        self.total.add_(v)
        self.accepted_users += int(users)
        self.accepted_replies += 1
        return None

    def _check(self, update: Any) -> str | None:
        if update is None:
            return "missing"
        if not isinstance(update, np.ndarray) or not np.issubdtype(update.dtype, np.floating):
            return "dtype"
        if update.shape != (self.dim,):
            return "shape"
        return None

    def drop_counts(self) -> dict[str, int]:
        return {r: int(self.reasons.get(r, 0)) for r in DROP_REASONS}
