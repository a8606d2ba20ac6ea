"""A fair share of one server: while other visitors wait in line, a race is cut to one run of a few tokens.

Races run one at a time, so a class shares one line, and each visitor's wait is the sum of the races ahead.
One visitor's 5 runs of 512 tokens would hold everyone for many minutes; so a race that starts with others
waiting behind it runs once, with at most ``FAIR_MAX_NEW`` new tokens (the page's default race), and
fewer where this server's calibrated estimate (``app.estimate``) says that race would still take longer than
``FAIR_RACE_S``, down to ``FAIR_MIN_NEW``, enough tokens for a speed to mean something. A visitor alone
in line races what they asked for; a later run of theirs is skipped once someone waits behind it.
"""
from __future__ import annotations

from typing import Callable

FAIR_RUNS = 1
FAIR_MAX_NEW = 48  # the page's default race (docs/app/classroom.md: what it takes on a class's server)
FAIR_RACE_S = 30.0  # a capped race is cut further where the estimate puts it over this
FAIR_MIN_NEW = 16  # but never below this: twice the tokens a race needs to be timed at all


def fair_share(max_new: int, runs: int, waiting: int, expected_s: Callable[[int], float | None] | None = None
               ) -> tuple[int, int, str]:
    """(max new tokens, runs, a message; '' when nothing was cut) for a race with ``waiting`` visitors
    behind it. ``expected_s(n)``: the race's expected seconds with n new tokens (None: no estimate)."""
    if waiting <= 0:
        return max_new, runs, ""
    cap = FAIR_MAX_NEW
    if expected_s is not None:
        while cap > FAIR_MIN_NEW and (expected_s(cap) or 0.0) > FAIR_RACE_S:
            cap = max(FAIR_MIN_NEW, cap * 3 // 4)
    fair_new, fair_runs = min(max_new, cap), min(runs, FAIR_RUNS)
    if (fair_new, fair_runs) == (max_new, runs):
        return max_new, runs, ""
    asked = _race(max_new, runs)
    others = "1 other visitor is" if waiting == 1 else f"{waiting} other visitors are"
    return fair_new, fair_runs, (f"**Cut to a fair share:** {others} waiting in line, so this race runs "
                                 f"{_race(fair_new, fair_runs)} instead of the {asked} asked for; races run one "
                                 "at a time, and the cut keeps everyone's wait short. Alone in line, a race runs "
                                 "as asked.")


def skipped_runs(done: int, runs: int, waiting: int) -> str:
    """Why a race stopped after ``done`` of its ``runs`` runs: others began to wait meanwhile."""
    others = "another visitor" if waiting == 1 else f"{waiting} other visitors"
    return (f"**Ran {done} of {runs} runs:** {others} began to wait in line meanwhile, so the other runs were "
            "left out to keep their wait short.")


def _race(max_new: int, runs: int) -> str:
    return f"{'1 run' if runs == 1 else f'{runs} runs'} of {max_new} new tokens"
