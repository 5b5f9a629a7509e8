"""Reading a config file and `--set` items, and the checks that need no schema.

A light module (no pydantic schema, no registries, no torch, Flower or Ray): the CLI runs
`precheck` first, so that a missing or malformed config file, a malformed `--set` or an
unknown top-level key is answered in a fraction of a second, before the registries (and torch)
are imported to validate the rest (`fedsim.config`, which re-exports these functions).
"""

from __future__ import annotations

import difflib
import tomllib
from pathlib import Path
from typing import Any

from fedsim.errors import FedsimError
from fedsim.shipped import experiments_dir, resolve_experiment

#: The experiment run when no CONFIG is given.
DEFAULT_EXPERIMENT = experiments_dir() / "shakespeare_default.toml"

#: The top-level keys of an experiment config (`fedsim.config.Config`'s fields; a test keeps
#: the two equal).
TOP_LEVEL_KEYS = (
    "name",
    "plugins",
    "seed",
    "rounds",
    "data",
    "model",
    "client",
    "clipping",
    "sampling",
    "privacy",
    "filter",
    "server",
    "eval",
    "sim",
    "checkpoint",
    "tracking",
)


def read_config_file(p: Path) -> dict[str, Any]:
    """The raw TOML table of config file `p`; every way it can be unreadable is a
    `FedsimError` naming the file (missing, a folder, a device, binary, not UTF-8, not TOML)."""
    import stat as _stat

    try:
        st = p.stat()
    except FileNotFoundError:
        raise FedsimError(
            f"config file not found: {p}; pass an existing .toml file or the name of a shipped experiment "
            f"(`fedsim experiments` lists them)"
        ) from None
    except OSError as e:
        raise FedsimError(f"config file {p}: {e.strerror}") from None
    if _stat.S_ISDIR(st.st_mode):
        raise FedsimError(f"config {p} is a folder; pass a .toml file")
    if not _stat.S_ISREG(st.st_mode):
        raise FedsimError(f"config {p} is not a regular file; pass a .toml file")
    if st.st_size > 10 * 2**20:
        raise FedsimError(f"config file {p} is {st.st_size / 2**20:.0f} MiB; a config is a small .toml file")
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise FedsimError(f"config file {p} is not UTF-8 text (a binary file?); pass a .toml file") from None
    except OSError as e:
        raise FedsimError(f"config file {p}: {e.strerror}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise FedsimError(f"config file {p} is not valid TOML: {e}") from None


def parse_override(item: str) -> tuple[list[str], Any]:
    """Parse one `dotted.key=value` override; the value is read as a TOML value
    (numbers, booleans, quoted strings, arrays), falling back to a bare string."""
    if "=" not in item:
        raise FedsimError(f"--set {item!r}: expected dotted.key=value, e.g. --set rounds=10")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key or any(not p for p in key.split(".")):
        raise FedsimError(f"--set {item!r}: the key {key!r} is not a dotted key like client.lr")
    raw = raw.strip()
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key.split("."), value


def read_experiment(path: str | Path | None = None) -> tuple[Path, dict[str, Any]]:
    """The file `path` names (a path, or a shipped experiment's name; None: the bundled default
    experiment) and its raw TOML table, with the relative paths of its `plugins`, `data.root`
    and `data.cache_dir` taken from the file's folder (`fedsim.plugins.relative_to`); an empty
    file is a `FedsimError` (omitting CONFIG runs the default experiment)."""
    from fedsim.plugins import relative_to

    p = resolve_experiment(path) if path is not None else DEFAULT_EXPERIMENT
    raw = read_config_file(p)
    if not raw and path is not None:
        raise FedsimError(
            f"config file {p} is empty; give the experiment's keys, or omit CONFIG to run the "
            f"bundled default experiment"
        )
    return p, relative_to(raw, p.resolve().parent)


def precheck(path: str | Path | None, overrides: list[str] | None) -> None:
    """What can be checked of a command's config without the schema: the file (readable, TOML,
    not empty), each `--set` item's form, and the top-level keys of both. Raises the same
    `FedsimError` the full validation would, only sooner."""
    keys = set(read_experiment(path)[1]) if path is not None else set()
    keys |= {parse_override(item)[0][0] for item in overrides or []}
    for key in sorted(keys - set(TOP_LEVEL_KEYS)):
        near = difflib.get_close_matches(key, TOP_LEVEL_KEYS, n=1)
        hint = f" (did you mean '{near[0]}'?)" if near else ""
        raise FedsimError(
            f"invalid config: unknown key '{key}'{hint}; allowed keys here: {', '.join(sorted(TOP_LEVEL_KEYS))}"
        )
