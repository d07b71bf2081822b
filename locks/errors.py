"""The one error type of user-facing configuration mistakes (a leaf module: everything may import it)."""


class ConfigError(ValueError):
    """A bad user-facing parameter; `run.py` prints it as one line and exits non-zero."""
