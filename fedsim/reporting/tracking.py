"""Optional experiment tracking: a run's metrics in TensorBoard or a local MLflow store.

fedsim's own record of a run is its folder (``config.toml``, ``metrics.jsonl``, ``ledger.json``,
``summary.json``); a tracker copies the same numbers into a tool the user already has:

- :class:`TensorBoardTracker` writes every numeric value of every metrics row as a scalar
  (tag = the key, nested dicts flattened with ``/``; step = the round) into
  ``<run folder>/tensorboard/``: ``tensorboard --logdir runs/`` shows every run.
- :class:`MLflowTracker` logs into a **local** ``file:`` store only (fedsim sends nothing over
  the network): one run per fedsim run in an experiment named after ``name`` in the config,
  the flattened config as params (dotted keys), the rows as metrics (step = the round), and at
  :meth:`~MLflowTracker.finish` the run folder's public files as artifacts.

Lifecycle (the runner's side): :meth:`Tracker.start` once the run folder holds ``config.toml``
(and, on ``--resume``, after ``metrics.jsonl`` was cut back to the checkpoint);
:meth:`Tracker.log_row` with every *published* metrics row (:func:`fedsim.reporting.metrics.public_row`,
applied again here from ``privacy.publish_side_statistics`` as a second line of defence);
:meth:`Tracker.finish` at the end with the summary, or with no summary after an interruption
or a failure (it is idempotent).

Resuming: each tracker keeps its state in ``<run folder>/tracking.json`` (rewritten atomically
after every row), so a new tracker object on the same folder continues the same TensorBoard
log and the same MLflow run. Rows already in ``metrics.jsonl`` that a tracker has not logged
(it was enabled only on resume, or the process died between the two writes) are logged at
:meth:`~Tracker.start`. Rows after the checkpoint that a resumed run recomputes are purged and
rewritten in TensorBoard (``purge_step``); MLflow cannot delete metric points, so those rounds
keep the values logged before the interruption (the recomputation is bit-identical except
for ``seconds``).

``tensorboard`` and ``mlflow`` (``mlflow-skinny`` suffices) are imported only inside the
trackers: fedsim imports without them (``pip install 'fedsim[tracking]'`` adds them). This
module imports neither Flower nor Ray.
"""

from __future__ import annotations

import importlib.util
import json
import numbers
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable
from urllib.parse import unquote, urlparse

from fedsim.errors import FedsimError
from fedsim.reporting.metrics import public_row

#: The file in the run folder holding each tracker's state (MLflow run id, last round logged).
STATE_FILE = "tracking.json"
#: The run folder's files uploaded as MLflow artifacts. An allow-list on purpose: the
#: ``checkpoint/`` folder is never uploaded (it holds the secret noise and sampler seeds).
ARTIFACT_FILES = ("config.toml", "metrics.jsonl", "ledger.json", "summary.json")
#: Folders of the run folder uploaded whole (the plots drawn from ``metrics.jsonl``).
ARTIFACT_DIRS = ("plots",)
#: The statuses a tracker's run can end with (MLflow's names).
STATUSES = ("FINISHED", "KILLED", "FAILED")
#: Where to get the optional packages.
INSTALL_HINT = "install fedsim[tracking] (pip install 'fedsim[tracking]')"
_MLFLOW_MAX_PARAM = 6000  # MLflow's longest param value
_MLFLOW_KEY_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-. :/")


@runtime_checkable
class Tracker(Protocol):
    """What the runner calls; see the module docstring for when."""

    #: short name used in messages and as the section of ``tracking.json``
    name: str

    def start(self, run_dir: str | Path, config: Mapping[str, Any], params: Mapping[str, Any] | None = None) -> None:
        """Open (or, on resume, reopen) the tracker's run for the run folder ``run_dir``."""
        ...

    def log_row(self, row: Mapping[str, Any]) -> None:
        """Log one metrics row (its ``round`` is the step)."""
        ...

    def finish(self, summary: Mapping[str, Any] | None = None, status: str | None = None) -> None:
        """Close the tracker's run; safe to call twice, and without :meth:`start`."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """The state a resumed tracker needs (what ``tracking.json`` holds for it)."""
        ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Use ``state`` instead of ``tracking.json`` at the next :meth:`start`."""
        ...


