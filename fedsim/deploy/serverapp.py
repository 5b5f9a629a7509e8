"""The deployment ServerApp (``[tool.flwr.app.components] serverapp``).

It builds the whole run from the app's run config on the SuperLink's grid
(:func:`fedsim.deploy.runconfig.run_deployment`): waits for the SuperNodes, takes the census of
their users, then runs the same strategy as a simulation. It belongs to the runner layer, above
``strategies/``, which never imports it.
"""

from __future__ import annotations

from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

app = ServerApp()


@app.main()
def deployed_main(grid: Grid, context: Context) -> None:
    """Deployment entry point: the whole run from ``context.run_config``."""
    from fedsim.deploy.runconfig import run_deployment

    run_deployment(grid, dict(context.run_config), app_dir=Path(__file__).resolve().parents[2])
