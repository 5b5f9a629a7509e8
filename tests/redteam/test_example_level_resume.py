"""Red team: example-level DP across a stop (issue 34, findings 1 and 2).

Under ``privacy.unit = "example"`` each silo draws its DP-SGD key from the OS, once per process,
so a re-run of a round trains every silo afresh: new Poisson batches, new DP-SGD noise. The
server's noise row for the round is keyed by (run key, t), so it is the same. A resumed run that
re-ran a round already sent out would release ``x_t`` and ``x'_t`` with the same server noise:
``x_t − x'_t = (U_t − U'_t)/K̄``, noise-free in the server's noise.

The attacks:

1. a run that stops on too few valid replies in round 5 (``checkpoint.every = 3``) and is resumed
   as the message advises: every model the server sends must be sent once, bit for bit the
   same if it is sent again;
2. the silos' DP-SGD trainings are counted (by wrapping the training function itself) and
   compared with the silo ledger after an aborted round, a crash and a stop mid-round.
"""

from __future__ import annotations

import json
import os
import signal
from collections import Counter

import pytest
from helpers import CrashAfter

import fedsim.training.example_dp as example_dp_module
from fedsim.clients.client_app import evaluate, train
from fedsim.clients.faults import make_faulty_client_app
from fedsim.config import load_config
from fedsim.errors import FedsimError
from fedsim.interrupt import RunInterrupted
from fedsim.runner import run_experiment
from fedsim.runner.build import model_sha256
from fedsim.runner.callbacks import RunCallback
from fedsim.training.example_dp import silo_epsilon

BASE = [
    "data.name='synthetic'",
    "data.num_clients=24",
    "model.name='logreg'",
    "sampling.scheme='poisson'",
    "sampling.cohort_size=6",
    "privacy.mechanism='gaussian'",
    "privacy.noise_multiplier=1.0",
    "privacy.unit='example'",
    "privacy.example_noise_multiplier=1.0",
    "client.batch_size=8",
    "client.max_examples=16",
    "eval.every=0",
    "sim.engine='inprocess'",
    "sim.num_workers=2",
    "sim.min_valid_replies=2",
    "rounds=6",
    "checkpoint.every=3",
]


class _SentModels(RunCallback):
    """Records the model the server holds after every round (what the next message carries)."""

    def __init__(self) -> None:
        self.run = None
        self.sent: dict[int, list[str]] = {}

    def on_start(self, run, out, resumed):
        self.run = run

    def on_round_end(self, row):
        self.sent.setdefault(row["round"], []).append(model_sha256(self.run.server.params))


class _CountTrainings:
    """Wraps the silo's DP-SGD training: every call is one training whose update leaves the silo."""

    def __init__(self, monkeypatch) -> None:
        self.calls: Counter[int] = Counter()
        real = example_dp_module.local_delta_example_dp

        def counting(model, x0, samples, round_index, user, *args, **kwargs):
            self.calls[int(user)] += 1
            return real(model, x0, samples, round_index, user, *args, **kwargs)

        monkeypatch.setattr(example_dp_module, "local_delta_example_dp", counting)


def _ledger(out):
    return json.loads((out / "ledger.json").read_text())


def _assert_ledger_covers(out, trainings: Counter[int]) -> None:
    """Every silo's ledger entry counts at least the trainings it ran, and its ε is at least the
    ε of those trainings."""
    ex = _ledger(out)["example_level"]
    silos = ex["silos"]
    for silo, n in trainings.items():
        rec = silos.get(str(silo))
        assert rec is not None, f"silo {silo} trained {n} times and is not in the ledger"
        assert rec["participations"] >= n, (silo, rec["participations"], n)
        true_eps = silo_epsilon(1.0, rec["sample_rate"], rec["steps_per_participation"] * n, ex["delta"])
        assert rec["epsilon"] >= true_eps * (1 - 1e-12)


def test_a_resumed_example_level_run_sends_every_model_once(tmp_path, monkeypatch):
    out = tmp_path / "run"
    cfg = load_config(None, BASE)
    counter = _CountTrainings(monkeypatch)
    first = _SentModels()
    faulty = make_faulty_client_app({0: "error", 1: "error"}, rounds={5})
    with pytest.raises(FedsimError, match="fedsim run --resume"):
        run_experiment(cfg, out, progress=False, client_app=faulty, callbacks=[first])
    assert sorted(first.sent) == [1, 2, 3, 4]
    _assert_ledger_covers(out, counter.calls)  # finding 2: the aborted round 5 trained silos too

    second = _SentModels()
    monkeypatch.setattr(example_dp_module, "_SILO_KEY", None)  # a resume is a new process: new silo keys
    run_experiment(cfg, out, progress=False, resume=True, callbacks=[second])
    # finding 1: no round that was sent out is computed again (it would differ by the silos'
    # fresh DP-SGD noise under the same server noise)
    for r in set(first.sent) & set(second.sent):
        assert second.sent[r] == first.sent[r], f"round {r} was released twice with different models"
    assert sorted(set(first.sent) | set(second.sent)) == [1, 2, 3, 4, 5, 6]
    _assert_ledger_covers(out, counter.calls)  # the resume does not roll the silo record back


