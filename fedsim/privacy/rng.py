"""Keyed, cryptographically secure randomness for everything the DP analysis relies on.

A user-level guarantee assumes that nobody can predict the noise. ``torch.Generator`` on the
CPU is a Mersenne Twister seeded with at most 64 bits, of which ``manual_seed`` keeps the low
32: all 2³² candidates are searched in a few CPU-hours, which recovers a round's noise (and so
the sum of the users' updates) from the broadcast model. So every random draw that a privacy
argument rests on — the noise stream, cohort sampling and group assignment, the adaptive
clipping count's noise, example-level DP noise and Poisson batches — comes from this module:

- a :class:`PrivacyKey` of 256 bits: in simulation derived from the config seed by a keyed
  BLAKE2b (bit-reproducible, and public like the seed); in deployment drawn from the OS
  (:meth:`PrivacyKey.generate`) and never written anywhere but an owner-only checkpoint;
- independent sub-keys per purpose and index, :meth:`PrivacyKey.derive` (BLAKE2b keyed with
  the parent key over an unambiguous encoding of the labels);
- AES-256 in counter mode as the keystream (:func:`keystream`), from the ``cryptography``
  package;
- uniforms from 52 random bits per float64 (:func:`uniforms`) and standard normals by the
  Box–Muller transform computed in float64, then cast (:func:`gaussians`);
- a keyed pseudo-random function on 64-bit user tags (:func:`prf_u64`, AES-256 on one block
  per input) for per-user decisions that must not depend on any other user: group membership,
  per-round participation coins (:mod:`fedsim.server.sampling`).

Devices: every stream is generated on the CPU in float64 and moved to the requested device,
so the GPU path uses the same numbers bit for bit.
"""

from __future__ import annotations

import hashlib
import math
import secrets
import struct
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

if TYPE_CHECKING:
    import torch
else:
    from fedsim._lazy import torch

#: Bytes of every key (AES-256).
KEY_BYTES = 32
_KDF_PERSON = b"fedsim-key-v1"  # BLAKE2b personalisation (≤ 16 bytes)
_SEED_KEY = b"fedsim/privacy-key-from-seed/v1"
_EXP_ONE = 0x3FF0000000000000  # IEEE-754 exponent bits of 1.0
_MANTISSA = (1 << 52) - 1


def _encode_labels(labels: Iterable[object]) -> bytes:
    """An injective encoding of a label tuple: each label is a type tag, its length and bytes."""
    out = bytearray()
    for lab in labels:
        if isinstance(lab, bool) or not isinstance(lab, (int, str, bytes)):
            raise TypeError(f"key labels are int, str or bytes, not {type(lab).__name__}")
        if isinstance(lab, int):
            tag, raw = b"i", str(int(lab)).encode()
        elif isinstance(lab, str):
            tag, raw = b"s", lab.encode("utf-8")
        else:
            tag, raw = b"b", bytes(lab)
        out += tag + struct.pack("<Q", len(raw)) + raw
    return bytes(out)


