"""Options of methods and drafters: a name, a default, a range and what it does.

The CLI, the bench and the app list them from the method registry (``methods/__init__.py``). An
option that belongs to one drafter (``only_with``, e.g. ("streams", 2)) applies only when that
drafter is chosen: given elsewhere with a value other than its default, it is refused.
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import MirrorSDError


@dataclass(frozen=True)
class Option:
    name: str
    default: int | float
    low: int | float  # smallest allowed value
    high: int | float  # largest allowed value
    help: str
    kind: type = int
    only_with: tuple[str, int] | None = None  # (selector option, value): applies only with that choice
    greedy_only: bool = False  # does something at temperature 0 only (T > 0 runs without it)

    def check(self, value):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (self.kind is int and value != int(value)):
            raise MirrorSDError(f"{self.name} must be {'an integer' if self.kind is int else 'a number'}, got {value!r}")
        if not self.low <= value <= self.high:
            raise MirrorSDError(f"{self.name} must be between {self.low} and {self.high}, got {value}")
        return self.kind(value)

    def applies(self, values: dict) -> bool:
        """Whether this option means something with the other options' ``values``."""
        return self.only_with is None or values.get(self.only_with[0]) == self.only_with[1]

    def scoped(self, selector: str, value: int) -> "Option":
        """This option, applying only with ``selector=value``; its help says so."""
        return Option(self.name, self.default, self.low, self.high, f"{selector}={value}: {self.help}", self.kind,
                      (selector, value), self.greedy_only)


def resolve(options: tuple[Option, ...], given: dict, owner: str) -> dict:
    """The options with defaults filled in: unknown or out-of-range values refused, and options of a
    drafter that was not chosen refused unless left at their default (then dropped)."""
    known: dict[str, list[Option]] = {}
    for o in options:
        known.setdefault(o.name, []).append(o)
    unknown = sorted(set(given) - set(known))
    if unknown:
        takes = f"takes {', '.join(known)}" if known else "takes no options"
        raise MirrorSDError(f"{owner} {takes}; got {', '.join(unknown)}")
    plain = {o.name: o.check(given[o.name]) if o.name in given else o.default for o in options if o.only_with is None}
    values = dict(plain)
    for name, variants in known.items():
        chosen = next((o for o in variants if o.only_with is not None and o.applies(plain)), None)
        if chosen is not None:
            values[name] = chosen.check(given[name]) if name in given else chosen.default
        elif name not in plain and name in given and given[name] != variants[0].default:
            scopes = " or ".join(f"{o.only_with[0]}={o.only_with[1]}" for o in variants)
            raise MirrorSDError(f"{name} applies with {scopes} only, got {name}={given[name]} with "
                                f"{variants[0].only_with[0]}={plain.get(variants[0].only_with[0])}")
    return values


def refuse_greedy_only(options: tuple[Option, ...], given: dict, temperature: float, owner: str):
    """At temperature > 0, refuse the options given other than their default that do something at
    temperature 0 only: run without them, the run would be labelled with settings it never used."""
    if temperature <= 0:
        return
    names = sorted({o.name for o in options if o.greedy_only and o.name in given and given[o.name] != o.default})
    if names:
        raise MirrorSDError(f"{owner}: {', '.join(names)} works at temperature 0 only (greedy decoding); at "
                            f"temperature {temperature:g} leave it at its default")
