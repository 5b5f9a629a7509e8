"""Noise mechanisms behind one interface: ``row(t)`` is the standardized noise of round ``t``.

The server adds ``c · z · sensitivity · row(t)`` to the summed clipped updates
(docs/algorithms.md §1, step 4). For independent Gaussian noise ``row(t) = ξ_t``
and ``sensitivity = 1``; correlated (matrix-factorization) mechanisms return row
``t`` of ``C⁻¹Z`` and their ``sens(C)``.

Randomness: ``ξ_t`` is ``rng.gaussians(key.derive(t), d)``: AES-256-CTR under a 256-bit
sub-key of the run's :class:`~fedsim.privacy.rng.PrivacyKey`, turned into normals in float64 and
cast to float32. Row ``t`` is a pure function of the key and ``t`` (bit-reproducible after a
resume, independent of the rows drawn before), and nobody without the key can predict it. The
key is derived from the config seed in simulation and drawn from the OS in deployment. Rows are
generated on the CPU and moved to the server's device, so a GPU run adds the same numbers.
"""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedsim.errors import FedsimError
from fedsim.privacy.background import worker
from fedsim.privacy.rng import PrivacyKey, gaussians
from fedsim.privacy.stream import Draw, NoiseStream

if TYPE_CHECKING:
    import torch
else:
    from fedsim._lazy import torch


def _xi(key: PrivacyKey | int, j: int, dim: int, device: torch.device) -> torch.Tensor:
    """``ξ_j ~ N(0, I_d)``: the standard normal row ``j`` of ``Z``, a pure function of (key, j)."""
    return gaussians(PrivacyKey.of(key).derive("xi", int(j)), dim, dtype=torch.float32, device=device)


