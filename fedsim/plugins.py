"""Plugins: user code that registers parts (models, datasets, filters, optimizers, mechanisms)
before fedsim builds its config schema from the registries.

A plugin is a module name (`my_package.my_module`, importable from `sys.path`) or a Python
file (`path/to/parts.py`; in a config file a relative path is taken from the file's folder,
elsewhere from the current directory; it is recorded absolute). Three ways to load one, all before `fedsim.config` builds its schema:

- the config key `plugins = [...]`: every fedsim entry point that reads a config (the CLI, the
  Python API, a resume, the deployed ServerApp) imports them first;
- the environment variable `FEDSIM_PLUGINS` (`os.pathsep`-separated): fedsim sets it once a
  config's plugins are loaded, so every process the run starts — Ray workers, Tune trials —
  imports them too; an operator sets it for a SuperNode;
- the entry-point group `fedsim.plugins` of installed packages.

A plugin that fails to import, or registers a name twice, is a one-line `FedsimError`
naming it. A plugin must not import `fedsim.config` itself (the schema is built after it).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fedsim.errors import FedsimError, RegistryFrozen

ENV = "FEDSIM_PLUGINS"
ENTRY_POINT_GROUP = "fedsim.plugins"
#: plugin spec (a module name or an absolute file path) → the module it was imported as
LOADED: dict[str, str] = {}
#: SHA-256 of each plugin file loaded → its spec: the same code at another path is the same plugin
DIGESTS: dict[str, str] = {}
_startup_done = False


def is_file(spec: str) -> bool:
    """Whether `spec` names a Python file rather than a module."""
    return spec.endswith(".py") or os.sep in spec or "/" in spec


def resolve(spec: str) -> str:
    """`spec` as recorded: a module name unchanged, a file path absolute."""
    if not isinstance(spec, str) or not spec.strip():
        raise FedsimError(f"plugins: {spec!r} is not a module name or a .py file path")
    return str(Path(spec).expanduser().resolve()) if is_file(spec) else spec.strip()


def _import_file(path: str) -> str:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"no such file: {p}")
    name = f"fedsim_plugin_{p.stem}_{hashlib.sha256(path.encode()).hexdigest()[:8]}"
    spec = importlib.util.spec_from_file_location(name, p)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {p}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return name


def load(specs: Iterable[str], origin: str) -> list[str]:
    """Import each plugin of `specs` once (`origin` says where they were listed, for errors);
    return them as recorded. Adds them to `FEDSIM_PLUGINS` for the processes started later."""
    out = []
    for raw in specs:
        spec = resolve(raw)
        out.append(spec)
        if spec in LOADED:
            continue
        sha = digest(spec)
        if sha and sha in DIGESTS:  # this file's code is loaded already, from another path
            LOADED[spec] = LOADED[DIGESTS[sha]]
            continue
        try:
            LOADED[spec] = _import_file(spec) if is_file(spec) else importlib.import_module(spec).__name__
        except RegistryFrozen:
            raise FedsimError(
                f"plugin {spec!r} (from {origin}) was not loaded when this process started, and parts cannot "
                f"be registered once a config is loaded: name it in ${ENV} for this process (in deployment, "
                f"in the environment of the SuperLink and of every SuperNode), or install it as a package "
                f"with a {ENTRY_POINT_GROUP!r} entry point"
            ) from None
        except FedsimError as e:
            raise FedsimError(f"plugin {spec!r} (from {origin}): {e}") from None
        except Exception as e:
            raise FedsimError(f"plugin {spec!r} (from {origin}) failed to import: {type(e).__name__}: {e}") from None
        if sha:
            DIGESTS[sha] = spec
    _export()
    return out


def digest(spec: str) -> str:
    """The SHA-256 of plugin file `spec` (hex), or `""` for a module name or a missing file."""
    p = Path(spec)
    return hashlib.sha256(p.read_bytes()).hexdigest() if is_file(spec) and p.is_file() else ""


def manifest(specs: Iterable[str] | None) -> list[dict[str, str]]:
    """What the processes of a run must load, as sent to them: each plugin's spec as recorded and,
    for a file, the SHA-256 of its contents (so a node may hold the same file at another path)."""
    return [{"spec": s, "sha256": digest(s)} for s in (specs or [])]


def require(items: Iterable[dict[str, str]], where: str) -> None:
    """Load the plugins of a run's `manifest` in this process (`where` names it for
    errors, e.g. `"this SuperNode"`). A plugin already loaded here, by spec or by the same file
    contents, counts as loaded; a file missing here, or different from the server's, is an error
    that says how to provide it."""
    load_startup()
    for item in items:
        spec, sha = str(item["spec"]), str(item.get("sha256", ""))
        if spec in LOADED or (sha and sha in DIGESTS):
            continue
        how = (
            f"copy it there, or start {where} with ${ENV} naming a copy, or install it as a package with a "
            f"{ENTRY_POINT_GROUP!r} entry point"
        )
        if is_file(spec) and not Path(spec).is_file():
            raise FedsimError(f"the run uses plugin {spec!r}, which is not on {where}: {how}")
        if sha and digest(spec) != sha:
            raise FedsimError(f"plugin {spec!r} on {where} is not the file the server loaded (SHA-256 differs): {how}")
        load([spec], f"the run's plugins, on {where}")


def ray_env_vars() -> dict[str, str]:
    """The environment a Ray job's workers need for this process's plugins (`FEDSIM_PLUGINS`
    when set): a cluster joined by address starts its workers from its own environment, not
    from this process's."""
    return {ENV: os.environ[ENV]} if os.environ.get(ENV) else {}


