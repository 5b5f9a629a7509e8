"""The runner layer: build a run from a config, execute it on an engine, record it.

- :mod:`fedsim.runner.build` — :func:`build_run` (``cfg → Run``): every piece of a run, nothing
  started (pure wiring, testable without Ray);
- :mod:`fedsim.runner.engines` — where the rounds execute (Ray, in-process, a deployment's grid);
- :mod:`fedsim.runner.callbacks` — metrics file, checkpoints, ledger, progress line, plots, tracking;
- :mod:`fedsim.runner.runner` — :func:`run_experiment`, which ties the three together in a locked run
  folder (:mod:`fedsim.runner.runfolder`), and resumes from checkpoints (:mod:`fedsim.runner.resume`).

Nothing below this layer (the core, ``strategies/``, ``clients/``) imports it.
"""

from fedsim.privacy.plan import (
    count_releases_per_user,
    note_max_users,
    privacy_report,
    resolve_clipping,
    resolve_privacy,
    scheme_of,
)
from fedsim.runner.build import (
    SYNTHETIC_ID_PREFIX,
    Deployment,
    Prepared,
    Run,
    SyntheticUsers,
    build_run,
    make_server_filter,
    make_server_optimizer,
    model_sha256,
    num_workers,
    prepare,
    resolve_engine,
    resolve_vectorize,
)
from fedsim.runner.callbacks import RunCallback
from fedsim.runner.runner import default_run_dir, make_strategy, make_summary, run_experiment

__all__ = [
    "SYNTHETIC_ID_PREFIX",
    "Deployment",
    "Prepared",
    "Run",
    "RunCallback",
    "SyntheticUsers",
    "build_run",
    "count_releases_per_user",
    "default_run_dir",
    "make_server_filter",
    "make_server_optimizer",
    "make_strategy",
    "make_summary",
    "model_sha256",
    "note_max_users",
    "num_workers",
    "prepare",
    "privacy_report",
    "resolve_clipping",
    "resolve_engine",
    "resolve_privacy",
    "resolve_vectorize",
    "run_experiment",
    "scheme_of",
]
