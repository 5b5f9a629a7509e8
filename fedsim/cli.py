"""The ``fedsim`` command.

Commands: ``run`` (train an experiment), ``privacy`` (ε or z without training),
``report`` (plots and a comparison table of run folders), ``data`` (``describe`` a config's
population; ``show``/``stats`` of the Stack Overflow files), ``factorize``, ``audit``. User
errors print one message (no traceback) and exit with status 2.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from fedsim.errors import FedsimError
from fedsim.interrupt import RunInterrupted

# Nothing heavy is imported here (torch, Flower, Ray, the registries): `fedsim --help` and the
# usage errors answer at once; each command imports what it needs.


def _keep_argument_help() -> None:
    """Make ``--help`` show each argument's help text. Typer 0.20 keeps an argument's help on
    its ``TyperArgument`` before calling ``click.Argument.__init__``, which since click 8.3 takes
    a ``help`` of its own and resets it to None, so every argument's help was blank. This
    restores the text Typer was given, and does nothing where the two agree."""
    import typer.core

    init = typer.core.TyperArgument.__init__
    if getattr(init, "_keeps_help", False):
        return

    def keeping(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        if self.help is None and kwargs.get("help") is not None:
            self.help = kwargs["help"]

    keeping._keeps_help = True  # type: ignore[attr-defined]
    typer.core.TyperArgument.__init__ = keeping  # type: ignore[method-assign]


_keep_argument_help()

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="fedsim — federated learning with user-level differential privacy on Flower + Ray.",
)


def _show_version(value: bool) -> None:
    if value:
        from fedsim import __version__

        typer.echo(f"fedsim {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", help="Print fedsim's version and exit.", callback=_show_version, is_eager=True),
    ] = False,
) -> None:
    """fedsim — federated learning with user-level differential privacy on Flower + Ray."""


def load_config(path: Path | str | None = None, overrides: list[str] | None = None) -> Any:
    """:func:`fedsim.config.load_config`, imported when a command needs it (after the plugins
    the file lists: they register parts the config may name). What needs no schema is checked
    first, before torch is imported (`fedsim.config_file.precheck`)."""
    from fedsim import plugins
    from fedsim.config_file import precheck

    precheck(path, overrides)
    plugins.of_file(path)
    from fedsim.config import load_config as _load

    return _load(path, overrides)


ConfigArg = Annotated[
    Path | None,
    typer.Argument(
        help="Experiment TOML, or the name of a shipped experiment (`fedsim experiments` lists them; "
        "default: shakespeare_default).",
        show_default=False,
    ),
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override a config key: --set dotted.key=value (repeatable; TOML values)."),
]


def _offline_env() -> None:
    for k, v in {"FLWR_TELEMETRY_ENABLED": "0", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}.items():
        os.environ.setdefault(k, v)


def _lines(obj: Any, indent: int = 0) -> list[str]:
    """``key: value`` lines of a JSON-like value, nested tables indented: what the commands print
    without ``--json``."""
    pad = "  " * indent
    if isinstance(obj, dict):
        out = []
        for k, v in obj.items():
            if (isinstance(v, dict) and v) or (isinstance(v, list) and any(isinstance(x, (dict, list)) for x in v)):
                out += [f"{pad}{k}:", *_lines(v, indent + 1)]
            else:
                out.append(f"{pad}{k}: {_scalar(v)}")
        return out
    if isinstance(obj, list):
        return [ln for item in obj for ln in (_lines(item, indent) if isinstance(item, dict) else [f"{pad}- {item}"])]
    return [f"{pad}{_scalar(obj)}"]


def _scalar(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, list):
        return ", ".join(_scalar(x) for x in v)
    if isinstance(v, dict):
        return "{}"
    return "–" if v is None else str(v)


def _echo(obj: Any, as_json: bool, **dumps: Any) -> None:
    """``obj`` as one JSON line (``--json``) or as indented ``key: value`` lines."""
    typer.echo(json.dumps(obj, **dumps) if as_json else "\n".join(_lines(obj)))


def _relation(name: object) -> str:
    from fedsim.privacy.accounting import RELATION_LABELS

    return RELATION_LABELS.get(str(name), str(name))


@app.command()
def run(
    config: ConfigArg = None,
    set_: SetOpt = None,
    out: Annotated[Path | None, typer.Option("--out", help="Run folder (default runs/<timestamp>-<name>).")] = None,
    resume: Annotated[
        Path | None,
        typer.Option("--resume", help="Continue the run in this folder from its checkpoint (bit-identical)."),
    ] = None,
    force: Annotated[
        list[str] | None,
        typer.Option(
            "--force",
            help="With --resume: a key that may differ from the run's checkpoint: sim.*, "
            "checkpoint.*, eval.*, name, privacy.account_every, and rounds (to grow, "
            "Gaussian noise only). Repeatable.",
        ),
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress line.")] = False,
) -> None:
    """Train an experiment in Flower's simulation engine on Ray and write its run folder.

    CONFIG is an experiment TOML (default: experiments/shakespeare_default.toml).

    Ctrl-C or SIGTERM stops the run after checkpointing its last completed round (exit status
    130 or 143; resume with --resume DIR); a second Ctrl-C quits at once.
    """
    _offline_env()
    from fedsim import plugins
    from fedsim.config_file import precheck

    if resume is None:  # a config error answers before torch, Flower and Ray are imported
        precheck(config, set_)
    # the plugins the config (or the resumed run) lists register their parts before anything
    # builds the config schema
    plugins.of_file(resume / "config.toml" if resume is not None else config)
    if resume is not None:
        from fedsim.runner import run_experiment
        from fedsim.runner.resume import resume_config

        if out is not None:
            raise FedsimError("--resume DIR writes into DIR; drop --out")
        if not resume.is_dir():
            raise FedsimError(f"--resume {resume}: no such run folder")
        cfg = resume_config(resume, config, set_ or [], force or [])
        summary = run_experiment(cfg, resume, progress=not quiet, resume=True)
    else:
        if force:
            raise FedsimError("--force applies only with --resume")
        cfg = load_config(config, set_ or [])  # value errors too answer before torch is imported
        from fedsim.runner import run_experiment

        summary = run_experiment(cfg, out, progress=not quiet)
    from fedsim.privacy.display import format_delta, format_epsilon

    acc = summary["final_eval_accuracy"]
    eps = summary["epsilon"]
    base = summary["majority_baseline_accuracy"]
    typer.echo(
        f"done: {summary['rounds_completed']} rounds, eval accuracy "
        f"{'–' if acc is None else f'{100 * acc:.2f}%'}"
        f"{'' if base is None else f' (majority class {100 * base:.2f}%)'}, "
        f"ε = {format_epsilon(eps)} at δ = {format_delta(summary['delta'])} "
        f"({_relation(summary.get('neighboring_relation'))}), {summary['wall_seconds']:.0f} s"
    )
    for k, v in (summary.get("final_eval_metrics") or {}).items():
        if k != "eval_accuracy":
            typer.echo(f"  {k} = {v:.4f}")
    for note in summary.get("notes", []):
        typer.echo(f"note: {note}")
    folder = summary.get("run_folder")
    if folder:
        typer.echo(f"run folder: {folder} (plots and a table: fedsim report {folder})")
        if (Path(folder) / "report.html").exists():
            typer.echo(f"pictures: {Path(folder) / 'plots'}; one page with them all: {Path(folder) / 'report.html'}")


@app.command()
def privacy(
    config: ConfigArg = None,
    set_: SetOpt = None,
    population: Annotated[int | None, typer.Option(help="Population N (what-if; skips loading data).")] = None,
    target_epsilon: Annotated[float | None, typer.Option(help="Calibrate z for this ε instead.")] = None,
    dim: Annotated[
        int | None,
        typer.Option(
            "--dim",
            help="The model's number of parameters: also estimate the noise's memory, disk and CPU for the run.",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Print ε (or, with --target-epsilon, the calibrated noise multiplier) without training.

    CONFIG is an experiment TOML (default: experiments/shakespeare_default.toml).
    """
    _offline_env()
    if target_epsilon is None:
        cfg = load_config(config, set_ or [])
    else:
        cfg = _load_with_target(config, set_ or [], target_epsilon)
    from fedsim.privacy.plan import note_max_users, privacy_report

    if population is None:
        from fedsim.data import population_size

        population = population_size(cfg.data)
        note_max_users(cfg, population)
    if population < 1:
        raise FedsimError("--population must be ≥ 1")
    report = privacy_report(cfg, population, dim)
    from fedsim.privacy.display import format_delta, format_epsilon

    if as_json:
        typer.echo(json.dumps(report))
    else:
        eps = report["epsilon"]
        typer.echo(
            f"{report['mechanism']} noise, {report['scheme']} sampling (q = {report['sampling_rate']:.4g}), "
            f"N = {report['population']}, {report['rounds']} rounds, z = {report['noise_multiplier']:.4g}: "
            f"ε = {format_epsilon(eps, 4)} at δ = {format_delta(report['delta'])} "
            f"for {_relation(report['neighboring_relation'])} ({report['accountant']} accountant, "
            f"{report['neighboring_relation']} adjacency, K̄ = {report['cohort_size']:.4g})"
        )
        split = report.get("budget_split")
        if split:
            typer.echo(
                f"adaptive clipping takes a share: the update's noise multiplier is "
                f"z_Δ = {split['update_noise_multiplier']:.4g}, the count's noise std σ_b = "
                f"{split['count_stddev']:.4g} ({split['count_releases_per_user']} release(s) per user); "
                f"together as private as z = {split['noise_multiplier']:.4g}"
            )
        for note in report.get("notes", []):
            typer.echo(f"note: {note}")
        if "noise_cost" in report:
            from fedsim.privacy.cost import describe_cost

            typer.echo(describe_cost(report["mechanism"], report["rounds"], report["noise_cost"]))


