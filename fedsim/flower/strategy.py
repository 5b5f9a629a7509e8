"""User-level DP with correlated (MF) noise around any Flower strategy: `UserLevelDP`.

One Flower node is one user. Round `t` (docs/algorithms.md §1, the same steps as fedsim's own
runs, built by the same code):

1. The wrapper — not the wrapped strategy — picks the round's nodes with fedsim's cohort sampler,
   which enforces the participation scheme (Poisson, or keyed `epochs`/`min_sep`/`single`
   groups) on each node's stable identity.
2. Each chosen node gets the message the wrapped strategy made for it (or its one message for
   all): the model `x_t` and its config. A round the strategy makes no message for is skipped
   (no training, no noise row, a ledger note).
3. Each reply's update `Δ_i = y_i − x_t` is checked and clipped to `c` on the server
   (`fedsim.server.aggregation.UpdateAggregator`), whether or not the node clipped it first.
4. `fedsim.server.step.DPServer` adds the mechanism's noise row `c·z·sens·n_t`, divides by the
   fixed `K̄` (never the number of replies), applies the optional fedsim filter (DOPPLER, EMA,
   DiSK look-ahead) and optimizer (`sgd` with `lr = 1` by default: `x_t + ĝ_t`; DP-AdamBC
   with its exact `Φ_t`), and records ε in the ledger.
5. Only the result reaches the wrapped strategy, as the one and only reply of the round with
   weight 1. Its aggregation and server optimizer (FedAvg, FedAdam, …) are post-processing, and
   sample-count weighting has nothing to weigh: one user's data cannot change another's weight.

The noised model is written to the checkpoint (`out`) before it is returned, so it is saved
before it leaves the server: a resumed run continues with the next noise row and never sends a
round twice with the same noise.

`UserLevelDP.start` runs the wrapped strategy's own `start()` with these rounds, and the wrapper
passes on the strategy's other attributes (fedsim.flower.driver; docs/flower.md).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from dataclasses import replace
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
import tomli_w
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from fedsim.checkpoint import save_checkpoint
from fedsim.config import Config, config_from_dict
from fedsim.errors import FedsimError
from fedsim.flower.arrays import Layout
from fedsim.flower.driver import WITHHELD, GuardedGrid, driver_of, real_grid, refuse_unsafe, unseal
from fedsim.flower.identity import Census
from fedsim.flower.mod import KEY_CLIP_NORM
from fedsim.flower.replies import screen_and_sum
from fedsim.noise_file import NoiseFile, load_with_noise, writes_behind
from fedsim.privacy.accounting import epsilon
from fedsim.privacy.rng import PrivacyKey
from fedsim.runner.build import Prepared, dp_server, prepare_without_data
from fedsim.server.aggregation import UpdateAggregator
from fedsim.server.sampling import make_sampler
from fedsim.server.step import DPServer

#: Keys of the privacy-relevant settings a resume must not change.
_FIXED_ON_RESUME = ("rounds", "client", "clipping", "sampling", "privacy")


#: Below this many users the wrapper warns (and notes in the ledger) that the guarantee means
#: little: the default δ = N^-1.1 is then above 0.0063, and one user is over 1% of every mean.
SMALL_POPULATION = 100


def _settings(
    rounds: int,
    population: int,
    clip_norm: float,
    privacy: dict[str, Any] | None,
    sampling: dict[str, Any] | None,
    filter: dict[str, Any] | None,
    optimizer: dict[str, Any] | None,
) -> tuple[Config, dict[str, Any]]:
    """The wrapper's settings as a fedsim config (validated by the same rules as `fedsim run`),
    and the raw tables that apply to it (what `out/config.toml` holds)."""
    priv = dict(privacy or {"mechanism": "gaussian", "noise_multiplier": 1.0})
    if "population" in priv and int(priv["population"]) != int(population):
        raise FedsimError("give the population once: population=, not privacy['population']")
    priv["population"] = int(population)
    raw: dict[str, Any] = {
        "name": "flower-user-dp",
        "rounds": int(rounds),
        "client": {"clip_norm": float(clip_norm)},
        "sampling": dict(sampling or {"scheme": "poisson"}),
        "privacy": priv,
        "filter": dict(filter or {"name": "none"}),
        "server": dict(optimizer or {"optimizer": "sgd", "lr": 1.0}),
    }
    cfg = config_from_dict(raw)
    if cfg.privacy.unit != "user":
        raise FedsimError("UserLevelDP protects users (one node = one user); privacy.unit must be 'user'")
    if cfg.clipping.adaptive or cfg.clipping.mode != "flat":
        raise FedsimError("UserLevelDP clips flat to clip_norm; adaptive and automatic clipping are not supported")
    return cfg, raw


def _population_notes(population: int, delta: float) -> list[str]:
    """Caveats of a guarantee stated for few users or at a large δ (logged and kept in the ledger)."""
    notes = []
    if delta >= 1.0 / population:
        notes.append(
            f"delta = {delta:.3g} is not below 1/N = {1.0 / population:.3g}: a delta that large allows releasing "
            "one user's data outright"
        )
    if population < SMALL_POPULATION:
        notes.append(
            f"N = {population} users is small (under {SMALL_POPULATION}): delta = {delta:.3g} is the chance the "
            "epsilon bound fails outright, and one user is 1/N of every mean; state the guarantee for more users"
        )
    return notes


class UserLevelDP(Strategy):
    """Wrap a Flower strategy so that every model it publishes is user-level DP.

    Parameters
    ----------
    strategy : flwr.serverapp.strategy.Strategy
        The Flower Message-API strategy to wrap (FedAvg, FedAdam, a subclass, …). It supplies
        each sampled node's train message and aggregates the one noised reply per round; its
        own `start()` runs the rounds (`UserLevelDP.start`), and its other attributes are
        reached through the wrapper.
    rounds : int
        `n`, the rounds the guarantee covers; more rounds are refused. Pass the same number to
        `start(num_rounds=…)`.
    population : int
        `N`, the public number of users (nodes) the guarantee is stated for: the Poisson rate is
        `K̄/N`, keyed groups use it, δ defaults to `1/N^1.1`. More distinct nodes than `N` stop
        the run.
    clip_norm : float
        `c`, the L2 bound on each node's model update. Default 1.0.
    privacy : dict | None
        fedsim's `[privacy]` table: `mechanism` (`gaussian`, `blt`, `banded`, `bsr`, …),
        `noise_multiplier` or `target_epsilon`, `delta`, the mechanism's own keys. Default None:
        `{"mechanism": "gaussian", "noise_multiplier": 1.0}`.
    sampling : dict | None
        fedsim's `[sampling]` table: `scheme` (`poisson`, `single`, `epochs`, `min_sep`),
        `cohort_size` (`K̄`), `min_sep`, … Default None: `{"scheme": "poisson"}` (`K̄` = 40
        unless given). `fixed` needs a constant node count and is refused.
    filter : dict | None
        fedsim's `[filter]` table (`doppler`, `ema`, `disk` with `mode = "lookahead"`),
        applied between the noise and the wrapped strategy. Default None: no filter.
    optimizer : dict | None
        fedsim's `[server]` table, applied between the filter and the wrapped strategy. Default
        None: `{"optimizer": "sgd", "lr": 1.0}` (passes `x_t + ĝ_t` on). `adambc` adds
        DP-AdamBC with the exact noise variance `Φ_t` of the mechanism and filter.
    identity : str
        What a user's rounds are keyed on. `node` (default): the Flower node id, stable for the
        life of a SuperLink (Poisson needs nothing more). `census`: the identity the node's
        `fedsim.flower.user_dp_mod` reports (`user-id`, else `partition-id`), stable across
        SuperLink restarts; keyed groups with `out` need it.
    clipping : str
        `server` (default): nodes send their model, the server clips. `client`: the train config
        also carries `fedsim.clip-norm` and the node's `user_dp_mod` clips before sending; the
        server re-clips anyway and counts replies it had to clip.
    side_statistics : bool
        Pass the nodes' own metrics (training loss, example counts) and federated evaluation
        through to the wrapped strategy. They are computed from users' data outside the noise,
        so ε does not cover them. Default False: training metrics are replaced by the wrapper's
        own and federated evaluation is skipped (centralised `evaluate_fn` still runs).
    out : str | Path | None
        A folder for `ledger.json` (read by `fedsim.privacy.ledger.recompute_epsilon`),
        `config.toml` and `checkpoint/checkpoint.pt` (the wrapper's state, written after each
        round's noise and before the model is returned). Default None: nothing is written.
    resume : bool
        Continue from `out`'s checkpoint (the settings must match). Default False; a folder that
        already holds a checkpoint is refused unless resuming.
    key : int | None
        An int seeds the privacy key (reproducible studies; anyone with the seed can predict and
        remove the noise). Default None: 256 bits from the OS CSPRNG, kept only in the
        checkpoint.
    """

    def __init__(
        self,
        strategy: Strategy,
        *,
        rounds: int,
        population: int,
        clip_norm: float = 1.0,
        privacy: dict[str, Any] | None = None,
        sampling: dict[str, Any] | None = None,
        filter: dict[str, Any] | None = None,
        optimizer: dict[str, Any] | None = None,
        identity: str = "node",
        clipping: str = "server",
        side_statistics: bool = False,
        out: str | Path | None = None,
        resume: bool = False,
        key: int | None = None,
    ) -> None:
        super().__init__()
        if isinstance(strategy, UserLevelDP):
            raise FedsimError("the strategy is already wrapped in UserLevelDP; wrap the inner strategy once")
        refuse_unsafe(strategy)
        if identity not in ("node", "census") or clipping not in ("server", "client"):
            raise FedsimError("identity must be 'node' or 'census'; clipping must be 'server' or 'client'")
        self.strategy = strategy
        self._driver = driver_of(strategy, self)
        self._outbox: dict[str, list[Message]] = {"train": [], "evaluate": []}
        self.cfg, self._raw = _settings(rounds, population, clip_norm, privacy, sampling, filter, optimizer)
        if self.cfg.sampling.scheme == "fixed":
            raise FedsimError("sampling.scheme = 'fixed' needs exactly N nodes every round; use 'poisson'")
        if self.cfg.filter.name == "disk" and getattr(self.cfg.filter, "mode", "") == "two_point":
            raise FedsimError(
                "filter disk with mode = 'two_point' needs every node to train twice (fedsim's own clients "
                "do); use mode = 'lookahead' (nodes train once, from x_t + γ·d_{t−1}) or 'ema'"
            )
        self.population, self.clipping, self.side_statistics = int(population), clipping, bool(side_statistics)
        self.census = Census(identity)
        self.key = PrivacyKey.generate() if key is None else PrivacyKey.from_seed(int(key))
        self.out = None if out is None else Path(out)
        self._prep: Prepared = prepare_without_data(self.cfg, self.population, torch.zeros(0))
        self.server: DPServer | None = None
        self.layout: Layout | None = None
        self._pending: dict[str, Any] | None = None
        self._round_state: dict[str, Any] = {}
        self.last_arrays: ArrayRecord | None = None
        self._planned: float | None = None
        #: (Flower round, noise rounds done before it) of each round the wrapped strategy skipped.
        self.skipped: list[tuple[int, int]] = []
        #: writes the noise stream's state behind each checkpoint (out= with fedsim's own stream).
        self._noise_file: NoiseFile | None = None
        self._notes = _population_notes(self.population, float(self.spec.delta))
        for note in self._notes:
            log(WARNING, "UserLevelDP: %s", note)
        self._start_folder(resume)
        self._ready = True

    # -- the wrapped strategy's attributes --------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        """The wrapped strategy's attributes and methods (what the wrapper does not define itself),
        except those of a sampling, clipping or noise it replaces (`WITHHELD`)."""
        inner = self.__dict__.get("strategy")
        if inner is None or name.startswith("__"):
            raise AttributeError(name)
        if name in WITHHELD:
            raise AttributeError(
                f"UserLevelDP does not pass on {name!r}: its own sampler, clipping and noise replace the wrapped "
                f"strategy's (read dp.strategy.{name} for the unused value)"
            )
        return getattr(inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        """After construction, an attribute the wrapper does not have is set on the wrapped strategy
        (`dp.save_path = …` reaches the strategy whose start() reads it)."""
        mine = name in self.__dict__ or hasattr(type(self), name) or "_ready" not in self.__dict__
        if mine:
            object.__setattr__(self, name, value)
        elif name in WITHHELD:
            raise AttributeError(f"UserLevelDP does not pass on {name!r}: its own sampler, clipping and noise apply")
        else:
            setattr(self.strategy, name, value)

    # -- settings and files ---------------------------------------------------------------

    @property
    def spec(self) -> Any:
        """The accounting spec (`z` after calibration, `δ`, the scheme's constants)."""
        return self._prep.spec

    @property
    def neighboring_relation(self) -> str:
        """The neighbouring relation ε is stated for, as the sampler enforces it."""
        return str(self.spec.neighboring_relation)

    def planned_epsilon(self) -> float:
        """ε after all `rounds` rounds (from dp-accounting), known before round 1 (computed once:
        a PLD composition takes a fraction of a second)."""
        if self._planned is None:
            self._planned = float(epsilon(self.spec, self.cfg.rounds))
        return self._planned

    def _start_folder(self, resume: bool) -> None:
        if self.out is None:
            if resume:
                raise FedsimError("resume=True needs out=, the folder of the run to resume")
            return
        ckpt = self.out / "checkpoint"
        if resume:
            state = load_with_noise(ckpt)
            self._check_same_settings(state)
            self._take(state)
            return
        if (ckpt / "checkpoint.pt").exists():
            raise FedsimError(f"{self.out} already holds a run; pass resume=True to continue it, or choose another out")
        self.out.mkdir(parents=True, exist_ok=True)
        head = (
            f"# UserLevelDP's settings: `fedsim privacy config.toml --population {self.population} --json` "
            "gives the ledger's epsilon, z and sensitivity_in_c\n"
        )
        (self.out / "config.toml").write_text(head + tomli_w.dumps(self._raw), encoding="utf-8")

    def _check_same_settings(self, state: dict[str, Any]) -> None:
        before = state["settings"]
        now = self.cfg.model_dump(mode="json")
        changed = [k for k in _FIXED_ON_RESUME if before.get(k) != now.get(k)]
        if changed or state["population"] != self.population:
            what = ", ".join(changed + ([] if state["population"] == self.population else ["population"]))
            raise FedsimError(f"resume with other privacy settings ({what}); the checkpoint's ε would not hold")

    def _write(self) -> None:
        """Ledger and checkpoint, before the round's model is returned. With fedsim's own
        in-order noise stream, the checkpoint holds the stream's position, and its state goes to
        `noise.pt` in the background once this returns (fedsim.noise_file)."""
        if self.out is None or self.server is None:
            return
        behind = self._noise_file is not None
        save_checkpoint(self.out / "checkpoint", self._state(noise_state=not behind))
        tmp = self.out / ".ledger.json.tmp"
        tmp.write_text(json.dumps(self.ledger_json(), indent=1), encoding="utf-8")
        os.replace(tmp, self.out / "ledger.json")
        if self._noise_file is not None:
            self._noise_file.write_behind(self.server.noise)

    def flush(self) -> None:
        """Wait until the noise stream's state is on disk (with `out=`; the checkpoint itself
        always is when a round's model is returned). Raises the write's error, if it failed.
        `start()` calls it before it returns."""
        if self._noise_file is not None:
            self._noise_file.wait()

    def ledger_json(self) -> dict[str, Any]:
        """What `out/ledger.json` holds: the ledger, its notes (small N, skipped rounds) and, as
        `fedsim privacy --json` states them, the noise's `sensitivity_in_c` (`sens(C)` for MF
        noise; the spec's own field is one round's sum, the DP event's) and `sensitivity_exact`."""
        if self.server is None:
            raise FedsimError("the ledger exists once the model is known (after the first configure_train)")
        self.server.ledger.notes = self._notes + [
            f"Flower round {r} (after {t} noise rounds) was skipped by the wrapped strategy: no node trained, "
            "no noise row was used, nothing was accounted"
            for r, t in self.skipped
        ]
        out = self.server.ledger.to_json()
        plan = self._prep.plan
        out["sensitivity_in_c"] = self.spec.sensitivity_in_c if plan is None else plan.sens
        out["sensitivity_exact"] = True if plan is None else plan.sens_exact
        return out

    # -- state ----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything a resume needs: the DP server (noise stream position and state, filter,
        optimizer, ledger, and `x`, whose floats are the last model the wrapper handed on), the
        privacy key (a secret: protect it like one), the identities seen, that model's array
        names, shapes, dtypes and non-floating arrays (its floats are not stored twice), the
        skipped rounds and the settings."""
        return self._state(noise_state=True)

    def _state(self, noise_state: bool) -> dict[str, Any]:
        """`state_dict`; with `noise_state` False, the noise stream's position only."""
        pending = None if self._pending is None else self._pending["server"]
        return {
            "format": "fedsim.flower/2",
            "settings": self.cfg.model_dump(mode="json"),
            "population": self.population,
            "key": self.key.state_dict(),
            "server": pending if self.server is None else self.server.state_dict(noise_state),
            "census": self.census.state_dict(),
            "published": None if self.last_arrays is None else _published_frame(self.last_arrays),
            "skipped": [list(x) for x in self.skipped],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict`'s output (applied when the model's size is known: at once if
        a round already ran, else at the first `configure_train`)."""
        self._check_same_settings(state)
        self._take(state)
        if self.server is not None:
            self._apply_pending()

    def _take(self, state: dict[str, Any]) -> None:
        """Keep `state` for `_apply_pending`; the key and the last model at once."""
        self._pending = state
        self.key = PrivacyKey.from_state_dict(state["key"])
        self.skipped = [(int(r), int(t)) for r, t in state.get("skipped", [])]
        if state.get("last_arrays") is not None:  # format 1: the model itself
            self.last_arrays = ArrayRecord({k: Array(v) for k, v in zip(state["last_names"], state["last_arrays"])})
        elif state.get("published") is not None and state["server"] is not None:  # format 2: its floats are x
            self.last_arrays = _from_frame(state["published"], state["server"]["params"])

    def _apply_pending(self) -> None:
        state, self._pending = self._pending, None
        assert state is not None and self.server is not None
        self.flush()  # the stream's state is about to change
        if state["server"] is not None:
            if state["server"]["params"].numel() != self.server.params.numel():
                raise FedsimError("the checkpoint's model has another size than the broadcast model")
            self.server.load_state_dict(state["server"])
            if self._noise_file is not None:  # noise.pt is the state just loaded, not the one before
                self._noise_file.write(self.server.noise)
        self.census.load_state_dict(state["census"])

    @property
    def rounds_done(self) -> int:
        """Rounds whose noise was added (and accounted)."""
        if self.server is not None:
            return self.server.round
        return 0 if self._pending is None or self._pending["server"] is None else int(self._pending["server"]["round"])

    def resume_arrays(self) -> ArrayRecord:
        """The last model this wrapper published (restored by a resume): pass it to
        `start(initial_arrays=…)` to continue where the run stopped."""
        if self.last_arrays is None:
            raise FedsimError("no round has been published yet; start from the app's initial model")
        return self.last_arrays

    @property
    def epsilon(self) -> float:
        """ε spent so far (0 before round 1)."""
        return 0.0 if self.server is None else self.server.ledger.epsilon

    # -- Flower's Strategy ----------------------------------------------------------------

    def summary(self) -> None:
        spec = self.spec
        log(INFO, "\t├──> fedsim user-level DP (one node = one user):")
        log(INFO, "\t│\t├── mechanism %s, z = %.4g, c = %g, K̄ = %g", spec.mechanism, spec.noise_multiplier,
            self.cfg.client.clip_norm, spec.cohort_size)  # fmt: skip
        log(INFO, "\t│\t├── scheme %s over N = %d, identity %s", spec.scheme, spec.population, self.census.source)
        log(INFO, "\t│\t└── ε = %.4g at δ = %.3g after %d rounds, for %s", self.planned_epsilon(), spec.delta,
            self.cfg.rounds, self.neighboring_relation)  # fmt: skip
        if not self.side_statistics:
            log(INFO, "\t│\t    (clients' metrics withheld and federated evaluation skipped: side_statistics=False)")
        self.strategy.summary()

    def _build(self, arrays: ArrayRecord) -> None:
        self.layout = Layout.of(arrays)
        flat = self.layout.flatten(arrays)
        assert flat is not None  # a record always fits its own layout
        x0 = torch.from_numpy(flat)
        self._prep = replace(self._prep, x0=x0, num_params=int(x0.numel()))
        self.server, _ = dp_server(self.cfg, self._prep, self.key, torch.device("cpu"), [])
        if self._pending is not None:
            self._apply_pending()
        if self.out is not None and writes_behind(self.server.noise):
            self._noise_file = NoiseFile(self.out / "checkpoint")
            self._noise_file.write(self.server.noise)  # round 0's (a few bytes), or the resumed round's

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
        **kwargs: Any,
    ) -> Result:
        """Run the wrapped strategy's own `start()` (Flower's, or the app's override with its
        results files, checkpoints and loggers) with the wrapper's rounds.

        The strategy's `start()` runs on a driver that shares the strategy's attributes and whose
        `configure_train`, `aggregate_train`, `configure_evaluate`, `aggregate_evaluate` and
        `summary` are the wrapper's (fedsim.flower.driver). It sees a grid that sends only the
        wrapper's messages and returns the train replies sealed. Parameters are Flower's
        `Strategy.start`'s; other keyword arguments go to the strategy's own `start()`.
        """
        refuse_unsafe(self.strategy)  # again: the strategy may have changed since it was wrapped
        start = type(self.strategy).start
        try:
            result = start(self._driver, GuardedGrid(real_grid(grid), self._outbox), initial_arrays,
                           num_rounds=num_rounds, timeout=timeout, train_config=train_config,
                           evaluate_config=evaluate_config, evaluate_fn=evaluate_fn, **kwargs)  # fmt: skip
        except BaseException:
            try:
                self.flush()
            except Exception as e:  # the run's own error is the one raised
                log(WARNING, "UserLevelDP: writing the noise state also failed: %s", e)
            raise
        self.flush()
        return result

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Ask the wrapped strategy for its train messages, then send each node that fedsim's
        sampler picks for this round (none of the wrapped strategy's own choice) the message the
        strategy made for that node (or its one message for all). A round for which the strategy
        makes no message is skipped: no node trains and no noise row is used."""
        grid = real_grid(grid)
        if self.server is None:
            self._build(arrays)
        assert self.server is not None and self.layout is not None
        t = self.server.round
        if t >= self.cfg.rounds:
            raise FedsimError(f"the guarantee covers {self.cfg.rounds} rounds, and all have run; rounds= sets more")
        x_t = self.layout.flatten(arrays)
        if x_t is None:
            raise FedsimError("the wrapped strategy changed the model's layout between rounds")
        self._outbox["train"] = []
        inner = list(self.strategy.configure_train(server_round, arrays, config, GuardedGrid(grid, {})))
        if not inner:
            log(INFO, "round %d: the wrapped strategy configured no training: skipped (no node trains, no noise "
                "row is used)", server_round)  # fmt: skip
            self._round_state = {"skip": (server_round, t)}
            return []
        nodes = self.census.update(grid, list(grid.get_node_ids()), self.population)
        ids = sorted(nodes)
        sampler = make_sampler(self._prep.scheme, self.key.derive("sampling"), ids)
        chosen = [nodes[ids[i]] for i in sampler.sample(t)]
        contents = _node_contents(inner, chosen)
        x_ref, model = x_t, None
        if self.server.track_step:  # DiSK look-ahead: the nodes train from y_t = x_t + γ·d_{t−1}
            assert self.server.last_step is not None
            x_ref = (torch.from_numpy(x_t) + self.server.filter.gamma * self.server.last_step).numpy()
            model = self.layout.unflatten(x_ref, arrays)
        messages = self._messages(contents, model, server_round)
        self._log_choice(server_round, len(chosen), len(messages))
        self._round_state = {"t": t, "messages": messages, "x_t": x_t, "x_ref": x_ref, "arrays": arrays,
                             "chosen": len(chosen), "unconfigured": len(chosen) - len(messages)}  # fmt: skip
        self._outbox["train"] = list(messages)
        self.server.prefetch_noise()
        return messages

    def _messages(self, contents: dict[int, RecordDict], model: ArrayRecord | None, server_round: int) -> list[Message]:
        """One train message per node of `contents`: its content, with the look-ahead model
        `model` (DiSK) and the clip norm (client clipping) put in."""
        assert self.server is not None
        done: dict[int, RecordDict] = {}
        out = []
        for node, content in contents.items():
            if id(content) not in done:
                c = content if model is None else _with_arrays(content, model)
                done[id(content)] = _with_clip_norm(c, self.server.clip_norm) if self.clipping == "client" else c
            out.append(Message(done[id(content)], dst_node_id=node, message_type=MessageType.TRAIN,
                               group_id=str(server_round)))  # fmt: skip
        return out

    def _log_choice(self, server_round: int, chosen: int, configured: int) -> None:
        if chosen == 0:
            log(WARNING, "round %d: the sampler chose no node (%s over N = %d): this round's model moves by noise "
                "alone", server_round, self.spec.scheme, self.population)  # fmt: skip
        elif configured < chosen:
            log(WARNING, "round %d: the wrapped strategy made per-node messages but none for %d of the %d sampled "
                "nodes: they do not train this round (let it address every node, e.g. fraction_train=1.0)",
                server_round, chosen - configured, chosen)  # fmt: skip

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Clip, sum, add the noise row, divide by `K̄`, filter and step; hand only that to the
        wrapped strategy. A skipped round is recorded (ledger note, checkpoint) and hands on
        nothing. A round in which no sampled node's update could be used stops the run."""
        st, self._round_state = self._round_state, {}
        if not st or self.server is None or self.layout is None:
            raise FedsimError("aggregate_train without configure_train: call Strategy.start, or both in order")
        if "skip" in st:
            self.skipped.append(st["skip"])
            self._write()
            return None, None
        sent = {m.metadata.message_id: m.metadata.dst_node_id for m in st["messages"]}
        agg = UpdateAggregator(self.layout.dim, self.server.clip_norm)
        screen_and_sum(unseal(replies), sent, self.layout, st["x_ref"], agg)  # Δ_i from the model the nodes got
        for _ in range(st["unconfigured"]):
            agg.drop("missing", 1)
        _report_drops(server_round, agg, st["chosen"])
        self.server.params = torch.from_numpy(st["x_t"]).clone()
        self.flush()  # the last round's noise state is on disk before the stream steps
        eps = self.server.step(agg.total, agg.accepted_users)
        noised = self.layout.unflatten(self.server.params, st["arrays"])
        self.last_arrays = noised
        self._write()  # saved before it leaves the server
        weight_key = str(getattr(self.strategy, "weighted_by_key", "num-examples"))
        reply = Message(
            RecordDict({"arrays": noised, "metrics": MetricRecord({weight_key: 1})}),
            dst_node_id=0,
            message_type=MessageType.TRAIN,
            group_id=str(server_round),
        )
        arrays, _ = self.strategy.aggregate_train(server_round, [reply])
        metrics = MetricRecord({"dp-epsilon": self.server.ledger.epsilon if eps is None else eps})
        if self.side_statistics:
            metrics["dp-accepted"] = agg.accepted_users
            metrics["dp-server-clipped"] = agg.server_clipped
            for reason, n in agg.drop_counts().items():
                if n:
                    metrics[f"dp-dropped-{reason}"] = n
        if agg.server_clipped and self.clipping == "client" and self.side_statistics:
            log(WARNING, "round %d: %d replies exceeded c although nodes clip", server_round, agg.server_clipped)
        return arrays, metrics

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The wrapped strategy's federated evaluation with `side_statistics`; none without."""
        self._outbox["evaluate"] = []
        if not self.side_statistics:
            return []
        messages = list(
            self.strategy.configure_evaluate(server_round, arrays, config, GuardedGrid(real_grid(grid), {}))
        )
        self._outbox["evaluate"] = list(messages)
        return messages

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        if not self.side_statistics:
            return None
        return self.strategy.aggregate_evaluate(server_round, unseal(replies))


def _published_frame(record: ArrayRecord) -> dict[str, Any]:
    """What the checkpoint keeps of the published model besides its floats, which are the DP
    server's `x` (saved once): each array's name, shape and dtype, and the non-floating arrays."""
    layout = Layout(
        tuple(record.keys()),
        tuple(tuple(a.shape) for a in record.values()),
        tuple(np.dtype(a.dtype) for a in record.values()),
        tuple(bool(np.issubdtype(np.dtype(a.dtype), np.floating)) for a in record.values()),
    )
    fixed = [a.numpy() for a, f in zip(record.values(), layout.floating) if not f]
    return {"names": list(layout.names), "shapes": [list(x) for x in layout.shapes],
            "dtypes": [d.str for d in layout.dtypes], "floating": list(layout.floating), "fixed": fixed}  # fmt: skip


def _from_frame(frame: dict[str, Any], params: torch.Tensor) -> ArrayRecord:
    """The published model from `_published_frame`'s output and the server's `x`."""
    layout = Layout(tuple(frame["names"]), tuple(tuple(x) for x in frame["shapes"]),
                    tuple(np.dtype(d) for d in frame["dtypes"]), tuple(frame["floating"]))  # fmt: skip
    fixed = iter(frame["fixed"])
    like = ArrayRecord(
        {n: Array(np.zeros(0, np.float32) if f else next(fixed)) for n, f in zip(layout.names, layout.floating)}
    )
    return layout.unflatten(params, like)


def _same_content(a: RecordDict, b: RecordDict) -> bool:
    """Whether two message contents are the same (one object, or equal records)."""
    if a is b:
        return True
    if list(a.keys()) != list(b.keys()):
        return False
    for name, ra in a.items():
        rb = b[name]
        if ra is rb:
            continue
        if isinstance(ra, ArrayRecord) and isinstance(rb, ArrayRecord):
            if list(ra.keys()) != list(rb.keys()) or not all(
                np.array_equal(ra[k].numpy(), rb[k].numpy()) for k in ra.keys()
            ):
                return False
        elif type(ra) is not type(rb) or dict(ra) != dict(rb):
            return False
    return True


def _node_contents(inner: list[Message], chosen: list[int]) -> dict[int, RecordDict]:
    """Each chosen node's content: the wrapped strategy's message to that node, else its one
    content for all (when all its messages carry the same); chosen nodes it gave per-node
    messages but none of their own are left out."""
    own: dict[int, RecordDict] = {}
    for m in inner:
        own.setdefault(m.metadata.dst_node_id, m.content)
    common = inner[0].content if all(_same_content(m.content, inner[0].content) for m in inner[1:]) else None
    out = {}
    for node in chosen:
        content = own.get(node, common)
        if content is not None:
            out[node] = content
    return out


def _report_drops(server_round: int, agg: UpdateAggregator, chosen: int) -> None:
    """A WARNING line when replies were dropped (with the reasons); a stop when the round has
    sampled nodes but no usable update (nothing is published, no noise row is used)."""
    reasons = ", ".join(f"{r} {n}" for r, n in agg.drop_counts().items() if n)
    if chosen and agg.accepted_users == 0:
        raise FedsimError(
            f"round {server_round}: no sampled node's update could be used ({reasons}); the run stops before "
            "publishing a model of noise alone (no noise row used): fix the ClientApp, then resume"
        )
    if reasons:
        log(WARNING, "round %d: replies dropped (%s); they count as zero updates", server_round, reasons)


def _with_arrays(content: RecordDict, model: ArrayRecord) -> RecordDict:
    """`content` with its (one) model record replaced by `model`."""
    out = RecordDict()
    for name, rec in content.items():
        out[name] = model if isinstance(rec, ArrayRecord) else rec
    return out


def _with_clip_norm(content: RecordDict, clip_norm: float) -> RecordDict:
    """`content` with `fedsim.clip-norm` added to its (one) config record."""
    out = RecordDict()
    for name, rec in content.items():
        if isinstance(rec, ConfigRecord):
            rec = ConfigRecord({**dict(rec), KEY_CLIP_NORM: float(clip_norm)})
        out[name] = rec
    if not content.config_records:
        out["config"] = ConfigRecord({KEY_CLIP_NORM: float(clip_norm)})
    return out


def noise_std_of_mean(dp: UserLevelDP) -> float:
    """`c·z·sens/K̄`: the per-coordinate std of the noise in one round's noised mean."""
    if dp.server is None:
        raise FedsimError("the noise scale is known once the model is (after the first configure_train)")
    return float(dp.server.noise_std / dp.server.expected_cohort)


__all__ = ["UserLevelDP", "noise_std_of_mean"]