def test_a_crash_and_its_resume_keep_every_training_in_the_silo_ledger(tmp_path, monkeypatch):
    out = tmp_path / "run"
    cfg = load_config(None, BASE + ["sim.min_valid_replies=0"])
    counter = _CountTrainings(monkeypatch)
    with pytest.raises(RuntimeError, match="crash after round 5"):
        run_experiment(cfg, out, progress=False, callbacks=[CrashAfter(5)])
    _assert_ledger_covers(out, counter.calls)
    run_experiment(cfg, out, progress=False, resume=True)
    _assert_ledger_covers(out, counter.calls)
    assert sum(counter.calls.values()) > 0


def _sigint_in_round(r: int):
    """A ClientApp that sends this process SIGINT after its silos trained in round ``r`` (the
    in-process engine runs the ClientApp in the run's own process)."""
    from flwr.clientapp import ClientApp

    def mod(msg, context, call_next):
        reply = call_next(msg, context)
        if msg.metadata.message_type == "train" and msg.content["config"]["round"] + 1 == r:
            os.kill(os.getpid(), signal.SIGINT)
        return reply

    app = ClientApp(mods=[mod])
    app.train()(train)
    app.evaluate()(evaluate)
    return app


def test_a_stop_mid_round_keeps_the_round_s_trainings_in_the_silo_ledger(tmp_path, monkeypatch):
    out = tmp_path / "run"
    cfg = load_config(None, BASE + ["sim.min_valid_replies=0", "sim.num_workers=1"])
    counter = _CountTrainings(monkeypatch)
    with pytest.raises(RunInterrupted):
        run_experiment(cfg, out, progress=False, client_app=_sigint_in_round(4))
    ledger = _ledger(out)
    assert len(ledger["entries"]) == 3  # round 4 was abandoned before its noise
    _assert_ledger_covers(out, counter.calls)
    run_experiment(cfg, out, progress=False, resume=True)
    _assert_ledger_covers(out, counter.calls)


USER_LEVEL = [b for b in BASE if "example" not in b and "min_valid" not in b and "every" not in b] + [
    "checkpoint.every=2",
    "rounds=5",
]


def test_user_level_resume_rechecks_a_rerun_round_against_what_was_sent(tmp_path):
    """The safety net under every source of non-reproducibility: a re-run of a round that was
    already sent must give the same model bits, or the run stops before sending it again. Here
    the resume changes the number of workers, which regroups the float32 sums of round 3."""
    cfg = load_config(None, USER_LEVEL)
    clean = tmp_path / "clean"
    run_experiment(cfg, clean, progress=False)
    # the same settings re-run round 3 to the same bits and finish as an uninterrupted run
    out = tmp_path / "run"
    with pytest.raises(RuntimeError, match="crash after round 3"):
        run_experiment(cfg, out, progress=False, callbacks=[CrashAfter(3)])
    log = [json.loads(x) for x in (out / "checkpoint" / "releases.jsonl").read_text().splitlines()]
    assert [e["round"] for e in log if e["event"] == "model"] == [1, 2, 3]
    assert (
        run_experiment(cfg, out, progress=False, resume=True)["model_sha256"]
        == json.loads((clean / "summary.json").read_text())["model_sha256"]
    )

    out2 = tmp_path / "run2"
    with pytest.raises(RuntimeError, match="crash after round 3"):
        run_experiment(cfg, out2, progress=False, callbacks=[CrashAfter(3)])
    sent = (out2 / "checkpoint" / "releases.jsonl").read_text()
    more = load_config(None, USER_LEVEL + ["sim.num_workers=3"])
    with pytest.raises(FedsimError, match="round 3 re-ran to a different model than the one already sent"):
        run_experiment(more, out2, progress=False, resume=True)
    # nothing of the differing round 3 was released: no new row (the resume dropped the rows
    # after the checkpoint, to be recomputed), no new record
    assert len((out2 / "metrics.jsonl").read_text().splitlines()) == 2
    assert (out2 / "checkpoint" / "releases.jsonl").read_text() == sent


@pytest.mark.parametrize(
    "extra,reproducible",
    [
        ([], True),
        (["privacy.unit='example'", "privacy.example_noise_multiplier=1.0"], False),
        (["sim.client_gpus=1", "sim.device='auto'"], False),
    ],
)
def test_which_runs_count_as_reproducible(extra, reproducible):
    """Only a run whose every round re-runs to the same bits may re-run a round after a resume;
    the others checkpoint every round before its model leaves the server."""
    from fedsim.runner import build_run

    assert build_run(load_config(None, USER_LEVEL + extra)).reproducible is reproducible
