"""The registry of decoding methods: CLI, bench and app list methods from here.

A method is a generator ``decode(run: Decoding, **options) -> Iterator[Step]``: it works on the
lanes of ``run.pair``, records spans through them, and yields each committed step via
``run.commit``. Adding a method is one module plus one ``register`` call below.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..errors import MirrorSDError


@dataclass(frozen=True)
class Option:
    name: str
    default: int | float
    low: int | float  # smallest allowed value
    high: int | float  # largest allowed value
    help: str
    kind: type = int

    def check(self, value):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (self.kind is int and value != int(value)):
            raise MirrorSDError(f"{self.name} must be {'an integer' if self.kind is int else 'a number'}, got {value!r}")
        if not self.low <= value <= self.high:
            raise MirrorSDError(f"{self.name} must be between {self.low} and {self.high}, got {value}")
        return self.kind(value)


@dataclass(frozen=True)
class Method:
    name: str
    title: str
    summary: str
    decode: Callable
    needs_draft: bool  # uses the draft model
    parallel_lanes: bool  # its lanes work at the same time (so CPU cores are split between them)
    options: tuple[Option, ...] = field(default=())

    def resolve_options(self, given: dict) -> dict:
        """The method's options with defaults filled in; unknown or out-of-range values refused."""
        known = {o.name: o for o in self.options}
        unknown = sorted(set(given) - set(known))
        if unknown:
            takes = f"takes {', '.join(known)}" if known else "takes no options"
            raise MirrorSDError(f"method {self.name!r} {takes}; got {', '.join(unknown)}")
        return {name: opt.check(given[name]) if name in given else opt.default for name, opt in known.items()}


METHODS: dict[str, Method] = {}


def register(method: Method):
    METHODS[method.name] = method


def get_method(name: str) -> Method:
    if name not in METHODS:
        raise MirrorSDError(f"unknown method {name!r}: choose from {', '.join(METHODS)}")
    return METHODS[name]


GAMMA = Option("gamma", 5, 1, 32, "draft tokens per step (window length)")

from . import sd, vanilla  # noqa: E402  (modules use Option/Method above)

register(Method("vanilla", "Vanilla", "autoregressive: one target forward per token",
                vanilla.decode, needs_draft=False, parallel_lanes=False))
register(Method("sd", "Speculative decoding", "a draft model proposes gamma tokens, the target verifies them in one forward",
                sd.decode, needs_draft=True, parallel_lanes=False, options=(GAMMA,)))
