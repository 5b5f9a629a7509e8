"""The one exception type for errors a user can cause and fix."""

from __future__ import annotations


class FedsimError(Exception):
    """A user error: bad config, bad data path, or an incompatible combination.

    The message always says what is wrong and what to change. The CLI prints it
    without a traceback and exits with status 2; nothing has started when it is
    raised during validation.
    """


class RegistryFrozen(FedsimError):
    """A part registered after the config schema was built from the registries
    (:meth:`fedsim.registry.Registry.add`); :mod:`fedsim.plugins` turns it into advice."""
