"""Local Hugging Face folders (no hub access) and fedsim's cache of decoded arrays.

A dataset folder is either a ``datasets.save_to_disk`` output (a ``Dataset`` or a
``DatasetDict``) or the data files as downloaded from the Hub: parquet or CSV. For data files
the split is the file-name prefix (``train-00000-of-00001.parquet`` → ``train``; ``test``,
``validation`` likewise), anything else is ``train``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from fedsim.errors import FedsimError

DATA_SUFFIXES = (".parquet", ".arrow", ".csv")
SPLITS = ("train", "test", "validation")


def data_files(root: Path) -> list[Path]:
    """The files of ``root`` that define its content (what the cache key hashes)."""
    return sorted(
        p
        for p in root.rglob("*")
        if p.is_file()
        and ".fedsim-cache" not in p.parts
        and (p.suffix in DATA_SUFFIXES or p.name in ("dataset_info.json", "state.json", "dataset_dict.json"))
    )


def _split_of(path: Path) -> str:
    prefix = path.name.split("-")[0].split(".")[0]
    return prefix if prefix in SPLITS else "train"


def load_hf_folder(root: str | Path, cache_dir: Path | None = None) -> dict[str, Any]:
    """The splits (``{name: datasets.Dataset}``) of a ``save_to_disk`` folder or a folder of
    parquet or CSV files."""
    import datasets

    datasets.disable_progress_bars()
    root = Path(root)
    if not root.is_dir():
        raise FedsimError(
            f"data.root = {str(root)!r} is not a folder; point it at the dataset saved with "
            f"datasets.save_to_disk or at the folder of downloaded parquet/CSV files"
        )
    if (root / "dataset_dict.json").exists() or (root / "state.json").exists():
        try:
            ds = datasets.load_from_disk(str(root))
        except Exception as e:
            raise FedsimError(f"{root}: could not load the datasets.save_to_disk folder ({e})") from None
        return dict(ds) if isinstance(ds, datasets.DatasetDict) else {"train": ds}
    for kind, suffix in (("parquet", "*.parquet"), ("csv", "*.csv")):
        files = sorted(p for p in root.rglob(suffix) if ".fedsim-cache" not in p.parts)
        if not files:
            continue
        by_split: dict[str, list[str]] = {}
        for f in files:
            by_split.setdefault(_split_of(f), []).append(str(f))
        try:
            dd = datasets.load_dataset(
                kind, data_files=by_split, cache_dir=None if cache_dir is None else str(cache_dir / "hf")
            )
        except Exception as e:
            raise FedsimError(f"{root}: could not read the {kind} files ({e})") from None
        return dict(dd)
    raise FedsimError(
        f"{root}: neither a datasets.save_to_disk folder (dataset_dict.json / state.json) "
        f"nor any *.parquet or *.csv file"
    )


def split_source(root: str | Path, split: str) -> str:
    """The file(s) a split was read from, for error messages: the data files of ``split`` (up
    to three named), or the ``save_to_disk`` folder."""
    root = Path(root)
    if (root / "dataset_dict.json").exists() or (root / "state.json").exists():
        return f"{root} (save_to_disk folder, split '{split}')"
    files = [p for p in data_files(root) if p.suffix in (".parquet", ".csv") and _split_of(p) == split]
    if not files:
        return str(root)
    more = f" and {len(files) - 3} more" if len(files) > 3 else ""
    return ", ".join(str(p) for p in files[:3]) + more


def cache_folder(cache: Path, name: str, root: Path, version: int, settings: list[Any]) -> Path:
    """``cache/<kind>/<name>-<key>``: the key hashes the settings, the folder's absolute path and
    every data file's relative path, size and modification time."""
    h = hashlib.sha256()
    h.update(json.dumps([version, name, str(root.resolve()), settings]).encode())
    for f in data_files(root):
        st = f.stat()
        h.update(f"{f.relative_to(root)}:{st.st_size}:{st.st_mtime_ns}".encode())
    return cache / "arrays" / f"{name}-{h.hexdigest()[:20]}"


def build_once(folder: Path, build: Callable[[Path], None]) -> Path:
    """Run ``build(tmp)`` into a temporary folder and rename it to ``folder``, unless
    ``folder/meta.json`` exists already. Concurrent builders are safe: the first rename wins."""
    if (folder / "meta.json").exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=folder.parent))
    try:
        build(tmp)
        os.replace(tmp, folder)
    except OSError:
        if not (folder / "meta.json").exists():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def user_contiguous(tmp: Path, split: str, x: np.ndarray, y: np.ndarray, idx: list[list[int]]) -> list[int]:
    """Save ``x``/``y`` rows reordered user by user (``idx[u]`` = user ``u``'s rows) as
    ``<split>_x.npy``/``<split>_y.npy``; return the per-user counts."""
    order = np.array([i for r in idx for i in r], dtype=np.int64)
    np.save(tmp / f"{split}_x.npy", x[order])
    np.save(tmp / f"{split}_y.npy", y[order])
    return [len(r) for r in idx]
