"""Atomic checkpoints: write to a temporary file in the same folder, then rename.

A kill during the write leaves the previous checkpoint intact. A checkpoint is
the union of every stateful piece's ``state_dict()`` plus the round counter. It holds the
privacy key (in deployment a secret from the OS) and the noise state, so the file is created
owner-only (0600) in an owner-only folder (0700), and must be protected like a key.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from fedsim.errors import FedsimError, writing

CHECKPOINT_NAME = "checkpoint.pt"


def save_checkpoint(folder: str | Path, state: dict[str, Any], name: str = CHECKPOINT_NAME) -> Path:
    """Write ``state`` to ``folder/name`` atomically and synced; return the path.

    Parameters
    ----------
    folder : the checkpoint folder (made owner-only, 0700).
    state : what to write (``torch.save``).
    name : the file's name in ``folder`` (default ``checkpoint.pt``; the Flower wrapper also
        writes its noise stream's state to ``noise.pt``).
    """
    folder = Path(folder)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(folder, 0o700)  # the checkpoint holds the privacy key and the noise state
    target = folder / name
    with writing(target):  # a full disk is a one-line error naming the checkpoint
        fd, tmp = tempfile.mkstemp(prefix=".ckpt-", dir=folder)  # created 0600
        try:
            os.fchmod(fd, 0o600)
            with os.fdopen(fd, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return target


def load_checkpoint(folder: str | Path, name: str = CHECKPOINT_NAME) -> dict[str, Any]:
    """Read ``folder/name`` (default ``checkpoint.pt``)."""
    path = Path(folder) / name
    if not path.exists():
        raise FedsimError(f"no checkpoint at {path}")
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:
        raise FedsimError(f"checkpoint {path} is unreadable ({e})") from None
