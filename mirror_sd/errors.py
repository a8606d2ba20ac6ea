"""The one exception type users see: a clear message, never a traceback."""


class MirrorSDError(ValueError):
    """Bad input, an unknown or incompatible model, a missing device: says what and why."""


class Stopped(Exception):
    """A run was asked to stop in the middle of a forward (``stream(..., stop=...)``): raised between two
    layers, or two chunks of a prefill, so that a long prefill ends within a layer's time. The engine
    ends the run "stopped", keeping what was committed; users never see it."""
