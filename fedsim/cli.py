"""The ``fedsim`` command.

Commands: ``run`` (train an experiment), ``privacy`` (ε or z without training),
``report`` (plots and a comparison table of run folders), ``data`` (population
statistics). User errors print one message (no traceback) and exit with status 2.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from fedsim.config import DEFAULT_EXPERIMENT, load_config
from fedsim.errors import FedsimError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="fedsim — federated learning with user-level differential privacy on Flower + Ray.",
)

ConfigArg = Annotated[
    Optional[Path],
    typer.Argument(help=f"Experiment TOML (default: {DEFAULT_EXPERIMENT.relative_to(DEFAULT_EXPERIMENT.parent.parent)}).",
                   show_default=False),
]
SetOpt = Annotated[
    Optional[list[str]],
    typer.Option("--set", help="Override a config key: --set dotted.key=value (repeatable; TOML values)."),
]


def _offline_env() -> None:
    for k, v in {"FLWR_TELEMETRY_ENABLED": "0", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}.items():
        os.environ.setdefault(k, v)


@app.command()
def run(config: ConfigArg = None, set_: SetOpt = None,
        out: Annotated[Optional[Path], typer.Option("--out", help="Run folder (default runs/<timestamp>-<name>).")] = None,
        quiet: Annotated[bool, typer.Option("--quiet", help="No progress line.")] = False) -> None:
    """Train an experiment in Flower's simulation engine on Ray and write its run folder."""
    _offline_env()
    cfg = load_config(config, set_ or [])
    from fedsim.simulation import run_experiment

    summary = run_experiment(cfg, out, progress=not quiet)
    acc = summary["final_eval_accuracy"]
    eps = summary["epsilon"]
    typer.echo(
        f"done: {summary['rounds_completed']} rounds, eval accuracy "
        f"{'–' if acc is None else f'{100 * acc:.2f}%'} (most frequent char "
        f"{100 * summary['majority_baseline_accuracy']:.2f}%), ε = {eps if isinstance(eps, str) else f'{eps:.3f}'} "
        f"at δ = {summary['delta']:.3g}, {summary['wall_seconds']:.0f} s"
    )


@app.command()
def privacy(config: ConfigArg = None, set_: SetOpt = None,
            population: Annotated[Optional[int], typer.Option(help="Population N (what-if; skips loading data).")] = None,
            target_epsilon: Annotated[Optional[float], typer.Option(help="Calibrate z for this ε instead.")] = None,
            as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """Print ε (or, with --target-epsilon, the calibrated noise multiplier) without training."""
    _offline_env()
    if target_epsilon is None:
        cfg = load_config(config, set_ or [])
    else:
        cfg = _load_with_target(config, set_ or [], target_epsilon)
    from fedsim.simulation import privacy_report

    if population is None:
        from fedsim.data import DataSpec, load_federated

        population = load_federated(DataSpec.from_config(cfg.data)).population
    if population < 1:
        raise FedsimError("--population must be ≥ 1")
    report = privacy_report(cfg, population)
    if as_json:
        typer.echo(json.dumps(report))
    else:
        eps = report["epsilon"]
        typer.echo(f"{report['mechanism']} noise, {report['scheme']} sampling (q = {report['sampling_rate']:.4g}), "
                   f"N = {population}, {report['rounds']} rounds, z = {report['noise_multiplier']:.4g}: "
                   f"ε = {eps if isinstance(eps, str) else f'{eps:.4f}'} at δ = {report['delta']:.3g} "
                   f"({report['accountant']} accountant, {report['neighboring_relation']} adjacency)")


def _load_with_target(config: Optional[Path], overrides: list[str], target: float):
    from fedsim.config import apply_overrides, config_from_dict
    import tomllib

    path = config if config is not None else DEFAULT_EXPERIMENT
    try:
        raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FedsimError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as e:
        raise FedsimError(f"config file {path} is not valid TOML: {e}") from None
    raw = apply_overrides(raw, overrides)
    priv = raw.setdefault("privacy", {})
    if not isinstance(priv, dict):
        raise FedsimError("privacy: expected a table")
    priv.pop("noise_multiplier", None)
    priv["target_epsilon"] = target
    if priv.get("mechanism", "gaussian") == "none":
        raise FedsimError("--target-epsilon needs a DP mechanism; privacy.mechanism is 'none'")
    return config_from_dict(raw)


@app.command()
def report(run_dirs: Annotated[list[Path], typer.Argument(help="Run folders.")],
           plot: Annotated[Optional[Path], typer.Option(help="Also write an accuracy comparison PNG here.")] = None,
           as_json: Annotated[bool, typer.Option("--json", help="Print the table as JSON.")] = False) -> None:
    """Redraw each run's plots and print a comparison table of the runs."""
    from fedsim.report import comparison_table, format_table, plot_comparison, plot_run

    for d in run_dirs:
        plot_run(d)
    rows = comparison_table(run_dirs)
    if plot is not None:
        plot_comparison(run_dirs, plot)
    if as_json:
        typer.echo(json.dumps([{k: ("inf" if isinstance(v, float) and math.isinf(v) else v)
                                for k, v in r.items()} for r in rows]))
    else:
        typer.echo(format_table(rows))


@app.command()
def data(config: ConfigArg = None, set_: SetOpt = None,
         as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """Build (once) and describe the config's federated dataset: population, examples per user."""
    _offline_env()
    cfg = load_config(config, set_ or [])
    import numpy as np

    from fedsim.data import DataSpec, load_federated

    d = load_federated(DataSpec.from_config(cfg.data))
    ex = d.examples_per_user()
    tests = np.array([d.num_test(u) for u in range(d.population)])
    info = {"name": cfg.data.name, "population": d.population, "vocab_size": d.vocab_size,
            "train_examples": int(ex.sum()), "test_examples": int(tests.sum()),
            "train_examples_per_user": {"min": int(ex.min()), "median": float(np.median(ex)),
                                        "mean": float(ex.mean()), "max": int(ex.max())}}
    typer.echo(json.dumps(info) if as_json else json.dumps(info, indent=1))


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the Typer app, turning :class:`FedsimError` into a clean message."""
    try:
        app(args=argv, standalone_mode=False)
    except FedsimError as e:
        print(f"fedsim: error: {e}", file=sys.stderr)
        sys.exit(2)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        print("fedsim: aborted", file=sys.stderr)
        sys.exit(130)
    except Exception as e:  # click usage errors
        import click

        if isinstance(e, click.ClickException):
            e.show()
            sys.exit(e.exit_code)
        raise


if __name__ == "__main__":  # pragma: no cover
    main()
