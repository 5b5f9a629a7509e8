"""Empirical privacy of a trained text model: secret-sharer canary users and user inference.

``fedsim audit CONFIG --attack canary --attack user-inference`` trains the config once on an
*audit population* (:class:`fedsim.attacks.population.AuditView`) and attacks the final model:

- **canary** (Carlini et al., USENIX Security 2019): ``M`` canary users join the population —
  each a real user's text (its donor leaves the population) with a random secret inserted ``r``
  times, over several repetition levels. After training, each secret's rank among random
  reference secrets under the model's log-perplexity gives its exposure
  (:func:`fedsim.attacks.scoring.canary_report`); the same report on the initial model is the
  chance level.
- **user-inference** (Kandpal et al. 2023): held-out users (never in the population) and as many
  held-in users (in it) are drawn from the users with test text; each user's statistic is the
  mean over its held-out samples of ``log p_θ(x) − log p_ref(x)`` (``p_ref``: the initial model).
  ROC AUC and TPR at 1 % and 0.1 % FPR come with bootstrap intervals, and the Clopper–Pearson
  lower bound ``ε_LB`` at the run's δ (threshold chosen on one half of the users, bounded on the
  other, :func:`fedsim.attacks.stats.epsilon_lower_bound_from_scores`) holds with 95 % confidence
  for the neighbouring relation the ledger prints: adding or removing one user.

The accountant counts the audit population (canary users included, held-out users and donors
not); only real users are evaluated, so the run's evaluation numbers never include canary or
held-out users. The audit folder holds ``run/`` (an ordinary run folder), ``audit.json`` and the
plots ``canary_exposure.png`` and ``user_inference_roc.png``; ``fedsim report`` renders it.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedsim.attacks.population import AuditView
from fedsim.config import Config
from fedsim.data import FederatedData, load_federated
from fedsim.errors import FedsimError
from fedsim.models import make_model
from fedsim.seeding import derive_seed

#: the attacks this module runs (``gradient`` is :mod:`fedsim.runner.audit`).
TEXT_ATTACKS = ("canary", "user-inference")


@dataclass(frozen=True)
class TextAuditOptions:
    """What the text audit inserts and measures.

    Parameters
    ----------
    attacks : some of ``canary``, ``user-inference``.
    num_canaries : ``M``, canary users (cycling through the repetition levels). Default 12.
    repetitions : ``r`` levels: copies of the secret in a canary's text. Default (1, 4, 16).
    sizes : canary-user data sizes: donor data a canary keeps (characters, or sentences for Stack
        Overflow) besides its secrets, one per level; None keeps all of it. Smaller means the
        secret is a larger share of the canary's data. The canaries cycle through the cells
        repetitions × sizes. Default (None,).
    secret_length : characters (Shakespeare) or words (Stack Overflow) per secret. Default 8.
    references : random reference secrets each canary is ranked among. Default 10000.
    held_out : user inference: held-out users, and as many held-in targets. Default 40.
    max_examples : user inference: held-out samples scored per user. Default 64.
    bootstrap : resamples of the AUC and TPR intervals. Default 1000.
    confidence : of the ε lower bound. Default 0.95.
    seed : the audit's analysis randomness (donors, secrets, splits); default from the run's seed.
    """

    attacks: tuple[str, ...] = TEXT_ATTACKS
    num_canaries: int = 12
    repetitions: tuple[int, ...] = (1, 4, 16)
    sizes: tuple[int | None, ...] = (None,)
    secret_length: int = 8
    references: int = 10_000
    held_out: int = 40
    max_examples: int = 64
    bootstrap: int = 1000
    confidence: float = 0.95
    seed: int | None = None

    def check(self) -> None:
        bad = sorted(set(self.attacks) - set(TEXT_ATTACKS))
        if bad or not self.attacks:
            raise FedsimError(f"--attack {', '.join(bad) or '(none)'}: allowed are {', '.join(TEXT_ATTACKS)}")
        if self.num_canaries < 1 or self.references < 10 or self.held_out < 2 or self.max_examples < 1:
            raise FedsimError("--canaries ≥ 1, --references ≥ 10, --held-out ≥ 2 and --max-examples ≥ 1 are needed")
        if not all(r >= 1 for r in self.repetitions):
            raise FedsimError(f"--repetitions must be integers ≥ 1 (got {list(self.repetitions)})")
        if not self.sizes or not all(s is None or s >= 1 for s in self.sizes):
            raise FedsimError(f"--canary-size must be integers ≥ 1 or 'all' (got {list(self.sizes)})")


def audit_view(cfg: Config, base: FederatedData, opts: TextAuditOptions, seed: int) -> tuple[AuditView, Any]:
    """The audit population: held-out users first (from users with test text), then canary donors
    among the rest (never a target). Returns the view and the user split (or None)."""
    from fedsim.attacks.canaries import make_canary_set
    from fedsim.attacks.user_inference import split_users, users_with_test_samples

    if base.task not in ("char", "nwp"):
        raise FedsimError(
            f"the text audit needs a next-character or next-word dataset; data.name = '{cfg.data.name}' is "
            f"{base.task!r} (use --attack gradient)"
        )
    split = None
    held_out: tuple[int, ...] = ()
    if "user-inference" in opts.attacks:
        split = split_users(base.population, opts.held_out, seed, eligible=users_with_test_samples(base))
        held_out = split.held_out
    canaries = None
    if "canary" in opts.attacks:
        exclude = () if split is None else split.held_in + split.held_out
        canaries = make_canary_set(
            base, opts.num_canaries, opts.repetitions, opts.sizes, opts.secret_length, seed, exclude=exclude
        )
    return AuditView(canaries, held_out), split


def _models(cfg: Config, out: Path, dims: dict[str, int]) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The trained model (the checkpoint's final parameters) and the initial one (the reference)."""
    from torch.nn.utils import vector_to_parameters

    from fedsim.checkpoint import load_checkpoint

    seed = derive_seed(cfg.seed, "model")
    initial = make_model(cfg.model.name, dims, seed=seed).eval()
    trained = make_model(cfg.model.name, dims, seed=seed).eval()
    params = load_checkpoint(out / "checkpoint")["server"]["params"]
    vector_to_parameters(params.detach().to(torch.float32).cpu(), trained.parameters())
    return trained, initial


