"""The fedsim ServerApp.

- :func:`make_server_app` (simulation): a ServerApp whose main loop is ``strategy.run(grid)``
  for a strategy fedsim built in-process (``fedsim run``).
- ``app`` (deployment, ``[tool.flwr.app.components] serverapp``): builds the run from the
  app's run config on the SuperLink's grid (:mod:`fedsim.deploy.runconfig`): waits for the
  SuperNodes, takes the census of their users, then runs the same strategy.
"""

from __future__ import annotations

from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from strategies.user_dp import UserLevelDPStrategy


def make_server_app(strategy: UserLevelDPStrategy) -> ServerApp:
    """A ServerApp whose main loop is ``strategy.run(grid)``."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        strategy.run(grid)

    return app


app = ServerApp()


@app.main()
def deployed_main(grid: Grid, context: Context) -> None:
    """Deployment entry point: the whole run from ``context.run_config``."""
    from fedsim.deploy.runconfig import run_deployment

    run_deployment(grid, dict(context.run_config), app_dir=Path(__file__).resolve().parents[1])