class PrivacyKey:
    """A 256-bit secret key; the root of every privacy-relevant random stream of a run.

    Parameters
    ----------
    secret : exactly :data:`KEY_BYTES` bytes.

    The secret never appears in ``repr``/``str``. :meth:`state_dict` exposes it (checkpoints
    need it to resume bit-identically), so a checkpoint of a deployed run must be protected
    like a key (:func:`fedsim.checkpoint.save_checkpoint` writes owner-only files).
    """

    __slots__ = ("_secret",)

    def __init__(self, secret: bytes) -> None:
        secret = bytes(secret)
        if len(secret) != KEY_BYTES:
            raise ValueError(f"a PrivacyKey has {KEY_BYTES} bytes, got {len(secret)}")
        self._secret = secret

    @classmethod
    def from_seed(cls, seed: int) -> PrivacyKey:
        """The simulation key of config seed ``seed`` (any integer): BLAKE2b-256 keyed with a
        fixed fedsim constant over the seed's decimal digits. Reproducible, hence not secret."""
        h = hashlib.blake2b(
            _encode_labels(["seed", int(seed)]), key=_SEED_KEY, digest_size=KEY_BYTES, person=_KDF_PERSON
        )
        return cls(h.digest())

    @classmethod
    def of(cls, key_or_seed: PrivacyKey | int) -> PrivacyKey:
        """``key_or_seed`` itself if it is a key, else :meth:`from_seed` of the integer."""
        return key_or_seed if isinstance(key_or_seed, PrivacyKey) else cls.from_seed(int(key_or_seed))

    @classmethod
    def generate(cls) -> PrivacyKey:
        """A fresh key from the OS CSPRNG (``secrets``): deployment, and each silo's own key."""
        return cls(secrets.token_bytes(KEY_BYTES))

    def derive(self, *labels: object) -> PrivacyKey:
        """An independent sub-key for the purpose named by ``labels`` (ints, strings, bytes)."""
        h = hashlib.blake2b(_encode_labels(labels), key=self._secret, digest_size=KEY_BYTES, person=_KDF_PERSON)
        return PrivacyKey(h.digest())

    @property
    def secret(self) -> bytes:
        return self._secret

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PrivacyKey) and secrets.compare_digest(self._secret, other._secret)

    def __hash__(self) -> int:
        return hash(self._secret)

    def __repr__(self) -> str:
        return "PrivacyKey(<secret>)"

    def state_dict(self) -> dict[str, Any]:
        return {"secret": self._secret}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> PrivacyKey:
        return cls(state["secret"])


_zeros = bytearray()  # a reusable all-zero plaintext: CTR mode then returns the keystream itself


def _zero_plaintext(nbytes: int) -> memoryview:
    global _zeros
    if len(_zeros) < nbytes:
        _zeros = bytearray(nbytes)
    return memoryview(_zeros)[:nbytes]


def keystream(key: PrivacyKey, nbytes: int) -> bytes:
    """``nbytes`` bytes of the AES-256-CTR keystream of ``key`` (counter starting at 0).

    Each derived key is used for one stream only, so a zero nonce is safe.
    """
    enc = Cipher(algorithms.AES(key.secret), modes.CTR(bytes(16))).encryptor()
    return enc.update(bytes(_zero_plaintext(int(nbytes)))) + enc.finalize()


def random_words(key: PrivacyKey, n: int) -> torch.Tensor:
    """``n`` uniformly random 64-bit words (int64 tensor): the AES-256-CTR keystream of ``key``
    (the same bytes as :func:`keystream`), written straight into the tensor."""
    n = int(n)
    if n <= 0:
        return torch.zeros(0, dtype=torch.int64)
    buf = torch.empty(n + 2, dtype=torch.int64)  # update_into needs 15 bytes of slack
    enc = Cipher(algorithms.AES(key.secret), modes.CTR(bytes(16))).encryptor()
    out = memoryview(buf.numpy()).cast("B")  # type: ignore[arg-type]  # an ndarray is a buffer; numpy's stubs lag
    written = enc.update_into(_zero_plaintext(8 * n), out)
    if written != 8 * n:  # pragma: no cover - CTR is a stream mode: output = input length
        raise RuntimeError("AES-CTR returned a short keystream")
    return buf[:n]


def _unit_interval(words: torch.Tensor) -> torch.Tensor:
    """Float64 in ``[1, 2)`` from the low 52 bits of each word (exact: 2⁵² equally likely values)."""
    return words.bitwise_and_(_MANTISSA).bitwise_or_(_EXP_ONE).view(torch.float64)


def uniforms(key: PrivacyKey, n: int) -> torch.Tensor:
    """``n`` float64 uniforms on ``[0, 1)`` with 52 random bits each."""
    return _unit_interval(random_words(key, n)).sub_(1.0)


