"""Seeded randomness: one independent ``torch.Generator`` per (stream, round, key).

Every random stream (cohort sampling, privacy noise, a user's local shuffles) is
derived from the run seed and a tuple of keys by hashing, so that a round's
randomness depends only on (seed, stream, round, user) — not on how users were
assigned to workers, nor on what ran before. That makes resuming from a
checkpoint bit-identical without saving generator internals.
"""

from __future__ import annotations

import hashlib
import secrets

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
    g = torch.Generator(device=device)
    g.manual_seed(derive_seed(seed, *keys))
    return g


def os_random_seed() -> int:
    """A 63-bit seed from the OS CSPRNG (deployment mode: never logged)."""
    return secrets.randbits(63)
