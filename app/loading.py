"""Loading the model pair without a silent wait: the pair for each device choice is loaded once, behind
a lock, in a background thread, while the page shows how long the load has taken so far.

The first load on a fresh machine converts the embedded 4-bit target to fp32 once (a cache in
``~/.cache/mirror-sd``); later loads read that cache.
"""
from __future__ import annotations

import threading
import time
from typing import Iterator


class Loader:
    """``factory(target_device=..., draft_device=...)`` called once per device choice; later calls reuse it."""

    def __init__(self, factory):
        self._factory = factory
        self._pairs: dict[tuple, object] = {}
        self._lock = threading.Lock()

    def loaded(self, **devices) -> bool:
        return _key(devices) in self._pairs

    def __call__(self, **devices):
        key = _key(devices)
        with self._lock:  # two visitors arriving at once load the models once
            if key not in self._pairs:
                self._pairs[key] = self._factory(**devices)
            return self._pairs[key]


def _key(devices: dict) -> tuple:
    return tuple(sorted(devices.items()))


def loading_message(elapsed_s: float) -> str:
    return (f"**Loading the models… {elapsed_s:.0f} s.** This happens once per server: the first load on a new "
            "machine also converts the 4-bit target model to full precision and keeps it for next time.")


def in_background(fn, tick_s: float = 1.0) -> Iterator[float]:
    """Run ``fn()`` in a thread, yielding the seconds elapsed every ``tick_s`` until it returns; the
    generator's return value is fn's (``pair = yield from in_background(...)``); fn's error is raised."""
    box: dict = {}

    def work():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001  raised again in the caller's thread
            box["error"] = e

    thread = threading.Thread(target=work, daemon=True, name="mirror-sd-load")
    start = time.perf_counter()
    thread.start()
    while True:
        thread.join(tick_s)
        if not thread.is_alive():
            break
        yield time.perf_counter() - start
    if "error" in box:
        raise box["error"]
    return box["value"]
