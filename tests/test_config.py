"""The experiment config: validation errors name the dotted key, overrides are TOML-typed,
and the resolved config round-trips through TOML."""

from __future__ import annotations

import copy
import tomllib

import pydantic
import pytest

from fedsim.config import (
    Config,
    apply_overrides,
    config_from_dict,
    load_config,
    parse_override,
)
from fedsim.errors import FedsimError

# (id, raw TOML table, substrings every one of which the error message must contain)
BAD_CONFIGS = [
    ("unknown-top-level", {"roundz": 5}, ["roundz"]),
    ("unknown-nested", {"client": {"lrr": 0.1}}, ["client.lrr"]),
    ("unknown-table", {"clientt": {"lr": 0.1}}, ["clientt"]),
    ("wrong-type-int", {"rounds": "ten"}, ["rounds"]),
    ("wrong-type-float", {"client": {"lr": "fast"}}, ["client.lr"]),
    ("wrong-type-table", {"client": 5}, ["client"]),
    ("clip-zero", {"client": {"clip_norm": 0}}, ["client.clip_norm"]),
    ("clip-negative", {"client": {"clip_norm": -1.0}}, ["client.clip_norm"]),
    ("cohort-zero", {"sampling": {"cohort_size": 0}}, ["sampling.cohort_size"]),
    ("rounds-zero", {"rounds": 0}, ["rounds"]),
    ("seed-negative", {"seed": -1}, ["seed"]),
    ("delta-above-one", {"privacy": {"noise_multiplier": 1.0, "delta": 1.5}}, ["privacy.delta"]),
    ("delta-zero", {"privacy": {"noise_multiplier": 1.0, "delta": 0.0}}, ["privacy.delta"]),
    ("bad-scheme", {"sampling": {"scheme": "stratified"}}, ["sampling.scheme"]),
    ("bad-mechanism", {"privacy": {"mechanism": "laplace", "noise_multiplier": 1.0}}, ["privacy.mechanism"]),
    ("bad-accountant", {"privacy": {"noise_multiplier": 1.0, "accountant": "moments"}}, ["privacy.accountant"]),
    ("bad-optimizer", {"server": {"optimizer": "sgdd"}}, ["server.optimizer"]),
    ("bad-device", {"sim": {"device": "tpu"}}, ["sim.device"]),
    ("momentum-one", {"server": {"momentum": 1.0}}, ["server.momentum"]),
    (
        "both-z-and-target",
        {"privacy": {"noise_multiplier": 1.0, "target_epsilon": 3.0}},
        ["privacy.noise_multiplier", "privacy.target_epsilon"],
    ),
    (
        "neither-z-nor-target",
        {"privacy": {"mechanism": "gaussian"}},
        ["privacy.noise_multiplier", "privacy.target_epsilon"],
    ),
    ("none-with-z", {"privacy": {"mechanism": "none", "noise_multiplier": 1.0}}, ["privacy.noise_multiplier"]),
    ("none-with-target", {"privacy": {"mechanism": "none", "target_epsilon": 2.0}}, ["privacy.target_epsilon"]),
    ("gaussian-with-z-zero", {"privacy": {"noise_multiplier": 0.0}}, ["privacy.noise_multiplier"]),
    ("bad-name-space", {"name": "my run"}, ["name"]),
    ("bad-name-slash", {"name": "../escape"}, ["name"]),
    ("empty-name", {"name": ""}, ["name"]),
    ("max-users-one", {"data": {"max_users": 1}}, ["data.max_users"]),
    ("window-too-large", {"data": {"window": 4096}}, ["data.window"]),
    (
        "factorize-device-not-dense",
        {"privacy": {"mechanism": "blt", "noise_multiplier": 1.0, "factorize_device": "cuda"}},
        ["privacy.factorize_device"],
    ),
]


@pytest.mark.parametrize("raw, expected", [(r, e) for _, r, e in BAD_CONFIGS], ids=[i for i, _, _ in BAD_CONFIGS])
def test_bad_config_names_the_key(raw, expected):
    with pytest.raises(FedsimError) as ei:
        config_from_dict(raw)
    msg = str(ei.value)
    for s in expected:
        assert s in msg, (s, msg)


def test_unknown_key_lists_allowed_keys():
    with pytest.raises(FedsimError) as ei:
        config_from_dict({"client": {"lrr": 0.1}})
    msg = str(ei.value)
    for k in ("lr", "clip_norm", "batch_size", "local_epochs", "max_examples"):
        assert k in msg


def test_every_bad_key_is_reported_at_once():
    with pytest.raises(FedsimError) as ei:
        config_from_dict({"client": {"lrr": 0.1}, "sampling": {"scheme": "x"}, "rounds": -3})
    msg = str(ei.value)
    assert "client.lrr" in msg and "sampling.scheme" in msg and "rounds" in msg


