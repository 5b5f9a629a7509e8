"""`out=` writes the noise stream's state behind the checkpoint (fedsim.noise_file): attacks on
that split.

The checkpoint, with the stream's position, is on disk before each round's model leaves the
server; `noise.pt`, the stream's state, is written in the background after it. Each test plays
what a crash, a full disk or a mixed-up folder would leave behind, and checks that a resume
either continues bit for bit as an uninterrupted run would, or is refused in one line.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg

from fedsim.checkpoint import load_checkpoint
from fedsim.errors import FedsimError
from fedsim.flower import UserLevelDP, user_dp_mod
from fedsim.noise_file import NOISE_NAME, load_with_noise, writes_behind
from fedsim.privacy.mechanisms.blt import BLTStream
from fedsim.privacy.noise import NoiseMechanism
from fedsim.runner.inprocess import InProcessGrid, task_identity

D = 64

MECHANISMS = {
    "blt": {"mechanism": "blt", "noise_multiplier": 1.0},
    "banded": {"mechanism": "banded", "bands": 2, "noise_multiplier": 1.0},
    "bisr": {"mechanism": "bisr", "bands": 3, "noise_multiplier": 1.0},
}


def _model() -> ArrayRecord:
    return ArrayRecord({"w": Array(np.zeros((D // 4, 4), np.float32))})


def _app() -> ClientApp:
    """Node ``p`` moves the first coordinate by 0.1·(p + 1): the sums differ between rounds."""
    app = ClientApp(mods=[user_dp_mod])

    @app.train()
    def train(msg: Message, context):
        p = int(context.node_config["partition-id"])
        w = msg.content["arrays"]["w"].numpy().copy()
        w.flat[0] += 0.1 * (p + 1)
        return Message(RecordDict({"arrays": ArrayRecord({"w": Array(w)}), "metrics": MetricRecord({"num-examples": 1})}),
                       reply_to=msg)  # fmt: skip

    return app


def _dp(mechanism: str, **kw) -> UserLevelDP:
    args = dict(rounds=4, population=8, clip_norm=1.0, privacy=MECHANISMS[mechanism],
                sampling={"scheme": "min_sep", "min_sep": 2}, key=3)  # fmt: skip
    args.update(kw)
    return UserLevelDP(FedAvg(min_available_nodes=1, fraction_evaluate=0.0), **args)


def _run(dp: UserLevelDP, rounds: int, initial: ArrayRecord | None = None, after=None) -> dict[int, np.ndarray]:
    """``rounds`` rounds on 4 nodes; the model after each round; ``after(round)`` is called then."""
    seen: dict[int, np.ndarray] = {}

    def record(rnd, arrays):
        seen[rnd] = arrays["w"].numpy().ravel().copy()
        if after is not None:
            after(rnd)

    with task_identity():
        dp.start(InProcessGrid(_app(), 4), initial or _model(), num_rounds=rounds, evaluate_fn=record)
    return seen


def _stream_tensors(dp: UserLevelDP) -> list[torch.Tensor]:
    assert dp.server is not None
    state = dp.server.noise.stream.state_dict()
    return [b for b in (state.get("buffers") or state.get("buffer") or [])]


@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
@pytest.mark.parametrize("kept", [0, 1])
def test_a_crash_before_the_noise_file_is_written_resumes_bit_for_bit(tmp_path, mechanism, kept):
    """The run is killed after round 2's checkpoint is on disk and its model was published, but
    before `noise.pt` caught up: `noise.pt` is the one of round `kept`. A resume must carry the
    stream forward from there and add rows 3 and 4 exactly as an uninterrupted run does (the same
    models, bit for bit), and its stream state must equal the uninterrupted one's."""
    straight_dp = _dp(mechanism)
    straight = _run(straight_dp, 4)
    copies = tmp_path / "copies"
    copies.mkdir()

    dp = _dp(mechanism, out=tmp_path / "run")

    def keep(rnd):
        if rnd:
            dp.flush()
            shutil.copy(tmp_path / "run" / "checkpoint" / NOISE_NAME, copies / f"{rnd}.pt")

    _run(dp, 2, after=keep)
    zero = _dp(mechanism, out=tmp_path / "zero")  # round 0's noise.pt: written when the model is first seen
    with task_identity():
        zero.configure_train(1, _model(), ConfigRecord(), InProcessGrid(_app(), 4))
    shutil.copy(tmp_path / "zero" / "checkpoint" / NOISE_NAME, copies / "0.pt")
    assert load_checkpoint(tmp_path / "run" / "checkpoint", NOISE_NAME)["next_round"] == 2
    shutil.copy(copies / f"{kept}.pt", tmp_path / "run" / "checkpoint" / NOISE_NAME)  # what the crash left
    assert load_checkpoint(tmp_path / "run" / "checkpoint", NOISE_NAME)["next_round"] == kept

    resumed = _dp(mechanism, out=tmp_path / "run", resume=True)
    assert resumed.rounds_done == 2
    rest = _run(resumed, 2, initial=resumed.resume_arrays())
    assert np.array_equal(rest[0], straight[2])
    assert np.array_equal(rest[1], straight[3]) and np.array_equal(rest[2], straight[4])
    mine, theirs = _stream_tensors(resumed), _stream_tensors(straight_dp)
    assert len(mine) == len(theirs) > 0
    assert all(torch.equal(a, b) for a, b in zip(mine, theirs))


