"""A newcomer's first hour (issue 47): every bad input the review met is one `fedsim: error:`
line saying what to change, or a note saying what was done — never a traceback, never a silent
result. Each test is one reported case, as a user met it."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import run_cli

N_ROWS = 60


def _one_line_error(code, err, *needles):
    assert code == 2, (code, err)
    lines = [ln for ln in err.strip().splitlines() if ln]
    assert len(lines) == 1 and lines[0].startswith("fedsim: error:"), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def _columns(**change):
    rng = np.random.default_rng(0)
    cols = {
        "u": [f"a{i % 6}" for i in range(N_ROWS)],
        "f0": rng.normal(size=N_ROWS),
        "f1": rng.normal(size=N_ROWS),
        "y": rng.integers(0, 3, N_ROWS),
    }
    return {**cols, **change}


def _table_args(root, *extra):
    keys = [
        "name='t'",
        "rounds=1",
        "data.name='table'",
        f"data.root='{root}'",
        "data.features=['f0','f1']",
        "data.label='y'",
        "data.user_column='u'",
        "model.name='logreg'",
        "sampling.scheme='poisson'",
        "sampling.cohort_size=2",
        "privacy.mechanism='gaussian'",
        "privacy.noise_multiplier=1.0",
        "sim.engine='inprocess'",
        "sim.num_workers=1",
        *extra,
    ]
    return [a for k in keys for a in ("--set", k)]


def _run_table(capsys, tmp_path, table, *extra):
    """`fedsim run` on `table` (a pyarrow table, or a path already written)."""
    root = table if not isinstance(table, pa.Table) else tmp_path / "t.parquet"
    if isinstance(table, pa.Table):
        pq.write_table(table, root)
    return run_cli(capsys, "run", "--out", str(tmp_path / "run"), "--quiet", *_table_args(root, *extra))


def test_a_table_with_no_rows_is_one_line(capsys, tmp_path):
    empty = pa.table(
        {
            "u": pa.array([], pa.string()),
            "f0": pa.array([], pa.float64()),
            "f1": pa.array([], pa.float64()),
            "y": pa.array([], pa.int64()),
        }
    )
    code, _, err = _run_table(capsys, tmp_path, empty)
    _one_line_error(code, err, "the table has no rows")
    assert not (tmp_path / "run").exists()


def test_garbage_bytes_named_parquet_are_one_line(capsys, tmp_path):
    bad = tmp_path / "t.parquet"
    bad.write_bytes(bytes(range(256)) * 3)
    code, _, err = _run_table(capsys, tmp_path, bad)
    _one_line_error(code, err, "is not a parquet file", str(bad))


def test_a_malformed_csv_is_one_line_naming_the_parser_s_complaint(capsys, tmp_path):
    bad = tmp_path / "t.csv"
    bad.write_text('u,f0,f1,y\na,1,2,0\nb,"3,4\n')
    code, _, err = _run_table(capsys, tmp_path, bad)
    _one_line_error(code, err, "is not a readable csv table", "EOF inside string")


def test_a_null_label_is_refused_naming_the_row(capsys, tmp_path):
    y = [None] + [float(v) for v in _columns()["y"][1:]]
    code, _, err = _run_table(capsys, tmp_path, pa.table(_columns(y=y)))
    _one_line_error(code, err, "data.label", "null", "first row 0")


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_features_are_refused_not_reported_as_zero_nonfinite_users(capsys, tmp_path, bad):
    f1 = _columns()["f1"].copy()
    f1[7] = bad
    code, _, err = _run_table(capsys, tmp_path, pa.table(_columns(f1=f1)))
    _one_line_error(code, err, "'f1'", "first row 7")


def test_a_fractional_label_is_refused(capsys, tmp_path):
    y = [float(v) for v in _columns()["y"]]
    y[4] = 0.5
    code, _, err = _run_table(capsys, tmp_path, pa.table(_columns(y=y)))
    _one_line_error(code, err, "holds 0.5, not a class", "first row 4")


def test_whole_number_float_labels_are_still_classes(tmp_path):
    from fedsim.data.table import TableOptions, load_table

    cols = _columns()
    pq.write_table(pa.table(_columns(y=[float(v) for v in cols["y"]])), tmp_path / "t.parquet")
    table = load_table(
        TableOptions(root=str(tmp_path / "t.parquet"), features=["f0", "f1"], label="y", user_column="u")
    )
    assert table.classes.tolist() == sorted(set(cols["y"].tolist()))
    assert table.y.tolist() == [int(v) for v in cols["y"]]  # classes 0, 1, 2 keep their numbers


def test_null_user_ids_are_refused_not_grouped_into_one_user(capsys, tmp_path):
    u = [None] * 10 + _columns()["u"][10:]
    code, _, err = _run_table(capsys, tmp_path, pa.table(_columns(u=u)))
    _one_line_error(code, err, "data.user_column", "10 row(s)")


@pytest.mark.parametrize("how", ["one_row_per_user", "test_fraction_0"])
def test_nothing_evaluated_is_said(capsys, tmp_path, how):
    if how == "one_row_per_user":
        table, extra = pa.table(_columns(u=[f"a{i}" for i in range(N_ROWS)])), ()
    else:
        table, extra = pa.table(_columns()), ("data.test_fraction=0.0",)
    code, out, err = _run_table(capsys, tmp_path, table, *extra)
    assert code == 0, err
    assert "note: no test rows: nothing evaluated" in out
    assert "majority class 0.00%" not in out  # the empty baseline is no longer printed


@pytest.mark.slow  # three commands with a table, 25 s; make test-slow
def test_a_config_s_relative_data_root_is_taken_from_the_config_s_folder(capsys, tmp_path, monkeypatch):
    """The own-data how-to's TOML, run from another folder: `root = "mine.parquet"` is the file
    beside the config (as `plugins` are), and a missing one is named with that rule."""
    home = tmp_path / "project"
    home.mkdir()
    pq.write_table(pa.table(_columns()), home / "mine.parquet")
    toml = "\n".join(
        [
            'name = "mine"',
            "rounds = 1",
            "[data]",
            'name = "table"',
            'root = "mine.parquet"',
            'features = ["f0", "f1"]',
            'label = "y"',
            'user_column = "u"',
            "[model]",
            'name = "logreg"',
            "[sampling]",
            'scheme = "poisson"',
            "cohort_size = 2",
            "[privacy]",
            'mechanism = "gaussian"',
            "noise_multiplier = 1.0",
            "[sim]",
            'engine = "inprocess"',
            "num_workers = 1",
        ]
    )
    (home / "mine.toml").write_text(toml)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    code, out, err = run_cli(capsys, "run", str(home / "mine.toml"), "--out", "r", "--quiet")
    assert code == 0, err
    assert "population: 6" in (elsewhere / "r" / "summary.json").read_text().replace('"', "").replace(",", "")
    for extra in ([], ["--target-epsilon", "3"]):  # fedsim privacy reads the table the same way
        code, out, err = run_cli(capsys, "privacy", str(home / "mine.toml"), "--json", *extra)
        assert code == 0 and json.loads(out)["population"] == 6, err
    (home / "mine.toml").write_text(toml.replace("mine.parquet", "missing.parquet"))
    code, _, err = run_cli(capsys, "run", str(home / "mine.toml"), "--out", "r2", "--quiet")
    _one_line_error(
        code, err, str(home / "missing.parquet"), "does not exist", "config file is taken from that file's folder"
    )


SMALL = [
    "data.name='synthetic'",
    "data.num_clients=12",
    "model.name='logreg'",
    "sampling.scheme='poisson'",
    "sampling.cohort_size=4",
    "privacy.mechanism='gaussian'",
    "privacy.noise_multiplier=1.0",
    "rounds=2",
    "eval.every=0",
    "sim.engine='inprocess'",
    "sim.num_workers=1",
]


def test_a_diverging_learning_rate_is_warned_about(capsys, tmp_path):
    args = [a for s in [*SMALL, "client.lr=1e30"] for a in ("--set", s)]
    code, out, err = run_cli(capsys, "run", "--out", str(tmp_path / "run"), "--quiet", *args)
    assert code == 0, err
    assert "note: training diverged: the train loss is" in out and "lower client.lr" in out
    page = tmp_path / "run" / "report.html"
    assert f"pictures: {tmp_path / 'run' / 'plots'}; one page with them all: {page}" in out and page.is_file()
    args = [a for s in SMALL for a in ("--set", s)]
    code, out, err = run_cli(capsys, "run", "--out", str(tmp_path / "fine"), "--quiet", *args)
    assert code == 0 and "diverged" not in out  # the default learning rate is not flagged


@pytest.mark.parametrize(
    "call, needle",
    [
        (lambda f: f.run(123), "config: give a TOML file's path"),
        (lambda f: f.run(None, out=123), "out: give a folder's path"),
        (lambda f: f.run(None, resume=4.5), "resume: give a folder's path"),
        (lambda f: f.run(None, overrides="rounds=1"), "overrides: give a list of 'dotted.key=value' strings"),
        (lambda f: f.load_config(None, "rounds=1"), "overrides: give a list"),
        (lambda f: f.privacy_report(None, overrides="rounds=1"), "overrides: give a list"),
        (lambda f: f.register_model("x"), "register_model takes a fedsim.models.ModelKind"),
    ],
    ids=["run-123", "out-123", "resume-float", "overrides-str", "load_config-str", "privacy-str", "register-str"],
)
def test_api_arguments_of_the_wrong_type_are_one_fedsim_error(call, needle):
    import fedsim

    with pytest.raises(fedsim.FedsimError, match=None) as e:
        call(fedsim)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_a_model_with_no_parameters_or_too_many_logits_is_refused(tmp_path):
    """In a fresh interpreter, as a user's script (models register before the schema is built)."""
    import json
    import subprocess
    import sys
    import textwrap

    cfg = {
        "name": "t",
        "rounds": 1,
        "data": {"name": "synthetic", "num_clients": 12},
        "sampling": {"scheme": "poisson", "cohort_size": 4},
        "privacy": {"mechanism": "gaussian", "noise_multiplier": 1.0},
        "sim": {"engine": "inprocess", "num_workers": 1},
    }
    script = textwrap.dedent(
        f"""
        import json, torch
        import fedsim
        from fedsim.models import ModelKind

        class Empty(torch.nn.Module):
            def __init__(self, in_features, num_classes, dp_layers=False):
                super().__init__()
            def forward(self, x):
                return x

        class Wide(torch.nn.Module):
            def __init__(self, in_features, num_classes, dp_layers=False):
                super().__init__()
                self.lin = torch.nn.Linear(in_features, num_classes + 3)
            def forward(self, x):
                return self.lin(x)

        fedsim.register_model(ModelKind("empty", "vector", Empty, {{}}, "no parameters"))
        fedsim.register_model(ModelKind("wide", "vector", Wide, {{}}, "3 logits too many"))
        errors = []
        for name in ("empty", "wide"):
            cfg = {json.dumps(cfg)}
            cfg["model"] = {{"name": name}}
            try:
                fedsim.run(cfg, {str(tmp_path)!r} + "/" + name, progress=False)
                errors.append(None)
            except fedsim.FedsimError as e:
                errors.append(str(e))
        print(json.dumps(errors))
        """
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    empty, wide = json.loads(r.stdout.strip().splitlines()[-1])
    assert "model.name = 'empty' (Empty) has no trainable parameters" in empty
    assert "emits 13 logits per sample, but the data have 10 classes" in wide
    assert not (tmp_path / "empty").exists() and not (tmp_path / "wide").exists()


@pytest.mark.parametrize(
    "sets, advice",
    [
        (["data.num_clients=10", "sampling.cohort_size=50"], "or raise data.num_clients"),
        (["data.max_users=6", "sampling.cohort_size=8"], None),
    ],
    ids=["synthetic", "max_users"],
)
def test_a_cohort_larger_than_the_population_names_the_key_that_sets_it(capsys, tmp_path, sets, advice):
    base = SMALL if advice else [s for s in SMALL if not s.startswith("data.")]
    if not advice:  # a dataset whose users data.max_users limits: the table
        pq.write_table(pa.table(_columns(u=[f"a{i % 12}" for i in range(N_ROWS)])), tmp_path / "t.parquet")
        args = _table_args(tmp_path / "t.parquet", *sets)
    else:
        args = [a for s in [*base, *sets] for a in ("--set", s)]
    code, _, err = run_cli(capsys, "run", "--out", str(tmp_path / "run"), *args)
    cohort = sets[-1].split("=")[1]
    _one_line_error(code, err, f"sampling.cohort_size = {cohort} exceeds")  # an int prints as one: not 50.0
    assert (advice or "or raise data.max_users (now 6)") in err
    assert "data.max_users" not in err if advice else True  # synthetic data have no max_users to raise


def test_an_unknown_local_update_with_none_registered_says_how_to_register_one(capsys):
    code, _, err = run_cli(capsys, "privacy", "--population", "100", "--set", "client.local_update='nope'")
    _one_line_error(code, err, "no local update is registered", "plugin")
    assert "use one of \n" not in err + "\n" and not err.rstrip().endswith("use one of")


def _small_args(*extra):
    return [a for s in [*SMALL, *extra] for a in ("--set", s)]


@pytest.mark.parametrize("failure", ["oserror", "torch_zip_writer"])
def test_a_full_disk_at_the_first_checkpoint_is_one_line_naming_the_file(capsys, tmp_path, monkeypatch, failure):
    """Simulated by making torch.save fail as it does on a full disk: an OSError(ENOSPC) from the
    file, or the RuntimeError torch's zip writer raises ("unexpected pos …"). The atomic write
    leaves no half-written checkpoint."""
    import errno

    import fedsim.checkpoint as ckpt

    def full(*_args, **_kwargs):
        if failure == "oserror":
            raise OSError(errno.ENOSPC, "No space left on device")
        raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 4352 vs 4246")

    monkeypatch.setattr(ckpt.torch, "save", full)
    out = tmp_path / "run"
    code, _, err = run_cli(capsys, "run", "--out", str(out), "--quiet", *_small_args())
    _one_line_error(code, err, f"could not write {out / 'checkpoint' / 'checkpoint.pt'}")
    assert (
        ("No space left on device; free space on that disk" in err) if failure == "oserror" else "unexpected pos" in err
    )
    assert not [p.name for p in (out / "checkpoint").iterdir() if p.name.startswith(".ckpt-")]


def test_a_full_disk_at_the_end_names_the_picture_and_how_to_draw_it_again(capsys, tmp_path, monkeypatch):
    """Simulated by a PNG write that fails with OSError(ENOSPC); the run's own files are
    complete and `fedsim report RUN` draws the pictures afterwards."""
    import errno
    from pathlib import Path

    real = Path.write_bytes

    def full(self, data):
        if ".png" in self.name:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", full)
    out = tmp_path / "run"
    code, _, err = run_cli(capsys, "run", "--out", str(out), "--quiet", *_small_args())
    _one_line_error(code, err, f"could not write {out / 'plots' / 'train_loss.png'}: No space left on device")
    assert f"fedsim report {out}" in err and (out / "summary.json").exists()
    assert not list((out / "plots").glob(".*.tmp"))  # nothing half-written
    monkeypatch.setattr(Path, "write_bytes", real)
    code, stdout, err = run_cli(capsys, "report", str(out))
    assert code == 0, err
    assert (out / "plots" / "train_loss.png").is_file() and (out / "report.html").is_file()


@pytest.mark.parametrize("terminal", [True, False])
def test_the_python_api_prints_progress_at_a_terminal_only(capsys, tmp_path, monkeypatch, terminal):
    import sys

    import fedsim

    monkeypatch.setattr(sys.stdout, "isatty", lambda: terminal)
    fedsim.run(None, tmp_path / "run", overrides=[*SMALL, "rounds=1"])
    got = capsys.readouterr()
    assert ("round 1/1" in got.err) == terminal and ("fedsim: " in got.out) == terminal
    # the header states the noise's cost before round 1 (fedsim/privacy/cost.py)
    assert (" of state in memory, about " in got.out and "ms of CPU a round" in got.out) == terminal


def _cli_in_fresh_interpreter(args: list[str], cwd, watch: tuple[str, ...]) -> tuple[dict, str]:
    """Run `fedsim <args>` by its main() in a fresh interpreter; its exit code, how many modules
    it imported, which of `watch` it imported, and its stderr."""
    import json
    import subprocess
    import sys

    script = (
        "import json, sys\n"
        "from fedsim.cli import main\n"
        "try:\n"
        f"    main({args!r})\n"
        "except SystemExit as e:\n"
        "    code = e.code\n"
        f"heavy = sorted(m for m in {watch!r} if m in sys.modules)\n"
        "print(json.dumps({'code': code, 'modules': len(sys.modules), 'heavy': heavy}))\n"
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=cwd, timeout=120)
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


@pytest.mark.parametrize(
    "args, needle",
    [
        (["run", "nope.toml"], "config file not found: nope.toml"),
        (["run", "--set", "rounds"], "expected dotted.key=value"),
        (["run", "--set", "rond=3"], "unknown key 'rond' (did you mean 'rounds'?)"),
        (["privacy", "--set", "nope.x=1", "--population", "10"], "unknown key 'nope'"),
        (["privacy", "nope.toml", "--target-epsilon", "3"], "config file not found"),
        (["data", "describe", "nope.toml"], "config file not found"),
        (["run", "BAD_TOML"], "is not valid TOML"),
        (["run", "--bogus"], "No such option"),
    ],
    ids=["missing", "set-form", "set-typo", "privacy-key", "privacy-target", "data", "toml", "usage"],
)
def test_config_and_cli_errors_answer_before_torch_flower_or_ray_are_imported(tmp_path, args, needle):
    """In a fresh interpreter: the error is printed, and the heavy packages were never imported
    (the import count, not a timing, pins this: importing torch alone costs about 1 s of CPU)."""
    bad = tmp_path / "bad.toml"
    bad.write_text("rounds = = 3\n")
    args = [str(bad) if a == "BAD_TOML" else a for a in args]
    got, err = _cli_in_fresh_interpreter(args, tmp_path, ("torch", "flwr", "ray", "scipy", "pydantic", "datasets"))
    assert got["code"] == 2 and needle in err, err
    assert got["heavy"] == [], got
    assert got["modules"] < 400, got  # ~215 today; torch alone brings ~1,500


@pytest.mark.parametrize(
    "args, needle",
    [
        (["run", "--set", "rounds=0"], "rounds: Input should be greater than or equal to 1"),
        (
            ["run", "--set", "privacy.mechanism=blt", "--set", "sampling.scheme=poisson"],
            "needs a bounded participation scheme",
        ),
        (["run", "--set", "model.name=femnist_cnn"], "does not fit data.name = 'shakespeare'"),
        (["privacy", "--set", "client.lr=-1"], "client.lr"),
        (["run", "--set", "privacy.mechanism=nope"], "privacy.mechanism"),
    ],
    ids=["rounds-0", "mf-poisson", "model-data", "privacy-lr", "mechanism-name"],
)
def test_config_value_errors_answer_before_torch_and_the_accountant_are_imported(tmp_path, args, needle):
    """Errors in a config's values need the schema (pydantic and the registries' options), not
    torch, Flower, Ray, datasets or dp-accounting: the registries import torch on first use
    (fedsim._lazy), and the schema is checked before the runner is imported."""
    watch = ("torch", "flwr", "ray", "datasets", "flwr_datasets", "dp_accounting", "pandas", "matplotlib", "pyarrow")
    got, err = _cli_in_fresh_interpreter(args, tmp_path, watch)
    assert got["code"] == 2 and needle in err, err
    assert got["heavy"] == [], got
    assert got["modules"] < 1000, got  # ~640 today (pydantic, numpy, scipy.linalg); torch alone brings ~1,500


def test_the_light_config_reader_knows_every_top_level_key():
    from fedsim.config import Config
    from fedsim.config_file import TOP_LEVEL_KEYS

    assert sorted(TOP_LEVEL_KEYS) == sorted(Config.model_fields)


def test_a_sweep_draws_accuracy_against_epsilon_across_its_arms():
    """One point per arm at (ε, mean accuracy in %) with its std over seeds; the no-DP arm a
    dashed line; the axes say what is drawn."""
    import matplotlib.pyplot as plt

    from fedsim.reporting.sweep_report import accuracy_vs_epsilon_figure

    base = {"delta": 1e-5, "neighboring_relation": "add_or_remove_one", "seeds": 3, "planned": 3}
    arms = [
        {**base, "arm": "z=0.5", "epsilon": 8.0, "final_eval_accuracy": 0.40, "final_eval_accuracy_std": 0.02},
        {**base, "arm": "z=1", "epsilon": 2.0, "final_eval_accuracy": 0.30, "final_eval_accuracy_std": 0.01},
        {**base, "arm": "no-dp", "epsilon": "inf", "final_eval_accuracy": 0.45, "final_eval_accuracy_std": 0.0},
    ]
    fig = accuracy_vs_epsilon_figure({"metric": "final_eval_accuracy", "arms": arms, "trials": []})
    try:
        (ax,) = fig.axes
        assert ax.get_xlabel() == "ε (add/remove one user, δ = 1e-05)"
        assert ax.get_ylabel() == "final_eval_accuracy (%), mean ± std over seeds"
        points = {
            c.get_label(): (list(c.lines[0].get_xdata()), list(c.lines[0].get_ydata()), c.lines[2][0].get_segments())
            for c in ax.containers
        }
        x, y, bars = points["z=0.5"]
        assert (x, y) == ([8.0], [pytest.approx(40.0)]) and [s[:, 1].tolist() for s in bars] == [[38.0, 42.0]]
        x, y, bars = points["z=1"]
        assert (x, y) == ([2.0], [pytest.approx(30.0)]) and [s[:, 1].tolist() for s in bars] == [[29.0, 31.0]]
        lines = {ln.get_label(): list(ln.get_ydata()) for ln in ax.lines if not ln.get_label().startswith("_")}
        assert lines == {"no-dp (ε = ∞)": [pytest.approx(45.0)] * 2}  # a dashed horizontal line
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["no-dp (ε = ∞)", "z=0.5", "z=1"]
    finally:
        plt.close(fig)
