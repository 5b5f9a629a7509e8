"""fedsim's Python API: what `import fedsim` offers (`fedsim.__all__`).

These names are stable; every other module may move between versions. The CLI commands are thin
shells around them: `fedsim run` is `run`, `fedsim privacy` `privacy_report`,
`fedsim sweep` `sweep`, `fedsim audit` `audit`.

- `load_config` — a validated experiment from a TOML file, a shipped experiment's name or a
  dict, with `dotted.key=value` overrides;
- `run` — train it (or resume it) and get a `RunResult`;
- `privacy_report` — ε, δ and the neighbouring relation without training;
- `sweep` — a sweep spec on Ray Tune;
- `audit` — an empirical privacy audit;
- `register_model`, `register_dataset`, `register_filter`, `register_optimizer`,
  `register_mechanism`, `register_local_update` — add a part to its registry, so configs can
  name it; `ModelKind` describes a model for `register_model`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fedsim.errors import FedsimError
from fedsim.models import ModelKind as ModelKind  # register_model's argument, public as fedsim.ModelKind

ConfigLike = Any  # a path, a shipped experiment's name, a dict, or a fedsim.config.Config


def load_config(source: str | Path | dict[str, Any] | None = None, overrides: Sequence[str] = ()) -> Any:
    """A validated experiment config. A bad key is a `FedsimError` that names every bad key;
    nothing runs.

    Parameters
    ----------
    source : str | Path | dict | None
        A TOML file, the name of a shipped experiment (`fedsim experiments` lists them), a dict
        with the TOML's tables, or None (the default) for the bundled default experiment.
    overrides : sequence of str
        `dotted.key=value` items (TOML values), applied in order, as the CLI's `--set`. Default:
        none.

    Returns
    -------
    fedsim.config.Config
        The validated config (a pydantic model): pass it to `run`, `privacy_report` or `audit`.
    """
    _check_arguments(source, overrides)
    from fedsim import plugins

    if not isinstance(source, dict):
        plugins.of_file(source)
        from fedsim import config as c

        return c.load_config(source, list(overrides))
    raw = plugins.of_table(json.loads(json.dumps(source)), "the config dict")  # a deep copy, plugins loaded
    from fedsim import config as c

    return c.config_from_dict(c.apply_overrides(raw, list(overrides)))


def _check_arguments(config: Any = None, overrides: Any = (), force: Any = (), **paths: Any) -> None:
    """One-line errors for arguments of the wrong type, before anything is imported or read
    (`run(123)`, `run(out=123)`, `overrides="rounds=1"`, which would be read one character at a
    time)."""
    if config is not None and not isinstance(config, (str, Path, dict)) and type(config).__name__ != "Config":
        raise FedsimError(
            f"config: give a TOML file's path, a shipped experiment's name, a dict or a loaded config, "
            f"not {type(config).__name__} {config!r}"
        )
    for name, value in paths.items():
        if value is not None and not isinstance(value, (str, Path)):
            raise FedsimError(f"{name}: give a folder's path (str or Path), not {type(value).__name__} {value!r}")
    for name, items in (("overrides", overrides), ("force", force)):
        if not isinstance(items, (list, tuple)) or not all(isinstance(x, str) for x in items):
            raise FedsimError(
                f"{name}: give a list of 'dotted.key=value' strings, e.g. {name}=['rounds=1'], not {items!r}"
            )


def _as_config(config: ConfigLike, overrides: Sequence[str] = ()) -> Any:
    from fedsim.config import Config

    if isinstance(config, Config):
        if overrides:
            return load_config(config.model_dump(mode="json", exclude_none=True), overrides)
        return config
    return load_config(config, overrides)


@dataclass(frozen=True)
class RunResult:
    """What a finished (or resumed and finished) run gives back.

    Attributes
    ----------
    run_folder : Path
        The run folder (`config.toml`, `metrics.jsonl`, `ledger.json`, `summary.json`,
        `checkpoint/`, `plots/`).
    summary : dict
        `summary.json` as a dict.
    metrics : list of dict
        The rows of `metrics.jsonl`, one per round.
    epsilon : float
        ε after the last round, from the ledger (`inf` without noise).
    delta : float
        δ of that guarantee.
    neighboring_relation : str
        What ε is stated for: `add_or_remove_one` or `zero_out`.
    """

    run_folder: Path
    summary: dict[str, Any]
    metrics: list[dict[str, Any]]
    epsilon: float
    delta: float
    neighboring_relation: str

    @property
    def final_parameters(self) -> torch.Tensor:
        """The final model `x_T` as one flat float32 vector (from the checkpoint)."""
        from fedsim.checkpoint import load_checkpoint

        return load_checkpoint(self.run_folder / "checkpoint")["server"]["params"].detach().cpu()

    def final_model(self) -> torch.nn.Module:
        """The final model as a PyTorch module of the run's architecture."""
        from torch.nn.utils import vector_to_parameters

        from fedsim.data import load_federated
        from fedsim.models import make_model

        cfg = load_config(self.run_folder / "config.toml")
        model = make_model(
            cfg.model.name, load_federated(cfg.data).model_dims(), dp_layers=cfg.privacy.unit == "example"
        )
        vector_to_parameters(self.final_parameters.to(torch.float32), model.parameters())
        return model


