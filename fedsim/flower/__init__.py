"""MF-DP-FTRL for any Flower app: a strategy wrapper and a client mod.

- `UserLevelDP` wraps a Flower Message-API strategy (`FedAvg`, `FedAdam`, …). One node
  is one user; the wrapper picks each round's nodes under fedsim's participation schemes, clips
  their updates, adds a noise mechanism's correlated noise (BLT, banded, BSR, … or Gaussian),
  divides by the fixed expected cohort, optionally filters (DOPPLER, EMA) and steps DP-AdamBC, and
  keeps the per-round ε ledger from dp-accounting. The wrapped strategy sees only the noised mean.
- `user_dp_mod` is the node's side: it clips the update on the node (`clipping="client"`)
  and reports the node's stable identity (`identity="census"`).

The same code as `fedsim run` clips, noises, divides and accounts (`fedsim.server.step`,
`fedsim.server.aggregation`, `fedsim.privacy`); docs/flower.md shows the change to an app.
"""

from __future__ import annotations

from fedsim.flower.mod import KEY_CENSUS, KEY_CLIP_NORM, user_dp_mod
from fedsim.flower.strategy import UserLevelDP, noise_std_of_mean

__all__ = ["KEY_CENSUS", "KEY_CLIP_NORM", "UserLevelDP", "noise_std_of_mean", "user_dp_mod"]