def gaussians(
    key: PrivacyKey, n: int, dtype: torch.dtype | None = None, device: str | torch.device = "cpu"
) -> torch.Tensor:
    """``n`` independent standard normals from the keystream of ``key``.

    Box–Muller in float64: for pairs of uniforms ``u₁ ∈ (0, 1]`` and ``u₂ ∈ [0, 1)`` (52 bits
    each), ``r = √(−2 ln u₁)``, and ``r·cos(2πu₂)``, ``r·sin(2πu₂)`` are independent N(0, 1).
    The first half of the output holds the cosines, the second half the sines. The float64
    result is cast to ``dtype`` (default float32) only at the end. ``u₁`` has 2⁵² values, so the
    largest magnitude is √(104 ln 2) ≈ 8.49: the tail beyond it has probability 2·10⁻¹⁷.

    Parameters
    ----------
    key : the stream's key (derive one per row: ``key.derive("noise", t)``).
    n : how many normals.
    dtype : output dtype. Default float32.
    device : output device (generated on the CPU and moved; the same numbers on every device).
    """
    n = int(n)
    dtype = torch.float32 if dtype is None else dtype
    if n <= 0:
        return torch.zeros(0, dtype=dtype, device=device)
    half = (n + 1) // 2
    w = _unit_interval(random_words(key, 2 * half))
    u1 = torch.rsub(w[:half], 2.0)  # 2 − [1, 2) = (0, 1], exactly
    theta = w[half:].sub_(1.0).mul_(2.0 * math.pi)
    r = u1.log_().mul_(-2.0).sqrt_()
    out = torch.empty(2 * half, dtype=torch.float64)
    torch.mul(r, torch.cos(theta), out=out[:half])
    torch.mul(r, theta.sin_(), out=out[half:])
    res = out[:n].to(dtype)
    return res if torch.device(device).type == "cpu" else res.to(device)


def user_tags(ids: Sequence[str | int]) -> np.ndarray:
    """A stable 64-bit tag per user id (BLAKE2b-64 of its text; uint64 array).

    The tag is not secret: what makes per-user decisions unpredictable is the key of
    :func:`prf_u64`. Two ids share a tag with probability about ``N²/2⁶⁵`` (3·10⁻⁹ for
    N = 342,477); they would then share their decisions, which still depend on nothing else.
    """
    out = np.empty(len(ids), dtype=np.uint64)
    for i, name in enumerate(ids):
        out[i] = int.from_bytes(
            hashlib.blake2b(str(name).encode("utf-8"), digest_size=8, person=b"fedsim-user-tag").digest(), "little"
        )
    return out


def prf_u64(key: PrivacyKey, tags: np.ndarray, counter: int) -> np.ndarray:
    """``F_key(tag, counter)``: AES-256 of the block ``tag ‖ counter`` (both little-endian
    uint64), first 8 bytes as a uint64 — one pseudo-random 64-bit value per tag.

    The value for a tag depends only on the key, the tag and the counter, never on the other
    tags in the array: that is what lets a user's group and participation coins be computed
    without any other user's presence changing them.
    """
    tags = np.ascontiguousarray(tags, dtype=np.uint64)
    if tags.size == 0:
        return np.zeros(0, dtype=np.uint64)
    blocks = np.empty((tags.size, 2), dtype="<u8")
    blocks[:, 0] = tags
    blocks[:, 1] = np.uint64(int(counter) % (1 << 64))
    enc = Cipher(algorithms.AES(key.secret), modes.ECB()).encryptor()
    ct = enc.update(blocks.tobytes()) + enc.finalize()
    return np.frombuffer(ct, dtype="<u8").reshape(-1, 2)[:, 0].astype(np.uint64)


def prf_uniform(key: PrivacyKey, tags: np.ndarray, counter: int) -> np.ndarray:
    """Float64 uniforms on ``[0, 1)`` (53 bits), one per tag, from :func:`prf_u64`."""
    return (prf_u64(key, tags, counter) >> np.uint64(11)).astype(np.float64) * 2.0**-53


def prf_mod(key: PrivacyKey, tags: np.ndarray, counter: int, m: int) -> np.ndarray:
    """Per-tag values in ``0..m−1`` (``F_key(tag, counter) mod m``; bias below ``m/2⁶⁴``)."""
    if m < 1:
        raise ValueError("m must be ≥ 1")
    return (prf_u64(key, tags, counter) % np.uint64(m)).astype(np.int64)
