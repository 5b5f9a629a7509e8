"""The deployed ServerApp's run configuration, and the run itself on a Deployment Engine grid.

``flwr run`` passes the app's run config (``[tool.flwr.app.config]`` in ``pyproject.toml``,
overridable with ``flwr run --run-config``). fedsim reads these keys:

- ``config`` — the experiment TOML (default: the bundled default experiment). A relative path
  is resolved against the app's folder, then the working directory.
- ``set`` — overrides, ``;``-separated ``dotted.key=value`` items, exactly like
  ``fedsim run --set`` (e.g. ``"rounds=3;data.max_users=60"``).
- ``out-dir`` — the run folder (default ``runs/deploy-<time>-<name>`` under the working
  directory of the ServerApp process; give an absolute path in production).
- ``min-nodes`` — wait until this many SuperNodes are connected before the census. Default 1.
- ``census-timeout`` — seconds to wait for every node's census answer. Default 600.
- ``resume`` — ``true``: continue the run in ``out-dir`` from its checkpoint, on this Deployment
  Engine (after a SuperLink crash, say). The folder's ``config.toml`` is the config (``config``
  is not read; ``set`` may change only what ``fedsim run --resume`` lets change, named in
  ``force``); the census must report the same users. Default false.
- ``force`` — with ``resume``: ``;``-separated keys that may differ from the checkpoint, as
  ``fedsim run --resume --force``.

The run folder, ledger and metrics are the same as in simulation. Differences, on purpose:
the 256-bit key of the noise, the cohort sampler and the clip count's noise comes from the OS
CSPRNG (``secrets``) and is never logged, written to the config or sent to a node; the config's ``seed``
still fixes the model initialisation and the clients' data order. Individual client updates
are never logged or persisted. Client-side error feedback is refused (its per-user state is
held by the simulator).
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import Any

from fedsim.config import Config, load_config
from fedsim.errors import FedsimError
from fedsim.privacy.rng import PrivacyKey
from fedsim.runner.build import Deployment

DEFAULT_CONFIG = "experiments/shakespeare_default.toml"


def _resolve(path: str, app_dir: Path | None) -> Path:
    from fedsim.config import resolve_experiment

    p = Path(path)
    if p.is_absolute():
        return p
    for base in ([app_dir] if app_dir is not None else []) + [Path.cwd()]:
        if (base / p).is_file():
            return base / p
    shipped = resolve_experiment(p)
    if shipped.is_file():
        return shipped
    raise FedsimError(
        f"run config 'config' = {path!r}: no such file (looked in the app folder, {Path.cwd()} and the shipped "
        f"experiments, which `fedsim experiments` lists)"
    )


def _items(value: Any) -> list[str]:
    return [item.strip() for item in str(value or "").split(";") if item.strip()]


def _resume(run_config: dict[str, Any], overrides: list[str]) -> tuple[bool, Config | None]:
    """``(resume, the config to resume with)`` from the run config's ``resume``/``force`` keys."""
    resume = run_config.get("resume", False)
    if not isinstance(resume, bool):
        raise FedsimError(f"run config: resume = {resume!r}; give true or false")
    out = str(run_config.get("out-dir", "")).strip()
    if not resume:
        if _items(run_config.get("force")):
            raise FedsimError("run config: force applies only with resume = true")
        return False, None
    if not out:
        raise FedsimError("run config: resume = true needs out-dir, the folder of the run to continue")
    from fedsim.runner.resume import resume_config

    return True, resume_config(Path(out), None, overrides, _items(run_config.get("force")))


def parse_run_config(run_config: dict[str, Any], app_dir: Path | None = None) -> tuple[Config, Path, int, float, bool]:
    """``(experiment config, run folder, min nodes, census timeout, resume)`` from the run config."""
    known = {"config", "set", "out-dir", "min-nodes", "census-timeout", "resume", "force"}
    unknown = sorted(set(run_config) - known)
    if unknown:
        raise FedsimError(f"run config: unknown key(s) {unknown}; allowed are {sorted(known)}")
    overrides = _items(run_config.get("set"))
    resume, resumed = _resume(run_config, overrides)
    cfg = resumed or load_config(_resolve(str(run_config.get("config", DEFAULT_CONFIG)), app_dir), overrides)
    if cfg.client.error_feedback == "server":
        raise FedsimError(
            "client.error_feedback = 'server' has no privacy guarantee (ε = ∞) and is refused in "
            "deployment; use client.error_feedback = 'none' or 'client'"
        )
    if cfg.client.error_feedback == "client":
        raise FedsimError(
            "client.error_feedback = 'client' keeps every user's error state in the simulator; "
            "it is not available in deployment"
        )
    out = str(run_config.get("out-dir", "")).strip()
    out_dir = Path(out) if out else Path("runs") / f"deploy-{datetime.now().strftime('%Y%m%d-%H%M%S')}-{cfg.name}"
    try:
        min_nodes = int(run_config.get("min-nodes", 1))
        timeout = float(run_config.get("census-timeout", 600.0))
    except (TypeError, ValueError):
        raise FedsimError("run config: min-nodes must be an integer and census-timeout a number") from None
    if min_nodes < 1 or timeout <= 0:
        raise FedsimError("run config: min-nodes must be ≥ 1 and census-timeout > 0")
    return cfg, out_dir, min_nodes, timeout, resume


def run_deployment(grid: Any, run_config: dict[str, Any], app_dir: Path | None = None) -> dict[str, Any]:
    """The deployed ServerApp's main: wait for the nodes, take the census, run the experiment."""
    from fedsim.data import spec_to_json
    from fedsim.deploy.nodes import merge_census
    from fedsim.plugins import manifest
    from fedsim.runner import run_experiment
    from fedsim.strategies.user_dp import census

    cfg, out_dir, min_nodes, timeout, resume = parse_run_config(run_config, app_dir)
    deadline = time.monotonic() + timeout
    while len(list(grid.get_node_ids())) < min_nodes:
        if time.monotonic() > deadline:
            raise FedsimError(
                f"only {len(list(grid.get_node_ids()))} of min-nodes = {min_nodes} SuperNodes "
                f"connected within {timeout:.0f} s"
            )
        time.sleep(0.2)
    data, owners = merge_census(census(grid, spec_to_json(cfg.data), timeout, manifest(cfg.plugins)))
    deployment = Deployment(grid, data, owners, min_nodes, PrivacyKey.generate())
    return run_experiment(cfg, out_dir, progress=True, deployment=deployment, resume=resume)
