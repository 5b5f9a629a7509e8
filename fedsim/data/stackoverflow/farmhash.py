"""FarmHash ``Fingerprint64`` (the ``farmhashna`` 64-bit hash), in pure Python.

TensorFlow's ``tf.strings.to_hash_bucket_fast`` is ``Fingerprint64(s) mod k``; TFF's
``StaticVocabularyTable`` uses it to put an out-of-vocabulary word into one of ``k`` OOV
buckets (docs/stackoverflow_format.md A5). Reproducing it is what lets ``data.num_oov_buckets > 1``
give TFF's ids without TensorFlow. Checked against published FarmHash test vectors
(``tests/data/test_so_farmhash.py``), for lengths 0 to 445 bytes, covering every branch.
"""

from __future__ import annotations

from functools import lru_cache

M = (1 << 64) - 1
K0 = 0xC3A5C85C97CB3127
K1 = 0xB492B66FBE98F273
K2 = 0x9AE16A3B2F90404F


def _u64(b: bytes, i: int) -> int:
    return int.from_bytes(b[i : i + 8], "little")


def _u32(b: bytes, i: int) -> int:
    return int.from_bytes(b[i : i + 4], "little")


def _rot(v: int, s: int) -> int:
    return ((v >> s) | (v << (64 - s))) & M


def _smix(v: int) -> int:
    return v ^ (v >> 47)


def _h16(u: int, v: int, mul: int) -> int:
    a = ((u ^ v) * mul) & M
    a ^= a >> 47
    b = ((v ^ a) * mul) & M
    b ^= b >> 47
    return (b * mul) & M


def _short(s: bytes) -> int:  # 0..16 bytes
    n = len(s)
    if n >= 8:
        mul = K2 + 2 * n
        a = (_u64(s, 0) + K2) & M
        b = _u64(s, n - 8)
        c = (_rot(b, 37) * mul + a) & M
        d = ((_rot(a, 25) + b) * mul) & M
        return _h16(c, d, mul)
    if n >= 4:
        mul = K2 + 2 * n
        return _h16((n + (_u32(s, 0) << 3)) & M, _u32(s, n - 4), mul)
    if n > 0:
        y = s[0] + (s[n >> 1] << 8)
        z = n + (s[n - 1] << 2)
        return (_smix(((y * K2) ^ (z * K0)) & M) * K2) & M
    return K2


def _ends(s: bytes, ka: int) -> tuple[int, int, int, int, int]:
    """``(mul, a, b, c, d)`` from the first 16 and last 16 bytes (17..64-byte inputs)."""
    n = len(s)
    mul = K2 + 2 * n
    return mul, (_u64(s, 0) * ka) & M, _u64(s, 8), (_u64(s, n - 8) * mul) & M, (_u64(s, n - 16) * K2) & M


def _mid(s: bytes) -> int:  # 17..32 bytes
    mul, a, b, c, d = _ends(s, K1)
    return _h16((_rot((a + b) & M, 43) + _rot(c, 30) + d) & M, (a + _rot((b + K2) & M, 18) + c) & M, mul)


def _long(s: bytes) -> int:  # 33..64 bytes
    n = len(s)
    mul, a, b, c, d = _ends(s, K2)
    y = (_rot((a + b) & M, 43) + _rot(c, 30) + d) & M
    z = _h16(y, (a + _rot((b + K2) & M, 18) + c) & M, mul)
    e = (_u64(s, 16) * mul) & M
    f = _u64(s, 24)
    g = ((y + _u64(s, n - 32)) * mul) & M
    h = ((z + _u64(s, n - 24)) * mul) & M
    return _h16((_rot((e + f) & M, 43) + _rot(g, 30) + h) & M, (e + _rot((f + a) & M, 18) + g) & M, mul)


def _weak32(s: bytes, i: int, a: int, b: int) -> tuple[int, int]:
    w, x, y, z = _u64(s, i), _u64(s, i + 8), _u64(s, i + 16), _u64(s, i + 24)
    a = (a + w) & M
    b = _rot((b + a + z) & M, 21)
    c = a
    a = (a + x + y) & M
    b = (b + _rot(a, 44)) & M
    return (a + z) & M, (b + c) & M


def fingerprint64(s: bytes) -> int:
    """FarmHash ``Fingerprint64`` of the bytes ``s`` (an unsigned 64-bit integer)."""
    n = len(s)
    if n <= 16:
        return _short(s)
    if n <= 32:
        return _mid(s)
    if n <= 64:
        return _long(s)
    x = 81
    y = (81 * K1 + 113) & M
    z = (_smix((y * K2 + 113) & M) * K2) & M
    v = (0, 0)
    w = (0, 0)
    x = (x * K2 + _u64(s, 0)) & M
    end = ((n - 1) // 64) * 64
    last = end + ((n - 1) & 63) - 63
    i = 0
    while True:
        x = (_rot((x + y + v[0] + _u64(s, i + 8)) & M, 37) * K1) & M
        y = (_rot((y + v[1] + _u64(s, i + 48)) & M, 42) * K1) & M
        x ^= w[1]
        y = (y + v[0] + _u64(s, i + 40)) & M
        z = (_rot((z + w[0]) & M, 33) * K1) & M
        v = _weak32(s, i, (v[1] * K1) & M, (x + w[0]) & M)
        w = _weak32(s, i + 32, (z + w[1]) & M, (y + _u64(s, i + 16)) & M)
        z, x = x, z
        i += 64
        if i == end:
            break
    mul = K1 + ((z & 0xFF) << 1)
    i = last
    w0 = (w[0] + ((n - 1) & 63)) & M
    v0 = (v[0] + w0) & M
    w0 = (w0 + v0) & M
    v = (v0, v[1])
    w = (w0, w[1])
    x = (_rot((x + y + v[0] + _u64(s, i + 8)) & M, 37) * mul) & M
    y = (_rot((y + v[1] + _u64(s, i + 48)) & M, 42) * mul) & M
    x ^= (w[1] * 9) & M
    y = (y + v[0] * 9 + _u64(s, i + 40)) & M
    z = (_rot((z + w[0]) & M, 33) * mul) & M
    v = _weak32(s, i, (v[1] * mul) & M, (x + w[0]) & M)
    w = _weak32(s, i + 32, (z + w[1]) & M, (y + _u64(s, i + 16)) & M)
    z, x = x, z
    return _h16((_h16(v[0], w[0], mul) + _smix(y) * K0 + z) & M, (_h16(v[1], w[1], mul) + x) & M, mul)


@lru_cache(maxsize=1 << 16)
def hash_bucket(word: bytes, k: int) -> int:
    """``tf.strings.to_hash_bucket_fast(word, k)``: ``Fingerprint64(word) mod k``."""
    return fingerprint64(word) % k