def test_the_checkpoint_holds_the_position_and_the_noise_file_the_state(tmp_path):
    """The file written before the model leaves holds no noise buffer; the stream's state is in
    noise.pt and, made whole again, equals the wrapper's own state_dict."""
    dp = _dp("blt", out=tmp_path / "run")
    _run(dp, 2)
    folder = tmp_path / "run" / "checkpoint"
    ckpt = load_checkpoint(folder)
    noise = ckpt["server"]["noise"]
    assert noise["position_only"] and noise["next_round"] == 2 and "buffers" not in noise
    whole = load_with_noise(folder)["server"]["noise"]
    mine = dp.state_dict()["server"]["noise"]
    assert whole["replay_to"] == 2 and whole["t"] == mine["t"] == 2
    assert all(torch.equal(a, b) for a, b in zip(whole["buffers"], mine["buffers"]))
    assert oct(folder.stat().st_mode & 0o777) == "0o700"
    assert oct((folder / NOISE_NAME).stat().st_mode & 0o777) == "0o600"  # as secret as the key


def test_a_failed_noise_write_stops_the_run_with_its_error(tmp_path):
    """The disk refuses round 2's noise.pt (a folder took its name): the run stops with a
    one-line error naming the file, before the stream steps again in round 3."""
    dp = _dp("blt", out=tmp_path / "run")
    target = tmp_path / "run" / "checkpoint" / NOISE_NAME

    def block(rnd):
        if rnd == 1:  # round 1's noise.pt is written; make the next write fail
            dp.flush()
            target.unlink()
            target.mkdir()
            (target / "x").write_text("occupied")

    with pytest.raises(FedsimError, match=r"could not write .*noise\.pt"):
        _run(dp, 3, after=block)
    assert load_checkpoint(tmp_path / "run" / "checkpoint")["server"]["round"] == 2  # round 2's checkpoint holds


@pytest.mark.parametrize(
    "spoil, message",
    [
        ("missing", "is missing"),
        ("other key", "another run's noise state"),
        ("ahead", "past its checkpoint's round"),
    ],
)
def test_a_mixed_up_noise_file_is_refused(tmp_path, spoil, message):
    """A noise.pt that is missing, of another run (another key), or from a later round than the
    checkpoint (a folder put together from two copies) is refused before anything runs."""
    _run(_dp("blt", out=tmp_path / "run"), 3)
    other = _dp("blt", out=tmp_path / "other", key=4)
    _run(other, 2)
    target = tmp_path / "run" / "checkpoint" / NOISE_NAME
    ckpt_folder = tmp_path / "run" / "checkpoint"
    if spoil == "missing":
        target.unlink()
    elif spoil == "other key":
        shutil.copy(tmp_path / "other" / "checkpoint" / NOISE_NAME, target)
    else:  # round 2's checkpoint with round 3's noise.pt
        ckpt = load_checkpoint(ckpt_folder)
        assert ckpt["server"]["round"] == 3
        noise = load_checkpoint(ckpt_folder, NOISE_NAME)
        noise["next_round"] = 4  # a state from after the checkpoint
        torch.save(noise, target)
    with pytest.raises(FedsimError, match=message):
        _dp("blt", out=tmp_path / "run", resume=True)


