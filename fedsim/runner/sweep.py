"""Sweeps: many runs of one experiment, scheduled by Ray Tune (``fedsim sweep SPEC.toml``).

A sweep spec is a TOML file with a ``[sweep]`` table:

.. code-block:: toml

    [sweep]
    name = "mechanism_grid"
    config = "../shakespeare_default.toml"   # the base experiment, relative to this file
                                             # (default: the bundled default experiment)
    set = ["eval.every=0"]                   # overrides every trial gets
    seeds = [0, 1, 2]
    metric = "final_eval_accuracy"           # what the table ranks by (and ASHA / Optuna use)
    mode = "max"

    [[sweep.arms]]                           # named arms: lists of overrides (optional)
    name = "gaussian"
    set = ["privacy.mechanism='gaussian'", "sampling.scheme='poisson'", "sampling.cohort_size=30"]

    [sweep.axes]                             # a grid, crossed with the arms and the seeds
    "privacy.target_epsilon" = [2.0, 4.0, 8.0]

Every trial is one ordinary run folder under ``<out>/trials/`` (the in-process engine, one worker,
``sim.client_cpus`` CPUs as its Tune resources); Tune keeps its state under ``<out>/tune/``. A
killed sweep re-run with ``--resume`` finishes only the trials that did not finish (Tune's
``Tuner.restore``; a trial whose run folder holds a ``summary.json`` is never recomputed, and one
killed mid-run continues from its checkpoint). The sweep reads its base config once and keeps it,
with the spec, in ``<out>/plan.json``: trials are configured from that copy, and ``--resume``
refuses a spec or base config edited since the start.

The sweep writes ``sweep.json`` (every trial's numbers), ``table.csv`` and ``table.md`` (per arm:
seeds finished/planned, mean ± std over seeds of the metric and wall time, ε with its δ and
neighbouring relation) and says what the selection of the best arm costs in privacy
(:mod:`fedsim.privacy.selection`). Every finished trial's ledger must hold the accounting spec
planned for its arm (:func:`not_as_planned`): one that does not is left out of the table and
named; trials that did not finish are listed as ``missing``.
"""

from __future__ import annotations

import csv
import difflib
import itertools
import json
import math
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fedsim.config import apply_overrides, config_from_dict, parse_override, read_config_file
from fedsim.errors import FedsimError
from fedsim.runner.callbacks import RunCallback

#: overrides every trial gets first (a spec may change them): one worker, so that a trial's numbers
#: do not depend on the machine's CPU count.
TRIAL_DEFAULTS = ["sim.num_workers=1"]
#: overrides every trial gets last: the in-process engine (Tune runs the trials in parallel, each on
#: its own CPUs).
TRIAL_ENGINE = ["sim.engine='inprocess'"]


class Arm(BaseModel):
    """A named arm: overrides applied on top of the base config."""

    model_config = ConfigDict(extra="forbid", strict=True)
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.+=-]+$")
    set: list[str] = []


class PrivateSelection(BaseModel):
    """Release the best of a random number of trials (Papernot & Steinke, ICLR 2022).

    Parameters
    ----------
    distribution : ``poisson`` (``K ~ Poisson(mean)``) or ``truncated_negative_binomial``
        (parameters ``eta`` and ``gamma``; ``eta = 0`` is the logarithmic distribution).
    mean : ``μ`` of the Poisson distribution.
    eta, gamma : of the truncated negative binomial.
    metric_is_private : the metric the selection ranks by is itself a DP output or computed on
        public data (the theorem needs it). Default False: ``final_eval_accuracy`` is computed from
        users' held-out data outside ε, so the selection is then reported as not covered.
    """

    model_config = ConfigDict(extra="forbid", strict=True)
    distribution: Literal["poisson", "truncated_negative_binomial"] = "poisson"
    mean: float = Field(default=10.0, gt=0)
    eta: float = Field(default=0.0, gt=-1)
    gamma: float = Field(default=0.1, gt=0, lt=1)
    metric_is_private: bool = False


class Search(BaseModel):
    """A search instead of a grid: Tune's Optuna search draws ``num_samples`` points of ``space``
    (``{"client.lr" = {loguniform = [0.1, 10]}}``; also ``uniform`` and ``choice``), each run with
    the spec's first seed.

    Parameters
    ----------
    algorithm : ``optuna`` (Tune's ``OptunaSearch``). num_samples : trials to draw. Default 8.
    space : dotted config key → ``{loguniform | uniform = [low, high]}`` or ``{choice = [values]}``.
    """

    model_config = ConfigDict(extra="forbid", strict=True)
    algorithm: Literal["optuna"] = "optuna"
    num_samples: int = Field(default=8, ge=1)
    space: dict[str, dict[Literal["loguniform", "uniform", "choice"], list[Any]]]


#: What ``sweep.metric`` may name: the numbers of a trial's ``summary.json``.
SWEEP_METRICS = (
    "final_eval_accuracy",
    "majority_baseline_accuracy",
    "epsilon",
    "example_epsilon_max",
    "noise_multiplier",
    "update_noise_multiplier",
    "final_clip_norm",
    "wall_seconds",
)


