"""FarmHash Fingerprint64 against published test vectors (FarmHash's farmhashna::Hash64, as
listed by independent ports), covering the 0–3, 4–7, 8–16, 17–32, 33–64 and > 64 byte paths,
and its use for TFF's OOV buckets."""

from __future__ import annotations

import pytest

from fedsim.data.stackoverflow.farmhash import fingerprint64, hash_bucket
from fedsim.data.stackoverflow.preprocess import NWPSpec

VECTORS = [
    (0x9AE16A3B2F90404F, b""),
    (0xB3454265B6DF75E3, b"a"),
    (0xAA8D6E5242ADA51E, b"ab"),
    (0x24A5B3A074E7F369, b"abc"),
    (0x1A5502DE4A1F8101, b"abcd"),
    (0xC22F4663E54E04D4, b"abcde"),
    (0xC329379E6A03C2CD, b"abcdef"),
    (0x3C40C92B1CCB7355, b"abcdefg"),
    (0xFEE9D22990C82909, b"abcdefgh"),
    (0x332C8ED4DAE5BA42, b"abcdefghi"),
    (0xAD052244B781C4EB, b"0123456789"),
    (0x3EF4C03514208C77, b"0123456789 "),
    (0x496841E83A33CC91, b"0123456789-0"),
    (0xD81BCB9F3679AC0C, b"0123456789~01"),
    (0x5DA5A6A117C606F6, b"0123456789#012"),
    (0x5361EAE17C1FF6BC, b"0123456789@0123"),
    (0x4283D4EF43627F64, b"0123456789'01234"),
    (0x46A7416ED4861E3B, b"0123456789=012345"),
    (0xA4ABB4E0DA2C594C, b"0123456789+0123456"),
    (0xCF1C7D3AD54F9215, b"0123456789*01234567"),
    (0x07ADF50B2AC764FC, b"0123456789&012345678"),
    (0xDEBCBA8E6F3EABD1, b"0123456789^0123456789"),
    (0xC91FDC3787A41523, b"0123456789%0123456789\\xa3"),
    (0xD78D5F852D522E6A, b"0123456789$0123456789!0"),
    (0x80D73B843BA57DB8, b"size:  a.out:  bad magic"),
    (0x8EB3808D1CCFC779, b"Nepal premier won't resign."),
    (0xB944F8A16261E414, b"C is as portable as Stonehedge!!"),
    (0xE8F89AB6DF9BDD25, b"Discard medicine more than two years old."),
    (0xA9961670CE2A46D9, b"I wouldn't marry him with a ten foot pole."),
    (0xBDD69B798D6BA37A, b"If the enemy is within range, then so are you."),
    (0xC2F8DB8624FEFC0E, b"The major problem is with sendmail.  -Mark Horton"),
    (0x5A0A6EFD52E84E2A, b"How can you write a big system without C++?  -Paul Glick"),
    (0x786D7E1987023CA9, b"He who has a shady past knows that nice guys finish last."),
    (0x5D14F96C18FE3D5E, b"Free! Free!/A trip/to Mars/for 900/empty jars/Burma Shave"),
    (0xEC8848FD3B266C10, b"His money is twice tainted: 'taint yours and 'taint mine."),
    (0x2A578B80BB82147C, b"The days of the digital watch are numbered.  -Tom Stoppard"),
    (0x55182F8859ECA4CE, b"For every action there is an equal and opposite government program."),
    (0xABCDB319FCF2826C, b"You remind me of a TV show, but that's all right: I watch it anyway."),
    (0x1D85702503AC7EB4, b"It's well we cannot hear the screams/That we create in others' dreams."),
    (0xA2B8BF3032021993, b"Give me a rock, paper and scissors and I will move the world.  CCFestoon"),
    (0x38AA3175B37F305C, b"It's a tiny change to the code and not completely disgusting. - Bob Manchek"),
    (0x7E85D7B050ED2967, b"There is no reason for any individual to have a computer in their home. -Ken Olsen, 1977"),
    (0x5A05644EB66E435E, b"Even if I could be Shakespeare, I think I should still choose to be Faraday. - A. Huxley"),
    (
        0x098EFF6958C5E91A,
        b"The fugacity of a constituent in a mixture of gases at a given temperature is proportional "
        b"to its mole fraction.  Lewis-Randall Rule",
    ),
    (
        0xC3F02C4FFD5D71E6,
        b"Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt "
        b"ut labore et dolore magna aliqua. Ut enim ad minim veniam, quis nostrud exercitation "
        b"ullamco laboris nisi ut aliquip ex ea commodo consequat. Duis aute irure dolor in "
        b"reprehenderit in voluptate velit esse cillum dolore eu fugiat nulla pariatur. Excepteur "
        b"sint occaecat cupidatat non proident, sunt in culpa qui officia deserunt mollit anim id "
        b"est laborum.",
    ),
]


@pytest.mark.parametrize("expected,data", VECTORS, ids=lambda v: str(len(v)) if isinstance(v, bytes) else "")
def test_fingerprint64_matches_published_vectors(expected, data):
    assert fingerprint64(data) == expected


def test_vectors_cover_every_length_branch():
    lengths = {len(d) for _, d in VECTORS}
    for lo, hi in ((0, 3), (4, 7), (8, 16), (17, 32), (33, 64), (65, 128), (129, 10_000)):
        assert any(lo <= n <= hi for n in lengths), (lo, hi)
    assert any(n > 64 and (n - 1) % 64 != 63 for n in lengths)  # the partial last block


def test_oov_buckets_follow_the_fingerprint():
    spec = NWPSpec([b"in", b"vocab"], seq_len=6, num_oov_buckets=4)
    assert (spec.oov, spec.bos, spec.eos, spec.num_classes) == (3, 7, 8, 9)
    words = [b"in", b"abc", b"", b"0123456789", b"vocab"]
    ids = spec.ids(b" ".join(words))
    assert ids[0] == spec.bos and ids[-1] == spec.eos
    assert ids[1:-1] == [
        1,
        3 + fingerprint64(b"abc") % 4,
        3 + fingerprint64(b"") % 4,
        3 + fingerprint64(b"0123456789") % 4,
        2,
    ]
    assert {hash_bucket(w, 4) for w in (b"abc", b"", b"0123456789")} == {
        0x24A5B3A074E7F369 % 4,
        0x9AE16A3B2F90404F % 4,
        0xAD052244B781C4EB % 4,
    }