@pytest.mark.parametrize(
    "raw",
    [{"rounds": "10"}, {"rounds": True}, {"server": {"bias_correction": "no"}}],
    ids=["str-for-int", "bool-for-int", "str-for-bool"],
)
def test_wrong_scalar_type_is_not_coerced(raw):
    with pytest.raises(FedsimError):
        config_from_dict(raw)


# --- overrides -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "item, path, value, typ",
    [
        ("rounds=5", ["rounds"], 5, int),
        ("sampling.scheme=fixed", ["sampling", "scheme"], "fixed", str),
        ("client.lr=0.5", ["client", "lr"], 0.5, float),
        ("client.lr=1e-3", ["client", "lr"], 1e-3, float),
        ("server.bias_correction=false", ["server", "bias_correction"], False, bool),
        ('name="quoted.name"', ["name"], "quoted.name", str),
        ("  client.clip_norm =  2  ", ["client", "clip_norm"], 2, int),
        ("name=a=b", ["name"], "a=b", str),
    ],
)
def test_parse_override_toml_typing(item, path, value, typ):
    p, v = parse_override(item)
    assert p == path
    assert type(v) is typ
    assert v == value


@pytest.mark.parametrize("item", ["rounds5", "", "=5", ".rounds=5", "client..lr=1", "client.=1"])
def test_parse_override_malformed(item):
    with pytest.raises(FedsimError) as ei:
        parse_override(item)
    assert "--set" in str(ei.value)
    if item:
        assert item.strip() in str(ei.value) or repr(item) in str(ei.value)


def test_malformed_set_names_the_item():
    with pytest.raises(FedsimError, match="rounds5"):
        apply_overrides({}, ["rounds5"])


def test_set_into_a_value_is_refused():
    with pytest.raises(FedsimError) as ei:
        apply_overrides({"rounds": 5}, ["rounds.x=1"])
    assert "rounds" in str(ei.value)
    with pytest.raises(FedsimError) as ei:
        apply_overrides({"client": {"lr": 0.1}}, ["client.lr.value=1"])
    assert "lr" in str(ei.value)


def test_apply_overrides_types_and_does_not_mutate():
    raw = {"rounds": 3, "client": {"lr": 0.1, "batch_size": 4}}
    before = copy.deepcopy(raw)
    out = apply_overrides(raw, ["rounds=5", "sampling.scheme=fixed", "client.lr=0.5"])
    assert raw == before
    assert out["rounds"] == 5 and type(out["rounds"]) is int
    assert out["sampling"] == {"scheme": "fixed"}
    assert out["client"] == {"lr": 0.5, "batch_size": 4}
    assert type(out["client"]["lr"]) is float
    # later overrides win
    assert apply_overrides({}, ["rounds=5", "rounds=7"])["rounds"] == 7


def test_overrides_validated_with_the_table():
    cfg = config_from_dict(apply_overrides({}, ["rounds=5", "sampling.scheme=fixed", "client.lr=0.5"]))
    assert cfg.rounds == 5 and isinstance(cfg.rounds, int)
    assert cfg.sampling.scheme == "fixed"
    assert cfg.client.lr == 0.5 and isinstance(cfg.client.lr, float)
    with pytest.raises(FedsimError, match=r"client\.lrr"):
        config_from_dict(apply_overrides({}, ["client.lrr=0.5"]))
    with pytest.raises(FedsimError, match=r"sampling\.scheme"):
        config_from_dict(apply_overrides({}, ["sampling.scheme=stratified"]))


# --- files ---------------------------------------------------------------------------


def test_load_config_file_and_overrides(tmp_path):
    p = tmp_path / "exp.toml"
    p.write_text(
        'name = "file-run"\nrounds = 7\n[client]\nlr = 0.25\n[privacy]\ntarget_epsilon = 4.0\ndelta = 1e-6\n',
        encoding="utf-8",
    )
    cfg = load_config(p)
    assert (cfg.name, cfg.rounds, cfg.client.lr) == ("file-run", 7, 0.25)
    assert cfg.privacy.target_epsilon == 4.0 and cfg.privacy.noise_multiplier is None
    assert cfg.privacy.delta == 1e-6
    assert cfg.client.clip_norm == 1.0  # untouched keys keep their defaults
    cfg2 = load_config(str(p), ["rounds=9", "client.clip_norm=0.5"])
    assert (cfg2.rounds, cfg2.client.lr, cfg2.client.clip_norm) == (9, 0.25, 0.5)
    with pytest.raises(FedsimError, match=r"client\.clip_norm"):
        load_config(p, ["client.clip_norm=0"])
    with pytest.raises(FedsimError, match=r"rounds5"):
        load_config(p, ["rounds5"])


def test_toml_syntax_error_names_the_path(tmp_path):
    p = tmp_path / "broken.toml"
    p.write_text("rounds = = 5\n[client\n", encoding="utf-8")
    with pytest.raises(FedsimError) as ei:
        load_config(p)
    assert str(p) in str(ei.value)