def _result(summary: dict[str, Any]) -> RunResult:
    folder = Path(summary["run_folder"])
    rows = [json.loads(x) for x in (folder / "metrics.jsonl").read_text(encoding="utf-8").splitlines() if x.strip()]
    eps = summary["epsilon"]
    return RunResult(
        folder,
        summary,
        rows,
        float("inf") if eps in (None, "inf") else float(eps),
        float(summary["delta"]),
        str(summary.get("neighboring_relation")),
    )


def run(
    config: ConfigLike = None,
    out: str | Path | None = None,
    *,
    overrides: Sequence[str] = (),
    resume: str | Path | None = None,
    force: Sequence[str] = (),
    progress: bool | None = None,
) -> RunResult:
    """Train an experiment and write its run folder (`fedsim run`).

    Parameters
    ----------
    config : str | Path | dict | Config | None
        A TOML file, a shipped experiment's name, a dict with the TOML's tables or a config from
        `load_config`. Default None: the bundled default experiment.
    out : str | Path | None
        The run folder; it must not hold a run. Default: `runs/<timestamp>-<name>`.
    overrides : sequence of str
        `dotted.key=value` items, as the CLI's `--set`. Default: none.
    resume : str | Path | None
        A run folder to continue from its checkpoint, bit-identical to an uninterrupted run;
        `config` may then be None (the folder's own config). Default None: a new run.
    force : sequence of str
        With `resume`, the config keys that may differ from the checkpoint's (as
        `fedsim run --resume --force`). Default: none.
    progress : bool | None
        Print the header and a progress line per round. Default None: print them when standard
        output is a terminal (an interactive session), not when it is a file or a notebook pipe;
        True or False to choose.

    Returns
    -------
    RunResult
        The run folder, the metrics and the guarantee after the last round.
    """
    _check_arguments(config, overrides, force, out=out, resume=resume)
    if progress is None:  # a person at a terminal sees the rounds go by; a script's log stays clean
        progress = sys.stdout.isatty()
    from fedsim.runner import run_experiment

    if resume is not None:
        from fedsim.runner.resume import resume_config

        if out is not None:
            raise FedsimError("resume= writes into that folder; drop out=")
        folder = Path(resume)
        if not folder.is_dir():
            raise FedsimError(f"resume={folder}: no such run folder")
        from fedsim import plugins

        plugins.of_file(folder / "config.toml")
        cfg = resume_config(folder, None if config is None else Path(config), list(overrides), list(force))
        return _result(run_experiment(cfg, folder, progress=progress, resume=True))
    if force:
        raise FedsimError("force= applies only with resume=")
    return _result(run_experiment(_as_config(config, overrides), out, progress=progress))


