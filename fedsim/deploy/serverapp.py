"""The deployment ServerApp (``[tool.flwr.app.components] serverapp``).

It builds the whole run from the app's run config on the SuperLink's grid
(:func:`fedsim.deploy.runconfig.run_deployment`): waits for the SuperNodes, takes the census of
their users, then runs the same strategy as a simulation. It belongs to the runner layer, above
``strategies/``, which never imports it.

Everything the ServerApp runs is imported here, when Flower loads this module, and not inside
:func:`deployed_main`: under a simulation SuperLink the ServerApp's main runs in a thread of its
own while the ClientApp is imported in the main thread, and a first import of fedsim's packages
from both threads at once failed (``KeyError: 'fedsim.privacy.mechanisms'``).
"""

from __future__ import annotations

from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

import fedsim.runner
import fedsim.strategies.user_dp  # noqa: F401
from fedsim.deploy.runconfig import run_deployment

app = ServerApp()


@app.main()
def deployed_main(grid: Grid, context: Context) -> None:
    """Deployment entry point: the whole run from ``context.run_config``."""
    run_deployment(grid, dict(context.run_config), app_dir=Path(__file__).resolve().parents[2])