def test_a_position_alone_is_refused_by_load_state_dict(tmp_path):
    """A checkpoint.pt read without its noise.pt (torch.load, then load_state_dict) is refused
    with the function that reads both, never taken as a stream at round 0."""
    dp = _dp("blt", out=tmp_path / "run")
    _run(dp, 1)
    state = load_checkpoint(tmp_path / "run" / "checkpoint")
    fresh = _dp("blt")
    fresh.load_state_dict(state)  # kept until the model's size is known
    with pytest.raises(FedsimError, match="load_with_noise"):
        _run(fresh, 1, initial=dp.resume_arrays())


def test_only_fedsims_own_streams_are_written_behind():
    """A stream whose step or state is a plugin's (here a subclass of BLT's that overrides step)
    stays inside the checkpoint; fedsim's BLT, and no stateless stream, are written behind."""

    class Plugin(BLTStream):
        def step(self, t, draw):
            return super().step(t, draw)

    theta, omega = np.array([0.5]), np.array([0.2])
    assert writes_behind(NoiseMechanism(8, 1, "cpu", BLTStream(theta, omega, 1.0)))
    assert not writes_behind(NoiseMechanism(8, 1, "cpu", Plugin(theta, omega, 1.0)))
    from fedsim.privacy.noise import IndependentStream

    assert not writes_behind(NoiseMechanism(8, 1, "cpu", IndependentStream()))


def test_a_checkpoint_with_the_whole_noise_state_still_resumes(tmp_path):
    """A checkpoint.pt that holds the stream's whole state (as every checkpoint did before
    noise.pt, and as `state_dict()` gives it) resumes without a noise.pt, bit for bit, and the
    resumed run writes its noise.pt from then on."""
    straight = _run(_dp("blt"), 3)
    dp = _dp("blt", out=tmp_path / "run")
    _run(dp, 2)
    folder = tmp_path / "run" / "checkpoint"
    torch.save(dp.state_dict(), folder / "checkpoint.pt")
    (folder / NOISE_NAME).unlink()
    resumed = _dp("blt", out=tmp_path / "run", resume=True)
    rest = _run(resumed, 1, initial=resumed.resume_arrays())
    assert np.array_equal(rest[1], straight[3])
    assert load_checkpoint(folder, NOISE_NAME)["next_round"] == 3


def test_a_state_loaded_mid_run_replaces_the_noise_file(tmp_path):
    """load_state_dict of another run's state (another key) at the round the wrapper's noise.pt
    is at: noise.pt must become the loaded stream's, so that the next checkpoint and noise.pt
    belong together and a resume continues the loaded run bit for bit."""
    other = _dp("blt", key=9)
    straight = _run(other, 3)
    source = _dp("blt", key=9)
    _run(source, 2)
    dp = _dp("blt", out=tmp_path / "run")
    _run(dp, 2)
    dp.load_state_dict(source.state_dict())
    assert load_checkpoint(tmp_path / "run" / "checkpoint", NOISE_NAME)["key"] == source.server.noise.key.state_dict()
    _run(dp, 1, initial=source.resume_arrays())
    resumed = _dp("blt", out=tmp_path / "run", resume=True)
    assert resumed.rounds_done == 3 and resumed.key == source.key
    assert np.array_equal(resumed.resume_arrays()["w"].numpy().ravel(), straight[3])
