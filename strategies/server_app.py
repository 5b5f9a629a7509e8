"""The fedsim ServerApp for simulation: :func:`make_server_app` wraps a strategy fedsim built
in-process (``fedsim run``) in a ServerApp whose main loop is ``strategy.run(grid)``.

The deployment ServerApp, which builds the run from the app's run config, is
:mod:`fedsim.deploy.serverapp` (the runner layer; this module does not import it).
"""

from __future__ import annotations

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedsim.strategies.user_dp import UserLevelDPStrategy


def make_server_app(strategy: UserLevelDPStrategy) -> ServerApp:
    """A ServerApp whose main loop is ``strategy.run(grid)``."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        strategy.run(grid)

    return app
