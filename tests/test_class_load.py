"""A class on one server: a lecturer's long race, then 8 students at once, all through the app's API, on a
tiny pair whose target sleeps on every forward (a race long enough to queue behind, whatever the load).

Every race is served and returns its complete cards; while others wait a race is cut to a fair share
(``app.fair``) and a lone race runs as asked; a visitor gets one race in line at a time; the last
student's wait is bounded by the fair races ahead of it, from race times measured here. The figures it
prints are the ones docs/app/classroom.md quotes ("A class on one server").
"""
import re
import threading
import time
from statistics import median

import pytest

from app import fair

STUDENTS = 8
SHARE = 24  # the fair share's tokens here: the app's own (48) on a pair this small and slowed would only
# make the test longer; the rule is the same
ASK = dict(max_new=48, runs=2)  # more than a fair share: twice its tokens, two runs
METHODS = ["vanilla", "sd"]
SLOW_S = 0.003  # seconds each target forward sleeps
TIMEOUT_S = 50.0  # every wait below ends by itself


@pytest.fixture(scope="module")
def class_url(tiny_dirs):
    from app.ui import QUEUE_SIZE, build_demo
    from mirror_sd import load_pair

    pair = load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["draft"]))
    pair.target.register_forward_pre_hook(lambda module, args: time.sleep(SLOW_S))
    demo = build_demo(pair_factory=lambda **devices: pair)
    _, url, _ = demo.queue(max_size=QUEUE_SIZE).launch(server_name="127.0.0.1", server_port=None,
                                                       prevent_thread_lock=True, quiet=True)
    yield url
    demo.close()


class Visitor:
    """One browser session's race through the API: when it was sent, began (its first update) and ended."""

    def __init__(self, url: str, name: str):
        from gradio_client import Client

        self.client, self.name = Client(url, verbose=False), name
        self.sent = self.began = self.ended = None
        self.outputs, self.error = None, None

    def send(self, prompt: str, **settings):
        self.sent = time.perf_counter()
        self.job = self.client.submit(prompt_text=prompt, methods=METHODS, **settings, api_name="/run")

    def close(self):
        """Cancel the race if it is still queued, and stop the client's threads (a failed test ends too)."""
        if getattr(self, "job", None) is not None and not self.job.done():
            self.job.cancel()
        self.client.close()

    def wait_queued(self):
        """Until the server has queued this visitor's race (its validator has let it in)."""
        from gradio_client.utils import Status

        deadline = time.perf_counter() + TIMEOUT_S
        while self.job.status().code in (Status.STARTING, Status.JOINING_QUEUE) and time.perf_counter() < deadline:
            time.sleep(0.01)

    def follow(self):
        try:
            for out in self.job:
                self.began = self.began or time.perf_counter()
                self.outputs = out
            self.outputs = self.job.result(timeout=TIMEOUT_S)
        except Exception as e:  # noqa: BLE001  asserted on below
            self.error = e
        self.ended = time.perf_counter()

    @property
    def wait_s(self) -> float:
        return self.began - self.sent

    @property
    def race_s(self) -> float:
        return self.ended - self.began

    def tokens(self) -> set[int]:
        """The new tokens each raced method's card shows."""
        _, *cards = self.outputs
        return {int(n) for card in cards if isinstance(card, str) for n in re.findall(r"(\d+) tokens", card)}


def test_a_class_of_eight_is_served_fairly_and_nothing_is_lost(class_url, monkeypatch):
    monkeypatch.setattr(fair, "FAIR_MAX_NEW", SHARE)
    warm = Visitor(class_url, "warm")  # the server's one-off warm-up, and a first race to calibrate on
    warm.send("t1 t2 t3", max_new=8)
    warm.follow()
    assert warm.error is None and warm.outputs[0].startswith("Done.")

    lecturer = Visitor(class_url, "lecturer")
    students = [Visitor(class_url, f"student {i}") for i in range(STUDENTS)]
    try:
        lecturer.send("t1 t2 t3 t4", **ASK)
        watch = threading.Thread(target=lecturer.follow, daemon=True)
        watch.start()
        deadline = time.perf_counter() + TIMEOUT_S
        while lecturer.began is None and time.perf_counter() < deadline:
            time.sleep(0.02)
        threads = []
        for i, student in enumerate(students):  # all at once, while the lecturer's race runs
            student.send(f"t{1 + i} t{2 + i} t3", **ASK)
            threads.append(threading.Thread(target=student.follow, daemon=True))
            threads[-1].start()
            if i == 0:  # a second race from a visitor whose race waits: one race per visitor in line
                student.wait_queued()
                again = student.client.submit(prompt_text="t5 t6", methods=METHODS, max_new=8, api_name="/run")
        with pytest.raises(Exception, match="already in the line"):
            again.result(timeout=TIMEOUT_S)
        for t in [watch, *threads]:
            t.join(max(0.0, deadline + TIMEOUT_S - time.perf_counter()))
        assert not any(t.is_alive() for t in [watch, *threads]), "a race never ended"
    finally:
        for v in [warm, lecturer, *students]:
            v.close()

    everyone = [lecturer, *students]
    for v in everyone:  # all served, nothing lost: every card finished, with its text
        assert v.error is None, f"{v.name}: {v.error}"
        status, *cards = v.outputs
        assert status.startswith(("Done.", "**Cut to a fair share")) and "Done." in status, f"{v.name}: {status}"
        raced = [c for c in cards if 'data-state="length"' in c]
        assert len(raced) == len(METHODS) and all('class="tok"' in c for c in raced), v.name
    assert "Ran 1 of 2 runs" in lecturer.outputs[0] and lecturer.tokens() == {ASK["max_new"]}  # alone at first
    order = sorted(students, key=lambda v: v.began)
    *cut, last = order
    for v in cut:  # others waited behind each: one run of a fair share
        assert "Cut to a fair share" in v.outputs[0] and v.tokens() == {SHARE}, v.name
        assert f"1 run of {SHARE} new tokens" in v.outputs[0]
    assert "Cut to a fair share" not in last.outputs[0] and "Ran 1 of" not in last.outputs[0]
    assert last.tokens() == {ASK["max_new"]}  # alone in line at last: as asked, both runs

    longest = max(v.race_s for v in cut)
    promised = lecturer.race_s + len(cut) * longest  # the lecturer's run, then a fair share each
    assert last.wait_s <= 1.2 * promised + 2.0, (last.wait_s, promised)
    assert median(v.race_s for v in cut) < last.race_s  # the share is shorter than the race asked for
    print(f"\nclass load: lecturer {lecturer.race_s:.1f} s (1 of 2 runs), fair races {min(v.race_s for v in cut):.1f}"
          f"-{longest:.1f} s, uncut race {last.race_s:.1f} s; waits "
          + ", ".join(f"{v.wait_s:.1f}" for v in order) + f" s; last wait {last.wait_s:.1f} s against "
          f"{promised:.1f} s promised by the limits (and {lecturer.race_s + len(cut) * last.race_s:.1f} s uncut)")
