"""Engines: where a built run's rounds execute.

- ``ray``: Flower's simulation engine on Ray (workers in parallel, multi-node capable);
- ``inprocess``: :class:`fedsim.runner.inprocess.InProcessGrid`, the ClientApp called in this
  process one message after the other (no Ray);
- a deployment: the Deployment Engine's grid that the deployed ServerApp was given
  (:mod:`fedsim.deploy.runconfig`).

:func:`execute` runs the strategy's rounds with the stop signals handled
(:mod:`fedsim.interrupt`); on a stop, every process the run started is gone when it returns.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from fedsim.interrupt import StopRequest, descendants, kill_descendants, stop_on_signals
from fedsim.runner.build import Run
from fedsim.training.allocator import tune_allocator


class _DropDeprecationBanner(logging.Filter):
    """fedsim drives Flower's simulation engine through ``run_simulation`` on purpose
    (no ``flwr run`` local mode, which installs dependencies at run time); its
    deprecation banner is not actionable for a fedsim user."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return "DEPRECATED FEATURE" not in msg and "deprecated feature" not in msg


@contextmanager
def ray_daemons_in_their_own_process_group() -> Iterator[None]:
    """Within the block, each process that Ray's local start launches (GCS, raylet, dashboard,
    log monitor) begins in a process group of its own instead of this process's; the raylet's
    workers and agents are in the raylet's.

    Why: a stop signal sent to this process's group (``timeout``, a batch scheduler, ``kill --
    -PGID``) used to reach Ray's daemons at the same instant as the run. When they died before
    the run's handler had abandoned the round, Ray's core worker in this process found the
    raylet gone while Flower's engine still waited on a task, and ended the process with exit
    status 1 from C++: no checkpoint, no ``128 + signal`` (measured: 1 in 3 when the daemons got
    SIGTERM 0.3 s before the driver). With the daemons outside this process's group only this
    process gets the signal, and :func:`execute` shuts Ray down in order. They still die with this
    process if it is killed outright: Ray starts them with the kernel's parent-death signal
    (measured: every process of a run gone 0.25 s after SIGKILL to the driver alone). Ray joined by
    address (a cluster) starts nothing here, so this changes nothing there."""
    from ray._private import services

    original = services.ConsolePopen

    class _OwnGroupPopen(original):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("process_group", 0)
            super().__init__(*args, **kwargs)

    services.ConsolePopen = _OwnGroupPopen  # type: ignore[misc]
    try:
        yield
    finally:
        services.ConsolePopen = original  # type: ignore[misc]


def _start_ray(init_args: dict[str, Any]) -> None:
    """Start (or join) Ray in the main thread, as Flower's Ray backend would: the workers get
    this process's import path and plugins, and Ray's daemons a process group of their own
    (:func:`ray_daemons_in_their_own_process_group`). Flower's backend then finds Ray running
    and uses it."""
    import ray

    if ray.is_initialized():
        return
    pythonpath = os.pathsep.join(sys.path)
    if os.environ.get("PYTHONPATH"):
        pythonpath = f"{pythonpath}{os.pathsep}{os.environ['PYTHONPATH']}"
    os.environ["PYTHONPATH"] = pythonpath
    from fedsim.plugins import ray_env_vars

    with ray_daemons_in_their_own_process_group():
        ray.init(runtime_env={"env_vars": {"PYTHONPATH": pythonpath, **ray_env_vars()}}, **init_args)


def _stop_ray() -> None:
    """Shut Ray down if it is still up (Flower's backend shuts it down after a normal run)."""
    import ray

    if ray.is_initialized():
        ray.shutdown()


def quiet_flower() -> None:
    """Flower's and Ray's own logging reduced to what a fedsim user can act on."""
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    flwr_logger = logging.getLogger("flwr")
    flwr_logger.setLevel(logging.WARNING)
    if not any(isinstance(f, _DropDeprecationBanner) for f in flwr_logger.filters):
        flwr_logger.addFilter(_DropDeprecationBanner())
    warnings.filterwarnings("ignore", category=DeprecationWarning)


def _ray_backend_config(run: Run) -> tuple[dict[str, Any], dict[str, Any]]:
    """Ray's ``init`` arguments and Flower's backend config for ``run``'s workers."""
    cfg, n = run.cfg, run.n_workers
    gpus = cfg.sim.client_gpus if torch.cuda.is_available() else 0.0
    init_args: dict[str, Any] = {
        "num_cpus": int(math.ceil(n * cfg.sim.client_cpus)),
        "num_gpus": int(math.ceil(n * gpus)),
        "include_dashboard": False,
        "logging_level": logging.ERROR,
        "log_to_driver": True,
    }
    if cfg.sim.ray_address:  # join a running cluster: its resources, not ours
        init_args = {"address": cfg.sim.ray_address, "logging_level": logging.ERROR, "log_to_driver": True}
    return init_args, {"client_resources": {"num_cpus": cfg.sim.client_cpus, "num_gpus": gpus}, "init_args": init_args}


def execute(run: Run, strategy: Any, client_app: Any, stop: StopRequest, resume_hint: str) -> None:
    """Run the strategy's rounds on the engine, with the stop signals handled
    (:mod:`fedsim.interrupt`); on a stop, every process this run started is gone on return."""
    if client_app is None:
        from fedsim.clients import client_app as default_client

        client_app = default_client.app
    if run.cfg.sim.allocator == "tuned":  # the server's aggregation reuses its buffers too
        tune_allocator()
    deployment = run.deployment
    ray_engine = deployment is None and run.engine == "ray"
    ours = set(descendants())  # processes that are not this run's (kept on a stop)
    silence = ("ray",) if ray_engine else ()
    levels: dict[str, int] = {}  # the muted loggers' levels as Ray set them, restored after teardown
    try:
        if ray_engine:
            init_args, backend_config = _ray_backend_config(run)
            _start_ray(init_args)  # here, so that the stop handlers below replace Ray's own
        levels = {name: logging.getLogger(name).level for name in silence}
        with stop_on_signals(stop, resume_hint, spare=ours, silence=silence):
            if deployment is not None:
                strategy.run(deployment.grid)
            elif run.engine == "inprocess":
                from fedsim.runner.inprocess import InProcessGrid, task_identity

                with task_identity():
                    strategy.run(InProcessGrid(client_app, run.n_workers, stop=stop.event))
            else:
                from flwr.simulation import run_simulation

                from fedsim.runner.dispatch import prompt_exchange
                from fedsim.strategies.server_app import make_server_app

                with prompt_exchange(strategy):
                    run_simulation(
                        server_app=make_server_app(strategy),
                        client_app=client_app,
                        num_supernodes=run.n_workers,
                        backend_config=backend_config,
                    )
    finally:
        try:
            if ray_engine:
                _stop_ray()
        finally:
            for name, level in levels.items():  # muted by a stop signal during Ray's teardown
                logging.getLogger(name).setLevel(level)
    if stop.requested and deployment is None:
        kill_descendants(grace=3.0, spare=ours)
