"""The replay's frame rate in a real browser: a recorded race opened in headless Chromium, replayed, and
every change of the cards' content counted (a MutationObserver on the cards' row; progress overlays and
other changes outside the cards themselves do not count).

    python demos/replay_fps.py                 # the recorded qa race on this CPU
    python demos/replay_fps.py --race nvidia-h200/qa --repeats 3

Prints the frames per second over the replay, the longest gap between two frames (a stall) and how
long the replay took against the recorded race's own length. No model is loaded: recorded races open
without one.
"""
import argparse
import json
import time
from pathlib import Path

from app_browser import CHROMIUM

from app.replay import RECORDED, recorded_races

WATCH = """() => {
  window.__frames = [];
  if (window.__watching) return;
  window.__watching = true;
  let last = '';
  const cards = () => [...document.querySelectorAll('#cards .card')].map(c => c.outerHTML).join('');
  new MutationObserver(() => {
    const now = cards();
    if (now !== last) { last = now; window.__frames.push(performance.now()); }
  }).observe(document.querySelector('#cards'), {subtree: true, childList: true, characterData: true});
}"""


def race_seconds(path: Path) -> float:
    """The recorded race's length on its own clock: the end of the slowest run's last span."""
    data = json.loads(path.read_text())
    return max(s["end"] for m in data["methods"].values() for s in m["trace"]["spans"])


def measure(page, seconds: float) -> dict:
    """Replay the open race once; the frames the cards showed, per second, and the longest stall."""
    page.evaluate(WATCH)
    page.get_by_role("button", name="Replay the race").click()
    start = time.perf_counter()
    page.wait_for_timeout(1000 * (seconds + 3))  # the replay, then time for its last frame
    frames = page.evaluate("window.__frames")
    if len(frames) < 2:
        return dict(frames=len(frames), fps=0.0, longest_gap_s=float("nan"), took_s=time.perf_counter() - start)
    gaps = [b - a for a, b in zip(frames, frames[1:])]
    took = (frames[-1] - frames[0]) / 1000
    return dict(frames=len(frames), fps=(len(frames) - 1) / took if took else 0.0, longest_gap_s=max(gaps) / 1000,
                took_s=took)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--race", default="qa", help="a recorded race's file in app/recorded/, without .json "
                        "(nvidia-h200/qa: the H200's, replayed slowed down)")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    path = RECORDED / f"{args.race}.json"
    seconds = race_seconds(path)

    from playwright.sync_api import expect, sync_playwright

    from app.ui import build_demo, page_style
    from mirror_sd import MirrorSDError

    def no_model(**devices):
        raise MirrorSDError("no model for this measurement: recorded races open without one")

    demo = build_demo(no_model)
    _, url, _ = demo.queue().launch(server_name="127.0.0.1", prevent_thread_lock=True, quiet=True, **page_style())
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(url)
            page.locator("#recorded input").click()
            label = next(lab for lab, where in recorded_races() if Path(where) == path)
            page.locator("#recorded input").fill(label)
            page.keyboard.press("ArrowDown")
            page.keyboard.press("Enter")
            expect(page.locator("#status")).to_contain_text("Recorded on", timeout=60_000)
            page.wait_for_timeout(2000)  # the race's views drawn
            print(f"recorded race {path.name}: {seconds:.2f} s on its own clock")
            for k in range(args.repeats):
                m = measure(page, seconds)
                print(f"replay {k + 1}: {m['frames']} frames in {m['took_s']:.2f} s, {m['fps']:.1f} frames/s, "
                      f"longest gap {m['longest_gap_s']:.2f} s")
            browser.close()
    finally:
        demo.close()


if __name__ == "__main__":
    main()
