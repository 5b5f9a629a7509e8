"""The pure-Python tf.train.Example decoder for Stack Overflow rows (docs/stackoverflow_format.md A3)."""

from __future__ import annotations

import itertools
import random
import struct

import pytest

from fedsim.data.stackoverflow.example_proto import (
    FEATURES,
    decode_example,
    decode_features,
    encode_example,
)
from fedsim.errors import FedsimError

NAMES = [name for name, _ in FEATURES]


# ----------------------------------------------------------------- an independent hand encoder
# Written from the protobuf wire-format spec, separately from encode_example, so that the
# decoder is not only checked against its own encoder.


def varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        low = n & 0x7F
        n >>= 7
        if n:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def ld(field: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return varint(field << 3 | 2) + varint(len(payload)) + payload


def bytes_feature(*values: bytes) -> bytes:
    return ld(1, b"".join(ld(1, v) for v in values))


def int64_feature(*values: int, packed: bool = True) -> bytes:
    if packed:
        return ld(3, ld(1, b"".join(varint(v) for v in values)))
    return ld(3, b"".join(varint(1 << 3 | 0) + varint(v) for v in values))


def float_feature(*values: float, packed: bool = True) -> bytes:
    if packed:
        return ld(2, ld(1, b"".join(struct.pack("<f", v) for v in values)))
    return ld(2, b"".join(b"\x0d" + struct.pack("<f", v) for v in values))


def entry(key: bytes | None, feature: bytes | None) -> bytes:
    """A map entry; None leaves the key or the value out."""
    body = (ld(1, key) if key is not None else b"") + (ld(2, feature) if feature is not None else b"")
    return ld(1, body)


def example(*entries: bytes) -> bytes:
    return ld(1, b"".join(entries))


def so_features(**override) -> dict[str, bytes]:
    """Serialized Feature per Stack Overflow name, for a default valid example."""
    base = {
        "creation_date": bytes_feature(b"2014-11-23 22:05:31.08 UTC"),
        "score": int64_feature(3),
        "tags": bytes_feature(b"python|c++"),
        "title": bytes_feature(b"how do i x ?"),
        "tokens": bytes_feature(b"i tried y ."),
        "type": bytes_feature(b"question"),
    }
    base.update(override)
    return base


def so_blob(**override) -> bytes:
    return example(*(entry(k.encode(), v) for k, v in so_features(**override).items() if v is not None))


DEFAULT = {
    "creation_date": "2014-11-23 22:05:31.08 UTC",
    "score": 3,
    "tags": "python|c++",
    "title": "how do i x ?",
    "tokens": "i tried y .",
    "type": "question",
}


def fields(**override) -> dict:
    d = dict(DEFAULT)
    d.update(override)
    return d


# ---------------------------------------------------------------------- a hand-written blob

# creation_date "2018-01-01 00:00:00 UTC" (23 bytes), score -5, tags "", title "hi",
# tokens "a b", type "answer"; written byte by byte, lengths counted by hand.
HAND = bytes.fromhex(
    "0a 8d01"  # Example.features, 141 bytes (2-byte varint)
    # entry creation_date: 44 bytes = key (2 + 13) + value (2 + 27)
    "0a 2c"
    "0a 0d" + b"creation_date".hex() + "12 1b"
    "0a 19"
    "0a 17" + b"2018-01-01 00:00:00 UTC".hex() +
    # entry score: 23 bytes = key (2 + 5) + value (2 + 14); -5 is a 10-byte varint
    "0a 17"
    "0a 05" + b"score".hex() + "12 0e"
    "1a 0c"
    "0a 0a"
    "fb ff ff ff ff ff ff ff ff 01"
    # entry tags: the empty string is one value b"" -> 0a 02 0a 00 inside the Feature
    "0a 0c"
    "0a 04" + b"tags".hex() + "12 04"
    "0a 02"
    "0a 00"
    # entry title
    "0a 0f"
    "0a 05" + b"title".hex() + "12 06"
    "0a 04"
    "0a 02" + b"hi".hex() +
    # entry tokens
    "0a 11"
    "0a 06" + b"tokens".hex() + "12 07"
    "0a 05"
    "0a 03" + b"a b".hex() +
    # entry type
    "0a 12"
    "0a 04" + b"type".hex() + "12 0a"
    "0a 08"
    "0a 06" + b"answer".hex()
)
HAND_DECODED = {
    "creation_date": "2018-01-01 00:00:00 UTC",
    "score": -5,
    "tags": "",
    "title": "hi",
    "tokens": "a b",
    "type": "answer",
}


def test_hand_written_blob():
    assert len(HAND) == 144
    got = decode_example(HAND)
    assert got == HAND_DECODED
    assert list(got) == NAMES == sorted(NAMES)
    assert isinstance(got["score"], int)


def test_encoder_default_is_tf_layout():
    assert encode_example(HAND_DECODED) == HAND


def test_hand_helpers_agree_with_hand_blob():
    assert (
        example(
            entry(b"creation_date", bytes_feature(b"2018-01-01 00:00:00 UTC")),
            entry(b"score", int64_feature(-5)),
            entry(b"tags", bytes_feature(b"")),
            entry(b"title", bytes_feature(b"hi")),
            entry(b"tokens", bytes_feature(b"a b")),
            entry(b"type", bytes_feature(b"answer")),
        )
        == HAND
    )


def test_decode_features_generic_map():
    blob = example(
        entry(b"b", bytes_feature(b"x", b"")),
        entry(b"i", int64_feature(1, -2, 300)),
        entry(b"f", float_feature(1.5, -0.25)),
        entry(b"fu", float_feature(2.0, packed=False)),
        entry(b"iu", int64_feature(7, -8, packed=False)),
    )
    got = decode_features(blob)
    assert got == {
        "b": ("bytes", [b"x", b""]),
        "f": ("float", [1.5, -0.25]),
        "fu": ("float", [2.0]),
        "i": ("int64", [1, -2, 300]),
        "iu": ("int64", [7, -8]),
    }
    assert list(got) == sorted(got)
    assert decode_features(blob, names=["i", "nope"]) == {"i": ("int64", [1, -2, 300])}
    assert decode_features(b"") == {}


def test_decode_features_of_hand_blob():
    got = decode_features(HAND)
    assert got["score"] == ("int64", [-5])
    assert got["tags"] == ("bytes", [b""])
    assert list(got) == NAMES


# -------------------------------------------------------------------------------- round trips

VALUE_SETS = [
    fields(),
    fields(score=-5),
    fields(score=-(2**40)),
    fields(score=-1),
    fields(score=0),
    fields(score=2**63 - 1),
    fields(score=-(2**63)),
    fields(score=127),
    fields(score=128),
    fields(score=16384),
    fields(tokens="naïve café ☃", title="über 𝄞"),
    fields(tags=""),
    fields(tags="node . js|c++"),
    fields(tokens="", title="", tags="", creation_date="", type=""),
    fields(tokens=" ".join(["word"] * 60)),  # > 127 bytes: 2-byte lengths
    fields(tokens="x" * 20000),  # 3-byte lengths
    fields(type="answer", creation_date="2008-07-31 21:42:52 UTC"),
]
OPTIONS = [
    dict(packed=p, key_value_order=kv, reverse_entries=r, extra_unknown=u)
    for p, kv, r, u in itertools.product([True, False], ["kv", "vk"], [False, True], [False, True])
]


@pytest.mark.parametrize("opts", OPTIONS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_round_trip_every_option(opts):
    for values in VALUE_SETS:
        blob = encode_example(values, **opts)
        got = decode_example(blob)
        assert got == values
        assert list(got) == NAMES


def test_round_trip_bytes_values_and_extra_features():
    blob = encode_example({**fields(), "extra_f": 0.5, "extra_b": b"\xff\xfe", "zz": 9})
    assert decode_example(blob) == fields()
    feats = decode_features(blob)
    assert feats["extra_f"] == ("float", [0.5])
    assert feats["extra_b"] == ("bytes", [b"\xff\xfe"])  # not UTF-8, but ignored by decode_example


def test_encoder_options_change_the_bytes():
    base = encode_example(fields(score=-5))
    variants = [encode_example(fields(score=-5), **o) for o in OPTIONS[1:]]
    assert all(v != base for v in variants)
    assert len(set(variants)) == len(variants)


def test_encoder_rejects_bad_input():
    with pytest.raises(ValueError):
        encode_example(fields(), key_value_order="x")
    with pytest.raises(ValueError):
        encode_example(fields(score=2**63))
    with pytest.raises(TypeError):
        encode_example(fields(score=True))
    with pytest.raises(TypeError):
        encode_example(fields(score=None))


# ------------------------------------------------------------------------- robustness rules


def test_negative_scores_are_ten_byte_varints():
    for score in (-5, -(2**40), -1, -(2**63)):
        assert len(varint(score)) == 10
        blob = so_blob(score=int64_feature(score))
        assert decode_example(blob)["score"] == score
        assert decode_example(so_blob(score=int64_feature(score, packed=False)))["score"] == score


def test_utf8_and_tags_with_spaces():
    blob = so_blob(tokens=bytes_feature("naïve café ☃".encode()), tags=bytes_feature(b"node . js|c++"))
    got = decode_example(blob)
    assert got["tokens"] == "naïve café ☃"
    assert got["tags"] == "node . js|c++"


def test_empty_tags_is_one_empty_value():
    got = decode_example(so_blob(tags=bytes_feature(b"")))
    assert got["tags"] == ""
    assert bytes_feature(b"") == bytes.fromhex("0a020a00")


def test_map_entries_in_any_order():
    feats = so_features()
    items = [entry(k.encode(), v) for k, v in feats.items()]
    rng = random.Random(0)
    for _ in range(20):
        rng.shuffle(items)
        got = decode_example(example(*items))
        assert got == fields()
        assert list(got) == NAMES


def test_value_before_key_inside_entry():
    feats = so_features()
    items = [ld(1, ld(2, v) + ld(1, k.encode())) for k, v in feats.items()]
    assert decode_example(example(*items)) == fields()


def test_repeated_features_field_is_merged():
    items = [entry(k.encode(), v) for k, v in so_features().items()]
    blob = ld(1, b"".join(items[:2])) + ld(1, b"".join(items[2:5])) + ld(1, items[5])
    assert decode_example(blob) == fields()
    # A later features field overrides an earlier one for the same key.
    blob = so_blob() + ld(1, entry(b"score", int64_feature(-7)) + entry(b"title", bytes_feature(b"new")))
    assert decode_example(blob) == fields(score=-7, title="new")
    # An empty features field, and one with no entries but unknown fields, change nothing.
    assert decode_example(ld(1, b"") + so_blob() + ld(1, b"\x10\x05")) == fields()


def test_duplicate_key_last_entry_wins():
    blob = example(
        *(entry(k.encode(), v) for k, v in so_features().items()),
        entry(b"tokens", bytes_feature(b"second")),
        entry(b"score", int64_feature(-2)),
    )
    assert decode_example(blob) == fields(tokens="second", score=-2)
    # Also when the later entry comes first in the features of another field order.
    blob = example(entry(b"tokens", bytes_feature(b"first")), *(entry(k.encode(), v) for k, v in so_features().items()))
    assert decode_example(blob)["tokens"] == "i tried y ."


def test_entry_without_list_is_absent_and_does_not_hide_earlier():
    base = [entry(k.encode(), v) for k, v in so_features().items()]
    for empty in (entry(b"tokens", b""), entry(b"tokens", None), entry(b"tokens", b"\x20\x01")):
        # An empty Feature, a missing value, a Feature with only an unknown field.
        assert decode_example(example(*base, empty)) == fields()
        assert decode_example(example(*base, empty, empty)) == fields()
    # Several entries: walking backwards, the first with a list set wins.
    blob = example(*base, entry(b"score", int64_feature(11)), entry(b"score", b""), entry(b"score", None))
    assert decode_example(blob)["score"] == 11
    # The only entry for the key has no list: the feature is missing.
    blob = example(*(entry(k.encode(), v) for k, v in so_features(tokens=b"").items()))
    with pytest.raises(FedsimError, match="'tokens' is missing"):
        decode_example(blob)
    assert "tokens" not in decode_features(blob)


def test_later_set_but_bad_entry_does_not_fall_back():
    base = [entry(k.encode(), v) for k, v in so_features().items()]
    # An empty list is a set list: it wins, and has 0 values.
    with pytest.raises(FedsimError, match="'tokens' has 0 values"):
        decode_example(example(*base, entry(b"tokens", ld(1, b""))))
    # A later entry of the wrong kind wins too, and is an error.
    with pytest.raises(FedsimError, match="'score' has kind bytes_list, expected int64_list"):
        decode_example(example(*base, entry(b"score", bytes_feature(b"3"))))


def test_entry_without_key_is_the_empty_name():
    blob = so_blob() + ld(1, entry(None, bytes_feature(b"v")))
    assert decode_example(blob) == fields()
    assert decode_features(blob)[""] == ("bytes", [b"v"])
    # Key twice inside one entry: the last key wins.
    twice = ld(1, ld(1, b"tokenz") + ld(1, b"tokens") + ld(2, bytes_feature(b"k")))
    assert decode_example(example(*(entry(k.encode(), v) for k, v in so_features().items()), twice))["tokens"] == "k"


def test_value_twice_in_entry_merges():
    # Two value fields merge like one Feature: the same kind's lists concatenate.
    two = ld(1, ld(1, b"tokens") + ld(2, bytes_feature(b"a")) + ld(2, bytes_feature(b"b")))
    blob = example(*(entry(k.encode(), v) for k, v in so_features().items()), two)
    assert decode_features(blob)["tokens"] == ("bytes", [b"a", b"b"])
    with pytest.raises(FedsimError, match="'tokens' has 2 values"):
        decode_example(blob)
    # A later value of another kind replaces the earlier (oneof).
    other = ld(1, ld(1, b"score") + ld(2, bytes_feature(b"x")) + ld(2, int64_feature(4)))
    blob = example(*(entry(k.encode(), v) for k, v in so_features().items()), other)
    assert decode_example(blob)["score"] == 4


def test_feature_oneof_last_kind_wins_and_same_kind_merges():
    feat = bytes_feature(b"x") + int64_feature(9)  # bytes_list then int64_list in one Feature
    assert decode_example(so_blob(score=feat))["score"] == 9
    feat = int64_feature(9) + bytes_feature(b"x")
    with pytest.raises(FedsimError, match="'score' has kind bytes_list"):
        decode_example(so_blob(score=feat))
    feat = bytes_feature(b"a") + bytes_feature(b"b")
    assert decode_features(so_blob(tokens=feat))["tokens"] == ("bytes", [b"a", b"b"])
    feat = bytes_feature(b"a") + int64_feature(1) + bytes_feature(b"b")
    assert decode_example(so_blob(tokens=feat))["tokens"] == "b"


UNKNOWN = [
    bytes.fromhex("f8 07") + varint(-3),  # field 127, varint (10 bytes)
    bytes.fromhex("49") + bytes(range(8)),  # field 9, fixed64
    ld(13, b"\x0a\x02\x0a\x00"),  # field 13, length-delimited
    bytes.fromhex("65 01 02 03 04"),  # field 12, fixed32
]


@pytest.mark.parametrize("junk", UNKNOWN, ids=["varint", "fixed64", "len", "fixed32"])
def test_unknown_fields_skipped_at_every_level(junk):
    def bf(v: bytes) -> bytes:  # junk in the Feature and in the BytesList
        return junk + ld(1, junk + ld(1, v) + junk) + junk

    def inf(v: int) -> bytes:  # a packed and an unpacked value, junk around and between
        return junk + ld(3, junk + ld(1, varint(v)) + junk + b"\x08" + varint(v) + junk) + junk

    def ent(k: str, feature: bytes) -> bytes:
        return ld(1, junk + ld(1, k.encode()) + junk + ld(2, feature) + junk)

    blob = (
        junk
        + ld(1, junk + b"".join(ent(k, inf(-5) if k == "score" else bf(DEFAULT[k].encode())) for k in NAMES) + junk)
        + junk
    )
    feats = decode_features(blob)
    assert feats["score"] == ("int64", [-5, -5])
    blob = (
        junk
        + ld(
            1,
            junk
            + b"".join(
                ent(k, junk + ld(3, junk + ld(1, varint(-5)) + junk) if k == "score" else bf(DEFAULT[k].encode()))
                for k in NAMES
            )
            + junk,
        )
        + junk
    )
    assert decode_example(blob) == fields(score=-5)


def test_known_field_with_other_wire_type_is_skipped():
    blob = b"\x08\x01" + so_blob()  # Example.features as a varint
    assert decode_example(blob) == fields()
    blob = example(
        *(entry(k.encode(), v) for k, v in so_features().items()), ld(1, ld(1, b"tokens") + b"\x10\x07")
    )  # entry value as a varint: no value
    assert decode_example(blob) == fields()
    feat = ld(1, b"\x0d\x00\x00\x00\x00" + ld(1, b"t"))  # BytesList.value as fixed32
    assert decode_example(so_blob(tokens=feat))["tokens"] == "t"


def test_int64_packed_unpacked_and_mixed():
    assert decode_example(so_blob(score=int64_feature(-5, packed=False)))["score"] == -5
    mixed = ld(3, b"\x08" + varint(1) + ld(1, varint(2) + varint(-3)) + b"\x08" + varint(2**40))
    assert decode_features(so_blob(score=mixed))["score"] == ("int64", [1, 2, -3, 2**40])
    two_chunks = ld(3, ld(1, varint(-4)) + ld(1, b""))  # an empty packed chunk adds nothing
    assert decode_example(so_blob(score=two_chunks))["score"] == -4


def test_float_packed_and_unpacked():
    feat = ld(2, ld(1, struct.pack("<2f", 1.0, 0.1)) + b"\x0d" + struct.pack("<f", -2.5))
    kind, values = decode_features(example(entry(b"f", feat)))["f"]
    assert kind == "float"
    assert values == [1.0, struct.unpack("<f", struct.pack("<f", 0.1))[0], -2.5]


def test_non_minimal_varints_accepted():
    # Tag 0x0a written as 8a 00 and lengths padded with a continuation byte: valid protobuf.
    body = b"".join(entry(k.encode(), v) for k, v in so_features().items())
    blob = b"\x8a\x00" + bytes([0x80 | (len(body) & 0x7F), 0x80 | (len(body) >> 7), 0x00]) + body
    assert decode_example(blob) == fields()
    feat = b"\x0a\x85\x00" + b"\x0a\x03" + b"a b"
    assert decode_example(so_blob(tokens=feat))["tokens"] == "a b"


def test_other_features_ignored_even_if_damaged():
    junk_feature = b"\x0a\x05\x0a\x09ab"  # its BytesList value runs past the end
    blob = example(
        entry(b"other", float_feature(1.0)),
        entry(b"z", junk_feature),
        *(entry(k.encode(), v) for k, v in so_features().items()),
    )
    assert decode_example(blob) == fields()


def test_accepts_bytearray_and_memoryview_rejects_str():
    assert decode_example(bytearray(HAND)) == HAND_DECODED
    assert decode_example(memoryview(HAND)) == HAND_DECODED
    with pytest.raises(TypeError):
        decode_example(HAND.decode("latin-1"))


# ------------------------------------------------------------------------------ error cases


@pytest.mark.parametrize("name", NAMES)
def test_missing_feature(name):
    with pytest.raises(FedsimError, match=f"feature '{name}' is missing"):
        decode_example(so_blob(**{name: None}))


def test_empty_example_is_missing_creation_date():
    with pytest.raises(FedsimError, match="'creation_date' is missing"):
        decode_example(b"")


@pytest.mark.parametrize("name", NAMES)
def test_wrong_kind(name):
    bad = bytes_feature(b"1") if name == "score" else int64_feature(1)
    want = "int64_list" if name == "score" else "bytes_list"
    with pytest.raises(FedsimError, match=f"'{name}' has kind .*, expected {want}"):
        decode_example(so_blob(**{name: bad}))
    with pytest.raises(FedsimError, match=f"'{name}' has kind float_list"):
        decode_example(so_blob(**{name: float_feature(1.0)}))


@pytest.mark.parametrize("name", NAMES)
def test_two_values_and_empty_list(name):
    two = int64_feature(1, 2) if name == "score" else bytes_feature(b"a", b"b")
    with pytest.raises(FedsimError, match=f"'{name}' has 2 values, expected exactly 1"):
        decode_example(so_blob(**{name: two}))
    empty = ld(3, b"") if name == "score" else ld(1, b"")
    with pytest.raises(FedsimError, match=f"'{name}' has 0 values"):
        decode_example(so_blob(**{name: empty}))


@pytest.mark.parametrize("name", [n for n in NAMES if n != "score"])
def test_invalid_utf8(name):
    with pytest.raises(FedsimError, match=f"'{name}' is not valid UTF-8"):
        decode_example(so_blob(**{name: bytes_feature(b"caf\xe9")}))


def test_invalid_utf8_feature_name_in_generic_map():
    blob = example(entry(b"\xff", bytes_feature(b"x")))
    with pytest.raises(FedsimError, match="not valid UTF-8"):
        decode_features(blob)
    with pytest.raises(FedsimError, match="'creation_date' is missing"):
        decode_example(blob)  # the bad name is just ignored


@pytest.mark.parametrize("opts", [{}, {"packed": False, "key_value_order": "vk", "reverse_entries": True}])
def test_every_truncation_raises_fedsim_error(opts):
    blob = encode_example(fields(score=-(2**40), tokens="naïve " * 30), **opts)
    for cut in range(1, len(blob)):
        with pytest.raises(FedsimError, match="corrupted tf.train.Example"):
            decode_example(blob[:cut])


def test_truncation_with_trailing_unknown_fields():
    # Cutting between two trailing unknown fields leaves a valid Example; any other cut fails.
    values = fields(score=-5)
    blob = encode_example(values, extra_unknown=True)
    valid = 0
    for cut in range(len(blob)):
        try:
            got = decode_example(blob[:cut])
        except FedsimError:
            continue
        assert got == values
        valid += 1
    assert valid == 4


@pytest.mark.parametrize(
    "blob, what",
    [
        (b"\x0a\x05\x0a", "past the end"),  # length past the end
        (b"\x0a", "middle of a field|past the end"),  # no length at all
        (b"\x0a\x80", "varint runs past"),  # varint running past the end
        (b"\x08" + b"\xff" * 10 + b"\x01", "longer than 10 bytes"),
        (b"\x0e\x00", "invalid wire type 6"),
        (b"\x0f\x00", "invalid wire type 7"),
        (b"\x0b\x0c", "group"),
        (b"\x0c", "group"),
        (b"\x02\x00", "field number 0"),
        (b"\x09\x00\x00", "runs past the end"),  # fixed64 cut short
        (b"\x0d\x00", "runs past the end"),  # fixed32 cut short
    ],
    ids=[
        "len",
        "nolen",
        "varint",
        "long-varint",
        "wt6",
        "wt7",
        "group-start",
        "group-end",
        "field0",
        "fixed64",
        "fixed32",
    ],
)
def test_corrupted_top_level(blob, what):
    with pytest.raises(FedsimError, match=f"corrupted tf.train.Example: .*({what})"):
        decode_example(blob)


def test_corrupted_inside_nested_messages():
    cases = [
        so_blob(tokens=b"\x0a\x03\x0a\x05abc"),  # BytesList value runs past its list
        so_blob(tokens=b"\x0a\x09\x0a\x01"),  # list runs past its Feature
        so_blob(score=b"\x1a\x03\x0a\x01\x80"),  # packed varint runs past its list
        so_blob(score=b"\x1a\x02\x08\x80"),  # unpacked varint runs past its list
        so_blob(score=b"\x1a\x0c\x0a\x0b" + b"\xff" * 11),  # packed varint of 11 bytes
        so_blob(tokens=b"\x0a\x02\x0b\x00"),  # a group inside a BytesList
        so_blob(tokens=b"\x0f"),  # bad wire type inside a Feature
        example(ld(1, ld(1, b"tokens") + b"\x12\x09\x0a\x01")),  # value past its entry
        example(b"\x0a\x09\x0a\x01x"),  # entry past its Features
        ld(1, b"\x0a\x80"),  # entry length varint runs past the Features
    ]
    for blob in cases:
        with pytest.raises(FedsimError, match="corrupted tf.train.Example"):
            decode_example(blob)


def test_corrupted_packed_float_length():
    blob = so_blob(score=int64_feature(1)) + ld(1, entry(b"f", ld(2, ld(1, b"\x00\x00\x80"))))
    with pytest.raises(FedsimError, match="not a multiple of 4"):
        decode_features(blob)


def test_random_damage_only_raises_fedsim_error():
    rng = random.Random(1234)
    blobs = [encode_example(v, **o) for v in VALUE_SETS[:6] for o in OPTIONS[::5]]
    for _ in range(3000):
        blob = bytearray(rng.choice(blobs))
        for _ in range(rng.randint(1, 4)):
            op = rng.random()
            i = rng.randrange(len(blob))
            if op < 0.6:
                blob[i] = rng.randrange(256)
            elif op < 0.8:
                del blob[i]
            else:
                blob.insert(i, rng.randrange(256))
        try:
            got = decode_example(bytes(blob))
        except FedsimError:
            continue
        assert list(got) == NAMES
        assert isinstance(got["score"], int)
        try:
            decode_features(bytes(blob))
        except FedsimError:
            pass
