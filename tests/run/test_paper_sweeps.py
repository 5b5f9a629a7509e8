"""The paper-claim sweeps (issue 38): every ``experiments/sweeps/paper_*.toml`` validates trial by
trial, and ``experiments/paper_tables.py``'s statistics agree with independent computations."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import experiment_script
from scipy import stats

ROOT = Path(__file__).resolve().parents[2]
SPECS = sorted(
    [
        *(ROOT / "experiments" / "sweeps").glob("paper_*.toml"),
        *(ROOT / "experiments" / "sweeps").glob("default_*.toml"),
    ]
)


def _tables() -> Any:
    return experiment_script("paper_tables")


#: run in a fresh process: the specs' plugin must register its dataset before the config schema is
#: built, which an earlier test of this process may have done already
_CHECK = """
import json, sys
from fedsim import plugins
out = {}
for path in sys.argv[1:]:
    plugins.of_sweep(path)
from fedsim.runner.sweep import check_trials, load_spec, read_base, trial_config, trials
for path in sys.argv[1:]:
    spec, base = load_spec(path)
    raw, items = read_base(base), trials(spec)
    check_trials(raw, spec, items)
    configs = {t["arm"]: trial_config(raw, [*t["sets"][:-1], "seed=0"]).model_dump_json() for t in items}
    out[spec.name] = {"trials": len(items), "arms": [t["arm"] for t in items], "configs": configs}