class NoiseMechanism:
    """The one noise class: a mechanism's :class:`~fedsim.privacy.stream.NoiseStream` fed with the
    rows ``ξ_j`` of ``Z`` drawn from the run's key.

    Parameters
    ----------
    dim : ``d``, length of the flat parameter vector.
    seed : the noise stream's :class:`~fedsim.privacy.rng.PrivacyKey` (an int is taken as a
        config seed: ``PrivacyKey.from_seed``); kept as ``self.key``.
    device : where rows are used (the server's device).
    stream : the mechanism's stream (bound here to ``dim`` and ``device``).
    """

    def __init__(self, dim: int, seed: PrivacyKey | int, device: str | torch.device, stream: NoiseStream) -> None:
        self.dim = int(dim)
        self.key = PrivacyKey.of(seed)
        self.device = torch.device(device)
        self.stream = stream
        self.name = stream.name
        stream.bind(self.dim, self.device)
        #: (key, j, future of ξ_j) from :meth:`prefetch`; not state (a checkpoint never holds it).
        self._ahead: tuple[PrivacyKey, int, Future[torch.Tensor]] | None = None

    @property
    def sensitivity(self) -> float:
        """``sens(C)``: L2 sensitivity of the strategy matrix under the run's scheme."""
        return self.stream.sensitivity

    def prefetch(self, j: int) -> None:
        """Start drawing ``ξ_j`` in a background thread, so that the draw overlaps the round's
        local training; :meth:`draw` of the same ``j`` and key then takes it. ``ξ_j`` is a pure
        function of (key, j), so the row is the same, bit for bit, whenever it is computed; a
        prefetched row whose key or index does not match is never used."""
        if not self.stream.draws_ahead() or (
            self._ahead is not None and self._ahead[0] == self.key and self._ahead[1] == int(j)
        ):
            return
        self._ahead = (self.key, int(j), worker("fedsim-noise").submit(_xi, self.key, int(j), self.dim, self.device))

    def draw(self, j: int) -> torch.Tensor:
        """``ξ_j`` of this run's key (the prefetched row when :meth:`prefetch` asked for it)."""
        ahead = self._ahead
        if ahead is not None and ahead[0] == self.key and ahead[1] == int(j):
            self._ahead = None
            return ahead[2].result()
        return _xi(self.key, j, self.dim, self.device)

    def row(self, t: int) -> torch.Tensor:
        """Standardized noise row of round ``t`` (0-based): float32, shape ``(dim,)``."""
        expected = self.stream.next_round()
        if expected is not None and t != expected:
            raise RuntimeError(f"{self.name} noise is streamed in order: expected round {expected}, got {t}")
        return self.stream.step(int(t), self.draw)

    def row_variance(self, t: int) -> float:
        """Per-coordinate variance of ``row(t)`` (``‖row_t(C⁻¹)‖²``; 1 for independent noise)."""
        return self.stream.row_variance(t)

    def set_scratch(self, folder: Path | None) -> None:
        """Let the stream keep secret working files (a noise table) in ``folder``, an owner-only
        folder where the key already is (a run's ``checkpoint/``); None: none."""
        self.stream.set_scratch(folder)

    def close(self) -> None:
        """Delete the stream's working files (at the end of the run, however it ends)."""
        self.stream.close()

    def state_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dim": self.dim, "key": self.key.state_dict(), **self.stream.state_dict()}

    def position_dict(self) -> dict[str, Any]:
        """The stream's position without its state: name, ``d``, key and the next round
        (``next_round``). The state itself is written apart (:mod:`fedsim.noise_file`) and put
        back by :func:`fedsim.noise_file.attach_noise_file` before :meth:`load_state_dict`."""
        return {"name": self.name, "dim": self.dim, "key": self.key.state_dict(), "position_only": True,
                "next_round": self.stream.next_round()}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`'s output. A state with ``replay_to`` (from
        :func:`fedsim.noise_file.attach_noise_file`) is then carried forward to that round
        (:meth:`catch_up`)."""
        if state.get("name") != self.name or int(state.get("dim", -1)) != self.dim:
            raise FedsimError(
                f"checkpoint noise state is for {state.get('name')} with dim {state.get('dim')}, "
                f"but this run uses {self.name} with dim {self.dim}"
            )
        if state.get("position_only"):
            raise FedsimError(
                "this checkpoint holds the noise stream's position only; its state is in noise.pt next to it: "
                "load the folder with fedsim.noise_file.load_with_noise(folder)"
            )
        self.key = PrivacyKey.from_state_dict(state["key"])
        self.stream.load_state_dict(state)
        if state.get("replay_to") is not None:
            self.catch_up(int(state["replay_to"]))

    def catch_up(self, t: int) -> None:
        """Carry an in-order stream from its round to round ``t``: rows ``next_round … t − 1`` are
        computed again (each ``ξ_j`` drawn again from the key) and thrown away. Rows are a pure
        function of the key and the rows before, so the state is the one an uninterrupted stream
        has at ``t``, bit for bit. Streams without state (``next_round`` None) need nothing.

        Parameters
        ----------
        t : the round the stream must be at next (0-based).
        """
        at = self.stream.next_round()
        if at is None:
            return
        if at > t:
            raise FedsimError(
                f"the noise state is at round {at}, past the checkpoint's round {t}: not this checkpoint's"
            )
        for j in range(at, int(t)):
            self.stream.step(j, self.draw)


class IndependentStream(NoiseStream):
    """Independent Gaussian noise: ``n_t = ξ_t ~ N(0, I_d)``, ``sens = 1``."""

    def __init__(self) -> None:
        super().__init__(1.0, "gaussian")

    def step(self, t: int, draw: Draw) -> torch.Tensor:
        return draw(t)


class ZeroStream(NoiseStream):
    """No noise (``privacy.mechanism = "none"``): ε = ∞."""

    def __init__(self) -> None:
        super().__init__(1.0, "none")

    def step(self, t: int, draw: Draw) -> torch.Tensor:
        return torch.zeros(self.dim, device=self.device, dtype=torch.float32)

    def row_variance(self, t: int) -> float:
        return 0.0


#: Bytes of memory a correlated stream may hold for its noise history by default (1 GiB):
#: ``privacy.noise_memory_mib``.
DEFAULT_NOISE_MEMORY = 1 << 30

#: Name prefix of a noise table's file (:class:`MatrixStream`); a run folder's ``checkpoint/``
#: holds at most one, while the run runs.
TABLE_PREFIX = ".noise-table-"


class MatrixStream(NoiseStream):
    """Correlated noise ``n_t = (M·Z)_t = Σ_j M[t, j] ξ_j`` for a noising matrix ``M``
    (tree, sqrt, dense, DP-MF+).

    ``M = C⁻¹`` for a square strategy ``C`` (``A⁻¹B`` in general, e.g. for the tree). Three
    ways to give row ``t``, all of the same numbers ``ξ_j`` and ``M``:

    - the history fits: when all ``m`` rows of ``ξ`` fit in ``memory_budget`` bytes they are
      kept in memory as they are drawn, and row ``t`` sums them in float64 (``O(t·d)`` adds);
    - a noise table (:meth:`set_scratch` gave a folder): every row of ``M·Z`` is computed once,
      at the first row asked for. Each ``ξ_j`` is drawn once and written to an owner-only file
      in that folder, then, block of coordinates by block, the ``m × B`` block of ``Z`` is read
      back in float64, multiplied by ``M`` (BLAS; triangular when ``M`` is) and its ``n × B``
      result written over it as float32.
      ``B`` is chosen so the two blocks fit in ``memory_budget``. A round then reads one row:
      ``O(d)`` whatever ``t`` is. The table is as secret as the key: the runner puts it in the
      run's ``checkpoint/`` (0700, where the key is) and :meth:`close` deletes it when the run
      ends, however it ends;
    - otherwise ``ξ_0 … ξ_t`` are drawn again each round (``O(t·d)`` draws, ``O(d)`` memory).

    The table's products sum in another order than the float64 loop, so a row can differ from
    the other two in the last bit of a float32 coordinate; within one path, rows are a pure
    function of the key and ``t`` (a resume rebuilds the same table). Rows can be asked for in
    any order; the stream has no state to checkpoint.

    Parameters
    ----------
    noising : ``M`` (``n × m``, float64).
    sens : ``sens(C)`` under the run's scheme.
    name : the mechanism's name (default ``matrix``).
    memory_budget : bytes allowed for the noise history in memory: the ``ξ`` rows kept, or the
        table's blocks (default :data:`DEFAULT_NOISE_MEMORY`, 1 GiB).
    """

    def __init__(
        self, noising: Any, sens: float, name: str = "matrix", memory_budget: int = DEFAULT_NOISE_MEMORY
    ) -> None:
        super().__init__(sens, name)
        import numpy as np

        self.noising = np.asarray(noising, dtype=np.float64)
        self.memory_budget = int(memory_budget)
        self._store: dict[int, torch.Tensor] = {}
        #: folder a noise table may be written to (None: no table).
        self.scratch: Path | None = None
        self._table: Any = None  # the table as a read-only memory map, once built
        self._table_path: Path | None = None

    def history_fits(self) -> bool:
        """Whether all ``m`` rows of ``ξ`` fit in :attr:`memory_budget` bytes (float32)."""
        return bool(self.noising.shape[1] * self.dim * 4 <= self.memory_budget)

    def draws_ahead(self) -> bool:
        """False once the noise table is built: a round then reads its row and draws nothing."""
        return self._table is None

    def table_bytes(self) -> int:
        """Disk the noise table takes: ``max(n, m)·d·4`` bytes (0 when the history fits)."""
        n, m = self.noising.shape
        return 0 if self.history_fits() else int(max(n, m) * self.dim * 4)

    def set_scratch(self, folder: Path | None) -> None:
        """Allow a noise table in ``folder`` (an owner-only folder that holds the run's key), or
        none (None). Refuses (:class:`FedsimError`) when the table it would need does not fit on
        that folder's disk, before any round runs."""
        import shutil

        self.close()
        self.scratch = None if folder is None else Path(folder)
        need = self.table_bytes()
        if self.scratch is None or not need:
            return
        probe = self.scratch
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        free = shutil.disk_usage(probe).free
        if need > free:
            raise FedsimError(
                f"privacy.mechanism = '{self.name}': its noise table needs {need / 1e9:.1f} GB of disk in {folder} "
                f"and {free / 1e9:.1f} GB are free. Use privacy.mechanism = 'blt' or 'banded' (their noise state is "
                f"a few rows of d), free disk there, or set privacy.noise_table = false (each round then redraws "
                f"all earlier rows of Z: O(t·d) work a round)"
            )

    def _row_xi(self, j: int, draw: Draw) -> torch.Tensor:
        if not self.history_fits():
            return draw(j)
        if j not in self._store:
            self._store[j] = draw(j)
        return self._store[j]

    def step(self, t: int, draw: Draw) -> torch.Tensor:
        if self.scratch is not None and not self.history_fits():
            if self._table is None:
                self._build_table(draw)
            return torch.from_numpy(self._table[int(t)].copy()).to(self.device)
        coeffs = self.noising[int(t)]
        out = torch.zeros(self.dim, dtype=torch.float64, device=self.device)
        for j in coeffs.nonzero()[0].tolist():
            out.add_(self._row_xi(j, draw).to(torch.float64), alpha=float(coeffs[j]))
        return out.to(torch.float32)

    def table_block(self) -> int:
        """``B``: coordinates per block of the table's product (the ``m × B`` block of ``Z`` and
        the ``n × B`` block of noise, float64, fit in :attr:`memory_budget`; at least 1)."""
        n, m = self.noising.shape
        return int(max(1, min(self.dim, self.memory_budget // (8 * (n + m)))))

    def _build_table(self, draw: Draw) -> None:
        """Compute every row of ``M·Z`` into a file in :attr:`scratch` (see the class docstring)."""
        import os
        import tempfile

        import numpy as np

        assert self.scratch is not None
        n, m = self.noising.shape
        self.scratch.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.scratch, 0o700)
        for stale in self.scratch.glob(TABLE_PREFIX + "*"):  # a killed process's table
            stale.unlink(missing_ok=True)
        fd, name = tempfile.mkstemp(prefix=TABLE_PREFIX, dir=self.scratch)  # created 0600
        os.close(fd)
        self._table_path = Path(name)
        rows = max(n, m)
        table = np.memmap(name, dtype=np.float32, mode="w+", shape=(rows, self.dim))
        for j in range(m):
            table[j] = draw(j).cpu().numpy()
        width = self.table_block()
        for a in range(0, self.dim, width):
            z = np.array(table[:m, a : a + width], dtype=np.float64, order="F")
            table[:n, a : a + width] = self._times(z).astype(np.float32)
        table.flush()
        del table
        self._table = np.memmap(name, dtype=np.float32, mode="r", shape=(rows, self.dim))

    def _times(self, z: Any) -> Any:
        """``M·z`` in float64: BLAS's triangular product for a square lower-triangular ``M``
        (dense, DP-MF+, sqrt: half the work), its general product otherwise (the tree)."""
        import numpy as np
        from scipy.linalg import blas

        n, m = self.noising.shape
        if n == m and not np.triu(self.noising, 1).any():
            return blas.dtrmm(1.0, self.noising, z, lower=1, overwrite_b=1)  # in place: z is Fortran-ordered
        return self.noising @ z

    def close(self) -> None:
        """Delete the noise table, if one was made (the run ended, or its folder changed)."""
        self._table = None
        if self._table_path is not None:
            self._table_path.unlink(missing_ok=True)
            self._table_path = None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.close()  # a table made under another key is not this run's
        self._store.clear()

    def row_variance(self, t: int) -> float:
        return float((self.noising[int(t)] ** 2).sum())


def gaussian_noise(dim: int, seed: PrivacyKey | int, device: str | torch.device = "cpu") -> NoiseMechanism:
    """Independent Gaussian noise (:class:`IndependentStream`) of length ``dim`` under key ``seed``."""
    return NoiseMechanism(dim, seed, device, IndependentStream())


def zero_noise(dim: int, seed: PrivacyKey | int = 0, device: str | torch.device = "cpu") -> NoiseMechanism:
    """No noise (:class:`ZeroStream`): ``privacy.mechanism = "none"``."""
    return NoiseMechanism(dim, seed, device, ZeroStream())