def privacy_report(
    config: ConfigLike = None, population: int | None = None, overrides: Sequence[str] = ()
) -> dict[str, Any]:
    """ε, δ, the noise multiplier, the scheme and the neighbouring relation of an experiment,
    without training (`fedsim privacy --json`).

    Parameters
    ----------
    config : str | Path | dict | Config | None
        As for `run`. Default None: the bundled default experiment.
    population : int | None
        `N`, the number of users, for a what-if (the data are not loaded). Default None: the
        data's users (or `privacy.population` when set).
    overrides : sequence of str
        `dotted.key=value` items, as the CLI's `--set`. Default: none.

    Returns
    -------
    dict
        What `fedsim privacy --json` prints: ε, δ, the noise multiplier, the scheme and the
        neighbouring relation.
    """
    from fedsim.runner import note_max_users
    from fedsim.runner import privacy_report as report

    cfg = _as_config(config, overrides)
    if population is None:
        if cfg.privacy.population is not None:
            population = int(cfg.privacy.population)
        else:
            from fedsim.data import load_federated

            population = load_federated(cfg.data).population
            note_max_users(cfg, population)
    if population < 1:
        raise FedsimError("population must be ≥ 1")
    return report(cfg, int(population))


def sweep(
    spec: str | Path,
    out: str | Path | None = None,
    *,
    address: str | None = None,
    resume: bool = False,
    only: str | None = None,
    overrides: Sequence[str] = (),
) -> dict[str, Any]:
    """Run (or resume) a sweep spec on Ray Tune (`fedsim sweep`); returns `sweep.json`'s dict.

    Parameters
    ----------
    spec : str | Path
        The sweep spec: a TOML file with a `[sweep]` table, or a shipped sweep's name.
    out : str | Path | None
        The sweep folder. Default: `runs/sweeps/<name>`.
    address : str | None
        A Ray cluster's `HOST:PORT` to join. Default None: a local Ray.
    resume : bool
        Finish a killed sweep in `out`. Default False.
    only : str | None
        Run only the trials whose name contains each comma-separated part. Default None: all.
    overrides : sequence of str
        `dotted.key=value` items applied to every trial (a smoke run: `rounds=2`). Default: none.

    Returns
    -------
    dict
        `sweep.json`: per arm, the seeds finished, the metric's mean ± std, ε with its δ and
        neighbouring relation, and the trials that are missing or not as planned.
    """
    from fedsim import plugins

    plugins.of_sweep(spec, out if resume else None)
    from fedsim.runner.sweep import run_sweep

    return run_sweep(spec, out, address=address, resume=resume, only=only, overrides=list(overrides))


def audit(
    config: ConfigLike = None,
    out: str | Path | None = None,
    *,
    attack: str = "gradient",
    canaries: int = 1000,
    overrides: Sequence[str] = (),
    progress: bool = False,
) -> dict[str, Any]:
    """An empirical privacy audit of an experiment (`fedsim audit`); returns `audit.json`'s dict.

    Parameters
    ----------
    config : str | Path | dict | Config | None
        As for `run`. Default None: the bundled default experiment.
    out : str | Path | None
        The audited run's folder. Default: `runs/<timestamp>-<name>`.
    attack : str
        `gradient` (random-direction canary users; a one-shot ε estimate), the default and the
        only one here. The text attacks (`canary`, `user-inference`) run from the CLI.
    canaries : int
        `M`, the canary users added to the population. Default 1000.
    overrides : sequence of str
        `dotted.key=value` items, as the CLI's `--set`. Default: none.
    progress : bool
        Print the run's progress. Default False.

    Returns
    -------
    dict
        `audit.json`: `epsilon_estimate` and `epsilon_interval` beside `ledger_epsilon`, the
        accounted ε of the same run.
    """
    if attack != "gradient":
        raise FedsimError(f"attack={attack!r}: the Python API runs 'gradient'; use `fedsim audit --attack {attack}`")
    from fedsim.runner.audit import run_audit

    return run_audit(_as_config(config, overrides), None if out is None else Path(out), canaries, progress=progress)


