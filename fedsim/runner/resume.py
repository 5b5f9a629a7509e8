"""What may change when a run is resumed, and the checks that enforce it.

The checkpoint holds the run's whole resolved config, the accounting spec it started with (``z``
after calibration, ``δ``, ``N``, ``K̄``, scheme, mechanism, assignment) and a SHA-256 digest of
every key that is not mutable. ``fedsim run --resume DIR`` compares the folder's ``config.toml``
*and* the requested config (``CONFIG``/``--set``) against the checkpoint — an edited file is
treated like a ``--set`` — and the ledger's ε after the resume is computed from the checkpointed
spec, never re-resolved from a file. The rules, in one place (:data:`RESUME_RULES`):

=====================================  =========================================================
key                                    on resume
=====================================  =========================================================
``sim.*``, ``checkpoint.*``,           may change with ``--force KEY``: they change neither the
``eval.*``, ``name``,                  released models nor the accounting (``eval.*`` changes
``privacy.account_every``              only side statistics)
``rounds``                             may be *raised* with ``--force rounds`` when the noise is
                                       independent Gaussian (``privacy.mechanism = "gaussian"``
                                       or ``"none"``): ε is recomputed honestly for the longer
                                       run with the checkpoint's ``z`` (it then exceeds any
                                       original target). Refused for matrix-factorization noise,
                                       whose ``C`` was built for the original ``n``.
everything else                        refused: start a new run
=====================================  =========================================================
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import fields
from pathlib import Path
from typing import Any

from fedsim.config import Config, config_from_dict, load_config
from fedsim.errors import FedsimError

#: Prefixes and keys that may differ on resume when named with ``--force``.
FORCE_PREFIXES = ("sim.", "checkpoint.", "eval.")
FORCE_KEYS = ("name", "privacy.account_every")
#: The rules, as printed in error messages and ``--help``.
RESUME_RULES = (
    "--force KEY allows sim.*, checkpoint.*, eval.*, name and privacy.account_every to change, "
    "and rounds to grow for privacy.mechanism = 'gaussian' or 'none'; nothing else may change"
)


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        out.update(_flat(v, key + ".") if isinstance(v, dict) else {key: v})
    return out


def forceable(key: str) -> bool:
    """Whether ``key`` may change on resume with ``--force`` (``rounds`` has its own rule)."""
    return key.startswith(FORCE_PREFIXES) or key in FORCE_KEYS


#: Keys added after checkpoints began to carry a digest, with the value that means "as before":
#: left out of it while they hold it, so that older checkpoints keep their digest.
_LATER_KEYS = {
    "privacy.population": None,
    "privacy.silo_statistics": None,
    "clipping.mode": "flat",
    "clipping.stability": 0.01,
    "client.local_update": None,
    "plugins": None,
    "privacy.noise_memory_mib": 1024,
    "privacy.noise_table": True,
}


def privacy_digest(cfg: Config) -> str:
    """SHA-256 over the canonical JSON of every key that may not change on resume."""
    flat = {
        k: v
        for k, v in _flat(cfg.model_dump(mode="json")).items()
        if not forceable(k) and k != "rounds" and not (k in _LATER_KEYS and v == _LATER_KEYS[k])
    }
    return hashlib.sha256(json.dumps(flat, sort_keys=True).encode()).hexdigest()


def check_resume(stored: Config, requested: Config, force: list[str], source: str) -> None:
    """Refuse ``requested`` unless every difference from the checkpoint's ``stored`` config is
    allowed by :data:`RESUME_RULES` and named in ``force``. ``source`` names where the requested
    values came from (for the message)."""
    a, b = _flat(stored.model_dump(mode="json")), _flat(requested.model_dump(mode="json"))
    for key in force:
        if key != "rounds" and not forceable(key):
            raise FedsimError(f"--force {key}: that key cannot change on resume ({RESUME_RULES})")
        if key not in a.keys() | b.keys():
            raise FedsimError(
                f"--force {key}: there is no such config key; name a key as --set writes it (sim.num_workers)"
            )
    changed = sorted(
        k for k in a.keys() | b.keys() if a.get(k) != b.get(k) and not (k == "privacy.delta" and b.get(k) is None)
    )
    # keys that can never change first: suggesting --force for a key that can would only lead to
    # the next refusal
    changed.sort(key=lambda k: k == "rounds" or forceable(k))
    for key in changed:
        was, now = a.get(key), b.get(key)
        if key == "rounds":
            independent = stored.privacy.mechanism in ("gaussian", "none")
            if not independent:
                raise FedsimError(
                    f"--resume: {source} sets rounds = {now}, but the run's matrix-factorization noise "
                    f"(privacy.mechanism = '{stored.privacy.mechanism}') was built for rounds = {was}; "
                    f"rounds cannot change for it. Start a new run"
                )
            if now is not None and was is not None and now < was:
                raise FedsimError(f"--resume: {source} lowers rounds from {was} to {now}; rounds can only grow")
        elif not forceable(key):
            raise FedsimError(
                f"--resume: {key} in {source} differs from the run's checkpoint ({was!r} → {now!r}); "
                f"it affects privacy or training and cannot change on resume ({RESUME_RULES}). "
                f"Restore it, or start a new run"
            )
        if key not in force:
            raise FedsimError(
                f"--resume: {key} in {source} differs from the run's checkpoint ({was!r} → {now!r}); "
                f"pass --force {key} to allow it"
            )


def load_stored_config(folder: Path) -> tuple[dict[str, Any], Config]:
    """``(checkpoint, the config it was written with)`` of the run in ``folder``."""
    from fedsim.checkpoint import load_checkpoint

    ckpt_dir = folder / "checkpoint"
    if not (ckpt_dir / "checkpoint.pt").exists():
        metrics = folder / "metrics.jsonl"
        rows = len(metrics.read_text(encoding="utf-8").splitlines()) if metrics.exists() else 0
        ran = f"{rows} round(s) ran but none was checkpointed; see checkpoint.every" if rows else "no round completed"
        raise FedsimError(
            f"--resume {folder}: there is no checkpoint yet ({ran}); it cannot be resumed. Remove the folder and "
            f"start the run again "
            f"(`fedsim run CONFIG --out {folder}`), or start it in another --out"
        )
    ckpt = load_checkpoint(ckpt_dir)
    if "spec" not in ckpt or "config" not in ckpt:
        raise FedsimError(
            f"--resume {folder}: its checkpoint predates fedsim's integrity checks (no accounting spec); "
            f"resume it with the fedsim version that wrote it, or start a new run"
        )
    stored = config_from_dict(ckpt["config"])
    if ckpt.get("privacy_digest") != privacy_digest(stored):
        raise FedsimError(
            f"--resume {folder}: the checkpoint's config does not match its own digest; the checkpoint "
            f"was altered. Start a new run"
        )
    return ckpt, stored


def resume_config(folder: Path, config: Path | None, overrides: list[str], force: list[str]) -> Config:
    """The config to resume ``folder`` with: the folder's ``config.toml`` (or ``config``) plus
    ``overrides``, after checking the file and the request against the checkpoint."""
    _, stored = load_stored_config(folder)
    on_disk = load_config(folder / "config.toml")
    check_resume(stored, on_disk, force, f"{folder / 'config.toml'}")
    requested = load_config(config if config is not None else folder / "config.toml", overrides)
    check_resume(stored, requested, force, "the command line" if config is None else str(config))
    return requested


def checkpointed_spec(ckpt: dict[str, Any], folder: Path) -> Any:
    """The :class:`~fedsim.privacy.accounting.AccountingSpec` the run started with."""
    from fedsim.privacy.accounting import AccountingSpec

    if "spec" not in ckpt:
        raise FedsimError(f"--resume {folder}: its checkpoint predates fedsim's integrity checks; start a new run")
    names = {f.name for f in fields(AccountingSpec)}
    return AccountingSpec(**{k: v for k, v in ckpt["spec"].items() if k in names})
