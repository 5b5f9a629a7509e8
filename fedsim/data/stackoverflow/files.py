"""The Stack Overflow files as downloaded from TFF, without TensorFlow (docs/stackoverflow_format.md A1).

A data folder (``data.root``) holds, as downloaded or extracted:

- ``stackoverflow.sqlite`` or ``stackoverflow.sqlite.lzma`` (``.xz`` or legacy ``.lzma``
  container: auto-detected);
- ``stackoverflow.word_count`` or ``stackoverflow.word_count.tar.bz2``;
- ``stackoverflow.tag_count`` or ``stackoverflow.tag_count.tar.bz2``.

Compressed files are unpacked once, streaming in 1 MiB chunks, into a cache folder (default
``<root>/.fedsim-cache``), through a temporary file renamed into place at the end, so an
interrupted decompression never leaves a truncated database behind. A plain file next to the
compressed one wins. Local copies need no checksum; :func:`verify_sha256` checks the count
archives against TFF's published values when asked (``--verify``).
"""

from __future__ import annotations

import hashlib
import lzma
import os
import tarfile
from pathlib import Path

from fedsim.errors import FedsimError

SQLITE = "stackoverflow.sqlite"
WORD_COUNT = "stackoverflow.word_count"
TAG_COUNT = "stackoverflow.tag_count"
#: TFF's published sha256 of the count archives (``stackoverflow.py:160-207``).
SHA256 = {
    WORD_COUNT + ".tar.bz2": "1dc00256d6e527c54b9756d968118378ae14e6692c0b3b6cad470cdd3f0c519c",
    TAG_COUNT + ".tar.bz2": "6fe281cec490d9384a290d560072438e7e2b377bbb823876ce7bd6f82696772d",
}
CHUNK = 1 << 20


def _cache(root: Path, cache_dir: str | Path | None) -> Path:
    c = Path(cache_dir) if cache_dir is not None else root / ".fedsim-cache"
    c.mkdir(parents=True, exist_ok=True)
    return c


def _check_root(root: str | Path) -> Path:
    r = Path(root)
    if not r.is_dir():
        raise FedsimError(
            f"data.root = {str(r)!r} is not a folder; point it at the folder holding the "
            f"Stack Overflow files ({SQLITE}[.lzma], {WORD_COUNT}[.tar.bz2], {TAG_COUNT}[.tar.bz2])"
        )
    return r


def _locate(root: str | Path, name: str, suffix: str, cache_dir: str | Path | None) -> tuple[Path, Path | None]:
    """``(file, None)`` when ``<root>/<name>`` or its cached unpacked copy exists, else
    ``(cache target, packed file)`` for ``<root>/<name><suffix>``; raises when neither is there."""
    r = _check_root(root)
    plain = r / name
    if plain.is_file():
        return plain, None
    packed = r / (name + suffix)
    if not packed.is_file():
        raise FedsimError(
            f"{r}: neither {name} nor {name}{suffix} is there; download "
            f"https://storage.googleapis.com/tff-datasets-public/{name}{suffix} into it"
        )
    out = _cache(r, cache_dir) / name
    return (out, None) if out.is_file() else (out, packed)


def sqlite_path(root: str | Path, cache_dir: str | Path | None = None) -> Path:
    """The database file: ``<root>/stackoverflow.sqlite``, or ``stackoverflow.sqlite.lzma``
    decompressed once into the cache."""
    out, packed = _locate(root, SQLITE, ".lzma", cache_dir)
    if packed is not None:
        decompress_lzma(packed, out)
    return out


def decompress_lzma(src: Path, dst: Path) -> None:
    """Stream-decompress ``src`` (``.xz`` or ``.lzma`` container, auto-detected) to ``dst``."""
    tmp = dst.with_name(dst.name + ".partial")
    dec = lzma.LZMADecompressor()  # FORMAT_AUTO: both containers
    try:
        with open(src, "rb") as fin, open(tmp, "wb") as fout:
            while True:
                chunk = fin.read(CHUNK)
                if not chunk:
                    break
                fout.write(dec.decompress(chunk))
                if dec.eof:
                    break
        if not dec.eof:
            raise FedsimError(f"{src} is truncated (the lzma stream ends early); download it again")
    except lzma.LZMAError as e:
        tmp.unlink(missing_ok=True)
        raise FedsimError(f"{src} is not a valid .lzma/.xz file ({e}); download it again") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, dst)


def count_file(root: str | Path, name: str, cache_dir: str | Path | None = None) -> Path:
    """``<root>/<name>`` (``stackoverflow.word_count`` or ``.tag_count``), or its ``.tar.bz2``
    archive's single member extracted once into the cache."""
    out, archive = _locate(root, name, ".tar.bz2", cache_dir)
    if archive is None:
        return out
    tmp = out.with_name(out.name + ".partial")
    try:
        with tarfile.open(archive, "r:*") as tar:
            member = next((m for m in tar.getmembers() if m.isfile() and Path(m.name).name == name), None)
            if member is None:
                raise FedsimError(f"{archive} holds no file named {name}; is it the right archive?")
            src = tar.extractfile(member)
            assert src is not None
            with open(tmp, "wb") as f:
                while chunk := src.read(CHUNK):
                    f.write(chunk)
    except (tarfile.TarError, EOFError, OSError) as e:
        tmp.unlink(missing_ok=True)
        raise FedsimError(f"{archive} is not a readable .tar.bz2 ({e}); download it again") from None
    os.replace(tmp, out)
    return out


def verify_sha256(path: str | Path, expected: str | None = None) -> None:
    """Check ``path`` against TFF's published sha256 (by file name) or ``expected``."""
    p = Path(path)
    want = expected or SHA256.get(p.name)
    if want is None:
        raise FedsimError(f"no published sha256 for {p.name}; only the count archives have one")
    h = hashlib.sha256()
    with open(p, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    if h.hexdigest() != want:
        raise FedsimError(
            f"{p}: sha256 {h.hexdigest()} differs from TFF's {want}; the file is corrupted "
            f"or not the TFF release (omit --verify for a local variant)"
        )