def register_model(kind: Any) -> Any:
    """Register a model so that `model.name` can name it. Register before the first config is
    loaded (in a plugin, so that every process has it).

    Parameters
    ----------
    kind : ModelKind
        `fedsim.ModelKind(name, task, cls, kwargs, summary)`: the name configs use, the
        dataset task it fits (`char`, `nwp`, `tag`, `femnist`, `cifar100` or `vector`), the
        `torch.nn.Module` class, fixed keyword arguments and a line for the docs. fedsim builds
        it as `cls(**dims, **kwargs, dp_layers=...)`, where `dims` are the dataset's sizes for
        the task (`vector`: `in_features` and `num_classes`).

    Returns
    -------
    ModelKind
        `kind`, registered.
    """
    from fedsim.models import register_model as add

    return add(kind)


def register_dataset(kind: Any) -> Any:
    """Register a dataset so that `data.name` can name it (see docs/howto/own-data.md).

    Parameters
    ----------
    kind : fedsim.data.registry.DatasetKind
        `DatasetKind(name, options, task, load, summary)`: the name configs use, its options
        model (a `DataOptions` subclass whose `name` is `Literal[name]`), the task its models
        fit, a function from the options to the population, and a line for the docs.

    Returns
    -------
    DatasetKind
        `kind`, registered.
    """
    from fedsim.data.registry import register_dataset as add

    return add(kind)


def register_filter(name: str, kind: Any, options: Any) -> Any:
    """Register a server filter so that `filter.name` can name it (see docs/howto/own-parts.md).

    Parameters
    ----------
    name : str
        The name configs use (`filter.name`).
    kind : fedsim.server.filters.base.FilterKind
        `FilterKind(name, options, build, summary)`: `build` makes a fresh filter from the
        options.
    options : type[pydantic.BaseModel]
        The filter's options model; its `name` field must be `Literal[name]` with default
        `name`.

    Returns
    -------
    FilterKind
        `kind`, registered.
    """
    from fedsim.server.filters.base import FILTERS

    return FILTERS.add(name, kind, options=options)


def register_optimizer(name: str, kind: Any, options: Any) -> Any:
    """Register a server optimizer so that `server.optimizer` can name it.

    Parameters
    ----------
    name : str
        The name configs use (`server.optimizer`).
    kind : fedsim.server.optim.OptimizerKind
        `OptimizerKind(name, options, build, summary, noise_variance)`: `build` makes a fresh
        optimizer from the options, the learning rate and the noise variance.
    options : type[pydantic.BaseModel]
        The optimizer's options model; its `optimizer` field must be `Literal[name]` with
        default `name`.

    Returns
    -------
    OptimizerKind
        `kind`, registered.
    """
    from fedsim.server.optim import OPTIMIZERS

    return OPTIMIZERS.add(name, kind, options=options)


def register_mechanism(name: str, mechanism: Any, options: Any | None = None) -> Any:
    """Register a noise mechanism so that `privacy.mechanism` can name it (see
    docs/howto/own-parts.md).

    Parameters
    ----------
    name : str
        The name configs use (`privacy.mechanism`).
    mechanism : fedsim.privacy.mechanisms.base.Mechanism
        An instance of a `Mechanism` subclass; its `strategy` gives the factorization.
    options : type[pydantic.BaseModel] | None
        The mechanism's options model; its `mechanism` field must be `Literal[name]` with
        default `name`. Default None: no options.

    Returns
    -------
    Mechanism
        `mechanism`, registered.
    """
    from fedsim.privacy.mechanisms.registry import MECHANISMS

    return MECHANISMS.add(name, mechanism, options=options)


def register_local_update(name: str, update: Any) -> Any:
    """Register a local update so that `client.local_update` can name it. fedsim runs it inside
    its per-user isolation and clips the result, so ε does not depend on it.

    Parameters
    ----------
    name : str
        The name configs use (`client.local_update`).
    update : callable
        `update(model, batches, loss, spec) -> float`: trains `model` (holding the broadcast
        model) in place on this user's `(x, y)` batches with the dataset's `loss`; `spec` is the
        configured `client` settings. Returns the mean training loss.

    Returns
    -------
    callable
        `update`, registered.
    """
    from fedsim.training.local_updates import register_local_update as add

    return add(name, update)
