"""The one exception type users see: a clear message, never a traceback."""


class MirrorSDError(ValueError):
    """Bad input, an unknown or incompatible model, a missing device: says what and why."""