def test_missing_file_names_the_path(tmp_path):
    p = tmp_path / "does_not_exist.toml"
    with pytest.raises(FedsimError) as ei:
        load_config(p)
    assert str(p) in str(ei.value)


def test_bad_key_in_file_names_the_key(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text("[sampling]\nscheme = 'stratified'\n", encoding="utf-8")
    with pytest.raises(FedsimError, match=r"sampling\.scheme"):
        load_config(p)


# --- round trip and defaults ---------------------------------------------------------


def test_default_round_trips_through_toml():
    cfg = Config()
    again = config_from_dict(tomllib.loads(cfg.to_toml()))
    assert again == cfg
    assert again.model_dump() == cfg.model_dump()


def test_nondefault_round_trips_through_toml():
    raw = {
        "name": "sweep.a-1_b",
        "seed": 12345,
        "rounds": 17,
        "data": {"max_users": 50, "subset_seed": 3, "cache_dir": "/tmp/x"},
        "model": {"name": "shakespeare_lstm"},
        "client": {"local_epochs": 2, "lr": 0.3, "clip_norm": 0.1},
        "sampling": {"scheme": "fixed", "cohort_size": 7},
        "privacy": {"target_epsilon": 3.5, "delta": 1e-7, "accountant": "rdp"},
        "server": {"optimizer": "adam", "lr": 0.01, "bias_correction": False},
        "eval": {"every": 0, "max_users": 5},
        "sim": {"num_workers": 3, "device": "cpu"},
        "checkpoint": {"every": 4},
    }
    cfg = config_from_dict(raw)
    text = cfg.to_toml()
    again = config_from_dict(tomllib.loads(text))
    assert again == cfg
    assert again.privacy.noise_multiplier is None
    assert again.server.bias_correction is False
    assert again.sampling.scheme == "fixed" and again.sampling.cohort_size == 7


def test_nonprivate_round_trips():
    cfg = config_from_dict({"privacy": {"mechanism": "none"}})
    assert cfg.privacy.noise_multiplier is None and cfg.privacy.target_epsilon is None
    assert config_from_dict(tomllib.loads(cfg.to_toml())) == cfg


def test_defaults_are_documented_values():
    cfg = Config()
    assert cfg.sampling.scheme == "poisson"
    assert cfg.privacy.mechanism == "gaussian"
    assert cfg.privacy.noise_multiplier == 1.0 and cfg.privacy.target_epsilon is None
    assert cfg.server.optimizer == "sgd" and cfg.server.lr == 1.0
    adam = config_from_dict({"server": {"optimizer": "adam"}}).server
    assert (adam.beta1, adam.beta2, adam.eps, adam.bias_correction) == (0.9, 0.99, 1e-3, True)  # type: ignore[attr-defined]
    assert config_from_dict({"server": {"optimizer": "momentum"}}).server.momentum == 0.9  # type: ignore[attr-defined]
    assert config_from_dict({"filter": {"name": "disk"}, "server": {"optimizer": "sgd"}}).filter.kappa == 0.7  # type: ignore[attr-defined]


def test_assignment_is_validated():
    cfg = Config()
    with pytest.raises(pydantic.ValidationError):
        cfg.client.clip_norm = -1.0
    assert cfg.client.clip_norm == 1.0


# --- population ----------------------------------------------------------------------


def test_validate_population():
    cfg = config_from_dict({"sampling": {"cohort_size": 40}})
    cfg.validate_population(40)  # K̄ = N is allowed
    cfg.validate_population(1000)
    with pytest.raises(FedsimError) as ei:
        cfg.validate_population(39)
    assert "sampling.cohort_size" in str(ei.value)
    assert "39" in str(ei.value)
    with pytest.raises(FedsimError):
        config_from_dict({"sampling": {"cohort_size": 1}}).validate_population(1)


def test_set_scheme_drops_group_keys_from_the_file(tmp_path):
    p = tmp_path / "g.toml"
    p.write_text(
        '[sampling]\nscheme = "epochs"\ncohort_size = 10\nmin_sep = 4\nmax_participations = 2\n'
        '[privacy]\nmechanism = "dense"\ntarget_epsilon = 3.0\n'
    )
    c = load_config(p, ["sampling.scheme='poisson'", "privacy.mechanism='gaussian'"])
    assert c.sampling.scheme == "poisson" and c.sampling.min_sep is None
    assert c.sampling.max_participations is None and c.privacy.target_epsilon == 3.0
    # Explicitly set on the command line: kept (and then validated by the scheme).
    c = load_config(p, ["sampling.scheme='single'", "sampling.min_sep=3"])
    assert c.sampling.min_sep == 3
    c = load_config(p, ["privacy.mechanism='none'"])
    assert c.privacy.target_epsilon is None and c.privacy.noise_multiplier is None