# --------------------------------------------------------------------------------------------
# helpers


def flatten(d: Mapping[str, Any], sep: str = "/", prefix: str = "") -> dict[str, Any]:
    """``d`` with nested mappings flattened into one level.

    Parameters
    ----------
    d : the (possibly nested) mapping.
    sep : separator between the levels of a key (default ``"/"``; the config uses ``"."``).
    prefix : prepended to every key (default none).
    """
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, sep, key + sep))
        else:
            out[key] = v
    return out


def numeric_items(d: Mapping[str, Any], skip: Iterable[str] = ()) -> dict[str, float]:
    """The numeric leaves of ``d`` (flattened with ``/``) as floats.

    ``None`` and non-numeric values (strings, lists) are left out; booleans become 0/1; the
    string ``"inf"``/``"-inf"`` that ``metrics.jsonl`` writes for an infinite value is read back
    as ±∞.

    Parameters
    ----------
    d : a metrics row or a summary.
    skip : top-level keys to leave out (default none; rows skip ``round``, their step).
    """
    skipped = set(skip)
    out: dict[str, float] = {}
    for key, v in flatten({k: v for k, v in d.items() if k not in skipped}).items():
        if isinstance(v, numbers.Real):
            out[key] = float(v)
        elif isinstance(v, str) and v in ("inf", "-inf"):
            out[key] = float(v)
    return out


def read_state(run_dir: Path) -> dict[str, Any]:
    """The contents of ``run_dir/tracking.json`` (``{}`` when there is none).

    Parameters
    ----------
    run_dir : the run folder.
    """
    path = run_dir / STATE_FILE
    if not path.exists():
        return {}
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise FedsimError(f"{path} is unreadable ({e}); delete it to start the trackers afresh") from None
    if not isinstance(state, dict):
        raise FedsimError(f"{path} is not a JSON object; delete it to start the trackers afresh")
    return state


