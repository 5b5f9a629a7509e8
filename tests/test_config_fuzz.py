"""Property-based config fuzzing (hypothesis, fixed budget and seed).

- Every valid generated config passes ``fedsim privacy`` (``privacy_report``) without error.
- Every invalid mutation of a valid config ends in :class:`FedsimError` whose message names
  the key — never another exception type.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedsim.config import config_from_dict
from fedsim.errors import FedsimError
from fedsim.runner import privacy_report

FUZZ = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@st.composite
def valid_configs(draw):
    """A raw config table and a population N it is valid for."""
    n_pop = draw(st.integers(50, 3000))
    rounds = draw(st.integers(1, 40))
    family = draw(st.sampled_from(["poisson", "fixed", "none", "single", "epochs", "min_sep"]))
    raw: dict = {
        "rounds": rounds,
        "seed": draw(st.integers(0, 2**31)),
        "client": {
            "clip_norm": draw(st.floats(0.01, 10)),
            "lr": draw(st.floats(0.001, 5)),
            "batch_size": draw(st.integers(1, 64)),
        },
        "server": {"optimizer": draw(st.sampled_from(["sgd", "momentum", "adam"]))},
    }
    z = draw(st.floats(0.3, 5.0))
    if family in ("poisson", "fixed", "none"):
        raw["sampling"] = {
            "scheme": "poisson" if family == "none" else family,
            "cohort_size": draw(st.integers(1, n_pop // 2)),
        }
        raw["privacy"] = (
            {"mechanism": "none"}
            if family == "none"
            else {"mechanism": "gaussian", "noise_multiplier": z, "accountant": draw(st.sampled_from(["pld", "rdp"]))}
        )
    else:
        mech = draw(st.sampled_from(["identity", "sqrt", "dense", "banded", "blt", "tree", "dpmf_plus"]))
        if family == "single":
            k_cohort = draw(st.integers(1, max(1, n_pop // rounds)))
            raw["sampling"] = {"scheme": "single", "cohort_size": k_cohort}
        else:
            b = draw(st.integers(1, min(rounds, 20)))
            group = n_pop // b
            sampling = {"scheme": family, "min_sep": b, "cohort_size": group}
            if family == "min_sep" and draw(st.booleans()) and mech in ("banded", "identity"):
                sampling.update(poisson_within_group=True, cohort_size=draw(st.integers(1, group)))
            raw["sampling"] = sampling
        raw["privacy"] = {"mechanism": mech, "noise_multiplier": z}
    if draw(st.booleans()):
        raw["privacy"]["delta"] = draw(st.floats(1e-9, min(1e-2, 0.99 / n_pop)))  # δ < 1/N (larger is refused)
    # Post-processing and clipping choices (issue 4): none of them may change validity.
    filt = draw(st.sampled_from(["none", "ema", "doppler", "disk"]))
    if filt != "none":
        raw["filter"] = {"name": filt}
        if filt == "disk":
            raw["filter"]["mode"] = draw(st.sampled_from(["two_point", "lookahead", "ema"]))
        if filt == "doppler":
            raw["filter"]["preset"] = draw(st.sampled_from(["first_order_v1", "second_order", "f6"]))
        raw["server"]["optimizer"] = draw(st.sampled_from(["sgd", "adam", "yogi", "adambc"]))
    extra = draw(st.sampled_from(["plain", "adaptive", "ef_client", "ef_server"]))
    dp = raw["privacy"]["mechanism"] != "none"
    if extra == "adaptive" and dp:
        raw["clipping"] = {"adaptive": True, "count_stddev": 1000.0, "target_quantile": draw(st.floats(0.05, 0.95))}
    elif extra == "ef_client":
        raw["client"]["error_feedback"] = "client"
    elif (
        extra == "ef_server"
        and raw["privacy"]["mechanism"] in ("gaussian", "none")
        and "target_epsilon" not in raw["privacy"]
    ):
        raw["client"]["error_feedback"] = "server"  # no guarantee: only with the explicit switch
        raw["privacy"]["allow_no_guarantee"] = True
    return raw, n_pop


@FUZZ
@given(valid_configs())
def test_valid_configs_pass_fedsim_privacy(case):
    raw, n_pop = case
    cfg = config_from_dict(raw)
    report = privacy_report(cfg, n_pop)
    eps = report["epsilon"]
    no_guarantee = cfg.privacy.mechanism == "none" or cfg.client.error_feedback == "server"
    # ε can be exactly 0 when δ exceeds what one round at a tiny q can leak
    assert eps == "inf" if no_guarantee else (math.isfinite(eps) and eps >= 0)
    assert report["population"] == n_pop and report["rounds"] == cfg.rounds


# (dotted key, bad value) — each must be rejected with the key named.
BAD_VALUES = [
    ("rounds", 0),
    ("rounds", "ten"),
    ("rounds", 1.5),
    ("rounds", True),
    ("seed", -1),
    ("client.clip_norm", 0),
    ("client.clip_norm", "big"),
    ("client.lr", -0.1),
    ("client.batch_size", 0),
    ("client.local_epochs", 0),
    ("client.max_examples", 0),
    ("sampling.scheme", "stratified"),
    ("sampling.cohort_size", 0),
    ("sampling.cohort_size", "all"),
    ("sampling.min_sep", 0),
    ("sampling.poisson_within_group", "yes"),
    ("privacy.mechanism", "laplace"),
    ("privacy.delta", 1.5),
    ("privacy.delta", 0),
    ("privacy.accountant", "gdp"),
    ("privacy.buffers", 0),
    ("privacy.objective", "mean"),
    ("server.optimizer", "adamw"),
    ("server.lr", 0),
    ("server.momentum", 1.0),
    ("eval.every", -1),
    ("sim.client_cpus", 0),
    ("sim.device", "tpu"),
    ("model.name", "gpt"),
    ("data.name", "mnist"),
    ("data.max_users", 1),
    ("name", "has space"),
    ("filter.name", "kalman"),
    ("filter.kappa", 0),
    ("filter.mode", "three_point"),
    ("clipping.target_quantile", 1.0),
    ("clipping.lr", 0),
    ("clipping.count_stddev", -1.0),
    ("client.error_feedback", "both"),
    ("client.ef_clip_norm", 0),
]


def _set(raw: dict, dotted: str, value) -> dict:
    import copy

    out = copy.deepcopy(raw)
    node = out
    parts = dotted.split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value
    return out


@FUZZ
@given(valid_configs(), st.sampled_from(BAD_VALUES))
def test_invalid_values_name_the_key(case, bad):
    raw, _ = case
    key, value = bad
    with pytest.raises(FedsimError) as ei:
        config_from_dict(_set(raw, key, value))
    assert key in str(ei.value)


@FUZZ
@given(
    valid_configs(),
    st.sampled_from(["", "client.", "sampling.", "privacy.", "server.", "sim."]),
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=3, max_size=12),
)
def test_unknown_keys_name_the_key(case, prefix, name):
    raw, _ = case
    from fedsim.config import Config, choice_tables

    section = prefix.rstrip(".")
    tables = choice_tables()
    if section in tables:  # a choice table: the keys of the chosen kind
        which, models = tables[section]
        chosen = (raw.get(section) or {}).get(which, Config().model_dump()[section][which])
        model = models[chosen]
    else:
        model = Config if not section else Config.model_fields[section].annotation
    if name in model.model_fields:
        return
    key = f"{prefix}{name}"
    with pytest.raises(FedsimError) as ei:
        config_from_dict(_set(raw, key, 1))
    assert key in str(ei.value)


@FUZZ
@given(valid_configs(), st.integers(1, 49))
def test_population_dependent_errors_are_user_errors(case, tiny_pop):
    """The same configs against a too-small population: either valid, or a FedsimError
    naming a sampling or data key — never another exception."""
    raw, _ = case
    cfg = config_from_dict(raw)
    try:
        privacy_report(cfg, tiny_pop)
    except FedsimError as e:
        assert any(k in str(e) for k in ("sampling.", "data", "rounds", "population"))


# ---------------------------------------------------------------- CLI arguments
#: Tokens the CLI fuzzer draws from: flags, values (valid and not), --set items.
CLI_TOKENS = [
    "--set",
    "--json",
    "--population",
    "--out",
    "--resume",
    "--force",
    "--quiet",
    "0",
    "-3",
    "12",
    "abc",
    "rounds=abc",
    "rounds=0",
    "rounds=5",
    "privacy.mechanism='laplace'",
    "sampling.cohort_size=10",
    "client.clip_norm=0",
    "nosuch.key=1",
    "=",
    "a..b=1",
    "privacy.noise_multiplier=1.0",
    "privacy.target_epsilon=-1",
    "/nonexistent/dir",
    "filter.name='disk'",
    "clipping.adaptive=true",
    "client.error_feedback='server'",
    "experiments/does_not_exist.toml",
]


@FUZZ
@given(st.sampled_from(["privacy", "run", "report", "data"]), st.lists(st.sampled_from(CLI_TOKENS), max_size=7))
def test_cli_arguments_end_in_a_clean_exit(tmp_path_factory, command, tokens):
    """Random argument lists: the CLI exits with 0 or a user-error status and a message — never
    a traceback. ``run`` always carries an unknown key, so it must stop before training, and
    no run folder appears."""
    import os

    from fedsim.cli import main

    cwd = tmp_path_factory.mktemp("cli")
    args = [command, *tokens]
    if command == "run":
        args += ["--set", "zz_unknown_key=1"]
    old = os.getcwd()
    os.chdir(cwd)
    try:
        with pytest.raises(SystemExit) as ei:
            main(args)
            raise SystemExit(0)
    finally:
        os.chdir(old)
    assert ei.value.code in (0, 1, 2), (args, ei.value.code)
    if command == "run":
        assert ei.value.code == 2
        assert not (cwd / "runs").exists()
