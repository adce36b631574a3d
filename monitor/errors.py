"""Errors a user can act on. The CLI prints their message and exits 2, with no traceback."""


class MonitorError(Exception):
    """Base class: the message says what is wrong and, where it can, how to fix it."""


class ConfigError(MonitorError, ValueError):
    """A configuration that cannot be used; the message names the bad key."""


class BudgetExhausted(MonitorError):
    """A ledger has no budget left for the requested charge."""