def write_state(run_dir: Path, section: str, value: Mapping[str, Any]) -> None:
    """Replace ``section`` of ``run_dir/tracking.json`` with ``value`` (atomically).

    Parameters
    ----------
    run_dir : the run folder. section : the tracker's name. value : its state (JSON-able).
    """
    state = read_state(run_dir)
    state["format"] = "fedsim.tracking/1"  # a format name, not a module path: unchanged so old folders resume
    state[section] = dict(value)
    tmp = run_dir / f".{STATE_FILE}.tmp"
    tmp.write_text(json.dumps(state, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, run_dir / STATE_FILE)


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a ``metrics.jsonl`` (``[]`` when it does not exist).

    Parameters
    ----------
    path : the file.
    """
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(ln) for ln in lines if ln.strip()]


def _step(row: Mapping[str, Any]) -> int:
    """The round of a metrics row (its step); ``ValueError`` when it has none."""
    r = row.get("round")
    if not isinstance(r, numbers.Integral) or isinstance(r, bool):
        raise ValueError(f"a metrics row needs an integer 'round' (got {r!r})")
    return int(r)


# --------------------------------------------------------------------------------------------
# the shared part


class BaseTracker(ABC):
    """State, resume and row handling shared by the trackers; subclasses write the values.

    A subclass sets :attr:`name` and implements ``_open`` (after the state is loaded; returns
    the last round already logged that is to be kept), ``_write(step, scalars)`` and
    ``_close(summary, status)``.
    """

    name: str = "tracker"

    def __init__(self) -> None:
        self.run_dir: Path | None = None
        self._state: dict[str, Any] = {}
        self._state_given = False
        self._publish = True
        self._active = False

    @property
    def last_round(self) -> int:
        """The last round this tracker logged (0: none)."""
        return int(self._state.get("last_round", 0))

    @property
    def active(self) -> bool:
        """Whether :meth:`start` was called and :meth:`finish` not yet."""
        return self._active

    def state_dict(self) -> dict[str, Any]:
        """The state ``tracking.json`` holds for this tracker (a copy)."""
        return dict(self._state)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Start from ``state`` (from :meth:`state_dict`) instead of ``tracking.json``.

        Parameters
        ----------
        state : what :meth:`state_dict` returned; must be called before :meth:`start`.
        """
        if self._active:
            raise RuntimeError(f"{self.name}: load_state_dict() comes before start()")
        self._state = dict(state)
        self._state_given = True

    def start(self, run_dir: str | Path, config: Mapping[str, Any], params: Mapping[str, Any] | None = None) -> None:
        """Open the tracker's run for ``run_dir``, or reopen it on resume.

        Parameters
        ----------
        run_dir : the run folder (must exist).
        config : the resolved config as a nested dict (``Config.model_dump(mode="json")``);
            ``name`` names the MLflow experiment, ``privacy.publish_side_statistics`` (default
            true) whether side statistics are logged.
        params : further facts about the run to log with the config, e.g. the noise
            multiplier or the fedsim version (default none). Flattened with ``.``.
        """
        if self._active:
            raise RuntimeError(f"{self.name}: start() called twice")
        self.run_dir = Path(run_dir)
        if not self.run_dir.is_dir():
            raise FedsimError(f"run folder {self.run_dir} does not exist")
        if not self._state_given:
            self._state = dict(read_state(self.run_dir).get(self.name, {}))
        privacy = config.get("privacy")
        self._publish = bool(privacy.get("publish_side_statistics", True)) if isinstance(privacy, Mapping) else True
        done = read_rows(self.run_dir / "metrics.jsonl")
        kept = self._open(config, dict(params or {}), max((_step(r) for r in done), default=0))
        self._state["last_round"] = kept
        self._state.pop("status", None)
        self._active = True
        self._save()
        for row in done:
            self.log_row(row)

    def log_row(self, row: Mapping[str, Any]) -> None:
        """Log the numeric values of a metrics row at step ``row["round"]``.

        Rows of rounds already logged are skipped (a resumed run recomputes them).

        Parameters
        ----------
        row : one metrics row as written to ``metrics.jsonl``; nested dicts are flattened
            with ``/``, ``None`` and non-numeric values skipped.
        """
        if not self._active:
            raise RuntimeError(f"{self.name}: start() comes before log_row()")
        step = _step(row)
        if step <= self.last_round:
            return
        scalars = numeric_items(public_row(dict(row), self._publish), skip=("round",))
        self._write(step, scalars)
        self._state["last_round"] = step
        self._save()

    def finish(self, summary: Mapping[str, Any] | None = None, status: str | None = None) -> None:
        """Close the run: final numbers, artifacts, status. Idempotent; a no-op before start.

        Parameters
        ----------
        summary : the run's ``summary.json`` (default none: the run did not complete).
        status : ``"FINISHED"``, ``"KILLED"`` (interrupted) or ``"FAILED"`` (default:
            ``FINISHED`` with a summary, ``KILLED`` without).
        """
        if not self._active:
            return
        status = status or ("FINISHED" if summary is not None else "KILLED")
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, not {status!r}")
        self._active = False
        try:
            self._close(summary, status)
        finally:
            self._state["status"] = status
            self._save()

    def _save(self) -> None:
        assert self.run_dir is not None
        write_state(self.run_dir, self.name, self._state)

    # subclass hooks
    @abstractmethod
    def _open(self, config: Mapping[str, Any], params: dict[str, Any], done: int) -> int:
        """Open the backend's run; return how many rounds it already holds."""

    @abstractmethod
    def _write(self, step: int, scalars: dict[str, float]) -> None:
        """Write one round's scalars at ``step``."""

    @abstractmethod
    def _close(self, summary: Mapping[str, Any] | None, status: str) -> None:
        """Close the backend's run with ``status``."""


# --------------------------------------------------------------------------------------------
# TensorBoard


class TensorBoardTracker(BaseTracker):
    """Every numeric value of every row as a TensorBoard scalar in ``<run_dir>/tensorboard/``.

    Tags are the row's keys (nested dicts flattened with ``/``, e.g. ``drop_reasons/stale``),
    the step is the round; values are stored as float32, TensorBoard's scalar type (ε and δ
    rounded up to the next float32, never down). At start
    the config is written as text (tab "Text"); at finish the summary's numbers as scalars
    ``summary/<key>`` at the last round, and the summary as text. Each row is flushed to disk
    at once. On resume the rows after the last kept round are purged (TensorBoard's
    ``purge_step``) and written again as the resumed run recomputes them.

    Parameters
    ----------
    subdir : the folder inside the run folder (default ``"tensorboard"``).
    """

    name: str = "tensorboard"

    def __init__(self, subdir: str = "tensorboard") -> None:
        super().__init__()
        self.subdir = subdir
        self._writer: Any = None

    @property
    def log_dir(self) -> Path:
        """``<run_dir>/<subdir>`` (after :meth:`start`)."""
        assert self.run_dir is not None, "start() first"
        return self.run_dir / self.subdir

    def _open(self, config: Mapping[str, Any], params: dict[str, Any], done: int) -> int:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise FedsimError(f"TensorBoard tracking needs the 'tensorboard' package ({e}); {INSTALL_HINT}") from None
        kept = min(self.last_round, done)
        had_events = self.log_dir.is_dir() and any(self.log_dir.iterdir())
        resuming = kept > 0 or had_events or done > 0
        self._writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=kept + 1 if resuming else None)
        if not resuming:
            text = json.dumps({"config": dict(config), **({"params": params} if params else {})}, indent=1, default=str)
            self._writer.add_text("config", _code_block(text), global_step=0)
            self._writer.flush()
        return kept

    def _write(self, step: int, scalars: dict[str, float]) -> None:
        for tag, value in scalars.items():
            self._writer.add_scalar(tag, _stored(tag, value), global_step=step)
        self._writer.flush()

    def _close(self, summary: Mapping[str, Any] | None, status: str) -> None:
        writer, self._writer = self._writer, None
        try:
            if summary is not None:
                for tag, value in numeric_items(summary).items():
                    writer.add_scalar(f"summary/{tag}", _stored(tag, value), global_step=self.last_round)
                writer.add_text(
                    "summary", _code_block(json.dumps(dict(summary), indent=1, default=str)), self.last_round
                )
        finally:
            writer.close()


