"""Where the shipped experiment configs are, and what a name given for one resolves to.

A light module (no config schema, no registries): the plugins a config lists are read from the
file a name resolves to before anything builds the schema (:func:`fedsim.plugins.of_file`).
"""

from __future__ import annotations

from pathlib import Path

#: the source tree (or, in a wheel, site-packages)
REPO_ROOT = Path(__file__).resolve().parent.parent


def experiments_dir() -> Path:
    """The shipped experiment configs: ``fedsim/experiments`` of an installed wheel, else the
    source tree's ``experiments/``."""
    inside = Path(__file__).resolve().parent / "experiments"
    return inside if inside.is_dir() else REPO_ROOT / "experiments"


def resolve_experiment(path: str | Path) -> Path:
    """``path`` when it exists; otherwise a shipped experiment it names — ``shakespeare_default``,
    ``shakespeare_default.toml``, ``experiments/shakespeare_default.toml`` or
    ``sweeps/filter_ablation.toml`` all work from any folder (``fedsim experiments`` lists them).
    A path that is neither is returned as given (the reader then says it is missing)."""
    p = Path(path)
    if p.exists() or p.is_absolute():
        return p
    parts = p.parts[1:] if p.parts[:1] == ("experiments",) else p.parts
    if not parts:
        return p
    shipped = experiments_dir().joinpath(*parts)
    if shipped.suffix != ".toml":
        shipped = shipped.with_name(shipped.name + ".toml")
    return shipped if shipped.is_file() else p


def shipped_experiments() -> list[tuple[str, str]]:
    """``(name, first line of its comment)`` of every shipped experiment and sweep config."""
    root = experiments_dir()
    out = []
    for f in sorted(root.glob("*.toml")) + sorted(root.glob("sweeps/*.toml")):
        first = next((ln.lstrip("# ").strip() for ln in f.read_text(encoding="utf-8").splitlines() if ln.strip()), "")
        out.append((f.relative_to(root).with_suffix("").as_posix(), first))
    return out
