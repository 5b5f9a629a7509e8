"""The noise stream's state, written behind the checkpoint (the Flower wrapper's ``out=``).

A round's checkpoint must be on disk before the round's model leaves the server. Otherwise a
resume from an earlier checkpoint would add that round's noise row again, to another sum, and the
two releases together would give the difference of the sums with no noise at all. Most of a
correlated mechanism's checkpoint is its noise stream's state, though: BLT's buffers, or a banded
mechanism's last rows (176 MB of BLT's 220 MB at 11M parameters). That state is a pure function
of the key and the round, since every row ``ξ_j`` of ``Z`` is drawn from the key
(:mod:`fedsim.privacy.stream`). So:

- ``checkpoint.pt`` is written and synced before the model is returned, as before, but holds the
  stream's position only (:meth:`fedsim.privacy.noise.NoiseMechanism.position_dict`);
- ``noise.pt`` holds the stream's state at some round ``s`` not after the checkpoint's. A
  background thread writes it once the model has been returned, while the next round trains.
  It must be done before the stream steps again: the thread reads the live state (its
  ``state_dict`` copies it there, off the round's critical path). :meth:`NoiseFile.wait` raises the thread's error, if it failed;
- a resume loads ``noise.pt`` and carries the stream from ``s`` to the checkpoint's round
  (:meth:`fedsim.privacy.noise.NoiseMechanism.catch_up`). After a crash during the write, that
  is one row, drawn again from the key.

Only fedsim's own in-order streams (BLT, banded, BISR) are written behind, because fedsim's code
makes their state a function of the rows drawn. A plugin's stream is written inside the
checkpoint, before the model is returned.
"""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedsim.checkpoint import load_checkpoint, save_checkpoint
from fedsim.errors import FedsimError
from fedsim.privacy.background import worker

if TYPE_CHECKING:
    from fedsim.privacy.noise import NoiseMechanism

#: the file, next to ``checkpoint.pt``, that holds the noise stream's state.
NOISE_NAME = "noise.pt"


def writes_behind(noise: NoiseMechanism) -> bool:
    """Whether ``noise``'s stream state may be written after the model is returned: a stream
    that keeps state (``next_round`` is not None) and whose ``step``, ``state_dict`` and
    ``load_state_dict`` are fedsim's own code."""
    from fedsim.privacy.mechanisms.checks import defined_by_fedsim

    cls = type(noise.stream)
    own = all(defined_by_fedsim(cls, a) for a in ("step", "state_dict", "load_state_dict"))
    return own and noise.stream.next_round() is not None


class NoiseFile:
    """Writes a noise stream's state to ``folder/noise.pt`` on a background thread.

    Parameters
    ----------
    folder : the checkpoint folder (owner-only; the key is there too).
    """

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self._job: Future[None] | None = None
        #: the round the last written (or in-flight) state is at (None: nothing written yet).
        self.at: int | None = None

    def write(self, noise: NoiseMechanism) -> None:
        """Write the stream's state now and wait for it (the first one, at round 0: a few bytes)."""
        self.wait()
        self.at = noise.stream.next_round()
        self._save(noise, self.at)

    def write_behind(self, noise: NoiseMechanism) -> None:
        """Start writing the stream's state in the background, unless that round's state is
        already written or being written. The stream must not step before :meth:`wait`."""
        at = noise.stream.next_round()
        if at == self.at:
            return
        self.wait()
        self._job = worker("fedsim-noise-file").submit(self._save, noise, at)
        self.at = at

    def _save(self, noise: NoiseMechanism, at: int | None) -> None:
        save_checkpoint(self.folder, {**noise.state_dict(), "next_round": at}, name=NOISE_NAME)

    def wait(self) -> None:
        """Wait for the write in flight; raise its error (a one-line :class:`FedsimError` for a
        full disk, as the checkpoint's own)."""
        job, self._job = self._job, None
        if job is not None:
            job.result()


def attach_noise_file(noise_state: dict[str, Any], folder: str | Path) -> dict[str, Any]:
    """A checkpoint's noise position (``position_dict``) with the stream's state from
    ``folder/noise.pt`` put back, and ``replay_to`` set to the position's round, for
    :meth:`fedsim.privacy.noise.NoiseMechanism.load_state_dict`. A state that is not a position
    is returned as it is.

    Refuses (:class:`FedsimError`) a missing ``noise.pt``, and one of another run (another key,
    mechanism or ``d``) or from after the checkpoint's round.
    """
    if not noise_state.get("position_only"):
        return noise_state
    path = Path(folder) / NOISE_NAME
    if not path.exists():
        raise FedsimError(f"{path} is missing: the checkpoint next to it needs it to resume; restore the whole folder")
    state = load_checkpoint(folder, name=NOISE_NAME)
    same = (state.get("name"), int(state.get("dim", -1)), state.get("key"))
    if same != (noise_state["name"], int(noise_state["dim"]), noise_state["key"]):
        raise FedsimError(f"{path} is another run's noise state (another key, mechanism or model size)")
    at, target = state.get("next_round"), int(noise_state["next_round"])
    if at is None or int(at) > target:
        raise FedsimError(f"{path} is at round {at}, past its checkpoint's round {target}: not this checkpoint's")
    return {**state, "replay_to": target}


def load_with_noise(folder: str | Path) -> dict[str, Any]:
    """``folder/checkpoint.pt`` with its server's noise state made whole from ``noise.pt``
    (:func:`attach_noise_file`), ready for ``load_state_dict``."""
    state = load_checkpoint(folder)
    server = state.get("server")
    if isinstance(server, dict) and isinstance(server.get("noise"), dict):
        server["noise"] = attach_noise_file(server["noise"], folder)
    return state