def _load_with_target(config: Path | None, overrides: list[str], target: float):
    from fedsim.config_file import precheck

    precheck(config, overrides)
    from fedsim import plugins

    plugins.of_file(config)  # its plugins register their parts before the schema is built
    from fedsim.config import apply_overrides, config_from_dict, read_experiment

    raw = apply_overrides(read_experiment(config)[1], overrides)  # relative paths from the file's folder
    priv = raw.setdefault("privacy", {})
    if not isinstance(priv, dict):
        raise FedsimError("privacy: expected a table")
    priv.pop("noise_multiplier", None)
    priv["target_epsilon"] = target
    if priv.get("mechanism", "gaussian") == "none":
        raise FedsimError("--target-epsilon needs a DP mechanism; privacy.mechanism is 'none'")
    return config_from_dict(raw)


@app.command()
def report(
    run_dirs: Annotated[list[Path], typer.Argument(help="Run folders.")],
    plot: Annotated[
        Path | None, typer.Option(help="Also write an accuracy comparison PNG here (its folder must exist).")
    ] = None,
    ablation: Annotated[
        Path | None,
        typer.Option(
            help="Also write an ablation PNG here: runs grouped into arms (same config but the seed), "
            "accuracy vs round per arm and final accuracy ± std."
        ),
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print JSON: one line per audit or sweep folder (its audit.json or sweep.json), then "
            "the runs' table as one list.",
        ),
    ] = False,
) -> None:
    """Draw each run's pictures, say where they are, and print a comparison table of the runs.

    Each run gets plots/train_loss.png, accuracy.png, eval_loss.png and epsilon.png (against the
    round) and report.html: one self-contained page with the privacy header and the plots, to open
    or share. A run with filter.trace_coordinates also gets plots/psd.png. An audit folder (fedsim audit
    --attack canary|user-inference) is printed and its plots redrawn; a sweep folder (fedsim sweep)
    gets accuracy_vs_epsilon.png and arms.png, and its table and the privacy of selecting its best
    arm are printed."""
    from fedsim.reporting.audit_report import format_text_audit, is_text_audit, plot_text_audit, read_text_audit
    from fedsim.reporting.report import comparison_table, format_table, plot_ablation, plot_comparison, plot_run
    from fedsim.reporting.sweep_report import is_sweep, plot_sweep, selection_line

    audits = [d for d in run_dirs if is_text_audit(d)]
    for d in audits:
        plot_text_audit(d)
        if as_json:  # one line per audit folder: its audit.json
            typer.echo(json.dumps({"audit": str(d), **read_text_audit(d)}))
        else:
            typer.echo(f"{d}:\n{format_text_audit(read_text_audit(d))}")
    sweeps = [d for d in run_dirs if is_sweep(d)]
    for d in sweeps:
        for f in plot_sweep(d):
            typer.echo(f"wrote {f}", err=True)
        if as_json:  # one line per sweep folder: its sweep.json and the selection line
            result = json.loads((d / "sweep.json").read_text(encoding="utf-8"))
            typer.echo(json.dumps({"sweep": str(d), **result, "selection_line": selection_line(d)}))
        else:
            typer.echo(f"{d}:\n{(d / 'table.md').read_text(encoding='utf-8')}")
            typer.echo(f"selection: {selection_line(d)}")
    run_dirs = [d / "run" if d in audits else d for d in run_dirs if d not in sweeps]
    if not run_dirs:
        return
    drawn = {d: plot_run(d) for d in run_dirs}
    rows = comparison_table(run_dirs)
    if plot is not None:
        drawn[Path("--plot")] = [plot_comparison(run_dirs, plot)]
    if ablation is not None:
        drawn[Path("--ablation")] = [plot_ablation(run_dirs, ablation)]
    for d, files in drawn.items():  # where the pictures are (stderr under --json: stdout stays JSON)
        typer.echo(f"{d}: {', '.join(str(f) for f in files)}", err=as_json)
    if as_json:
        typer.echo(
            json.dumps(
                [{k: ("inf" if isinstance(v, float) and math.isinf(v) else v) for k, v in r.items()} for r in rows]
            )
        )
    else:
        typer.echo(format_table(rows))