class SweepSpec(BaseModel):
    """The ``[sweep]`` table (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    name: str = Field(default="sweep", min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    config: str | None = None
    set: list[str] = []
    seeds: list[int] = [0]
    arms: list[Arm] = []
    axes: dict[str, list[Any]] = {}
    metric: str = "final_eval_accuracy"
    mode: Literal["max", "min"] = "max"
    max_concurrent: int | None = Field(default=None, ge=1)
    scheduler: Literal["none", "asha"] = "none"
    search: Search | None = None
    private_selection: PrivateSelection | None = None

    @field_validator("metric")
    @classmethod
    def _known_metric(cls, v: str) -> str:
        if v not in SWEEP_METRICS:
            close = difflib.get_close_matches(v, SWEEP_METRICS, n=1)
            raise ValueError(
                f"{v!r} is not a number of a run's summary.json"
                + (f" (did you mean {close[0]!r}?)" if close else "")
                + f"; allowed are {', '.join(SWEEP_METRICS)}"
            )
        return v


def load_spec(path: str | Path, overrides: list[str] | None = None) -> tuple[SweepSpec, Path | None]:
    """The sweep spec in ``path`` and its base config's path (resolved against the spec's folder).
    ``overrides`` (``fedsim sweep --set``) are appended to the spec's ``set``."""
    p = Path(path)
    raw = read_config_file(p)
    if "sweep" not in raw or not isinstance(raw["sweep"], dict) or set(raw) != {"sweep"}:
        raise FedsimError(f"sweep spec {p}: expected one [sweep] table (and nothing else)")
    try:
        spec = SweepSpec.model_validate(raw["sweep"])
    except ValidationError as e:
        problems = "; ".join(f"sweep.{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        raise FedsimError(f"sweep spec {p}: {problems}") from None
    if overrides:
        spec = spec.model_copy(update={"set": [*spec.set, *overrides]})
    from fedsim.config import DEFAULT_EXPERIMENT

    base = DEFAULT_EXPERIMENT if spec.config is None else (p.parent / spec.config).resolve()
    if len({a.name for a in spec.arms}) != len(spec.arms):
        raise FedsimError(f"sweep spec {p}: arm names must be distinct")
    _check_distinct(spec, p)
    return spec, base


def _repeats(values: Sequence[Any]) -> list[Any]:
    """The values that equal an earlier one (``0.5`` and ``0.50`` are one value)."""
    return [v for i, v in enumerate(values) if any(v == w for w in values[:i])]


def _check_distinct(spec: SweepSpec, path: Path) -> None:
    """Refuse a spec whose grid names one trial twice: a repeated seed or axis value (the trial's
    results would be counted twice in its arm's mean) or two grid points whose trial names agree
    (they would share one run folder, and the second would take the first's results)."""
    seeds = _repeats(spec.seeds)
    if seeds:
        raise FedsimError(
            f"sweep spec {path}: sweep.seeds repeats {', '.join(map(str, seeds))}; a seed runs once per arm "
            "(a repeat would count its results twice): remove the repeats"
        )
    for key, values in spec.axes.items():
        same = _repeats(values)
        if same:
            raise FedsimError(
                f'sweep spec {path}: sweep.axes."{key}" repeats {", ".join(map(repr, same))}; each value runs '
                "once (a repeat would count its results twice): remove the repeats"
            )
    names = [t["name"] for t in trials(spec)]
    clash = sorted(n for n, c in Counter(names).items() if c > 1)
    if clash:
        raise FedsimError(
            f"sweep spec {path}: different grid points get the same trial name ({'; '.join(clash[:3])}), so they "
            "would share one run folder: make the axis values distinct as text (e.g. not both 1 and '1')"
        )


def _value(v: Any) -> str:
    """A TOML value for a ``--set`` override."""
    if isinstance(v, str):
        return repr(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


#: characters a trial name writes as ``%XX``: the path separators (a name is a folder), the
#: separators of the name's own ``key=value`` parts (``,`` and ``=``, so two grid points never share
#: a name), and ``|`` and line breaks (which would break a markdown table's row).
_ESCAPES = {"%": "%25", "/": "%2F", "\\": "%5C", ",": "%2C", "=": "%3D", "|": "%7C", "\n": "%0A", "\r": "%0D"}


def _label(key: str, value: Any) -> str:
    """``key=value`` for a trial's name, which is also its folder's name: exact (a float by its
    shortest round-trip form, so two values never share a folder) and unambiguous: ``%``, ``/``,
    ``\\``, ``,``, ``=``, ``|`` and line breaks in the value are written as ``%XX``
    (:data:`_ESCAPES`; a value with none of them keeps its plain text)."""
    text = repr(value) if isinstance(value, float) else str(value)
    return f"{key}=" + "".join(_ESCAPES.get(c, c) for c in text)


def trials(spec: SweepSpec) -> list[dict[str, Any]]:
    """Every trial of the grid: ``{"name", "arm", "seed", "sets"}`` (arms × axes × seeds)."""
    arms = spec.arms or [Arm(name="base")]
    keys = list(spec.axes)
    out = []
    for arm in arms:
        for values in itertools.product(*(spec.axes[k] for k in keys)):
            point = [f"{k}={_value(v)}" for k, v in zip(keys, values)]
            label = ",".join([arm.name] + [_label(k, v) for k, v in zip(keys, values)])
            for seed in spec.seeds:
                sets = [*spec.set, *arm.set, *point, f"seed={seed}"]
                out.append({"name": f"{label},seed={seed}", "arm": label, "seed": seed, "sets": sets})
    return out


def read_base(base: Path | None) -> dict[str, Any]:
    """The base config's table (``{}`` without one). A sweep reads it once, when it starts: every
    trial, the checks and the selection's accounting use this table, never the file again."""
    if base is None:
        return {}
    from fedsim.plugins import relative_to

    return dict(relative_to(read_config_file(base), base.resolve().parent))  # plugins recorded absolute


def trial_config(raw: dict[str, Any], sets: list[str]) -> Any:
    """The config of a trial with overrides ``sets`` on the base table ``raw``: the sweep's
    per-trial defaults first, the trial's overrides, then the in-process engine."""
    return config_from_dict(apply_overrides(raw, TRIAL_DEFAULTS + sets + TRIAL_ENGINE))


def check_trials(raw: dict[str, Any], spec: SweepSpec, items: list[dict[str, Any]]) -> None:
    """Validate every trial's config (``raw``: the base config's table, :func:`read_base`) before
    anything starts (a broken trial never starts a sweep)."""
    for t in items:
        for item in t["sets"]:
            parse_override(item)
        trial_config(raw, t["sets"])


def _trial_result(summary: dict[str, Any], metric: str) -> dict[str, Any]:
    eps = summary.get("epsilon")
    return {
        metric: summary.get(metric),
        "final_eval_accuracy": summary.get("final_eval_accuracy"),
        "epsilon": math.inf if eps in ("inf", None) else float(eps),
        "delta": summary.get("delta"),
        "neighboring_relation": summary.get("neighboring_relation"),
        "noise_multiplier": summary.get("noise_multiplier"),
        "wall_seconds": summary.get("wall_seconds"),
        "model_sha256": summary.get("model_sha256"),
    }


class _ReportRounds(RunCallback):
    """A run callback that reports every evaluated round to Tune (what ASHA stops trials on)."""

    def __init__(self, metric: str) -> None:
        self.metric = metric

    def on_round_end(self, row: dict[str, Any]) -> None:
        from ray import tune

        acc = row.get("eval_accuracy")
        if acc is not None:
            tune.report({self.metric: acc, "round": row["round"]})


def _searched_trial(config: dict[str, Any]) -> dict[str, Any]:
    """The trial of a search point: its overrides and a name from its values."""
    params = config["params"]
    point = [f"{k}={_value(v)}" for k, v in sorted(params.items())]
    label = ",".join(_label(k, v) for k, v in sorted(params.items()))
    seed = int(config["seed"])
    return {
        "name": f"{label},seed={seed}",
        "arm": label,
        "seed": seed,
        "sets": [*config["set"], *point, f"seed={seed}"],
    }


def run_trial(config: dict[str, Any]) -> dict[str, Any] | None:
    """One trial (a Tune function trainable): the run folder's summary, reused when it exists."""
    from fedsim.runner.runner import run_experiment

    t = config["trial"] if "trial" in config else _searched_trial(config)
    out = Path(config["out"]) / "trials" / t["name"]
    summary_path = out / "summary.json"
    if summary_path.exists():  # finished before a crash of the sweep: never recomputed
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
    else:
        # the base table the sweep read when it started (a sweep folder from before plan.json
        # holds only the file's path)
        old_path = config.get("base")
        raw = config["base_config"] if "base_config" in config else read_base(Path(old_path) if old_path else None)
        cfg = trial_config(raw, t["sets"])
        resume = out.exists() and resumable(out, cfg)
        if out.exists() and not resume:  # killed before its first checkpoint: it starts again
            import shutil

            shutil.rmtree(out)
        extra: list[RunCallback] = [_ReportRounds(config["metric"])] if config.get("report_rounds") else []
        summary = run_experiment(cfg, out, progress=False, callbacks=extra, resume=resume)
    result = _trial_result(summary, config["metric"])
    result["trial"] = t["name"]
    # Tune's loggers take numbers only: ε = ∞ (no noise) is reported as None (sweep.json has "inf")
    result = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in result.items()}
    if config.get("report_rounds"):
        from ray import tune

        tune.report(result)
        return None
    return result


def resumable(folder: Path, cfg: Any) -> bool:
    """Whether the trial killed mid-run in ``folder`` continues from its checkpoint (bit-identical to
    an uninterrupted run): it has one, intact, written with exactly the config ``cfg`` (any
    difference, even one ``fedsim run --resume --force`` would allow, starts the trial again)."""
    from fedsim.runner.resume import check_resume, load_stored_config

    try:
        _, stored = load_stored_config(folder)
        check_resume(stored, cfg, [], str(folder))
    except FedsimError:  # no checkpoint, an unreadable or altered one, or another config
        return False
    return True


def _tuner(spec: SweepSpec, raw: dict[str, Any], out: Path, items: list[dict[str, Any]], resume: bool) -> Any:
    from ray import tune

    cpus = _trial_cpus(raw, (items or trials(spec))[0]["sets"])
    trainable = tune.with_resources(run_trial, {"cpu": cpus})
    space: dict[str, Any] = {
        "out": str(out),
        "base_config": raw,
        "metric": spec.metric,
        "report_rounds": spec.scheduler == "asha",
    }
    search_alg, samples = None, 1
    if spec.search is None:
        space["trial"] = tune.grid_search(items)
    else:
        from ray.tune.search.optuna import OptunaSearch

        space.update(params=_search_space(spec.search), seed=spec.seeds[0], set=list(spec.set))
        search_alg = OptunaSearch(metric=spec.metric, mode=spec.mode, seed=spec.seeds[0])
        samples = spec.search.num_samples
    storage = out / "tune"
    if resume and (storage / spec.name).exists():
        return tune.Tuner.restore(str(storage / spec.name), trainable, resume_unfinished=True, resume_errored=True)
    scheduler = None
    if spec.scheduler == "asha":
        from ray.tune.schedulers import ASHAScheduler

        scheduler = ASHAScheduler(metric=spec.metric, mode=spec.mode, grace_period=1)
    return tune.Tuner(
        trainable,
        param_space=space,
        tune_config=tune.TuneConfig(
            max_concurrent_trials=spec.max_concurrent,
            scheduler=scheduler,
            search_alg=search_alg,
            num_samples=samples,
            reuse_actors=True,
            trial_dirname_creator=lambda trial: trial.trial_id,
        ),
        run_config=tune.RunConfig(
            name=spec.name, storage_path=str(storage), verbose=0, callbacks=[_progress_callback(spec, len(items))]
        ),
    )


def _progress_callback(spec: SweepSpec, planned: int) -> Any:
    """A Tune callback printing one line per trial that finishes or fails (Tune's own tables are
    off): ``sweep: 3/36 done: <trial> final_eval_accuracy = 0.3412``."""
    import sys

    from ray import tune

    class Progress(tune.Callback):
        done = 0

        def _line(self, trial: Any, what: str) -> None:
            self.done += 1
            item = trial.config.get("trial") or {}
            name = item.get("name", trial.trial_id) if isinstance(item, dict) else trial.trial_id
            total = planned if spec.search is None else spec.search.num_samples
            print(f"sweep: {self.done}/{total} {what}: {name}", file=sys.stderr, flush=True)

        def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
            value = (trial.last_result or {}).get(spec.metric)
            self._line(trial, f"done ({spec.metric} = {value:.4g})" if isinstance(value, float) else "done")

        def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
            self._line(trial, "FAILED")

    return Progress()


def _search_space(search: Search) -> dict[str, Any]:
    """Tune's distributions for the search space."""
    from ray import tune

    space: dict[str, Any] = {}
    for key, dist in search.space.items():
        if len(dist) != 1:
            raise FedsimError(f"sweep.search.space.{key}: give one of loguniform, uniform or choice")
        ((kind, values),) = dist.items()
        if kind == "choice":
            space[key] = tune.choice(values)
        elif len(values) != 2 or not all(isinstance(v, int | float) for v in values):
            raise FedsimError(f"sweep.search.space.{key}.{kind} must be [low, high]")
        else:
            space[key] = (tune.loguniform if kind == "loguniform" else tune.uniform)(*values)
    return space


def _trial_cpus(raw: dict[str, Any], sets: list[str]) -> float:
    """``sim.client_cpus`` of a trial with overrides ``sets``: its Tune resources."""
    return float(trial_config(raw, sets).sim.client_cpus)


def _collect(out: Path, items: list[dict[str, Any]], metric: str) -> list[dict[str, Any]]:
    """Every finished trial's result, read from its run folder (what Tune reported, and more).
    ``items``: the trials (the grid's, or the points a search ran); a trial without a
    ``summary.json`` did not finish."""
    rows = []
    for t in items:
        path = out / "trials" / t["name"] / "summary.json"
        if path.exists():
            summary = json.loads(path.read_text(encoding="utf-8"))
            rows.append({"trial": t["name"], "arm": t["arm"], "seed": t["seed"], **_trial_result(summary, metric)})
    return rows


def _arm_plans(raw: dict[str, Any], items: Sequence[dict[str, Any]]) -> dict[str, tuple[Any, int]]:
    """Each arm's planned accounting spec and rounds, from the config of its first trial in
    ``items`` (its trials differ only in the seed, which the accounting does not read); the data is
    loaded once per data config for its population. ``raw``: the base config's table."""
    from fedsim.data import load_federated
    from fedsim.runner.build import resolve_privacy

    populations: dict[str, int] = {}
    plans: dict[str, tuple[Any, int]] = {}
    for t in items:
        if t["arm"] in plans:
            continue
        cfg = trial_config(raw, t["sets"])
        data_key = cfg.data.model_dump_json()
        if data_key not in populations:
            populations[data_key] = load_federated(cfg.data).population
        plans[t["arm"]] = (resolve_privacy(cfg, populations[data_key]), cfg.rounds)
    return plans


def planned_specs(raw: dict[str, Any], items: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Each arm's :class:`~fedsim.privacy.accounting.AccountingSpec` as the plan gives it (what a
    trial of the arm must have run under), computed once per arm.

    Parameters
    ----------
    raw : the base config's table (:func:`read_base`).
    items : trials (``{"name", "arm", "seed", "sets"}``); the first one of each arm is used.
    """
    return {arm: plan[0] for arm, plan in _arm_plans(raw, items).items()}


def not_as_planned(out: Path, rows: Sequence[dict[str, Any]], specs: dict[str, Any]) -> list[str]:
    """The finished trials that did not run as planned: their ``ledger.json`` is missing or holds
    another accounting spec than ``specs`` gives their arm, or their ``summary.json``'s δ or
    neighbouring relation differs from it (a folder copied in from another run, say). Such a
    trial's ε holds for another spec, so it is never averaged into its arm's row.

    Parameters
    ----------
    out : the sweep folder (trials under ``out/trials/<name>/``).
    rows : finished trials (:func:`_collect`'s rows: ``trial``, ``arm``, and from ``summary.json``
        ``delta`` and ``neighboring_relation`` where known).
    specs : arm → its planned accounting spec (:func:`planned_specs`).
    """
    from fedsim.privacy.ledger import spec_from_ledger

    bad = []
    for r in rows:
        planned = specs.get(r["arm"])
        ledger = out / "trials" / r["trial"] / "ledger.json"
        try:
            ran = spec_from_ledger(json.loads(ledger.read_text(encoding="utf-8"))) if ledger.exists() else None
        except (FedsimError, ValueError, KeyError, TypeError):  # an unreadable ledger proves nothing
            ran = None
        summary_differs = planned is not None and (
            ("delta" in r and r["delta"] != planned.delta)
            or ("neighboring_relation" in r and r["neighboring_relation"] != planned.neighboring_relation)
        )
        if planned is None or ran != planned or summary_differs:
            bad.append(r["trial"])
    return bad


def _mean_sd(values: list[float | None]) -> tuple[float | None, float | None]:
    """Mean and sample std of the finite values (std None for fewer than two: there is none)."""
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return None, None
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else None)


def _worst_epsilon(eps: list[float | None]) -> float | None:
    """An arm's ε: the largest of its trials' (∞ if any is ∞; its trials share one accounting spec,
    so they agree unless one stopped early), None without any."""
    known = [e for e in eps if e is not None]
    return max(known) if known else None


def arm_table(
    rows: list[dict[str, Any]],
    metric: str,
    planned: dict[str, int] | None = None,
    stray: Sequence[str] = (),
    arms: Sequence[dict[str, Any]] = (),
) -> list[dict[str, Any]]:
    """One row per arm: mean ± std over seeds of the metric and wall time, ε (the largest of the
    arm's trials: ∞ if any is ∞), δ and the neighbouring relation, and how many trials finished.

    Parameters
    ----------
    rows : finished trials that ran as planned (:func:`_collect`, less :func:`not_as_planned`).
    metric : the metric's key in the rows.
    planned : arm → number of trials planned for it (None: as many as finished).
    stray : names of trials that finished but not as planned (counted in their arm's
        ``not_as_planned``, never in its numbers).
    arms : every planned trial (``{"name", "arm"}``): arms none of whose trials finished get a row
        too, and ``stray`` names are mapped to their arms.

    The trials of an arm must share δ and relation (:func:`not_as_planned` ensures it); if they do
    not, the row's ε, δ and relation are None and ``relation`` says "mixed" rather than one of them.
    """
    arm_of = {t["name"]: t["arm"] for t in arms}
    order = list(dict.fromkeys([*(t["arm"] for t in arms), *(r["arm"] for r in rows)]))
    table = []
    for arm in order:
        group = [r for r in rows if r["arm"] == arm]
        m, m_sd = _mean_sd([r[metric] for r in group])
        w, w_sd = _mean_sd([r["wall_seconds"] for r in group])
        kinds = {(r.get("neighboring_relation"), r.get("delta")) for r in group}
        mixed = len(kinds) > 1
        relation, delta = (None, None) if mixed or not kinds else next(iter(kinds))
        table.append(
            {
                "arm": arm,
                "seeds": len(group),
                "planned": len(group) if planned is None else planned.get(arm, len(group)),
                "not_as_planned": sum(1 for n in stray if arm_of.get(n) == arm),
                metric: m,
                f"{metric}_std": m_sd,
                "epsilon": None if mixed else _worst_epsilon([r["epsilon"] for r in group]),
                "delta": delta,
                "neighboring_relation": "mixed" if mixed else relation,
                "wall_seconds": w,
                "wall_seconds_std": w_sd,
            }
        )
    return table


def _fmt(m: float | None, sd: float | None, scale: float = 1.0, digits: int = 2) -> str:
    """``mean ± std`` (the mean alone, marked "(1 seed)", without a std; "–" without a mean)."""
    if m is None:
        return "–"
    if math.isinf(m):
        return "∞"
    if sd is None:
        return f"{m * scale:.{digits}f} (1 seed)"
    return f"{m * scale:.{digits}f} ± {sd * scale:.{digits}f}"


def _cell(value: Any) -> str:
    """A markdown table cell: ``|`` escaped and line breaks as spaces (they would end the row)."""
    return str(value).replace("\\", "\\\\").replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def _seeds_cell(r: dict[str, Any]) -> str:
    """``finished/planned`` (and how many finished not as planned)."""
    text = f"{r['seeds']}/{r.get('planned', r['seeds'])}"
    if r.get("not_as_planned"):
        text += f" (+{r['not_as_planned']} not as planned, left out)"
    return text


def markdown_table(table: list[dict[str, Any]], metric: str) -> str:
    """The arm table as markdown (accuracy-like metrics in percent; ε and δ rounded up)."""
    from fedsim.privacy.display import format_delta, format_epsilon

    pct = metric.endswith("accuracy")
    head = f"| arm | seeds done/planned | {metric}{' %' if pct else ''} | ε | δ | relation | wall s |"
    lines = [head, "|---|---|---|---|---|---|---|"]
    for r in table:
        eps = r["epsilon"]
        cells = [
            r["arm"],
            _seeds_cell(r),
            _fmt(r[metric], r[f"{metric}_std"], 100 if pct else 1),
            "∞" if eps is not None and math.isinf(eps) else format_epsilon(eps, 3, "f"),
            format_delta(r.get("delta")),
            r["neighboring_relation"] or "–",
            _fmt(r["wall_seconds"], r["wall_seconds_std"], digits=1),
        ]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines)


def _csv_safe(value: Any) -> Any:
    """A CSV cell: text that a spreadsheet would run as a formula (``= + - @`` first) gets a ``'``."""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@"):
        return "'" + value
    return value


def _write_outputs(
    out: Path, spec: SweepSpec, rows: list[dict[str, Any]], selection: dict[str, Any], table: list[dict[str, Any]]
) -> dict[str, Any]:
    result = {
        "name": spec.name,
        "metric": spec.metric,
        "mode": spec.mode,
        "trials": rows,
        "arms": table,
        "selection": selection,
    }
    (out / "sweep.json").write_text(json.dumps(json_safe(result), indent=1), encoding="utf-8")
    with (out / "table.csv").open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(table[0]) if table else ["arm"])
        writer.writeheader()
        writer.writerows({k: _csv_safe(v) for k, v in r.items()} for r in table)
    (out / "table.md").write_text(markdown_table(table, spec.metric) + "\n", encoding="utf-8")
    return result


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float written as ``"inf"`` (JSON has no ∞)."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return "inf"
    return value


def _stray_note(stray: Sequence[str]) -> str:
    return (
        f"; trial(s) {', '.join(stray)} did not run as planned (their ledger.json holds another accounting spec "
        "than the plan gives their arm): not as planned, left out of the table"
    )


def selection_note(
    spec: SweepSpec,
    table: list[dict[str, Any]],
    rows: list[dict[str, Any]],
    privacy: dict[str, Any] | None,
    out: Path,
    missing: Sequence[str] = (),
    stray: Sequence[str] | None = None,
) -> dict[str, Any]:
    """What choosing the best arm on private data costs, and whether it is accounted.

    ``privacy``: :func:`selection_privacy` (computed before the trials ran), None without
    ``sweep.private_selection``. Under private selection the release is the best single trial
    (``best_trial``; ``best_arm`` is its arm), and every finished trial's ledger must hold the
    accounting spec the plan gives its arm: a trial that ran under another one (its folder reused
    from elsewhere) leaves the selection not accounted, and so do ``missing`` trials (the bound is
    for the best of all ``K``; which trials fail could depend on the data). ``stray``: the trials
    that finished not as planned (:func:`not_as_planned`; ``rows`` then holds only the others),
    None to check ``rows`` here (private selection only). They are named in the note, as
    ``not_as_planned``, for every sweep."""
    from fedsim.privacy.display import format_delta, format_epsilon

    pick = max if spec.mode == "max" else min
    if privacy is None:
        scored = [r for r in table if r[spec.metric] is not None]
        note = (
            "selection not accounted: choosing the best arm by a metric computed on users' data "
            "is itself a release that the per-run ε does not cover (configure sweep.private_selection)"
        )
        return {
            "best_arm": pick(scored, key=lambda r: r[spec.metric])["arm"] if scored else None,
            "accounted": False,
            "not_as_planned": list(stray or []),
            "note": note + (_stray_note(stray) if stray else ""),
        }
    from fedsim.privacy.accounting import RELATION_LABELS

    if stray is None:
        stray = not_as_planned(out, rows, privacy["specs"])
        rows = [r for r in rows if r["trial"] not in stray]
    result = {k: v for k, v in privacy.items() if k != "specs"}
    scored_trials = [r for r in rows if r[spec.metric] is not None]
    best = pick(scored_trials, key=lambda r: r[spec.metric]) if scored_trials else None
    result["best_trial"] = None if best is None else best["trial"]
    result["best_arm"] = None if best is None else best["arm"]
    result["not_as_planned"] = list(stray)
    ps = spec.private_selection
    assert ps is not None
    where = f"at δ = {format_delta(result['delta'])} for {RELATION_LABELS[result['neighboring_relation']]}"
    if privacy.get("draws") == 0:
        note = f"K = 0 trials drawn: the procedure releases nothing ({result['theorem']})"
    else:
        note = (
            f"ε of releasing the selected model: {format_epsilon(result['epsilon'], 4, 'g')} {where} "
            f"({result['theorem']})"
        )
    result["accounted"] = ps.metric_is_private and not stray and not missing
    if missing:
        note += (
            f"; {len(missing)} of the K = {privacy.get('draws')} trials did not finish (resume the sweep): the bound "
            "is for the best of all K, so the selection is not accounted"
        )
    if stray:
        note += _stray_note(stray) + "; selection not accounted"
    if not missing and not stray and not ps.metric_is_private:
        note += (
            f"; it assumes the ranking metric is private or public, but '{spec.metric}' is computed from "
            "users' data outside ε: selection not accounted"
        )
    result["note"] = note
    return result


def selection_privacy(spec: SweepSpec, raw: dict[str, Any], draws: int | None = None) -> dict[str, Any] | None:
    """The ε of releasing the best trial under ``sweep.private_selection`` (None without it),
    computed before any trial runs, from every arm's accounting spec: an arm that was not drawn
    counts too, since the guarantee is over the random choice of arm.

    ``raw``: the base config's table (:func:`read_base`); ``draws``: the number of trials drawn.
    All arms' ε must hold for one neighbouring relation; arms under different relations (e.g. a
    ``fixed`` arm, replace one user, beside a ``poisson`` arm, add/remove one user) are refused:
    no one guarantee covers choosing among them. Returns :func:`~fedsim.privacy.selection.selection_epsilon`'s
    dict with ``neighboring_relation``, ``draws`` and ``specs`` (each arm's accounting spec)."""
    ps = spec.private_selection
    if ps is None:
        return None
    from fedsim.privacy.accounting import RELATION_LABELS
    from fedsim.privacy.selection import selection_epsilon

    plans = _arm_plans(raw, trials(spec))
    specs = {arm: plan[0] for arm, plan in plans.items()}
    runs = list(plans.values())
    relations = {s.neighboring_relation for s in specs.values()}
    if len(relations) > 1:
        detail = "; ".join(f"{arm}: {RELATION_LABELS[s.neighboring_relation]}" for arm, s in specs.items())
        raise FedsimError(
            f"sweep.private_selection: the arms' ε hold for different neighbouring relations ({detail}); "
            "no one guarantee covers choosing among them. Give every arm the same sampling.scheme (and "
            "sampling.assignment), or remove [sweep.private_selection]"
        )
    out = selection_epsilon(runs, max(s.delta for s in specs.values()), ps.distribution, ps.mean, ps.eta, ps.gamma)
    return {**out, "neighboring_relation": relations.pop(), "draws": draws, "specs": specs}


def random_trials(spec: SweepSpec, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Private selection's trials: ``K`` drawn from the spec's distribution, each a uniformly random
    arm with a fresh seed (from the keyed CSPRNG of the spec's first seed)."""
    from fedsim.privacy.rng import PrivacyKey, random_words
    from fedsim.privacy.selection import draw_arms, draw_trial_count

    ps = spec.private_selection
    assert ps is not None
    key = PrivacyKey.from_seed(spec.seeds[0]).derive("private-selection")
    k = draw_trial_count(ps.distribution, ps.mean, ps.eta, ps.gamma, key.derive("count"))
    arms = list(dict.fromkeys(t["arm"] for t in items))
    first = {a: next(t for t in items if t["arm"] == a) for a in arms}
    out = []
    for i, a in enumerate(draw_arms(len(arms), k, key.derive("arms"))):
        seed = int(random_words(key.derive("seed", i), 1)[0]) % 2**31  # a fresh seed per trial
        t = first[arms[a]]
        sets = [s for s in t["sets"] if not s.startswith("seed=")] + [f"seed={seed}"]
        out.append({"name": f"trial{i:03d},{arms[a]}", "arm": arms[a], "seed": seed, "sets": sets})
    return out


def run_sweep(
    spec_path: str | Path,
    out_dir: str | Path | None = None,
    *,
    address: str | None = None,
    resume: bool = False,
    only: str | None = None,
    overrides: list[str] | None = None,
) -> dict[str, Any]:
    """Run (or resume) the sweep of ``spec_path`` on Ray Tune and write its outputs.

    Parameters
    ----------
    spec_path : the sweep spec (TOML with a ``[sweep]`` table).
    out_dir : the sweep folder (default ``runs/sweeps/<name>``; with ``resume``, the folder to resume).
    address : join this Ray cluster (``HOST:PORT`` of its head) instead of starting a local Ray.
    resume : finish a killed sweep in ``out_dir``: only its unfinished trials run.
    only : run only the grid's trials that have each comma-separated part of this text as a whole
        part of their name (e.g. ``blt`` for an arm, ``seed=0``, or ``blt,seed=0``; ``seed=1`` does
        not match ``seed=10``).
    overrides : ``dotted.key=value`` items applied to every trial after the spec's ``set`` (a
        smoke run: ``rounds=2``); part of the plan, so a resume must pass the same ones.

    Returns the dict written to ``sweep.json``: besides the trials, the arm table and the
    selection, ``missing`` (trials that did not finish: not run yet, or failed, for a grid and a
    search alike; a trial ASHA stopped early on purpose is not missing), ``failed`` (those Tune
    reports as errored) and ``not_as_planned`` (finished trials whose ledger holds another
    accounting spec than the plan gives their arm: left out of the table).
    """
    spec, base = load_spec(spec_path, overrides)
    raw = read_base(base)
    items = _planned_trials(spec, raw, only)
    privacy = selection_privacy(spec, raw, len(items))
    # every arm's accounting spec, computed before anything runs: each finished trial is checked against it
    specs = privacy["specs"] if privacy is not None else planned_specs(raw, items)
    out = Path(out_dir) if out_dir is not None else Path("runs") / "sweeps" / spec.name
    if not resume and any((out / part).exists() for part in ("tune", "trials", PLAN_FILE)):
        # its trials' summaries would be taken as this sweep's finished trials
        raise FedsimError(f"sweep folder {out} already holds a sweep; pass --resume to finish it, or another --out")
    out.mkdir(parents=True, exist_ok=True)
    _keep_plan(out, sweep_plan(spec, base, raw, only), resume)
    (out / "spec.json").write_text(json.dumps(spec.model_dump(mode="json"), indent=1), encoding="utf-8")
    t0 = time.perf_counter()
    outcomes: list[tuple[dict[str, Any], bool]] = []
    if privacy is None or items:  # K = 0: the procedure runs nothing and releases nothing
        outcomes = _fit(spec, raw, out, items, resume, address)
    if spec.search is not None:  # the points Tune drew (a point drawn twice is one trial)
        items = list({t["name"]: t for t, _ in outcomes}.values())
        specs = planned_specs(raw, items)
    found = _collect(out, items, spec.metric)
    if (privacy is None or items) and not found:
        raise FedsimError(f"no trial of the sweep finished; Tune's logs are under {out / 'tune'}")
    stray = not_as_planned(out, found, specs)
    rows = [r for r in found if r["trial"] not in stray]
    finished = {r["trial"] for r in found}
    errored = {t["name"] for t, error in outcomes if error}
    # ASHA stops trials early on purpose: those are not "missing" (the ones that failed are)
    missing = [
        t["name"] for t in items if t["name"] not in finished and (spec.scheduler != "asha" or t["name"] in errored)
    ]
    planned = Counter(t["arm"] for t in items)
    table = arm_table(rows, spec.metric, dict(planned), stray, items)
    note = selection_note(spec, table, rows, privacy, out, missing, stray)
    result = _write_outputs(out, spec, rows, note, table)
    result["wall_seconds"] = time.perf_counter() - t0
    result["missing"] = missing
    result["failed"] = [n for n in missing if n in errored]
    result["not_as_planned"] = stray
    (out / "sweep.json").write_text(json.dumps(json_safe(result), indent=1), encoding="utf-8")
    return result


#: The file in a sweep folder that holds what the sweep was started with (:func:`sweep_plan`).
PLAN_FILE = "plan.json"


def finished_as_planned(out: str | Path, spec_path: str | Path | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """A grid sweep's finished trials read back from its folder for a table of one's own (the
    experiment wrappers' ``--table``), with the check every sweep's table makes: ``(rows, left
    out)``. ``rows`` are the finished trials that ran as planned (:func:`_collect`'s rows);
    ``left out`` names the others — a trial whose ledger holds another accounting spec than its
    arm's plan (:func:`not_as_planned`), and a folder under ``trials/`` that is no trial of the
    plan at all. Their numbers hold for another guarantee, or another experiment, and never enter
    a row.

    Parameters
    ----------
    out : the sweep folder.
    spec_path : the sweep spec, for a folder without ``plan.json`` (written since sweeps keep their
        plan); otherwise the plan the sweep started with is used (its spec, base config and
        ``--only``).
    """
    out = Path(out)
    plan_path = out / PLAN_FILE
    if plan_path.exists():
        plan = json.loads(plan_path.read_text(encoding="utf-8"))
        try:
            spec = SweepSpec.model_validate(plan["spec"])
            raw, only = dict(plan["base_config"] or {}), plan.get("only")
        except (KeyError, TypeError, ValidationError):
            raise FedsimError(f"{plan_path} is not a sweep's plan (spec, base_config, only); restore it") from None
    elif spec_path is not None:
        spec, base = load_spec(spec_path)
        raw, only = read_base(base), None
    else:
        raise FedsimError(f"{out} holds no {PLAN_FILE}: pass the sweep spec it was run from")
    if spec.search is not None:
        raise FedsimError(f"{out} is a search, whose trials Tune drew: read its table.md or `fedsim report {out}`")
    items = _planned_trials(spec, raw, only)
    found = _collect(out, items, spec.metric)
    names = {t["name"] for t in items}
    strangers = sorted(
        d.name for d in (out / "trials").glob("*") if d.name not in names and (d / "summary.json").exists()
    )
    done = {r["trial"] for r in found}
    stray = not_as_planned(out, found, planned_specs(raw, [t for t in items if t["name"] in done]))
    return [r for r in found if r["trial"] not in stray], stray + strangers


def sweep_plan(spec: SweepSpec, base: Path | None, raw: dict[str, Any], only: str | None) -> dict[str, Any]:
    """What a sweep runs, as data: its spec, the base config's path and table, and ``--only``."""
    return json.loads(
        json.dumps(
            {
                "spec": spec.model_dump(mode="json"),
                "base": None if base is None else str(base),
                "base_config": raw,
                "only": only,
            },
            default=str,  # TOML dates, should a config hold one
        )
    )


def _keep_plan(out: Path, plan: dict[str, Any], resume: bool) -> None:
    """Write the plan into a new sweep's folder; on ``--resume``, refuse a spec, base config or
    ``--only`` that differs from the one the sweep started with (the finished trials ran that one,
    and the selection's ε is computed for it). A folder from before plans were kept gets one."""
    path = out / PLAN_FILE
    if resume and path.exists():
        started = json.loads(path.read_text(encoding="utf-8"))
        what = {"spec": "sweep spec", "base_config": f"base config ({plan['base']})", "only": "--only"}
        changed = [label for key, label in what.items() if started.get(key) != plan[key]]
        if changed:
            raise FedsimError(
                f"sweep folder {out} was started with another {' and '.join(changed)} than now; a resumed sweep "
                f"runs what it started with (its finished trials and its ε are for that; see {path}). Restore "
                "the file(s) as they were, or start a new sweep with another --out"
            )
        return
    path.write_text(json.dumps(plan, indent=1), encoding="utf-8")


def _matches_only(name: str, only: str) -> bool:
    """Whether the trial ``name`` has every comma-separated part of ``only`` as a whole part
    (``seed=1`` matches ``…,seed=1`` but not ``…,seed=10``; ``blt`` matches the arm ``blt``)."""
    parts = set(name.split(","))
    wanted = [p for p in only.split(",") if p]
    return bool(wanted) and all(p in parts for p in wanted)


def _search_points(spec: SweepSpec) -> list[dict[str, Any]]:
    """Trials that stand for every value a search can draw, to check before anything runs: each
    ``choice`` value and each range's endpoints (as floats, as Tune draws them), one key at a
    time, the other keys at their first value. Refuses an empty ``choice`` and a range whose
    endpoints are not ``low <= high`` (``0 < low`` for ``loguniform``)."""
    assert spec.search is not None
    candidates: dict[str, list[Any]] = {}
    for key, dist in spec.search.space.items():
        if len(dist) != 1:
            raise FedsimError(f"sweep.search.space.{key}: give one of loguniform, uniform or choice")
        ((kind, values),) = dist.items()
        if kind == "choice":
            if not values:
                raise FedsimError(f"sweep.search.space.{key}.choice is empty: give at least one value")
            candidates[key] = list(values)
            continue
        if len(values) != 2 or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            raise FedsimError(f"sweep.search.space.{key}.{kind} must be [low, high] (two numbers)")
        low, high = float(values[0]), float(values[1])
        if not low <= high or (kind == "loguniform" and low <= 0):
            need = "0 < low <= high" if kind == "loguniform" else "low <= high"
            raise FedsimError(f"sweep.search.space.{key}.{kind} = [{low:g}, {high:g}]: need {need}")
        candidates[key] = [low, high]
    first = {k: v[0] for k, v in candidates.items()}
    points = [first] + [{**first, k: v} for k, vals in candidates.items() for v in vals[1:]]
    return [_searched_trial({"params": p, "seed": spec.seeds[0], "set": list(spec.set)}) for p in points]


def _planned_trials(spec: SweepSpec, raw: dict[str, Any], only: str | None) -> list[dict[str, Any]]:
    """The trials to run (empty for a search, whose trials Tune draws), every config checked (for a
    search: every choice and both ends of every range, :func:`_search_points`)."""
    if spec.search is not None and (spec.arms or spec.axes or spec.private_selection is not None):
        raise FedsimError("sweep.search replaces the grid: remove sweep.arms, sweep.axes and sweep.private_selection")
    if spec.scheduler == "asha" and spec.private_selection is not None:
        raise FedsimError(
            "sweep.scheduler = 'asha' stops trials on one another's intermediate scores, and private selection's "
            "bound is for the best of K independent, complete trials: set sweep.scheduler = 'none', or remove "
            "[sweep.private_selection]"
        )
    if spec.search is not None:
        if only is not None:
            raise FedsimError("--only picks trials of a grid; a search's trials are drawn by Tune: remove --only")
        for t in _search_points(spec):
            try:
                check_trials(raw, spec, [t])
            except FedsimError as e:
                raise FedsimError(
                    f"sweep.search.space: the search can draw the trial {t['name']}, whose config is invalid ({e}); "
                    "change the choice values or the range in sweep.search.space"
                ) from None
        return []
    items = trials(spec)
    if only is not None:
        items = [t for t in items if _matches_only(t["name"], only)]
        if not items:
            raise FedsimError(
                f"--only {only!r} matches no trial of the sweep (each comma-separated part must be a whole part of "
                "a trial's name, e.g. 'seed=0' or an arm's name)"
            )
    if spec.private_selection is not None:
        items = random_trials(spec, items)
    check_trials(raw, spec, items or trials(spec))
    return items


def _outcomes(grid: Any) -> list[tuple[dict[str, Any], bool]]:
    """Every trial of Tune's ``ResultGrid`` as ``(trial, errored)``: the trial dict (the grid's, or
    the one a search point names, :func:`_searched_trial`) and whether it failed."""
    outcomes = []
    for i in range(len(grid)):
        r = grid[i]
        config = r.config or {}
        if "trial" not in config and "params" not in config:
            continue
        t = config["trial"] if "trial" in config else _searched_trial(config)
        outcomes.append((t, r.error is not None))
    return outcomes


def _fit(
    spec: SweepSpec, raw: dict[str, Any], out: Path, items: list[dict[str, Any]], resume: bool, address: str | None
) -> list[tuple[dict[str, Any], bool]]:
    """Start (or join) Ray and let Tune run the trials; returns :func:`_outcomes` of every trial."""
    import logging
    import os

    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # Tune's own progress tables: off (the table is ours)
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    # Ray runs its workers at niceness 15; the trials are the work here, so they run at the
    # priority of the command (a local Ray only; a cluster keeps its own setting)
    os.environ.setdefault("RAY_worker_niceness", "0")
    import ray

    from fedsim.plugins import ray_env_vars

    env = ray_env_vars()  # a cluster's workers import the plugins too
    ray.init(
        address=address,
        runtime_env={"env_vars": env} if env else None,
        include_dashboard=False,
        log_to_driver=False,
        ignore_reinit_error=True,
        logging_level=logging.ERROR,
    )
    try:
        return _outcomes(_tuner(spec, raw, out.resolve(), items, resume).fit())
    finally:
        ray.shutdown()