print(json.dumps(out))
"""


def test_every_paper_spec_validates_and_has_its_papers_arms():
    assert SPECS, "no experiments/sweeps/paper_*.toml"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run(
        [sys.executable, "-c", _CHECK, *map(str, SPECS)], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    tables = _tables()
    assert set(found) == {p.stem for p in SPECS}  # a spec's name is its file's
    families: dict[str, set[str]] = {}
    for name, info in found.items():
        key = tables.paper_of(name)  # the analysis knows every sweep
        assert info["trials"] > 0
        families.setdefault(key, set()).update(tables.family(a) for a in info["arms"])
        if name.endswith("_more"):  # added seeds: each arm configured exactly as in the paper's grid
            for arm, config in info["configs"].items():
                assert found[key]["configs"].get(arm) == config, (name, arm)
    for key, fams in families.items():
        paper = tables.PAPERS[key]
        compared = {
            paper["baseline"],
            paper["treatment"],
            *(f for pair in paper.get("also", ()) for f in pair),
            *(f for row in paper.get("rows", ()) for f in (row["baseline"], row["treatment"])),
        }
        assert compared <= fams, (key, compared - fams)
    _check_dicesgd_is_equal_noise(found["paper_dicesgd"]["configs"])
    for name in (n for n in found if n.startswith("default_")):  # their parts too (more lrs, more seeds)
        base = "shakespeare_gaussian" if name.startswith("default_gaussian") else None
        _check_default_scale_is_the_default_but_the_server_step(found[name]["configs"], base)


def _check_default_scale_is_the_default_but_the_server_step(configs: dict[str, str], base: str | None) -> None:
    """Every arm of a default-scale sweep is its base experiment (the bundled default, or the
    shipped experiment ``base``) with only the server step (optimizer, lr, filter) and the
    evaluation/checkpoint cadence changed: same data, model, clipping, participation, mechanism
    and privacy target, hence the same ε."""
    sys.path.insert(0, str(ROOT))
    try:
        from fedsim.config import DEFAULT_EXPERIMENT, load_config
    finally:
        sys.path.remove(str(ROOT))
    default = json.loads(load_config(base or DEFAULT_EXPERIMENT, ["seed=0"]).model_dump_json())
    free = {"server", "filter", "eval", "checkpoint", "name", "sim"}  # sweep trials run in-process
    for arm, config in configs.items():
        c = json.loads(config)
        assert {k: v for k, v in c.items() if k not in free} == {k: v for k, v in default.items() if k not in free}, arm
        # where the trial runs (one in-process worker per trial) and when it evaluates may differ
        for table, keys in (("eval", {"every"}), ("sim", {"engine", "num_workers"})):
            assert {k: v for k, v in c[table].items() if k not in keys} == {
                k: v for k, v in default[table].items() if k not in keys
            }, (arm, table)


def _check_dicesgd_is_equal_noise(configs: dict[str, str]) -> None:
    """DiceSGD's baseline clips at c₁ + c₂ of its client-EF arms with the same z (the same noise
    z·(c₁ + c₂) and the same ε); every EF arm is the privacy-valid client variant with c₂ = c₁."""
    tables = _tables()
    by_family: dict[str, list[dict[str, Any]]] = {}
    for arm, config in configs.items():
        by_family.setdefault(tables.family(arm), []).append(json.loads(config))
    assert set(by_family) == {"clip", "ef", "ef_decay", "clip_c1"}
    noise = {c["privacy"]["noise_multiplier"] for cs in by_family.values() for c in cs}
    assert len(noise) == 1  # one z for every arm
    bound = {c["client"]["clip_norm"] for c in by_family["clip"]}
    assert len(bound) == 1 and all(c["client"]["error_feedback"] == "none" for c in by_family["clip"])
    for fam in ("ef", "ef_decay"):
        for c in by_family[fam]:
            ef = c["client"]
            assert ef["error_feedback"] == "client" and ef["ef_clip_norm"] == ef["clip_norm"]
            assert {ef["clip_norm"] + ef["ef_clip_norm"]} == bound
            assert ef["ef_decay"] == (0.5 if fam == "ef_decay" else None)
    assert {2 * c["client"]["clip_norm"] for c in by_family["clip_c1"]} == bound  # c₁ alone: half the noise


NUMBERS = [0.012, -0.004, 0.021, 0.007, -0.011, 0.016, 0.003, 0.009]


@pytest.mark.parametrize("confidence", [0.95, 0.9])
def test_t_interval_matches_scipy(confidence):
    ci = _tables().t_interval(NUMBERS, confidence)
    x = np.asarray(NUMBERS)
    low, high = stats.t.interval(confidence, len(x) - 1, loc=x.mean(), scale=stats.sem(x))
    assert ci["mean"] == pytest.approx(x.mean(), abs=1e-15)
    assert ci["sd"] == pytest.approx(x.std(ddof=1), rel=1e-12)
    assert (ci["low"], ci["high"]) == (pytest.approx(low, rel=1e-12), pytest.approx(high, rel=1e-12))
    assert ci["n"] == len(x)


def test_power_and_seed_count_match_a_simulated_paired_t_test():
    tables = _tables()
    effect, sd = 0.01, 0.012
    n = tables.seeds_needed(effect, sd)
    assert tables.paired_power(n, effect, sd) >= 0.8 > tables.paired_power(n - 1, effect, sd)
    rng = np.random.default_rng(38)
    for m in (n - 1, n):  # the noncentral-t power against 40,000 simulated paired t-tests
        d = rng.normal(effect, sd, (40_000, m))
        t = d.mean(axis=1) / (d.std(axis=1, ddof=1) / np.sqrt(m))
        simulated = float(np.mean(np.abs(t) > stats.t.ppf(0.975, m - 1)))
        assert tables.paired_power(m, effect, sd) == pytest.approx(simulated, abs=0.01)


def test_verdicts():
    verdict = _tables().verdict
    assert verdict(-0.03, -0.01) == "reproduced"
    assert verdict(0.01, 0.02) == "opposite"
    assert verdict(-0.01, 0.02) == "not reproduced"


def test_compare_picks_lr_on_tuning_seeds_and_pairs_the_rest():
    tables = _tables()
    rows = []
    for seed in range(6):
        for lr, base_loss in ((0.1, 0.9), (0.2, 0.8), (0.4, 1.0)):
            rows.append({"family": "a", "lr": lr, "seed": seed, "loss": base_loss + 0.01 * seed, "acc": 0.5})
        for lr, loss in ((0.1, 0.7), (0.2, 0.75), (0.4, 0.9)):  # best at the grid's low edge
            rows.append({"family": "b", "lr": lr, "seed": seed, "loss": loss + 0.02 * seed, "acc": 0.6})
    spec = {"tune_seeds": (0, 1), "effect_loss": 0.01}
    c = tables.compare(rows, spec, "a", "b")
    assert c["lr"] == {"a": 0.2, "b": 0.1}
    assert c["edge_tune"] == {"a": False, "b": True}
    assert c["eval_seeds"] == [2, 3, 4, 5]
    diffs = [(0.7 + 0.02 * s) - (0.8 + 0.01 * s) for s in (2, 3, 4, 5)]
    assert c["loss"]["mean"] == pytest.approx(np.mean(diffs))
    assert c["verdict"] == "reproduced"
    assert c["acc"]["mean"] == pytest.approx(0.1)
    assert tables.family("adambc+lr=0.002,seed=3") == "adambc"
    assert tables.best_family(rows, ["a", "b"], (0, 1)) == "b"  # b's best tuning mean 0.71, a's 0.805


def test_a_sweep_with_several_claims_gives_a_row_per_claim(monkeypatch):
    """``default_scale`` tests three claims in one sweep: one table row each, with its own pair of
    families, its lr chosen on the one tuning seed (0) and compared on the other seeds."""
    tables = _tables()
    losses = {"dpsgd": 1.0, "lp_dpsgd": 1.1, "disk": 0.9, "adam": 1.2, "adambc": 1.3}  # per family, at its best lr
    best = {"dpsgd": 0.5, "lp_dpsgd": 0.5, "disk": 1.0, "adam": 0.01, "adambc": 0.003}
    rows = []
    for fam, loss in losses.items():
        for lr in (best[fam] / 2, best[fam], best[fam] * 2):
            for seed in (0, 1, 2, 3) if lr == best[fam] else (0,):  # stage 2: seeds 1–3 at the chosen lr only
                rows.append(
                    {
                        "family": fam,
                        "lr": lr,
                        "seed": seed,
                        "loss": loss + (0.0 if lr == best[fam] else 0.2) + 0.01 * seed,
                        "acc": 0.5,
                        "epsilon": 8.0,
                        "delta": 6e-4,
                        "relation": "add/remove one user",
                        "wall": 1.0,
                    }
                )
    monkeypatch.setattr(tables, "read_trials", lambda folder: (rows, []))
    res = tables.analyse("default_scale", [Path("unused")])
    assert [(r["baseline"], r["treatment"]) for r in res["rows"]] == [("dpsgd", "disk"), ("adam", "adambc")]
    for c in (res["main"], *res["rows"]):
        assert c["lr"] == {c["baseline"]: best[c["baseline"]], c["treatment"]: best[c["treatment"]]}
        assert c["eval_seeds"] == [1, 2, 3]
        assert c["loss"]["mean"] == pytest.approx(losses[c["treatment"]] - losses[c["baseline"]])
    assert [c["verdict"] for c in (res["main"], *res["rows"])] == ["opposite", "reproduced", "opposite"]
    table = tables.markdown([res], tables.REGIMES).splitlines()
    assert len(table) == 2 + 3  # header, rule, one row per claim
    assert "DiSK (000), at the default experiment's scale" in table[3]
    assert "DP-AdamBC (002), at the default experiment's scale" in table[4]
