"""`fedsim privacy --dim D`: the noise's memory, disk and CPU for the run, before round 1
(fedsim/privacy/cost.py), checked against closed forms of each stream's state."""

from __future__ import annotations

import pytest

from fedsim.privacy.cost import noise_cost
from fedsim.privacy.mechanisms import get_mechanism, plan_mf
from fedsim.privacy.participation import make_scheme

ROUNDS = 24
SCHEME = make_scheme("epochs", 400, 50, rounds=ROUNDS)


def _cost(mechanism: str, dim: int, budget: int = 1 << 30, table: bool = True, **options):
    plan = plan_mf(mechanism, SCHEME, ROUNDS, **options)
    return plan, noise_cost(lambda: get_mechanism(mechanism).stream(plan), ROUNDS, dim, budget, table)


@pytest.mark.parametrize("buffers", [1, 3])
def test_blt_holds_one_float32_row_of_d_per_buffer(buffers):
    _, cost = _cost("blt", 1_000_003, buffers=buffers)
    assert cost["state_bytes"] == buffers * 1_000_003 * 4 and cost["disk_bytes"] == 0


def test_banded_holds_its_bands_minus_one_rows():
    plan, cost = _cost("banded", 777_777, bands=5)
    from fedsim.privacy.sensitivity import num_bands

    assert cost["state_bytes"] == (num_bands(plan.C) - 1) * 777_777 * 4


def test_a_dense_inverse_keeps_its_history_or_writes_a_table_past_the_budget():
    d = 100_000
    _, fits = _cost("dense", d)
    assert fits["state_bytes"] == ROUNDS * d * 4 and fits["disk_bytes"] == 0
    _, table = _cost("dense", d, budget=4 * d * 4)
    assert table["disk_bytes"] == ROUNDS * d * 4 and table["state_bytes"] == 4 * d * 4
    assert table["table_build_cpu_s"] > 0 and table["run_cpu_s"] >= table["table_build_cpu_s"]
    _, redraw = _cost("dense", d, budget=4 * d * 4, table=False)
    assert redraw["disk_bytes"] == 0 and redraw["state_bytes"] == 0


def test_cpu_is_the_probes_median_row_scaled_linearly_to_d(monkeypatch):
    """The arithmetic, with the probe's row times fixed (timings themselves are not tested)."""
    from fedsim.privacy import cost as cost_mod

    real = cost_mod._stepped

    def fixed(make_stream, dim, rounds):
        stream, seconds = real(make_stream, dim, rounds)
        return stream, [0.5] + [0.002, 0.001, 0.003][: rounds - 1] + [0.002] * max(rounds - 4, 0)

    monkeypatch.setattr(cost_mod, "_stepped", fixed)
    _, got = _cost("blt", 10 * cost_mod.PROBE_DIM)
    assert got["row_cpu_ms"] == pytest.approx(10 * 2.0)  # median 2 ms at d₀, first row left out
    assert got["run_cpu_s"] == pytest.approx(10 * 0.002 * ROUNDS)


def test_the_cli_states_the_cost_and_says_when_it_does_not_fit(monkeypatch, capsys):
    from fedsim import cli, resources

    args = ["privacy", "--set", "privacy.accountant=rdp", "--population", "848", "--dim", "4050748"]
    cli.main(args)
    out = capsys.readouterr().out
    assert "blt noise at d = 4,050,748: 62 MiB of state in memory" in out and "NOT fit" not in out
    monkeypatch.setattr(
        resources, "available_memory_bytes", lambda: 16 << 20
    )  # the factorization fits, the 62 MiB state does not
    cli.main(args)
    assert (
        "does NOT fit this machine's available memory: use privacy.mechanism = 'blt' or 'banded'"
        in capsys.readouterr().out
    )


def test_a_dimension_below_one_is_one_line(capsys):
    from fedsim.cli import main

    with pytest.raises(SystemExit) as e:
        main(["privacy", "--set", "privacy.accountant=rdp", "--population", "848", "--dim", "0"])
    assert e.value.code == 2 and "--dim 0" in capsys.readouterr().err


@pytest.mark.parametrize("rounds", [1, 3])
@pytest.mark.parametrize("mechanism", ["dense", "sqrt", "banded"])
def test_a_run_shorter_than_the_probe_is_costed_without_stepping_past_its_last_round(mechanism, rounds):
    """A run's header costs its noise before round 1: a 3-round sqrt deployment used to stop there
    with "index 3 is out of bounds" (the timing probe stepped one row past the run)."""
    d = 10_000
    plan = plan_mf(mechanism, make_scheme("epochs", 400, 400 // rounds, rounds=rounds), rounds)
    cost = noise_cost(lambda: get_mechanism(mechanism).stream(plan), rounds, d, 1 << 30, True)
    if mechanism == "banded":
        from fedsim.privacy.sensitivity import num_bands

        assert cost["state_bytes"] == (num_bands(plan.C) - 1) * d * 4
    else:
        assert cost["state_bytes"] == rounds * d * 4 and cost["disk_bytes"] == 0
    assert cost["run_cpu_s"] >= 0 and cost["row_cpu_ms"] >= 0


def test_a_run_whose_noise_state_does_not_fit_is_refused_before_round_1(monkeypatch, tmp_path):
    """banded with 3 bands on a 59k-parameter model holds 2 rows of d (about 0.45 MiB): with less
    memory available than that (and enough for the 4-round factorization), the run is refused in
    one line that names blt; with enough memory it builds."""
    from fedsim import resources
    from fedsim.config import load_config
    from fedsim.errors import FedsimError
    from fedsim.runner.build import build_run

    sets = ["rounds=4", "privacy.mechanism='banded'", "privacy.bands=3", "sim.engine='inprocess'", "data.max_users=40"]
    cfg = load_config(None, [*sets, "privacy.noise_multiplier=1.0"])
    monkeypatch.setattr(resources, "available_memory_bytes", lambda: 200 << 10)
    with pytest.raises(FedsimError, match=r"its noise state needs .* use privacy.mechanism = 'blt'"):
        build_run(cfg)
    monkeypatch.setattr(resources, "available_memory_bytes", lambda: 1 << 30)
    assert build_run(cfg).noise is not None