def _option_fields() -> dict[str, tuple[list[str], Any]]:
    """Every option of the matrix-factorization mechanisms (from the registry) → (the mechanisms
    that take it, its pydantic field)."""
    from fedsim.privacy.mechanisms import MECHANISMS

    out: dict[str, tuple[list[str], Any]] = {}
    for name, mech in MECHANISMS.items():
        if not mech.correlated:
            continue
        for key, field in mech.options.model_fields.items():
            if key != "mechanism":
                out.setdefault(key, ([], field))[0].append(name)
    return out


def _cli_type(field: Any) -> Any:
    text = str(field.annotation)
    return int | None if "int" in text else float | None if "float" in text else str | None


def _factorize_options() -> tuple[list[inspect.Parameter], dict[str, Any]]:
    """The mechanism options of ``fedsim factorize``, derived from the registry's option models:
    ``--<key>`` for every key (None = the mechanism's default)."""
    params, hints = [], {}
    for key, (names, field) in _option_fields().items():
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        flags = [f"--{key.replace('_', '-')}", *extra.get("cli_aliases", [])]
        helptext = f"{', '.join(names)}: {field.description or key}."
        hint = Annotated[_cli_type(field), typer.Option(*flags, help=helptext, show_default=False)]  # type: ignore[valid-type]
        params.append(inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=hint))
        hints[key] = hint
    return params, hints