def _stored(tag: str, value: float) -> float:
    """What a float32 scalar store keeps of ``value``: an ε or δ (tags naming ``epsilon`` or
    ``delta``) goes up to the least float32 not below it, so the log never shows a smaller ε or
    δ than was accounted; other values as TensorBoard rounds them."""
    name = tag.rsplit("/", 1)[-1]
    if "epsilon" in name or name == "delta":
        from fedsim.privacy.display import epsilon_float32

        return epsilon_float32(value)
    return value


def _code_block(text: str) -> str:
    """``text`` as a Markdown code block (TensorBoard renders text summaries as Markdown)."""
    return "\n".join("    " + ln for ln in text.splitlines())


# --------------------------------------------------------------------------------------------
# MLflow


def local_store_uri(uri: str) -> str:
    """The absolute ``file:`` URI of a local MLflow store, or :class:`FedsimError`.

    Parameters
    ----------
    uri : ``file:./mlruns``, ``file:/abs/path`` or ``file:///abs/path`` (a relative path is
        taken from the current directory). Any other scheme (``http:``, ``databricks``,
        ``sqlite:``…) or a ``file://host/…`` is refused: fedsim logs to a local folder only.
    """
    parsed = urlparse(uri)
    if parsed.scheme != "file" or parsed.netloc not in ("", "localhost") or not parsed.path:
        raise FedsimError(
            f"MLflow tracking URI {uri!r} is not a local store: fedsim logs only to a local 'file:' "
            f"store, e.g. file:./mlruns or file:///abs/path/mlruns"
        )
    path = Path(unquote(parsed.path)).expanduser().resolve()
    if path.exists() and not path.is_dir():
        raise FedsimError(f"MLflow store {path} is a file, not a folder; choose a folder path")
    return path.as_uri()


