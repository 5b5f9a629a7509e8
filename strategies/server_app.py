"""The fedsim ServerApp: runs :class:`~strategies.user_dp.UserLevelDPStrategy` on a Flower Grid."""

from __future__ import annotations

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
