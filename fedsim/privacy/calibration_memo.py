"""Calibrated noise multipliers, remembered across processes.

Calibrating `z` for a target ε (`fedsim.privacy.accounting.calibrate_noise_multiplier`) costs
about ten PLD compositions: 8 s of CPU for the default experiment, every time `fedsim privacy`
or `fedsim run` starts. The result is a pure function of the accounting spec without its `z`,
the number of rounds, the target ε, dp-accounting's version and fedsim's search, so it is kept
in `$FEDSIM_CACHE/calibration/<digest>.json` (`$FEDSIM_CACHE` defaults to `~/.cache/fedsim`).

What the file is trusted with: nothing privacy depends on. A remembered `z` is used only after
ε at that `z` has been computed afresh with dp-accounting and found at most the target; the ε
that is printed and written to the ledger is always that fresh computation. A stale, foreign
or altered file can cost a fresh calibration, never a false ε. Set `FEDSIM_NO_CALIBRATION_MEMO=1`
to neither read nor write it.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

#: Bump when the search in `calibrate_noise_multiplier` changes what it returns.
SEARCH_VERSION = 1


def memo_dir() -> Path:
    """`$FEDSIM_CACHE/calibration` (read at every call)."""
    root = os.environ.get("FEDSIM_CACHE") or str(Path.home() / ".cache" / "fedsim")
    return Path(root) / "calibration"


def memo_key(spec: dict[str, Any], rounds: int, target_epsilon: float) -> dict[str, Any]:
    """Everything the calibrated `z` depends on.

    Parameters
    ----------
    spec : dict
        The accounting spec's fields (`AccountingSpec.to_dict()`); its `noise_multiplier` is
        left out (calibration ignores it).
    rounds : int
        Rounds of the run.
    target_epsilon : float
        The ε the search aims at.
    """
    fields = {k: v for k, v in spec.items() if k != "noise_multiplier"}
    return {
        "spec": fields,
        "rounds": int(rounds),
        "target_epsilon": float(target_epsilon),
        "dp_accounting": metadata.version("dp-accounting"),
        "search": SEARCH_VERSION,
    }


def _path(key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    return memo_dir() / f"{digest}.json"


def _enabled() -> bool:
    return os.environ.get("FEDSIM_NO_CALIBRATION_MEMO", "") in ("", "0")


def recall(key: dict[str, Any]) -> float | None:
    """The `z` remembered for `key`, or None (none, unreadable, or written for another key)."""
    if not _enabled():
        return None
    try:
        entry = json.loads(_path(key).read_text())
        z = float(entry["noise_multiplier"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return z if entry.get("key") == key and z > 0 else None


def remember(key: dict[str, Any], z: float) -> None:
    """Keep `z` for `key` (atomically; an unwritable cache is skipped: the memo only saves time)."""
    if not _enabled():
        return
    path = _path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".memo-", dir=path.parent)
    except OSError:
        return
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"key": key, "noise_multiplier": z}, f)
        os.replace(tmp, path)
    except OSError:
        Path(tmp).unlink(missing_ok=True)
