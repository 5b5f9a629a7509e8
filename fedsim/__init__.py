"""fedsim: a federated-learning simulator for user-level differential privacy.

Everything here is importable without a running Flower process; the Flower glue
lives in the top-level ``strategies`` (server side) and ``clients`` (client side)
packages.
"""

from fedsim.errors import FedsimError

__version__ = "0.1.0"
__all__ = ["FedsimError", "__version__"]