def _export() -> None:
    if LOADED:
        os.environ[ENV] = os.pathsep.join(LOADED)


def load_startup() -> None:
    """Load the plugins of `FEDSIM_PLUGINS` and of the `fedsim.plugins` entry points (once per
    process; `fedsim.config` calls it before building its schema)."""
    global _startup_done
    if _startup_done:
        return
    _startup_done = True
    env = [s for s in os.environ.get(ENV, "").split(os.pathsep) if s.strip()]
    if env:
        load(env, f"${ENV}")
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.value in LOADED:
            continue
        try:
            ep.load()
        except Exception as e:
            raise FedsimError(
                f"plugin entry point {ep.name!r} ({ep.value}) failed to import: {type(e).__name__}: {e}"
            ) from None
        LOADED[ep.value] = ep.value
    _export()


def relative_to(raw: Any, folder: Path) -> Any:
    """`raw` with the relative file paths of its `plugins`, `data.root` and
    `data.cache_dir` taken from `folder` (a config file's own folder), so that a config names
    its plugins and its data wherever fedsim is started from (`--set` paths stay relative to the
    current folder, as a shell's are)."""
    data = raw.get("data") if isinstance(raw, dict) else None
    if isinstance(data, dict):
        paths = {
            k: str(folder / v)
            for k, v in data.items()
            if k in ("root", "cache_dir") and isinstance(v, str) and v and not Path(v).expanduser().is_absolute()
        }
        raw = {**raw, "data": {**data, **paths}}
    if not isinstance(raw, dict) or not isinstance(raw.get("plugins"), list):
        return raw
    specs = [
        str(folder / s) if isinstance(s, str) and is_file(s) and not Path(s).expanduser().is_absolute() else s
        for s in raw["plugins"]
    ]
    return {**raw, "plugins": specs}


def of_table(raw: Any, origin: str) -> Any:
    """Load the plugins a raw config table lists (`plugins = [...]`), before the schema is
    built; returns the table with their specs as recorded (file paths absolute)."""
    if not isinstance(raw, dict) or "plugins" not in raw:
        return raw
    specs = raw["plugins"]
    if not isinstance(specs, list):
        raise FedsimError(f"plugins (in {origin}): expected a list of module names or .py paths")
    return {**raw, "plugins": load(specs, origin)}


def _toml(p: Path) -> dict[str, Any] | None:
    """The table of TOML file `p`, or None when it is missing or unreadable (the config loader
    reports those, with its own message)."""
    if p.suffix != ".toml" or not p.is_file():
        return None
    try:
        return tomllib.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None


def of_file(path: str | Path | None) -> None:
    """Load the plugins listed in the config file `path`, or in the shipped experiment it names
    (None, a missing or unreadable file: nothing; the config loader reports those)."""
    from fedsim.shipped import resolve_experiment

    if path is None:
        return
    p = resolve_experiment(path)  # a shipped experiment's name reads that file's plugins
    raw = _toml(p)
    if raw is not None:
        of_table(relative_to(raw, p.resolve().parent), str(path))


def of_sweep(spec: str | Path | None, resume: str | Path | None = None) -> None:
    """Load the plugins of a sweep: its base config's (`sweep.config`, relative to the spec), or
    for a resumed sweep those of the base table recorded in its `plan.json`."""
    if resume is not None:
        plan = Path(resume) / "plan.json"
        if plan.is_file():
            import json

            try:
                of_table(json.loads(plan.read_text(encoding="utf-8")).get("base_config"), str(plan))
            except (OSError, ValueError, AttributeError):
                return
        return
    from fedsim.shipped import resolve_experiment

    path = None if spec is None else resolve_experiment(spec)  # a shipped sweep's name too
    raw = None if path is None else _toml(path)
    sweep = raw.get("sweep") if raw is not None else None
    base = sweep.get("config") if isinstance(sweep, dict) else None
    if isinstance(base, str) and path is not None:
        of_file(path.parent / base)
