"""The visitors' line for the race: who is waiting, who is racing, and how long races here have taken,
so a waiting visitor sees their place and an estimate made from this server's own past races.

Gradio's queue runs one race at a time (``concurrency_limit=1``) in the order visitors clicked Run;
this line mirrors that order per browser session, so the page can say where each visitor stands.
"""
from __future__ import annotations

import threading
import time
from statistics import median


class Line:
    def __init__(self, remember: int = 10):
        self._lock = threading.Lock()
        self._order: list[str] = []  # sessions in click order; the race running is first
        self._durations: list[float] = []  # seconds of the last races that ran to the end
        self._since: dict[str, float] = {}  # session -> perf_counter when its race began to run
        self._remember = remember

    def join(self, session: str) -> int:
        """Add a session that clicked Run; its place: the number of races ahead of it."""
        with self._lock:
            if session not in self._order:
                self._order.append(session)
            return self._order.index(session)

    def ahead(self, session: str) -> int | None:
        """Races ahead of this session, or None when it is not in the line."""
        with self._lock:
            return self._order.index(session) if session in self._order else None

    def behind(self, session: str) -> int:
        """Sessions waiting behind this one."""
        with self._lock:
            return len(self._order) - 1 - self._order.index(session) if session in self._order else 0

    def start(self, session: str):
        """A session's race began to run (its models loaded)."""
        with self._lock:
            self._since[session] = time.perf_counter()

    def leave(self, session: str, finished: bool = False):
        """A session's race ended (``finished``: it ran to the end, so its time is learnt from; a race
        stopped early would make the estimates short) or it went away."""
        with self._lock:
            if session in self._order:
                self._order.remove(session)
            since = self._since.pop(session, None)
            if finished and since is not None:
                self._durations = (self._durations + [time.perf_counter() - since])[-self._remember:]

    def estimate_s(self, ahead: int) -> float | None:
        """Seconds until a race with ``ahead`` races before it starts: the median past race here for each,
        less the time the race running now has already run."""
        with self._lock:
            if not self._durations or not ahead:
                return None if not self._durations else 0.0
            typical = median(self._durations)
            running = self._since.get(self._order[0]) if self._order else None
            done = time.perf_counter() - running if running is not None else 0.0
            return max(typical - done, 0.0) + (ahead - 1) * typical

    def message(self, session: str) -> str:
        """The waiting visitor's line on the page ('' once their race runs)."""
        ahead = self.ahead(session)
        if not ahead:
            return ""
        wait = self.estimate_s(ahead)
        est = " no estimate yet (no race has finished on this server)" if wait is None else \
            " any moment now, from the last races on this server" if wait < 1 else \
            f" about {wait:.0f} s, from the last races on this server"
        races = "race is" if ahead == 1 else "races are"
        return (f"**Waiting your turn:** {ahead} {races} ahead of yours;{est}. Races run one at a time so their "
                "timings stay fair.")