def factorize(
    mechanism: Annotated[str, typer.Option(help="A matrix-factorization mechanism: see the list below.")],
    rounds: Annotated[int, typer.Option(help="n, the number of rounds.")],
    scheme: Annotated[str, typer.Option(help="single | epochs | min_sep")] = "single",
    min_sep: Annotated[int | None, typer.Option("--min-sep", help="b (epochs, min_sep).")] = None,
    max_participations: Annotated[int | None, typer.Option(help="k (epochs, min_sep).")] = None,
    momentum: Annotated[float, typer.Option(help="β of the momentum workload.")] = 0.9,
    out: Annotated[Path | None, typer.Option(help="Write C, the noising matrix and A to this .npz.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    **options: Any,
) -> None:
    """Compute a factorization and print its sensitivity and errors (units of (c·z)²)."""
    result, arrays = _factorize(mechanism, rounds, scheme, min_sep, max_participations, momentum, options)
    if out is not None:
        import numpy as np

        np.savez(out, **arrays)
    _echo(result, as_json)


def _register_factorize() -> None:
    """Give ``factorize`` its registry-derived options and register it with the app (after the
    plugins of ``FEDSIM_PLUGINS`` and the entry points, so their mechanisms are listed too)."""
    from fedsim import plugins

    plugins.load_startup()
    from fedsim.privacy.mechanisms import MECHANISMS

    params, hints = _factorize_options()
    sig = inspect.signature(factorize, eval_str=True)
    fixed = [p for p in sig.parameters.values() if p.kind != inspect.Parameter.VAR_KEYWORD]
    factorize.__signature__ = sig.replace(parameters=fixed + params)  # type: ignore[attr-defined]
    factorize.__annotations__ = {**{p.name: p.annotation for p in fixed}, **hints, "return": None}
    listing = "\n\n".join(f"{n}: {m.summary}" for n, m in MECHANISMS.items() if m.correlated)
    app.command(help=f"{factorize.__doc__}\n\nMechanisms and their options (--<option>):\n\n{listing}")(factorize)


def _factorize_listed(ctx: typer.Context) -> None:
    """Compute a factorization and print its sensitivity and errors (units of (c·z)²)."""


def _use_factorize(full: bool) -> None:
    """Register ``factorize``: with its registry-derived options when it runs (``full``), else a
    placeholder that lists it in ``fedsim --help`` without importing the mechanisms."""
    name = "full" if full else "listed"
    if _factorize_state["registered"] == name or (_factorize_state["registered"] == "full"):
        return
    app.registered_commands[:] = [c for c in app.registered_commands if c.name != "factorize"]
    if full:
        _register_factorize()
    else:
        app.command("factorize", help=_factorize_listed.__doc__)(_factorize_listed)
    _factorize_state["registered"] = name


_factorize_state: dict[str, str | None] = {"registered": None}


def _factorize(
    mechanism: str,
    rounds: int,
    scheme: str,
    min_sep: int | None,
    max_participations: int | None,
    momentum: float,
    options: dict[str, Any],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``fedsim factorize``: the checked options → (the printed result, the arrays for --out)."""
    from fedsim.privacy.mechanisms import get_mechanism, mechanism_names, options_of
    from fedsim.resources import check_factorization_fits

    if rounds < 1:
        raise FedsimError("--rounds must be ≥ 1")
    if mechanism not in mechanism_names(correlated=True):
        raise FedsimError(f"--mechanism {mechanism!r}: allowed are {', '.join(mechanism_names(correlated=True))}")
    given = {k: v for k, v in options.items() if v is not None}
    own = [k for k in get_mechanism(mechanism).options.model_fields if k != "mechanism"]
    foreign = sorted(set(given) - set(own))
    if foreign:
        flag = lambda k: "--" + k.replace("_", "-")
        raise FedsimError(
            f"{', '.join(map(flag, foreign))}: not an option of mechanism '{mechanism}' "
            f"(its options: {', '.join(map(flag, own)) or 'none'})"
        )
    opts = options_of(mechanism, **given)
    check_factorization_fits(
        mechanism, rounds, getattr(opts, "factorize_device", None)
    )  # refuses in well under a second
    import time

    from fedsim.privacy.mechanisms import factorization_quality, plan_mf, workload_matrix
    from fedsim.privacy.participation import make_scheme

    if scheme not in ("single", "epochs", "min_sep"):
        raise FedsimError(f"--scheme {scheme!r}: allowed are single, epochs, min_sep")
    b = min_sep if min_sep is not None else rounds
    if scheme == "single":
        part = make_scheme("single", rounds, 1, rounds=rounds)
    else:
        part = make_scheme(scheme, b, 1, min_sep=b, max_participations=max_participations, rounds=rounds)
    t0 = time.perf_counter()
    plan = plan_mf(opts, part, rounds, momentum=momentum)
    seconds = time.perf_counter() - t0
    A = workload_matrix(getattr(opts, "workload", "prefix"), rounds, momentum)
    result = {
        "mechanism": mechanism,
        "rounds": rounds,
        "scheme": scheme,
        "max_participations": part.max_participations or 1,
        "min_sep": part.min_separation,
        "sensitivity": plan.sens,
        "sensitivity_exact": plan.sens_exact,
        **factorization_quality(plan, A),
        "seconds": seconds,
        "iterations": plan.info.get("iterations"),
    }
    return result, {"C": plan.C, "noising": plan.noising, "A": A}


data_app = typer.Typer(
    no_args_is_help=False,
    help="Datasets: describe the config's data, inspect the "
    "Stack Overflow files (show, stats), or generate a "
    "fixture folder (synth).",
)
app.add_typer(data_app, name="data")


@data_app.callback(invoke_without_command=True)
def _data_default(ctx: typer.Context) -> None:
    """Without a subcommand: ``describe`` the default experiment's dataset."""
    if ctx.invoked_subcommand is None:
        describe(None, None, False)


@data_app.command()
def describe(
    config: ConfigArg = None,
    set_: SetOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Build (once) and describe the config's federated dataset: population, examples per user.

    CONFIG is an experiment TOML (default: experiments/shakespeare_default.toml).
    """
    _offline_env()
    cfg = load_config(config, set_ or [])
    import numpy as np

    from fedsim.data import load_federated

    d = load_federated(cfg.data)
    ex = d.examples_per_user()
    tests = np.array([d.num_test(u) for u in range(d.population)])
    info = {
        "name": cfg.data.name,
        "population": d.population,
        "vocab_size": d.vocab_size,
        "train_examples": int(ex.sum()),
        "test_examples": int(tests.sum()),
        "train_examples_per_user": {
            "min": int(ex.min()),
            "median": float(np.median(ex)),
            "mean": float(ex.mean()),
            "max": int(ex.max()),
        },
    }
    _echo(info, as_json)


SO_NAMES = ("stackoverflow_nwp", "stackoverflow_tag")
RootOpt = Annotated[
    Path, typer.Option("--root", help="Folder with the Stack Overflow files (as downloaded or extracted).")
]


def _so_name(name: str) -> None:
    if name not in SO_NAMES:
        raise FedsimError(f"dataset {name!r}: `fedsim data show/stats` know {', '.join(SO_NAMES)}")


@data_app.command()
def show(
    name: Annotated[str, typer.Argument(help="stackoverflow_nwp | stackoverflow_tag")],
    root: RootOpt,
    split: Annotated[str, typer.Option("--split", help="train | heldout | test")] = "train",
    client: Annotated[str, typer.Option("--client", help="The client id (opaque text).")] = "",
    vocab_size: Annotated[int, typer.Option("--vocab-size", help="NWP: V.")] = 10000,
    seq_len: Annotated[int, typer.Option("--seq-len", help="NWP: L.")] = 20,
    num_oov_buckets: Annotated[int, typer.Option("--num-oov-buckets", help="NWP: k.")] = 1,
    word_vocab_size: Annotated[int, typer.Option("--word-vocab-size", help="Tags: W.")] = 10000,
    tag_vocab_size: Annotated[int, typer.Option("--tag-vocab-size", help="Tags: T.")] = 500,
    limit: Annotated[int | None, typer.Option("--limit", help="Only the first N examples.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """One client's examples in stored order.

    Prints the six raw fields of each example and, for next-word prediction, the token ids and
    the x and y sequences (TFF's preprocessing); for tag prediction, x (length W) and y (length T)."""
    _so_name(name)
    if limit is not None and limit < 1:
        raise FedsimError(f"--limit {limit}: give a positive number of examples (omit --limit for all)")
    if not client:
        from fedsim.data.stackoverflow.database import StackOverflowDB
        from fedsim.data.stackoverflow.files import sqlite_path

        first = StackOverflowDB(sqlite_path(root)).clients(split)[:5]
        raise FedsimError(
            f"--client ID is required: an opaque client id of split {split!r}, e.g. "
            f"{', '.join(map(repr, first)) or '(the split is empty)'}"
        )
    from fedsim.data.stackoverflow.database import StackOverflowDB
    from fedsim.data.stackoverflow.example_proto import decode_example
    from fedsim.data.stackoverflow.files import TAG_COUNT, WORD_COUNT, count_file, sqlite_path
    from fedsim.data.stackoverflow.preprocess import NWPSpec, tag_xy
    from fedsim.data.stackoverflow.vocab import load_tag_vocab, load_word_vocab

    db = StackOverflowDB(sqlite_path(root))
    rows = [decode_example(b) for b in db.examples(split, client, limit)]
    if not rows and client not in set(db.clients(split)):
        raise FedsimError(f"client {client!r} is not in split {split!r}")
    examples = []
    if name == "stackoverflow_nwp":
        spec = NWPSpec(load_word_vocab(count_file(root, WORD_COUNT), vocab_size), seq_len, num_oov_buckets)
        for r in rows:
            tok = str(r["tokens"]).encode("utf-8")
            xs, ys = spec.xy([tok])
            examples.append({**r, "ids": spec.ids(tok), "x": xs[0].tolist(), "y": ys[0].tolist()})
    else:
        words = {w: i for i, w in enumerate(load_word_vocab(count_file(root, WORD_COUNT), word_vocab_size))}
        tags = {t: j for j, t in enumerate(load_tag_vocab(count_file(root, TAG_COUNT), tag_vocab_size))}
        for r in rows:
            x, y = tag_xy(
                str(r["tokens"]).encode("utf-8"),
                str(r["title"]).encode("utf-8"),
                str(r["tags"]).encode("utf-8"),
                words,
                tags,
            )
            examples.append({**r, "x": x.tolist(), "y": y.tolist()})
    out = {"dataset": name, "split": split, "client_id": client, "examples": examples}
    _echo(out, as_json, ensure_ascii=False)


@data_app.command()
def stats(
    name: Annotated[str, typer.Argument(help="stackoverflow_nwp | stackoverflow_tag")],
    root: RootOpt,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Clients and examples per split (from the database's client_metadata table)."""
    _so_name(name)
    from fedsim.data.stackoverflow.database import StackOverflowDB
    from fedsim.data.stackoverflow.files import sqlite_path

    out = {"splits": StackOverflowDB(sqlite_path(root)).stats()}
    _echo(out, as_json)


@data_app.command()
def prepare(
    name: Annotated[str, typer.Argument(help="stackoverflow")],
    root: RootOpt,
    cache_dir: Annotated[
        Path | None,
        typer.Option("--cache-dir", help="Where compressed files are unpacked (default ROOT/.fedsim-cache)."),
    ] = None,
    verify: Annotated[
        bool, typer.Option("--verify", help="Check the count archives against TFF's published sha256.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Unpack the Stack Overflow files once and index the database.

    Unpacks .lzma and .tar.bz2 files, optionally verifies them, makes sure the database has its
    (split_name, client_id) index, and prints the clients per split."""
    if name != "stackoverflow":
        raise FedsimError(f"dataset {name!r}: `fedsim data prepare` knows 'stackoverflow'")
    from fedsim.data.stackoverflow.database import StackOverflowDB, ensure_index
    from fedsim.data.stackoverflow.files import TAG_COUNT, WORD_COUNT, count_file, sqlite_path, verify_sha256

    verified = []
    if verify:
        for f in (WORD_COUNT, TAG_COUNT):
            archive = Path(root) / f"{f}.tar.bz2"
            if archive.is_file():
                verify_sha256(archive)
                verified.append(archive.name)
        if not verified:
            raise FedsimError("--verify: no .tar.bz2 count archive in --root (TFF publishes sha256 only for those)")
    db_path = sqlite_path(root, cache_dir)
    files = {
        "database": str(db_path),
        "word_count": str(count_file(root, WORD_COUNT, cache_dir)),
        "tag_count": str(count_file(root, TAG_COUNT, cache_dir)),
    }
    created = ensure_index(db_path)
    out = {"files": files, "verified": verified, "index_created": created, "splits": StackOverflowDB(db_path).stats()}
    _echo(out, as_json)


@data_app.command()
def synth(
    name: Annotated[str, typer.Argument(help="stackoverflow")],
    out: Annotated[Path, typer.Option("--out", help="Empty folder to write the files into.")],
    users: Annotated[int, typer.Option("--users", help="Train clients.")] = 60,
    per_user: Annotated[float, typer.Option("--per-user", help="Mean train examples per client.")] = 30.0,
    vocab: Annotated[int, typer.Option("--vocab", help="Distinct words in the text.")] = 200,
    tags: Annotated[int, typer.Option("--tags", help="Distinct tags.")] = 20,
    seed: Annotated[int, typer.Option("--seed", help="Generator seed.")] = 0,
) -> None:
    """Write a generated Stack Overflow folder (not real text) for trying the pipeline.

    The folder has TFF's file layout (SQLite database, word and tag counts); its text is random."""
    if name != "stackoverflow":
        raise FedsimError(f"dataset {name!r}: `fedsim data synth` knows 'stackoverflow'")
    for opt, val in (("--users", users), ("--per-user", per_user), ("--vocab", vocab), ("--tags", tags)):
        if not val > 0 or val != val or val == float("inf"):
            raise FedsimError(f"{opt} {val}: must be a positive number")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FedsimError(
            f"--out {out} {'is not a folder' if not out.is_dir() else 'is not empty'}: `fedsim data synth` writes "
            f"a whole dataset folder; give a new or empty folder"
        )
    from fedsim.data.stackoverflow.synthetic import generate

    generate(out, users=users, per_user=per_user, vocab=vocab, tags=tags, seed=seed)
    typer.echo(f"wrote a generated Stack Overflow folder ({users} train clients) to {out}")


# `fedsim audit`'s longer options
CanaryKindOpt = Annotated[
    str,
    typer.Option(
        "--canary-kind",
        help="one-run: gradient (default: full-clip-norm updates in random directions; final-model and "
        "every-model bounds) or text (secret-sharer canary users on a next-character or next-word task, "
        "scored by how much training lowered the secret's log-perplexity; final-model bounds).",
    ),
]
CanaryDirectionsOpt = Annotated[
    str,
    typer.Option(
        "--canary-directions",
        help="one-run gradient canaries: random (default: uniform on the sphere, an m × d matrix kept) or "
        "orthogonal (each canary its own keyed coordinate with a keyed sign: no matrix, no interference "
        "between canaries, m up to the model's size).",
    ),
]
NullOpt = Annotated[
    str,
    typer.Option(
        "--null",
        help="Null distribution: theoretical (N(0, 1/d), the paper's) "
        "or empirical (fitted to never-inserted directions).",
    ),
]


@app.command()
def audit(
    config: ConfigArg = None,
    set_: SetOpt = None,
    out: Annotated[Path | None, typer.Option("--out", help="Run folder (default runs/<timestamp>-<name>).")] = None,
    attack: Annotated[
        list[str] | None,
        typer.Option(
            "--attack",
            help="gradient (default: random-direction canaries, a one-shot ε estimate), one-run "
            "(gradient canaries each included with probability 1/2: one-run ε lower bounds for the "
            "final-model and every-model adversaries), canary (secret-sharer canary users: exposure) "
            "or user-inference (held-in vs held-out users: AUC, TPR at low FPR, an ε lower bound); "
            "canary and user-inference can share one run.",
        ),
    ] = None,
    canaries: Annotated[
        int | None,
        typer.Option(
            "--canaries",
            help="M, the canary users added to the population (gradient and one-run: 1000; canary: 12; one-run with "
            "--canary-kind text: 200).",
        ),
    ] = None,
    repetitions: Annotated[
        str | None,
        typer.Option(
            help="canary: repetition levels r, comma-separated (copies of each secret; default 1,4,16). "
            "one-run with --canary-kind text: one level (default 16)."
        ),
    ] = None,
    secret_length: Annotated[int, typer.Option(help="canary: characters or words per secret.")] = 8,
    canary_size: Annotated[
        str | None,
        typer.Option(
            help="canary: canary-user data sizes, comma-separated: donor text each canary keeps (characters, "
            "or sentences) besides its secrets; 'all' keeps all of it. The canaries cycle through "
            "repetitions × sizes (default all). one-run with --canary-kind text: one size (default 100)."
        ),
    ] = None,
    references: Annotated[int, typer.Option(help="canary: random reference secrets per canary.")] = 10_000,
    canary_kind: CanaryKindOpt = "gradient",
    canary_directions: CanaryDirectionsOpt = "random",
    held_out: Annotated[int, typer.Option(help="user-inference: held-out users (and as many held-in targets).")] = 40,
    alpha: Annotated[float, typer.Option("--alpha", help="The bootstrap interval has confidence 1 − alpha.")] = 0.05,
    null: NullOpt = "theoretical",
    as_json: Annotated[bool, typer.Option("--json", help="Print the audit as JSON (no progress line).")] = False,
) -> None:
    """Attack one training run of CONFIG and print what it leaks next to the ledger's ε.

    gradient (default): M canaries, each a full-norm update in its own random direction, and a
    one-shot ε estimate from their cosines with the final model delta (Andrew et al., ICLR 2024);
    audit.json goes into the run folder. one-run: M gradient canaries, each included with
    probability 1/2 by a keyed coin, and 1 − alpha lower bounds on ε (Steinke–Nasr–Jagielski and
    one-run f-DP) for the final-model and every-model adversaries; one_run_audit.json goes into
    the run folder. canary: M secret-sharer canary users (a real user's text
    with a random secret inserted r times) and each secret's exposure. user-inference: held-in vs
    held-out users scored by the final model against the initial one; ROC AUC, TPR at 1 % and
    0.1 % FPR, and a 95 % lower bound on ε at the run's δ. Text attacks write an audit folder
    (audit.json, plots, run/) that `fedsim report` renders.

    CONFIG is an experiment TOML (default: experiments/shakespeare_default.toml).
    """
    _offline_env()
    attacks = _attacks(attack)
    cfg = load_config(config, set_ or [])
    if "one-run" in attacks:
        text = _one_run_text_options(canary_kind, repetitions, canary_size, secret_length)
        if text is not None and canary_directions != "random":
            raise FedsimError("--canary-directions applies to gradient canaries; drop it with --canary-kind text")
        _one_run_audit(cfg, out, attacks, canaries, alpha, as_json, text, canary_directions)
        return
    if canary_kind != "gradient" or canary_directions != "random":
        raise FedsimError("--canary-kind and --canary-directions apply to --attack one-run only; drop them here")
    if "gradient" not in attacks:
        reps, sizes = repetitions or "1,4,16", canary_size or "all"
        opts = _text_audit_options(attacks, canaries, reps, secret_length, sizes, references, held_out)
        _text_audit(cfg, out, opts, as_json)
        return
    if len(attacks) > 1:
        raise FedsimError("--attack gradient runs alone; run the text attacks (canary, user-inference) separately")
    _gradient_audit(cfg, out, 1000 if canaries is None else canaries, null, alpha, as_json)


def _gradient_audit(cfg: Any, out: Path | None, m: int, null: str, alpha: float, as_json: bool) -> None:
    """`fedsim audit --attack gradient`: the one-shot ε estimate, next to the ledger's ε."""
    from fedsim.runner.audit import run_audit

    rep = run_audit(cfg, out, m, null_model=null, alpha=alpha, progress=not as_json)
    for w in rep["warnings"]:
        typer.echo(f"audit: warning: {w}", err=True)
    if as_json:
        typer.echo(json.dumps(rep))
        return

    def fmt(v: object) -> str:
        return v if isinstance(v, str) else f"{v:.3f}"

    from fedsim.privacy.display import format_delta, format_epsilon

    ledger_eps = rep["ledger_epsilon"]  # an upper bound: rounded up, as every printed guarantee

    lo, hi = rep["epsilon_interval"]
    typer.echo(
        f"audit: ε estimate {fmt(rep['epsilon_estimate'])} ({100 * rep['confidence']:.0f}% interval "
        f"{fmt(lo)} to {fmt(hi)}) vs the ledger's ε = {format_epsilon(ledger_eps)} at δ = {format_delta(rep['delta'])} "
        f"({_relation(rep.get('neighboring_relation'))}); "
        f"{rep['num_canaries']} canaries, d = {rep['dimension']:,}, final model only. "
        f"An estimate, not a strict lower bound: see {Path(rep['run_dir']) / 'audit.json'}"
    )


def _one_run_text_options(
    kind: str, repetitions: str | None, size: str | None, secret_length: int
) -> dict[str, Any] | None:
    """`--canary-kind` of the one-run audit: None for gradient canaries, else the text canaries'
    options (one repetition level, default 16; one size, default 100; 'all' keeps all)."""
    if kind not in ("gradient", "text"):
        raise FedsimError(f"--canary-kind {kind!r}: allowed are gradient and text (default gradient)")
    if kind == "gradient":
        if repetitions is not None or size is not None:
            raise FedsimError("--repetitions and --canary-size need --canary-kind text with --attack one-run")
        return None
    try:
        reps = 16 if repetitions is None else int(repetitions)
        keep = 100 if size is None else None if size.strip() == "all" else int(size)
    except ValueError:
        raise FedsimError(
            "--canary-kind text takes one --repetitions level and one --canary-size (an integer or all), "
            "e.g. --repetitions 16 --canary-size 100"
        ) from None
    return {"repetitions": reps, "size": keep, "secret_length": secret_length}


def _one_run_audit(
    cfg: Any,
    out: Path | None,
    attacks: tuple[str, ...],
    m: int | None,
    alpha: float,
    as_json: bool,
    text: dict[str, Any] | None = None,
    directions: str = "random",
) -> None:
    """`fedsim audit --attack one-run`: one line per adversary and bound, next to the ledger's ε
    (text canaries when `text` holds their options, gradient canaries in `directions` otherwise)."""
    if len(attacks) > 1:
        raise FedsimError("--attack one-run runs alone; run the other attacks separately")
    if not 0.0 < alpha < 1.0:
        raise FedsimError(f"--alpha must be in (0, 1) (got {alpha})")
    from fedsim.privacy.display import format_delta, format_epsilon

    if text is None:
        from fedsim.runner.audit import run_one_run_audit

        m = 1000 if m is None else m
        rep = run_one_run_audit(cfg, out, m, confidence=1.0 - alpha, progress=not as_json, directions=directions)
        where = Path(rep["run_dir"]) / "one_run_audit.json"
    else:
        from fedsim.runner.text_audit import run_text_one_run_audit

        rep = run_text_one_run_audit(
            cfg, out, 200 if m is None else m, confidence=1.0 - alpha, progress=not as_json, **text
        )
        where = Path(rep["run_dir"]).parent / "one_run_audit.json"
    if as_json:
        typer.echo(json.dumps(rep))
        return
    led = rep["ledger_epsilon"]
    typer.echo(
        f"one-run audit: {rep['num_canaries']} {'text' if text else 'gradient'} canaries "
        f"({rep['num_included']} included), ledger ε = "
        f"{format_epsilon(led)} at δ = {format_delta(rep['delta'])} ({_relation(rep.get('neighboring_relation'))}); "
        f"ceiling for m: snj {rep['ceiling']['snj']:.3f}, fdp {rep['ceiling']['fdp']:.3f}"
    )
    for b in rep["bounds"]:
        typer.echo(
            f"  {b['adversary']:<16} {b['method']:<3}  ε ≥ {b['epsilon']:.3f} with {100 * b['confidence']:.0f}% "
            f"confidence ({b['correct']} of {b['guesses']} guesses correct, {b['candidates']} rules paid for)"
        )
    typer.echo(f"A lower bound for each adversary: see {where}")


def _attacks(attack: list[str] | None) -> tuple[str, ...]:
    """``--attack`` values, checked (default ``gradient``)."""
    attacks = tuple(attack or ["gradient"])
    allowed = ("gradient", "one-run", "canary", "user-inference")
    bad = [a for a in attacks if a not in allowed]
    if bad:
        raise FedsimError(f"--attack {', '.join(bad)}: allowed are {', '.join(allowed)} (default gradient)")
    return attacks


def _text_audit_options(
    attacks: tuple[str, ...],
    canaries: int | None,
    repetitions: str,
    secret_length: int,
    sizes: str,
    references: int,
    held_out: int,
) -> Any:
    """The text audit's options from the command line."""
    from fedsim.runner.text_audit import TextAuditOptions

    try:
        reps = tuple(int(r) for r in repetitions.split(","))
    except ValueError:
        raise FedsimError(f"--repetitions {repetitions!r}: give integers separated by commas, e.g. 1,4,16") from None
    try:
        size_levels = tuple(None if v.strip() == "all" else int(v) for v in sizes.split(","))
    except ValueError:
        raise FedsimError(
            f"--canary-size {sizes!r}: give integers or 'all' separated by commas, e.g. 100,400,all"
        ) from None
    return TextAuditOptions(
        attacks=attacks,
        num_canaries=12 if canaries is None else canaries,
        repetitions=reps,
        sizes=size_levels,
        secret_length=secret_length,
        references=references,
        held_out=held_out,
    )


def _text_audit(cfg: Any, out: Path | None, opts: Any, as_json: bool) -> None:
    """``fedsim audit --attack canary|user-inference``."""
    from fedsim.reporting.audit_report import format_text_audit
    from fedsim.runner.text_audit import run_text_audit

    rep = run_text_audit(cfg, out, opts, progress=not as_json)
    typer.echo(json.dumps(rep) if as_json else format_text_audit(rep))


@app.command()
def sweep(
    spec: Annotated[Path, typer.Argument(help="The sweep spec: a TOML file with a [sweep] table.")],
    out: Annotated[Path | None, typer.Option("--out", help="Sweep folder (default runs/sweeps/<name>).")] = None,
    address: Annotated[
        str | None, typer.Option(help="Run on this Ray cluster (HOST:PORT of its head) instead of a local Ray.")
    ] = None,
    resume: Annotated[
        Path | None,
        typer.Option(
            "--resume",
            help="Finish the killed sweep in this folder (only unfinished trials run; the spec and base "
            "config must be as they were when it started).",
        ),
    ] = None,
    only: Annotated[
        str | None,
        typer.Option(
            help="Run only the grid's trials that have each comma-separated part of this text as a whole "
            "part of their name (e.g. 'seed=0' or 'blt,seed=0'; 'seed=1' does not match 'seed=10')."
        ),
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="Override a config key in every trial, after the spec's own set (e.g. --set rounds=2 for a "
            "smoke run). Repeatable; a resume needs the same ones.",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print sweep.json.")] = False,
) -> None:
    """Run a sweep on Ray Tune: a base config × named arms × a grid of overrides × seeds.

    Every trial is an ordinary run folder under <out>/trials/ (in-process engine, sim.client_cpus
    CPUs each; Tune runs trials in parallel). Writes sweep.json, table.csv and table.md (per arm:
    seeds finished/planned, mean ± std over seeds of the metric and wall time, ε with its δ and
    relation); a finished trial whose ledger differs from its arm's plan is left out and named
    'not as planned'. Says whether selecting the best arm is accounted (sweep.private_selection).
    `fedsim report SWEEP_DIR` draws it.
    """
    _offline_env()
    from fedsim import plugins

    plugins.of_sweep(spec, resume)
    from fedsim.runner.sweep import json_safe, markdown_table, run_sweep

    if resume is not None and out is not None:
        raise FedsimError("--resume DIR finishes the sweep in DIR; drop --out")

    from fedsim.config import resolve_experiment

    result = run_sweep(
        resolve_experiment(spec),
        resume if resume is not None else out,
        address=address,
        resume=resume is not None,
        only=only,
        overrides=set_ or [],
    )
    if as_json:
        typer.echo(json.dumps(json_safe(result)))
        return
    typer.echo(markdown_table(result["arms"], result["metric"]))
    typer.echo(f"selection: {result['selection']['note']}")
    if result["missing"]:
        failed = len(result.get("failed") or [])
        typer.echo(
            f"fedsim: {len(result['missing'])} trial(s) did not finish"
            f"{f' ({failed} failed)' if failed else ''}; resume with --resume",
            err=True,
        )


@app.command()
def experiments(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON: name, path and description of each.")] = False,
) -> None:
    """List the shipped experiment configs and sweeps; any command's CONFIG takes their names.

    For example `fedsim run shakespeare_banded` or `fedsim sweep sweeps/filter_ablation`, from any
    folder. To change one, copy it (--json prints each one's path)."""
    from fedsim.config import experiments_dir, shipped_experiments

    found = shipped_experiments()
    if as_json:
        root = experiments_dir()
        typer.echo(
            json.dumps([{"name": n, "path": str(root / f"{n}.toml"), "description": d} for n, d in found], indent=1)
        )
        return
    width = max(len(n) for n, _ in found)
    for name, description in found:
        typer.echo(f"{name:<{width}}  {description}")


deploy_app = typer.Typer(
    no_args_is_help=True, help="Deployment on Flower's Deployment Engine: certificates and SuperNode keys."
)
app.add_typer(deploy_app, name="deploy")


@deploy_app.command()
def certs(
    out: Annotated[Path, typer.Option("--out", help="Empty folder for the files.")],
    host: Annotated[
        list[str], typer.Option("--host", help="A host name or IP address clients use to reach the SuperLink (repeat).")
    ],
    nodes: Annotated[int, typer.Option("--nodes", help="SuperNode key pairs to create.")] = 3,
    days: Annotated[int, typer.Option("--days", help="Validity in days.")] = 365,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Make a CA, the SuperLink's TLS certificate and SuperNode key pairs.

    The certificate covers the --host names. Key pairs are node-0, node-0.pub, …; register the
    .pub files with: flwr supernode register."""
    from fedsim.deploy.certs import make_all

    made = make_all(out, list(host), nodes, days)
    typer.echo(json.dumps(made) if as_json else "\n".join(f"{k}: {', '.join(v)}" for k, v in made.items()))


_DATA_COMMANDS = ("describe", "show", "stats", "prepare", "synth")


def main(argv: list[str] | None = None) -> None:
    """Entry point, with one error contract: a user-caused failure is one ``fedsim: error: …``
    line on stderr and exit status 2 (:class:`FedsimError`, command-line usage errors, and the
    operating system refusing a path or memory the user asked for); anything else is a bug, shown
    with its traceback and a line asking to report it, exit status 1."""
    args = list(sys.argv[1:] if argv is None else argv)
    _use_factorize(full="factorize" in args[:1])
    # `fedsim data CONFIG …` means `fedsim data describe CONFIG …` (README's `fedsim data [describe] [CONFIG]`)
    if len(args) > 1 and args[0] == "data" and not args[1].startswith("-") and args[1] not in _DATA_COMMANDS:
        args.insert(1, "describe")
    try:
        app(args=args, standalone_mode=False)
    except FedsimError as e:
        print(f"fedsim: error: {e}", file=sys.stderr)
        sys.exit(2)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except RunInterrupted as e:  # checkpointed; 130 for SIGINT, 143 for SIGTERM
        print(f"fedsim: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        print("fedsim: aborted", file=sys.stderr)
        sys.exit(130)
    except MemoryError:
        print(
            "fedsim: error: out of memory; lower the sizes in the command (rounds, users, model) or use a "
            "machine with more memory",
            file=sys.stderr,
        )
        sys.exit(2)
    except OSError as e:  # a path the user gave: unwritable, missing, a folder, a full disk
        where = f" ({e.filename})" if getattr(e, "filename", None) else ""
        print(f"fedsim: error: {e.strerror or e}{where}; check the paths in the command", file=sys.stderr)
        sys.exit(2)
    except Exception as e:  # click usage errors; everything else is a bug
        import click

        if isinstance(e, click.ClickException):
            e.show()
            sys.exit(e.exit_code)
        import traceback

        traceback.print_exc()
        print(
            "fedsim: internal error: this is a bug in fedsim, not in your input; please report it with the "
            "command you ran and the traceback above",
            file=sys.stderr,
        )
        sys.exit(1)


if __name__ == "__main__":  # pragma: no cover
    main()
