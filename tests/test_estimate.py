"""The race's expected time, calibrated from races actually run (issue 70): a few real races through the
app's own Run handler on a tiny pair whose models sleep on every forward (a race of a few seconds whatever
else the machine does), then the estimate of a different race, against its measured duration."""
import time
from types import SimpleNamespace

import pytest

from app import estimate, prompt_cost
from app.handlers import RACE_INPUTS, Stops, make_prompt_info, make_race
from app.loading import Loader
from app.race import warm_up
from app.waiting import Line
from mirror_sd import METHODS, load_pair

RACED = ["vanilla", "mirror"]  # sd's many hand-offs between the lanes swing with other work on a shared 2-core
# machine (twice as long from one minute to the next): that is the load, which no estimate made before a race sees


@pytest.fixture
def slow_pair(tiny_dirs):
    """A tiny pair of this test's own whose every layer sleeps, the target's 80 ms and the draft's 30 ms
    (Mirror-SD calls the layers without the model's own forward): most of a race's time, which other work
    sharing the machine hardly changes (the tiny models' own compute can grow several times over on a
    busy machine). Warmed up as the app does at page open (the probe the estimate starts from)."""
    pair = load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["draft"]))
    for model, seconds in ((pair.target, 0.08), (pair.draft, 0.03)):
        for layer in model.model.layers:
            layer.register_forward_pre_hook(lambda module, args, s=seconds: time.sleep(s))
    warm_up(pair)
    yield pair
    estimate.forget(pair)
    prompt_cost._speeds.pop(id(pair), None)


def race_once(pair, prompt: str, max_new: int, runs: int = 1) -> tuple[float, str]:
    """One race through the Run handler the page uses: (its seconds, its last status)."""
    race = make_race(lambda **devices: pair, Stops(), [], Line())
    given = dict(prompt_text=prompt, methods=RACED, max_new=max_new, temperature=0.0, top_p=1.0, seed=0,
                 target_device="auto", draft_device="auto", runs=runs, show_rejected=False)
    start = time.perf_counter()
    *_, last = race(SimpleNamespace(session_hash="visitor"), *(given[k] for k in RACE_INPUTS))
    return time.perf_counter() - start, last.status


def words(n: int) -> str:
    return " ".join(f"t{1 + i % 15}" for i in range(n))


def test_the_estimate_learns_from_races_run_here_and_is_within_half_again(slow_pair):
    """Before any race the estimate is the warm-up probe's, and says so; after three races of other lengths
    it comes from them, and the next race, longer, with two runs and another prompt, takes between 1/1.5
    and 1.5 times its estimate."""
    tokens = lambda prompt: len(slow_pair.encode(prompt))  # noqa: E731
    first = estimate.race_s(slow_pair, RACED, 8, 16)
    first_guess = lambda pair, n: estimate.Estimate(prompt_cost.speeds_of(pair).race_s(n, len(RACED), 6, 2), 0)  # noqa: E731
    assert first.races == 0 and "warm-up's probe" in first.source()
    for max_new, prompt in ((3, words(8)), (5, words(20)), (4, words(12))):
        _, status = race_once(slow_pair, prompt, max_new)
        assert status.startswith("Done."), status
    prompt = words(30)
    probe = first_guess(slow_pair, tokens(prompt))
    expected = estimate.race_s(slow_pair, RACED, tokens(prompt), 6, runs=2)
    assert expected.races == 3 and "last 3 races here" in expected.source()
    took, status = race_once(slow_pair, prompt, 6, runs=2)
    assert status.startswith("Done."), status
    assert 1 / 1.5 <= took / expected.seconds <= 1.5, (took, expected.seconds)
    print(f"\nestimate: {expected.seconds:.2f} s expected, {took:.2f} s measured (x{took / expected.seconds:.2f}); "
          f"before any race the probe said {probe.seconds:.2f} s for it")


def test_no_estimate_while_a_recorded_race_is_open(slow_pair):
    """The line under the prompt gives the race's expected time for a live race, and none while a recorded
    race is open: that race ran elsewhere, and nothing here is about to run."""
    get_pair = Loader(lambda **devices: slow_pair)
    get_pair(target_device=None, draft_device=None)
    info = make_prompt_info(get_pair)
    live = info("t1 t2 t3", RACED, 16, 1)
    assert "this race, about" in live and "tokens**" in live
    recorded = info("t1 t2 t3", RACED, 16, 1, "app/recorded/some-race.json")
    assert "this race" not in recorded and "about" not in recorded and "A recorded race is open" in recorded