def _user_inference(
    trained: torch.nn.Module,
    initial: torch.nn.Module,
    base: FederatedData,
    split: Any,
    opts: TextAuditOptions,
    delta: float,
    seed: int,
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    from fedsim.attacks import stats
    from fedsim.attacks.user_inference import user_inference_scores

    s_in, s_out = user_inference_scores(
        trained, initial, base, list(split.held_in), list(split.held_out), opts.max_examples
    )
    s_in, s_out = np.asarray(s_in, dtype=np.float64), np.asarray(s_out, dtype=np.float64)
    level = 0.95

    def interval(fn: Any) -> dict[str, float]:
        b = stats.bootstrap_ci(fn, s_in, s_out, n_boot=opts.bootstrap, level=level, seed=seed)
        return {"estimate": b.estimate, "low": b.low, "high": b.high}

    lb = stats.epsilon_lower_bound_from_scores(s_in, s_out, delta, confidence=opts.confidence, seed=seed)
    fpr, tpr, _ = stats.roc_curve(s_in, s_out)
    result = {
        "held_in": len(s_in),
        "held_out": len(s_out),
        "statistic": "mean over the user's held-out samples of log p_θ(x) − log p_x0(x) (nats)",
        "auc": interval(stats.roc_auc),
        "tpr_at_1pct_fpr": interval(lambda m, n: stats.tpr_at_fpr(m, n, 0.01)),
        "tpr_at_0.1pct_fpr": interval(lambda m, n: stats.tpr_at_fpr(m, n, 0.001)),
        "bootstrap": {"resamples": opts.bootstrap, "level": level},
        "epsilon_lower_bound": _json_safe(asdict(lb)),
        "scores_in": {"mean": float(s_in.mean()), "std": float(s_in.std())},
        "scores_out": {"mean": float(s_out.mean()), "std": float(s_out.std())},
    }
    return result, {"scores_in": s_in, "scores_out": s_out, "fpr": fpr, "tpr": tpr}


def _json_safe(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return "inf" if value > 0 else "-inf"
    if isinstance(value, np.floating | np.integer):
        return _json_safe(value.item())
    return value


def run_text_audit(
    cfg: Config, out_dir: str | Path | None, opts: TextAuditOptions, progress: bool = True
) -> dict[str, Any]:
    """Train ``cfg`` once on the audit population and attack the final model (module docstring).

    Parameters
    ----------
    cfg : the experiment config.
    out_dir : the audit folder (default ``runs/<timestamp>-<name>-audit``); the run goes to
        ``<out_dir>/run``.
    opts : the attacks and their sizes.
    progress : print the run's progress line. Default True.

    Returns the dict written to ``audit.json``.
    """
    from fedsim.runner.runner import default_run_dir, run_experiment

    opts.check()
    out = Path(out_dir) if out_dir is not None else default_run_dir(cfg).with_name(default_run_dir(cfg).name + "-audit")
    seed = derive_seed(cfg.seed, "text-audit") % (2**63) if opts.seed is None else int(opts.seed)
    base = load_federated(cfg.data)
    view, split = audit_view(cfg, base, opts, seed)
    out.mkdir(parents=True, exist_ok=True)
    summary = run_experiment(cfg, out / "run", progress=progress, view=view)
    trained, initial = _models(cfg, out / "run", base.model_dims())
    report: dict[str, Any] = {
        "kind": "text-audit",
        "attacks": list(opts.attacks),
        "ledger_epsilon": summary["epsilon"],
        "delta": summary["delta"],
        "neighboring_relation": summary.get("neighboring_relation"),
        "mechanism": summary["mechanism"],
        "scheme": summary["scheme"],
        "noise_multiplier": summary["noise_multiplier"],
        "population": summary["population"],
        "rounds": summary["rounds_completed"],
        "final_eval_accuracy": summary.get("final_eval_accuracy"),
        "seed": seed,
        "run_dir": str(out / "run"),
    }
    arrays: dict[str, np.ndarray] = {}
    if view.canaries is not None:
        from fedsim.attacks.scoring import canary_report

        report["canary"] = canary_report(trained, view.canaries, opts.references, seed)
        report["canary"]["initial_model"] = canary_report(initial, view.canaries, opts.references, seed)["by_level"]
    if split is not None:
        report["user_inference"], arrays = _user_inference(
            trained, initial, base, split, opts, float(summary["delta"]), seed
        )
    report = _json_safe(report)
    (out / "audit.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
    if arrays:
        np.savez(
            out / "user_inference.npz",
            scores_in=arrays["scores_in"],
            scores_out=arrays["scores_out"],
            fpr=arrays["fpr"],
            tpr=arrays["tpr"],
        )
    from fedsim.reporting.audit_report import plot_text_audit

    plot_text_audit(out)
    return report


def run_text_one_run_audit(
    cfg: Config,
    out_dir: str | Path | None,
    num_canaries: int = 200,
    *,
    repetitions: int = 16,
    size: int | None = 100,
    secret_length: int = 8,
    confidence: float = 0.95,
    seed: int | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """One-run ε lower bounds from text canaries (fedsim.attacks.one_run), final-model adversary.

    `num_canaries` secret-sharer canary users are described (a donor's text, `size` characters or
    sentences, with a random secret inserted `repetitions` times); each is included with
    probability 1/2 by the keyed coin of fedsim.runner.audit.inclusion_bits. An included canary
    replaces its donor; an excluded one is absent and so is its donor, so a coin adds or removes
    exactly one user. After training, every canary's score is how much training lowered its
    secret's log-perplexity: `lp_initial − lp_trained` (bits). The guesses and bounds are those of
    `one_run_bound` at the run's δ.

    Parameters
    ----------
    cfg : the experiment config (a next-character or next-word dataset).
    out_dir : the audit folder (default runs/<timestamp>-<name>-audit); the run goes to out_dir/run,
        the report to out_dir/one_run_audit.json, the scores to out_dir/one_run_scores.npz.
    num_canaries : m, canaries with a coin (each needs its own donor). Default 200.
    repetitions : copies of each secret. Default 16.
    size : donor data each canary keeps (characters or sentences); None keeps all. Default 100.
    secret_length : characters or words per secret. Default 8.
    confidence : of the bounds. Default 0.95.
    seed : the audit seed (donors, secrets, coins); default from the run's seed.
    progress : print the run's progress line.
    """
    from dataclasses import replace

    from fedsim.attacks.canaries import make_canary_set
    from fedsim.attacks.one_run import one_run_bound, perfect_separation_bound
    from fedsim.attacks.scoring import sequence_log_perplexity
    from fedsim.runner.audit import inclusion_bits
    from fedsim.runner.runner import default_run_dir, run_experiment

    if num_canaries < 2:
        raise FedsimError(f"--canaries must be ≥ 2 for a one-run audit (got {num_canaries})")
    out = Path(out_dir) if out_dir is not None else default_run_dir(cfg).with_name(default_run_dir(cfg).name + "-audit")
    seed = derive_seed(cfg.seed, "text-audit") % (2**63) if seed is None else int(seed)
    base = load_federated(cfg.data)
    if base.task not in ("char", "nwp"):
        raise FedsimError(f"text canaries need a next-character or next-word dataset; data.name = '{cfg.data.name}'")
    every = make_canary_set(base, num_canaries, (repetitions,), (size,), secret_length, seed)
    inc = inclusion_bits(seed, num_canaries)
    kept = tuple(replace(c, index=j) for j, c in enumerate(c for c, i in zip(every.canaries, inc) if i))
    view = AuditView(
        replace(every, canaries=kept), held_out=tuple(c.donor for c, i in zip(every.canaries, inc) if not i)
    )
    out.mkdir(parents=True, exist_ok=True)
    summary = run_experiment(cfg, out / "run", progress=progress, view=view)
    trained, initial = _models(cfg, out / "run", base.model_dims())
    secrets = np.asarray([c.secret for c in every.canaries], dtype=np.int64)
    kw: dict[str, Any] = dict(window=every.window if every.task == "char" else None)
    lp_trained = sequence_log_perplexity(trained, every.task, secrets, every.context, **kw)
    lp_initial = sequence_log_perplexity(initial, every.task, secrets, every.context, **kw)
    scores = lp_initial - lp_trained
    delta = float(summary["delta"])
    bounds = [
        {"adversary": "final-model", "statistic": "lp_initial - lp_trained of the secret (bits)", **b.to_dict()}
        for b in (one_run_bound(scores, inc, delta, confidence=confidence, method=m) for m in ("snj", "fdp"))
    ]
    report = {
        "kind": "text-one-run-audit",
        "bounds": bounds,
        "ceiling": {
            m: perfect_separation_bound(num_canaries, delta, confidence=confidence, method=m) for m in ("snj", "fdp")
        },
        "ledger_epsilon": summary["epsilon"],
        "delta": delta,
        "confidence": confidence,
        "neighboring_relation": summary.get("neighboring_relation"),
        "num_canaries": num_canaries,
        "num_included": int(inc.sum()),
        "repetitions": repetitions,
        "size": size,
        "secret_length": secret_length,
        "score_included": {"mean": float(scores[inc].mean()), "std": float(scores[inc].std())},
        "score_excluded": {"mean": float(scores[~inc].mean()), "std": float(scores[~inc].std())},
        "mechanism": summary["mechanism"],
        "scheme": summary["scheme"],
        "noise_multiplier": summary["noise_multiplier"],
        "population": summary["population"],
        "rounds": summary["rounds_completed"],
        "final_eval_accuracy": summary.get("final_eval_accuracy"),
        "seed": seed,
        "run_dir": str(out / "run"),
    }
    report = _json_safe(report)
    (out / "one_run_audit.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
    np.savez(out / "one_run_scores.npz", included=inc, scores=scores, lp_trained=lp_trained, lp_initial=lp_initial)
    return report
