"""Seeded *non-private* randomness: one ``torch.Generator`` per (stream, round, key).

Model initialisation, each user's local batches and shuffles, the evaluation subset and the
filter-trace coordinates come from here. They are derived from the run seed and a tuple of keys
by hashing, so that a round's randomness depends only on (seed, stream, round, user) — not on how
users were assigned to workers, nor on what ran before — and resuming is bit-identical.

Never use this module for a draw a privacy argument rests on: ``manual_seed`` keeps only 32 bits
of the seed on the CPU. Noise, sampling, group assignment, clip-count noise and example-level DP
use the keyed CSPRNG of :mod:`fedsim.privacy.rng`.
"""

from __future__ import annotations

import hashlib

import torch


def derive_seed(seed: int, *keys: object) -> int:
    """A 63-bit seed from ``seed`` and any keys (ints or strings), by BLAKE2b."""
    h = hashlib.blake2b(digest_size=8)
    h.update(str(int(seed)).encode())
    for k in keys:
        h.update(b"\x1f")
        h.update(str(k).encode())
    return int.from_bytes(h.digest(), "little") & ((1 << 63) - 1)


def make_generator(seed: int, *keys: object, device: str | torch.device = "cpu") -> torch.Generator:
    """A fresh ``torch.Generator`` on ``device`` seeded with ``derive_seed(seed, *keys)``."""
    return reseed(torch.Generator(device=device), seed, *keys)


def reseed(g: torch.Generator, seed: int, *keys: object) -> torch.Generator:
    """Reset ``g`` to the state :func:`make_generator` gives a fresh generator for the same
    ``(seed, *keys)`` (one generator reused over many users instead of one built per user)."""
    g.manual_seed(derive_seed(seed, *keys))
    return g