def _mlflow_key(key: str) -> str:
    """``key`` with the characters MLflow refuses in names replaced by ``_``."""
    return "".join(c if c in _MLFLOW_KEY_CHARS else "_" for c in key)


def _param_value(v: Any) -> str:
    """A config value as an MLflow param: strings as they are, the rest as JSON, cut to MLflow's limit."""
    text = v if isinstance(v, str) else json.dumps(v, default=str)
    return text[:_MLFLOW_MAX_PARAM]


class MLflowTracker(BaseTracker):
    """The run as an MLflow run in a local ``file:`` store.

    One MLflow run per fedsim run, in the experiment named after the config's ``name``
    (created when missing), named after the run folder and tagged ``fedsim.run_dir``. Params:
    the config flattened with dotted keys (``privacy.target_epsilon``) plus ``params``; values
    that are not strings are JSON (``null``, ``true``, lists). Metrics: every numeric value of
    every row (step = the round; nested keys joined with ``/``); at finish the summary's
    numbers as ``summary/<key>`` at the last round. Artifacts, at finish (also after an
    interruption): ``config.toml``, ``metrics.jsonl``, ``ledger.json``, ``summary.json`` and
    ``plots/`` — never ``checkpoint/``, which holds the run's secret noise and sampler seeds.

    The run id is kept in ``<run_dir>/tracking.json``: a resumed fedsim run (a new tracker on
    the same folder and store) reopens the same MLflow run. MLflow params cannot change, so a
    config value changed on resume (``--force``) is recorded as the tag
    ``fedsim.changed_on_resume.<key>``.

    MLflow (≥ 3.x) refuses ``file:`` stores unless ``MLFLOW_ALLOW_FILE_STORE=true``; this
    tracker sets it (unless already set), and sets ``MLFLOW_DISABLE_TELEMETRY=true`` (unless
    already set) so that nothing leaves the machine.

    Parameters
    ----------
    tracking_uri : the store, a ``file:`` URI (see :func:`local_store_uri`); required.
    """

    name: str = "mlflow"

    def __init__(self, tracking_uri: str) -> None:
        super().__init__()
        self.tracking_uri = local_store_uri(tracking_uri)
        self._client: Any = None

    @property
    def run_id(self) -> str | None:
        """The MLflow run id (after :meth:`start`)."""
        rid = self._state.get("run_id")
        return str(rid) if rid else None

    def _make_client(self) -> Any:
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        try:
            from mlflow.tracking import MlflowClient
        except ImportError as e:
            raise FedsimError(f"MLflow tracking needs the 'mlflow' package ({e}); {INSTALL_HINT}") from None
        return MlflowClient(tracking_uri=self.tracking_uri)

    def _open(self, config: Mapping[str, Any], params: dict[str, Any], done: int) -> int:
        self._client = self._make_client()
        from mlflow.exceptions import MlflowException

        wanted = {_mlflow_key(k): _param_value(v) for k, v in flatten({**config, **params}, sep=".").items()}
        try:
            existing = self._reopen()
            if existing is None:
                self._create(str(config.get("name") or "fedsim"), wanted)
            else:
                self._update_params(existing, wanted)
        except MlflowException as e:
            raise FedsimError(f"MLflow store {self.tracking_uri}: {e.message}") from None
        return self.last_round

    def _reopen(self) -> dict[str, str] | None:
        """Reopen the run named in the state; its params, or None when there is none to reopen."""
        from mlflow.exceptions import MlflowException

        if not self.run_id or self._state.get("tracking_uri") != self.tracking_uri:
            return None
        try:
            run = self._client.get_run(self.run_id)
        except MlflowException:
            return None  # deleted from the store: start a new run, the rows are logged again
        if run.info.lifecycle_stage != "active":
            return None
        self._client.update_run(self.run_id, status="RUNNING")
        return dict(run.data.params)

    def _experiment_id(self, name: str) -> str:
        from mlflow.exceptions import MlflowException

        exp = self._client.get_experiment_by_name(name)
        if exp is not None and exp.lifecycle_stage == "active":
            return str(exp.experiment_id)
        if exp is not None:
            raise FedsimError(
                f"MLflow experiment {name!r} is deleted in {self.tracking_uri}; restore it, or rename the run"
            )
        try:
            return str(self._client.create_experiment(name))
        except MlflowException:  # created meanwhile by another run
            return str(self._client.get_experiment_by_name(name).experiment_id)

    def _create(self, experiment: str, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        assert self.run_dir is not None
        exp_id = self._experiment_id(experiment)
        tags = {"fedsim.run_dir": str(self.run_dir.resolve()), "mlflow.source.name": "fedsim"}
        run = self._client.create_run(exp_id, run_name=self.run_dir.name, tags=tags)
        self._state = {
            "tracking_uri": self.tracking_uri,
            "experiment_id": exp_id,
            "run_id": run.info.run_id,
            "last_round": 0,
        }
        self._save()  # the id is on disk before anything else can fail
        self._client.log_batch(run.info.run_id, params=[Param(k, v) for k, v in params.items()])

    def _update_params(self, existing: dict[str, str], params: dict[str, str]) -> None:
        from mlflow.entities import Param, RunTag

        new = [Param(k, v) for k, v in params.items() if k not in existing]
        changed = [RunTag(f"fedsim.changed_on_resume.{k}", v) for k, v in params.items() if existing.get(k, v) != v]
        resumes = RunTag("fedsim.resumes", str(int(self._state.get("resumes", 0)) + 1))
        self._state["resumes"] = int(resumes.value)
        self._client.log_batch(self.run_id, params=new, tags=[*changed, resumes])

    def _write(self, step: int, scalars: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(_mlflow_key(k), v, now, step) for k, v in scalars.items()]
        self._client.log_batch(self.run_id, metrics=metrics)

    def _close(self, summary: Mapping[str, Any] | None, status: str) -> None:
        try:
            if summary is not None:
                self._write(self.last_round, {f"summary/{k}": v for k, v in numeric_items(summary).items()})
            self.upload_artifacts()
        finally:
            self._client.set_terminated(self.run_id, status=status)

    def upload_artifacts(self) -> list[str]:
        """Upload the run folder's public files that exist (:data:`ARTIFACT_FILES`,
        :data:`ARTIFACT_DIRS`); returns their names. Files already uploaded are replaced."""
        assert self.run_dir is not None and self.run_id is not None, "start() first"
        done = []
        for name in ARTIFACT_FILES:
            if (self.run_dir / name).is_file():
                self._client.log_artifact(self.run_id, str(self.run_dir / name))
                done.append(name)
        for name in ARTIFACT_DIRS:
            if (self.run_dir / name).is_dir():
                self._client.log_artifacts(self.run_id, str(self.run_dir / name), artifact_path=name)
                done.append(name)
        return done


# --------------------------------------------------------------------------------------------
# construction and fan-out


def make_trackers(tensorboard: bool = False, mlflow_uri: str | None = None) -> list[Tracker]:
    """The trackers a run asked for, checked before anything starts.

    Parameters
    ----------
    tensorboard : write ``<run_dir>/tensorboard/`` (default false).
    mlflow_uri : log to this local MLflow store, a ``file:`` URI (default none: no MLflow).

    Raises :class:`FedsimError` when a package is missing ("install fedsim[tracking]") or the
    URI is not a local ``file:`` store. Nothing is imported: the check finds the packages only.
    """
    trackers: list[Tracker] = []
    if tensorboard:
        _require("tensorboard", "--tensorboard")
        trackers.append(TensorBoardTracker())
    if mlflow_uri is not None:
        tracker = MLflowTracker(mlflow_uri)  # the URI first: its error is the more useful one
        _require("mlflow", "--mlflow")
        trackers.append(tracker)
    return trackers


def _require(module: str, option: str) -> None:
    """:class:`FedsimError` naming ``option`` when ``module`` is not installed (found, not imported)."""
    if importlib.util.find_spec(module) is None:
        raise FedsimError(f"{option} needs the '{module}' package, which is not installed; {INSTALL_HINT}")


class TrackerGroup:
    """Several trackers as one: what the runner holds.

    :meth:`start` raises (before round 1 the user can fix the cause); a tracker that fails
    later is reported once through ``warn`` and dropped, and the run goes on — its folder is
    the complete record.

    Parameters
    ----------
    trackers : the trackers (e.g. from :func:`make_trackers`).
    warn : called with a one-line message when a tracker fails mid-run (default: print it to
        standard error).
    """

    name = "trackers"

    def __init__(self, trackers: Sequence[Tracker], warn: Callable[[str], None] | None = None) -> None:
        self.trackers = list(trackers)
        self.warn = warn or _print_warning
        self._started: list[Tracker] = []

    def __len__(self) -> int:
        return len(self.trackers)

    def start(self, run_dir: str | Path, config: Mapping[str, Any], params: Mapping[str, Any] | None = None) -> None:
        """Start every tracker; if one fails, finish those started (``FAILED``) and re-raise.

        Parameters
        ----------
        run_dir, config, params : as for :meth:`BaseTracker.start`.
        """
        for t in self.trackers:
            try:
                t.start(run_dir, config, params)
            except BaseException:
                self.finish(status="FAILED")
                raise
            self._started.append(t)

    def log_row(self, row: Mapping[str, Any]) -> None:
        """Log ``row`` with every tracker still running.

        Parameters
        ----------
        row : the published metrics row.
        """
        self._each(lambda t: t.log_row(row))

    def finish(self, summary: Mapping[str, Any] | None = None, status: str | None = None) -> None:
        """Finish every started tracker (idempotent).

        Parameters
        ----------
        summary, status : as for :meth:`BaseTracker.finish`.
        """
        started, self._started = self._started, []
        for t in started:
            self._try(t, lambda t: t.finish(summary, status))

    def state_dict(self) -> dict[str, Any]:
        """Each tracker's state, by name."""
        return {t.name: t.state_dict() for t in self.trackers}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Give each tracker its part of ``state`` (from :meth:`state_dict`).

        Parameters
        ----------
        state : a dict by tracker name; trackers without an entry read ``tracking.json``.
        """
        for t in self.trackers:
            if t.name in state:
                t.load_state_dict(state[t.name])

    def _each(self, call: Callable[[Tracker], None]) -> None:
        for t in list(self._started):
            if not self._try(t, call):
                self._started.remove(t)
                try:
                    t.finish(status="FAILED")
                except Exception:  # already reported: one message per tracker
                    pass

    def _try(self, t: Tracker, call: Callable[[Tracker], None]) -> bool:
        try:
            call(t)
        except Exception as e:
            self.warn(f"fedsim: {t.name} tracking failed ({type(e).__name__}: {e}); it stops, the run goes on")
            return False
        return True


def _print_warning(text: str) -> None:
    import sys

    print(text, file=sys.stderr)


__all__ = [
    "ARTIFACT_DIRS",
    "ARTIFACT_FILES",
    "STATE_FILE",
    "BaseTracker",
    "MLflowTracker",
    "TensorBoardTracker",
    "Tracker",
    "TrackerGroup",
    "flatten",
    "local_store_uri",
    "make_trackers",
    "numeric_items",
]
