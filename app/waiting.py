"""The visitors' line for the race: who is waiting, who is racing, and how long their races should take,
so a waiting visitor sees their place and an honest estimate of their wait.

Gradio's queue runs one race at a time (``concurrency_limit=1``) in the order visitors clicked Run;
this line mirrors that order per browser session, so the page can say where each visitor stands. A race
enters the line when Gradio queues it (``enter``, the Run event's validator, for a browser and an API
caller alike), with its expected time from this server's calibrated estimate (``app.estimate``); a
session already in line gets no second race. The wait is the sum of the expected times of the races
ahead (less what the running one has already run); a race with no estimate of its own counts as the
median race that finished here, and with neither the line says it has no estimate.
"""
from __future__ import annotations

import threading
import time
from statistics import median


class Line:
    def __init__(self, remember: int = 10):
        self._lock = threading.Lock()
        self._order: list[str] = []  # sessions in click order; the race running is first
        self._queued: set[str] = set()  # sessions whose race Gradio holds in its queue (or runs)
        self._expect: dict[str, float] = {}  # session -> its race's expected seconds, where known
        self._durations: list[float] = []  # seconds of the last races that ran to the end
        self._since: dict[str, float] = {}  # session -> perf_counter when its race began to run
        self._clicked: set[str] = set()  # sessions whose Run click put them in line (the page's own join)
        self._again: set[str] = set()  # sessions that pressed Run again while their race was in line
        self._remember = remember

    def join(self, session: str) -> int:
        """Add a session that clicked Run; its place: the number of races ahead of it."""
        with self._lock:
            if session not in self._order:
                self._order.append(session)
            return self._order.index(session)

    def click(self, session: str) -> int:
        """A page's Run click (before Gradio queues the race): ``join``, and note a second click while
        this session is still in line, which queues no second race (the page says so)."""
        with self._lock:
            if session in self._clicked:
                self._again.add(session)
            self._clicked.add(session)
        return self.join(session)

    def enter(self, session: str, expected_s: float | None = None) -> bool:
        """A session's race is queued, expected to take ``expected_s`` (None: unknown). False, and nothing
        changed, when this session already has a race in the line."""
        with self._lock:
            if session in self._queued:
                self._again.add(session)
                return False
            self._queued.add(session)
            if session not in self._order:
                self._order.append(session)
            if expected_s is not None:
                self._expect[session] = expected_s
            return True

    def expect(self, session: str, seconds: float | None):
        """The expected seconds of this session's race, once its settings are settled (a cut race's own)."""
        with self._lock:
            if seconds is None:
                self._expect.pop(session, None)
            elif session in self._order:
                self._expect[session] = seconds

    def ahead(self, session: str) -> int | None:
        """Races ahead of this session, or None when it is not in the line."""
        with self._lock:
            return self._order.index(session) if session in self._order else None

    def behind(self, session: str) -> int:
        """Sessions waiting behind this one."""
        with self._lock:
            return len(self._order) - 1 - self._order.index(session) if session in self._order else 0

    def start(self, session: str):
        """A session's race began to run (its models loaded). Gradio's queue is first come, first served,
        so a session still ahead of it that never began has left the queue: it leaves the line too."""
        with self._lock:
            if session in self._order:
                gone = [s for s in self._order[:self._order.index(session)] if s not in self._since]
                for s in gone:
                    self._drop(s)
            self._since[session] = time.perf_counter()

    def leave(self, session: str, finished: bool = False):
        """A session's race ended (``finished``: it ran to the end, so its time is learnt from; a race
        stopped early would make the estimates short) or it went away."""
        with self._lock:
            since = self._since.get(session)
            self._drop(session)
            if finished and since is not None:
                self._durations = (self._durations + [time.perf_counter() - since])[-self._remember:]

    def _drop(self, session: str):
        if session in self._order:
            self._order.remove(session)
        self._queued.discard(session)
        self._again.discard(session)
        self._clicked.discard(session)
        self._expect.pop(session, None)
        self._since.pop(session, None)

    def estimate_s(self, session: str) -> float | None:
        """Seconds until this session's race starts: each race ahead's expected time (else the median
        race here), less what the running one has already run; None when a race ahead has neither."""
        with self._lock:
            if session not in self._order:
                return None
            ahead = self._order[:self._order.index(session)]
            typical = median(self._durations) if self._durations else None
            each = [self._expect.get(s, typical) for s in ahead]
            if any(e is None for e in each):
                return None
            if not each:
                return 0.0
            running = self._since.get(ahead[0])
            done = time.perf_counter() - running if running is not None else 0.0
            return max(each[0] - done, 0.0) + sum(each[1:])

    def message(self, session: str) -> str:
        """The waiting visitor's line on the page ('' once their race runs)."""
        ahead = self.ahead(session)
        if not ahead:
            return ""
        wait = self.estimate_s(session)
        est = (" no estimate yet: no race has finished on this server, and the warm-up has not yet measured it"
               if wait is None else " any moment now" if wait < 1 else
               f" about {wait:.0f} s, the sum of the races ahead as this server estimates them")
        races = "race is" if ahead == 1 else "races are"
        again = (" You pressed Run again: one race per visitor in line at a time, so yours stays where it was."
                 if session in self._again else "")
        return (f"**Waiting your turn:** {ahead} {races} ahead of yours;{est}. Races run one at a time so their "
                f"timings stay fair; while others wait, each race is cut to a fair share.{again}")
