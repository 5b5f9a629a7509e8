"""A pure-Python ``tf.train.Example`` decoder (and test encoder) for Stack Overflow rows.

Every row of TFF's ``stackoverflow.sqlite`` holds one serialized ``tf.train.Example``
(``docs/stackoverflow_format.md`` A3). This module reads it without TensorFlow
or the ``protobuf`` package.

Wire format (proto3, ``tensorflow/core/example/{example,feature}.proto``)::

    Example   { Features features = 1; }
    Features  { map<string, Feature> feature = 1; }  // entry: key = 1 (string), value = 2 (Feature)
    Feature   { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
                             Int64List int64_list = 3; } }
    BytesList { repeated bytes value = 1; }
    FloatList { repeated float value = 1 [packed = true]; }
    Int64List { repeated int64 value = 1 [packed = true]; }

A protobuf message is a sequence of fields ``tag payload``; ``tag = field << 3 | wire_type``
is a varint (7 bits a byte, little-endian groups, high bit = "more"). Wire type 0 is a
varint, 1 eight little-endian bytes, 2 a varint length then that many bytes (strings,
sub-messages, packed lists), 5 four little-endian bytes; 3 and 4 (groups) never occur in an
Example and are rejected. A TF-written Example is ``0a L [0a L [0a L key 12 L [kind L
values]]]...``: one ``features`` field holding one map entry per feature.

Rules (each is what protobuf, or TF's fast parser where it differs, does):

- Map entries may come in any order; inside an entry the key (field 1) and the value
  (field 2) may come in either order. A missing key is ``""``; a missing value is an empty
  ``Feature``. A field that occurs twice inside an entry: the last key wins, values merge.
- ``features`` (field 1 of Example) may occur several times: the occurrences merge, which
  for the map means their entries are concatenated.
- If a key occurs in several entries, TF's fast parser walks the entries backwards and the
  first entry whose ``Feature`` has a list set wins; an entry whose ``Feature`` has no list
  set is skipped (it counts as absent and does not hide an earlier entry). A list that is
  set but empty (``0a 00``) is set: it has zero values.
- Unknown fields are skipped at every level (wire types 0, 1, 2, 5), and so is a known
  field number with a wire type it cannot have (as protobuf treats it as unknown).
- ``Int64List`` values are packed (wire type 2, what TF writes) or unpacked (wire type 0),
  or a mix; negative values are 10-byte two's-complement varints. ``FloatList`` values are
  packed (wire type 2) or unpacked (wire type 5). Float values are float32 widened to float.
- Inside a ``Feature`` the last ``kind`` field wins (oneof); the same kind written twice
  merges (its values are concatenated), as protobuf does.
- Only the entries that are needed are decoded: damage inside the ``Feature`` of an
  ignored key, or of an entry hidden by a later one, is not noticed (neither does TF).
- A truncated or corrupted blob (a varint or a length running past the end of its message,
  a varint longer than 10 bytes, field number 0, wire types 3/4/6/7, a packed float list
  whose length is not a multiple of 4) raises :class:`~fedsim.errors.FedsimError`
  ``"corrupted tf.train.Example: ..."``.

Where TF is stricter (its fast parser rejects an unknown field before the list inside a
``Feature``, or a map entry with other than exactly a key and a value), this decoder
accepts what protobuf accepts.

:func:`decode_example` returns the six Stack Overflow features (A3) in lexicographic order:
``creation_date`` (str), ``score`` (int), ``tags`` (str), ``title`` (str), ``tokens`` (str),
``type`` (str). Each must be present, of its list kind (int64 for ``score``, bytes for the
others), with exactly one value (``""`` is the one value ``b""``, not an empty list);
strings must be valid UTF-8. Other features are ignored.

The decoder works by index arithmetic on one ``bytes`` object: no copies of sub-messages,
one slice per string value, single-byte varints (almost every tag and length) read inline.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Mapping

from fedsim.errors import FedsimError

__all__ = [
    "BYTES",
    "FEATURES",
    "FLOAT",
    "INT64",
    "decode_example",
    "decode_features",
    "encode_example",
]

#: List kinds, as :func:`decode_features` reports them.
BYTES = "bytes"
FLOAT = "float"
INT64 = "int64"

#: The Stack Overflow features (name, list kind), in the order :func:`decode_example` returns them.
FEATURES: tuple[tuple[str, str], ...] = (
    ("creation_date", BYTES),
    ("score", INT64),
    ("tags", BYTES),
    ("title", BYTES),
    ("tokens", BYTES),
    ("type", BYTES),
)

_SPEC = tuple((name, name.encode("ascii"), kind) for name, kind in FEATURES)
_WANTED = frozenset(key for _, key, _ in _SPEC)
_LIST_NAME = {BYTES: "bytes_list", FLOAT: "float_list", INT64: "int64_list"}

_MASK64 = (1 << 64) - 1
_SIGN64 = 1 << 63
_WRAP64 = 1 << 64
_F32 = struct.Struct("<f")


def _corrupt(what: str) -> FedsimError:
    return FedsimError(
        f"corrupted tf.train.Example: {what} (the blob is truncated or damaged; "
        f"re-download or re-decompress the database)"
    )


def _varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """The varint at ``buf[pos:end]`` as an unsigned 64-bit int, and the position after it."""
    if pos + 1 < end:  # one or two bytes: lengths up to 16 KiB, scores up to 16383
        b = buf[pos]
        if b < 0x80:
            return b, pos + 1
        c = buf[pos + 1]
        if c < 0x80:
            return (b & 0x7F) | (c << 7), pos + 2
    result = 0
    shift = 0
    while pos < end:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result & _MASK64, pos
        shift += 7
        if shift == 70:
            raise _corrupt(f"varint longer than 10 bytes ending at byte {pos}")
    raise _corrupt(f"varint runs past the end of its message (at byte {end})")


def _skip(buf: bytes, pos: int, end: int, tag: int) -> int:
    """Skip the payload of an unknown field whose tag was read; return the position after it."""
    wire = tag & 7
    field = tag >> 3
    if field == 0:
        raise _corrupt(f"field number 0 before byte {pos}")
    if wire == 0:
        return _varint(buf, pos, end)[1]
    if wire == 2:
        n, pos = _varint(buf, pos, end)
        q = pos + n
    elif wire == 5:
        q = pos + 4
    elif wire == 1:
        q = pos + 8
    elif wire == 3 or wire == 4:
        raise _corrupt(
            f"field {field} is a group (wire type {wire}), which a tf.train.Example "
            f"never contains and this decoder does not support"
        )
    else:
        raise _corrupt(f"invalid wire type {wire} for field {field} before byte {pos}")
    if q > end:
        raise _corrupt(f"field {field} (wire type {wire}) runs past the end of its message")
    return q


# The parsers below share one inline pattern for a varint that is almost always one byte:
#     v = buf[pos]
#     if v < 0x80: pos += 1
#     else: v, pos = _varint(buf, pos, end)
# A tag is read only while pos < end. A length may be read at pos == end (the byte belongs to
# the enclosing message, or buf[pos] raises IndexError at the end of the blob); the check
# ``q > end`` that follows every length then fails, since pos has moved past end.


def _bytes_list(buf: bytes, pos: int, end: int, out: list) -> None:
    while pos < end:
        tag = buf[pos]
        if tag < 0x80:
            pos += 1
        else:
            tag, pos = _varint(buf, pos, end)
        if tag == 0x0A:
            n = buf[pos]
            if n < 0x80:
                pos += 1
            else:
                n, pos = _varint(buf, pos, end)
            q = pos + n
            if q > end:
                raise _corrupt("a BytesList value runs past the end of its list")
            out.append(buf[pos:q])
            pos = q
        else:
            pos = _skip(buf, pos, end, tag)


# The list readers repeat the one-byte-varint fast path inline on purpose: a call per tag and
# per length costs about a third of the decode time on the real data's short lists.
def _int64_list(buf: bytes, pos: int, end: int, out: list) -> None:
    while pos < end:
        tag = buf[pos]
        if tag < 0x80:
            pos += 1
        else:
            tag, pos = _varint(buf, pos, end)
        if tag == 0x0A:  # packed
            n = buf[pos]
            if n < 0x80:
                pos += 1
            else:
                n, pos = _varint(buf, pos, end)
            q = pos + n
            if q > end:
                raise _corrupt("a packed Int64List runs past the end of its list")
            while pos < q:
                v = buf[pos]
                if v < 0x80:
                    pos += 1
                else:
                    v, pos = _varint(buf, pos, q)
                    if v >= _SIGN64:
                        v -= _WRAP64
                out.append(v)
        elif tag == 0x08:  # unpacked
            v, pos = _varint(buf, pos, end)
            if v >= _SIGN64:
                v -= _WRAP64
            out.append(v)
        else:
            pos = _skip(buf, pos, end, tag)


def _float_list(buf: bytes, pos: int, end: int, out: list) -> None:
    while pos < end:
        tag = buf[pos]
        if tag < 0x80:
            pos += 1
        else:
            tag, pos = _varint(buf, pos, end)
        if tag == 0x0A:  # packed
            n = buf[pos]
            if n < 0x80:
                pos += 1
            else:
                n, pos = _varint(buf, pos, end)
            q = pos + n
            if q > end:
                raise _corrupt("a packed FloatList runs past the end of its list")
            if n & 3:
                raise _corrupt(f"a packed FloatList is {n} bytes long, not a multiple of 4")
            out.extend(struct.unpack_from(f"<{n >> 2}f", buf, pos))
            pos = q
        elif tag == 0x0D:  # unpacked
            q = pos + 4
            if q > end:
                raise _corrupt("a FloatList value runs past the end of its list")
            out.append(_F32.unpack_from(buf, pos)[0])
            pos = q
        else:
            pos = _skip(buf, pos, end, tag)


_KIND_BY_TAG = {0x0A: (BYTES, _bytes_list), 0x12: (FLOAT, _float_list), 0x1A: (INT64, _int64_list)}


def _feature(buf: bytes, spans: tuple[int, ...]) -> tuple[str | None, list]:
    """Decode a ``Feature`` made of the byte ranges ``spans`` (start, stop, start, stop, ...).

    Several ranges (the value written more than once in a map entry) merge, as parsing their
    concatenation would. Returns ``(None, [])`` when no list is set.
    """
    if len(spans) == 2:
        # Fast path for what TF writes: one list field filling the whole Feature, i.e.
        # 0a L1 0a L2 <L2 bytes> for a string, 1a L1 0a L2 <varints> for an int64.
        pos, end = spans
        tag = buf[pos] if pos < end else 0
        if tag == 0x0A or tag == 0x1A:
            n = buf[pos + 1]
            if n < 0x80:
                pos += 2
            else:
                n, pos = _varint(buf, pos + 1, end)
            if pos + n == end and n >= 2 and buf[pos] == 0x0A:
                if tag == 0x1A:
                    ints: list = []
                    _int64_list(buf, pos, end, ints)
                    return INT64, ints
                m = buf[pos + 1]
                if m < 0x80:
                    pos += 2
                else:
                    m, pos = _varint(buf, pos + 1, end)
                if pos + m == end:
                    return BYTES, [buf[pos:end]]
    kind = None
    values: list = []
    for j in range(0, len(spans), 2):
        pos = spans[j]
        end = spans[j + 1]
        while pos < end:
            tag = buf[pos]
            if tag < 0x80:
                pos += 1
            else:
                tag, pos = _varint(buf, pos, end)
            hit = _KIND_BY_TAG.get(tag)
            if hit is None:
                pos = _skip(buf, pos, end, tag)
                continue
            n = buf[pos]
            if n < 0x80:
                pos += 1
            else:
                n, pos = _varint(buf, pos, end)
            q = pos + n
            if q > end:
                raise _corrupt("a Feature's list runs past the end of the Feature")
            if hit[0] != kind:  # oneof: another kind replaces the list; the same kind merges
                kind = hit[0]
                values = []
            hit[1](buf, pos, q, values)
            pos = q
    return kind, values


def _entries(buf: bytes) -> list[tuple[bytes, tuple[int, ...]]]:
    """All map entries of all ``features`` fields, in order: (key, value byte ranges)."""
    entries: list[tuple[bytes, tuple[int, ...]]] = []
    end = len(buf)
    pos = 0
    while pos < end:  # Example
        span = _next_field1(buf, pos, end, "the features field runs past the end of the Example")
        if span is None:
            break
        pos = _features(buf, span[0], span[1], entries.append)
    return entries


def _next_field1(buf: bytes, pos: int, end: int, what: str) -> tuple[int, int] | None:
    """The payload ``(start, stop)`` of the next length-delimited field number 1 in
    ``buf[pos:end]``, skipping other fields; None when none is left. ``what`` names the field in
    the error raised when its length runs past ``end``."""
    while pos < end:
        tag = buf[pos]
        if tag < 0x80:
            pos += 1
        else:
            tag, pos = _varint(buf, pos, end)
        if tag != 0x0A:
            pos = _skip(buf, pos, end, tag)
            continue
        n = buf[pos]
        if n < 0x80:
            pos += 1
        else:
            n, pos = _varint(buf, pos, end)
        if pos + n > end:
            raise _corrupt(what)
        return pos, pos + n
    return None


def _features(buf: bytes, pos: int, fend: int, append: Callable[[tuple[bytes, tuple[int, ...]]], None]) -> int:
    """The map entries of one Features message ``buf[pos:fend]``, passed to ``append``; returns
    the position after it."""
    while pos < fend:  # Features
        span = _next_field1(buf, pos, fend, "a feature map entry runs past the end of its Features")
        if span is None:
            return fend
        pos, eend = span
        entry = _tf_entry(buf, pos, eend) if eend > pos and buf[pos] == 0x0A else None
        append(entry if entry is not None else _map_entry(buf, pos, eend))
        pos = eend
    return pos


def _tf_entry(buf: bytes, pos: int, eend: int) -> tuple[bytes, tuple[int, ...]] | None:
    """Fast path for what TF writes, ``0a K <key> 12 V <Feature>`` filling the entry exactly;
    None when the entry has another shape (then :func:`_map_entry` reads it)."""
    k = buf[pos + 1]
    if k >= 0x80:
        return None
    q = pos + 2 + k
    if q >= eend or buf[q] != 0x12:
        return None
    v = buf[q + 1]
    if v < 0x80:
        vs = q + 2
    else:
        v, vs = _varint(buf, q + 1, eend)
    return (buf[pos + 2 : q], (vs, eend)) if vs + v == eend else None


def _map_entry(buf: bytes, pos: int, eend: int) -> tuple[bytes, tuple[int, ...]]:
    """One map entry ``buf[pos:eend]`` in any field order: (key, value byte ranges)."""
    key = b""
    spans: tuple[int, ...] = ()
    while pos < eend:  # map entry
        tag = buf[pos]
        if tag < 0x80:
            pos += 1
        else:
            tag, pos = _varint(buf, pos, eend)
        if tag != 0x0A and tag != 0x12:
            pos = _skip(buf, pos, eend, tag)
            continue
        n = buf[pos]
        if n < 0x80:
            pos += 1
        else:
            n, pos = _varint(buf, pos, eend)
        q = pos + n
        if q > eend:
            raise _corrupt("a feature name or value runs past the end of its map entry")
        if tag == 0x0A:
            key = buf[pos:q]
        else:
            spans += (pos, q)
        pos = q
    return key, spans


def _as_bytes(blob: bytes | bytearray | memoryview) -> bytes:
    if type(blob) is bytes:
        return blob
    if isinstance(blob, (bytes, bytearray, memoryview)):
        return bytes(blob)
    raise TypeError(f"a serialized tf.train.Example must be bytes, not {type(blob).__name__}")


def _decode_map(blob: bytes | bytearray | memoryview, wanted: frozenset[bytes] | None) -> dict[bytes, tuple[str, list]]:
    """The resolved feature map, keyed by the raw name bytes, restricted to ``wanted``."""
    buf = _as_bytes(blob)
    try:
        entries = _entries(buf)
        found: dict[bytes, tuple[str, list]] = {}
        # Backwards, as TF's fast parser: the last entry with a list set wins.
        for key, spans in reversed(entries):
            if key in found or not spans or (wanted is not None and key not in wanted):
                continue
            kind, values = _feature(buf, spans)
            if kind is not None:
                found[key] = (kind, values)
        return found
    except IndexError:
        raise _corrupt(f"the data ends in the middle of a field (blob of {len(buf)} bytes)") from None


def decode_features(
    blob: bytes | bytearray | memoryview, names: Iterable[str] | None = None
) -> dict[str, tuple[str, list]]:
    """The feature map of a serialized ``tf.train.Example``: name -> ``(kind, values)``.

    ``kind`` is ``"bytes"`` (values are ``bytes``), ``"float"`` (``float``) or ``"int64"``
    (``int``). Duplicate keys, empty ``Feature`` entries and merging follow the module rules.
    Names are sorted. ``names`` restricts the result to those features (the others are not
    decoded, and so not checked). Raises :class:`FedsimError` on a corrupted blob or a
    feature name that is not valid UTF-8.
    """
    wanted = None if names is None else frozenset(n.encode("utf-8") for n in names)
    found = _decode_map(blob, wanted)
    out: dict[str, tuple[str, list]] = {}
    for key in sorted(found):
        try:
            name = key.decode("utf-8")
        except UnicodeDecodeError as e:
            raise FedsimError(f"tf.train.Example: feature name {key!r} is not valid UTF-8 ({e})") from None
        out[name] = found[key]
    return out


def _bad(name: str, what: str) -> FedsimError:
    return FedsimError(
        f"tf.train.Example: feature '{name}' {what}; a Stack Overflow example (TFF release) has "
        f"creation_date, tags, title, tokens, type (bytes_list) and score (int64_list), each with "
        f"exactly one value. Is this TFF's stackoverflow.sqlite?"
    )


def decode_example(blob: bytes | bytearray | memoryview) -> dict[str, str | int]:
    """Decode one Stack Overflow row into its six features, in lexicographic order.

    Returns ``{"creation_date": str, "score": int, "tags": str, "title": str, "tokens": str,
    "type": str}`` (a ``dict``, whose order is this order, as TFF's ``OrderedDict``). Raises
    :class:`FedsimError` naming the feature if one is missing, of the wrong list kind, has other
    than exactly one value, or is not valid UTF-8; and on a corrupted blob.
    """
    found = _decode_map(blob, _WANTED)
    out: dict[str, str | int] = {}
    for name, key, kind in _SPEC:
        got = found.get(key)
        if got is None:
            raise _bad(name, "is missing")
        if got[0] != kind:
            raise _bad(name, f"has kind {_LIST_NAME[got[0]]}, expected {_LIST_NAME[kind]}")
        values = got[1]
        if len(values) != 1:
            raise _bad(name, f"has {len(values)} values, expected exactly 1")
        value = values[0]
        if kind == BYTES:
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError as e:
                raise FedsimError(
                    f"tf.train.Example: feature '{name}' is not valid UTF-8 ({e}); "
                    f"the database is damaged or not TFF's stackoverflow.sqlite"
                ) from None
        out[name] = value
    return out


# --------------------------------------------------------------------------- encoder


def _put_varint(out: bytearray, v: int) -> None:
    v &= _MASK64  # negative int64: 10-byte two's complement
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


def _put_len(out: bytearray, tag: int, payload: bytes | bytearray) -> None:
    out.append(tag)
    _put_varint(out, len(payload))
    out += payload


def _unknown_fields() -> bytes:
    """Fields 9..12, one per wire type 0, 1, 2, 5: unknown at every level of an Example."""
    out = bytearray()
    out.append(9 << 3 | 0)
    _put_varint(out, -7)  # a 10-byte varint
    out.append(10 << 3 | 1)
    out += b"\x01\x02\x03\x04\x05\x06\x07\x08"
    _put_len(out, 11 << 3 | 2, b"\x0a\x02\x0a\x00junk")
    out.append(12 << 3 | 5)
    out += b"\xff\xfe\xfd\xfc"
    return bytes(out)


def encode_example(
    fields: Mapping[str, str | bytes | int | float],
    *,
    packed: bool = True,
    key_value_order: str = "kv",
    reverse_entries: bool = False,
    extra_unknown: bool = False,
) -> bytes:
    """Serialize a ``tf.train.Example`` with one single-value feature per item of ``fields``.

    For tests and fixtures: pass the six Stack Overflow features (any other items are written
    too). ``str`` and ``bytes`` values become a ``bytes_list`` (``str`` as UTF-8), ``int`` an
    ``int64_list``, ``float`` a ``float_list``. With the defaults the bytes are what TF writes
    (entries sorted by name, key before value, packed lists). The options give other valid
    encodings of the same Example:

    - ``packed=False``: int64 values as unpacked varints (wire type 0), float values as
      unpacked fixed32 (wire type 5).
    - ``key_value_order="vk"``: each map entry writes the value before the key.
    - ``reverse_entries=True``: map entries in reverse name order.
    - ``extra_unknown=True``: unknown fields of wire types 0, 1, 2 and 5 at the start and the
      end of every message (Example, Features, map entry, Feature, list).
    """
    if key_value_order not in ("kv", "vk"):
        raise ValueError(f"key_value_order must be 'kv' or 'vk', not {key_value_order!r}")
    junk = _unknown_fields() if extra_unknown else b""
    features = bytearray(junk)
    for name in sorted(fields, reverse=reverse_entries):
        value = fields[name]
        lst = bytearray(junk)
        if isinstance(value, (str, bytes)):
            raw = value.encode("utf-8") if isinstance(value, str) else value
            _put_len(lst, 0x0A, raw)
            list_tag = 0x0A
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"feature {name!r}: cannot encode a {type(value).__name__}")
        elif isinstance(value, int):
            if not -_SIGN64 <= value < _SIGN64:
                raise ValueError(f"feature {name!r}: {value} does not fit in an int64")
            if packed:
                body = bytearray()
                _put_varint(body, value)
                _put_len(lst, 0x0A, body)
            else:
                lst.append(0x08)
                _put_varint(lst, value)
            list_tag = 0x1A
        else:
            if packed:
                _put_len(lst, 0x0A, _F32.pack(value))
            else:
                lst.append(0x0D)
                lst += _F32.pack(value)
            list_tag = 0x12
        lst += junk
        feature = bytearray(junk)
        _put_len(feature, list_tag, lst)
        feature += junk
        key = bytearray()
        _put_len(key, 0x0A, name.encode("utf-8"))
        val = bytearray()
        _put_len(val, 0x12, feature)
        entry = bytearray(junk)
        entry += key + val if key_value_order == "kv" else val + key
        entry += junk
        _put_len(features, 0x0A, entry)
    features += junk
    example = bytearray(junk)
    _put_len(example, 0x0A, features)
    example += junk
    return bytes(example)
