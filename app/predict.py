"""Predict, then reveal: the visitor guesses which method will be fastest before the race's numbers are
in, and, in the step-through of Mirror-SD, whether the next step will be a hit. Each reveal is one
sentence of why, written from the recorded run. Guessing is one click and always optional.
"""
from __future__ import annotations

from statistics import median

from .cards import ms_per_step
from .explain import explain
from .figures import ms_text
from .lanes import same_processor
from .repeat import middle

SKIP = "skip"
HIT, MISS = "hit", "miss"
HIT_CHOICES = [("Yes, a hit", HIT), ("No, a miss", MISS)]
HIT_QUESTION = ("Predict, before you press Next: will the next step be a hit? A step is a hit when the target's own "
                "token at its end was among the early-exit guesses and the draft rolled out that guess's branch "
                "during the step, so the step after it starts with its window already drafted.")
PER_STEP = " (ms a step as on the cards: each run's wall time over its steps, reading the prompt included)"


def guess_choices(methods: dict[str, str]) -> list[tuple[str, str]]:
    """Radio choices: each method (title, name), then a way to skip."""
    return [*methods.items(), ("Skip", SKIP)]


def _speed(r) -> float:
    """Tokens/s: the median over repeated runs when there were several."""
    runs = [n["tokens_per_s"] for n in getattr(r, "runs", []) or []]
    return median(runs) if len(runs) > 1 else r.metrics["tokens_per_s"]


def fastest(current: dict):
    """The Result with the most tokens per second among the methods that ran to the end, or None."""
    finished = [r for r in (current or {}).values() if r.finished in ("eos", "length") and r.metrics]
    return max(finished, key=_speed, default=None)


def why(winner, current: dict) -> str:
    """One sentence: tokens per step against the time a step took, beside vanilla's: τ and ms/step as
    the cards show them (``cards.ms_per_step``, a mean), so the reveal and the cards agree."""
    vanilla = current.get("vanilla")
    if winner.method == "vanilla" or vanilla is None or not vanilla.metrics:
        rival = max((r for r in current.values() if r is not winner and r.metrics), key=_speed, default=None)
        if winner.method != "vanilla" or rival is None:
            return (f"{winner.title} was fastest at {_speed(winner):.1f} tokens/s, committing {_tau(winner):.2f} "
                    f"tokens per step in {ms_text(ms_per_step(winner))} a step{PER_STEP}.")
        return (f"Vanilla was fastest ({_speed(winner):.1f} tokens/s): here drafting cost more than it saved; "
                f"{rival.title} committed {_tau(rival):.2f} tokens per step but each step took "
                f"{ms_text(ms_per_step(rival))} against vanilla's {ms_text(ms_per_step(winner))} for one token{PER_STEP}.")
    ratio = _speed(winner) / _speed(vanilla)
    return (f"{winner.title} was fastest ({_speed(winner):.1f} tokens/s, {ratio:.2f}× vanilla): "
            f"it committed {_tau(winner):.2f} tokens per step in {ms_text(ms_per_step(winner))} a step, while "
            f"vanilla made 1 token per step in {ms_text(ms_per_step(vanilla))}{PER_STEP}.")


def _tau(r) -> float:
    """τ as its card shows it: the median over repeated runs when there were several."""
    return middle(r, "mean_accepted")


def noted(guess: str | None, titles: dict[str, str]) -> str:
    """What the page says of a guess for a race still to run or running: the answer waits for its end."""
    if not guess or guess == SKIP:
        return ""
    return f"Your guess: **{titles.get(guess, guess)}**. The answer comes when the race ends."


def guess_made(current: dict, guess: str | None, titles: dict[str, str]) -> str:
    """The visitor picked a guess: where the race on the page is over (a recorded race opened, or a
    race that has ended) its answer comes at once, from the numbers on the page; else it waits."""
    over = bool(current) and all(r.done for r in current.values())
    return reveal(current, guess) if over else noted(guess, titles)


def reveal(current: dict, guess: str | None) -> str:
    """The race's answer once it is over; '' when the visitor did not guess."""
    if not guess or guess == SKIP:
        return ""
    title = current[guess].title if guess in (current or {}) else guess
    winner = fastest(current)
    if winner is None:
        return f"Your guess: **{title}**. No method ran to the end, so there is no answer this time."
    if not winner.timed:
        return (f"Your guess: **{title}**. This race wrote {winner.metrics['new_tokens']:g} tokens: too few to time, "
                "since the time is mostly reading the prompt, the same work for every method. No winner this time: "
                "raise Max new tokens and race again.")
    verdict = "**Right!**" if winner.method == guess else f"**Not this time** (you guessed {title})."
    behind = f" {mirror_behind_sd(current)}" if guess == "mirror" and winner.method != "mirror" else ""
    rough = (" The machine was busy while this race ran, so read these speeds as rough: run it again when it is "
             "quiet.") if winner.busy else ""
    return f"{verdict} {why(winner, current)}{behind}{rough}"


def mirror_behind_sd(current: dict) -> str:
    """Why Mirror-SD fell behind speculative decoding in this race, from both runs' steps: what a step
    on a hit's window cost against an sd step, and whether the draft lane shared the target's
    processor. '' when either did not finish or Mirror-SD had no step on a hit's window."""
    mirror, sd = current.get("mirror"), current.get("sd")
    if not all(r is not None and r.finished in ("eos", "length") for r in (mirror, sd)):
        return ""
    costs, sd_costs = mirror.trace.step_costs(), sd.trace.step_costs()
    hits = costs[costs.kind.str.startswith("hit's branch")]
    if hits.empty or sd_costs.empty or _speed(mirror) >= _speed(sd):
        return ""
    hit_ms, sd_ms = hits.ms.mean(), sd_costs.ms.mean()
    text = (f"Why not Mirror-SD: its steps on a window a hit had drafted took {ms_text(hit_ms)} on average for "
            f"{hits.tokens.mean():.2f} tokens, against {ms_text(sd_ms)} for {sd_costs.tokens.mean():.2f} in speculative "
            "decoding's steps")
    fallbacks = costs[costs.kind.str.startswith("fallback")]
    if hit_ms > sd_ms:
        text += ": a hit saves the draft, but here splitting the target around the rollouts cost more than that."
    elif not fallbacks.empty:
        text += (f"; but {len(fallbacks) / len(costs):.0%} of its steps came after a miss and drafted afresh first, "
                 f"{ms_text(fallbacks.ms.mean())} each.")
    else:
        text += "."
    if same_processor(list(mirror.trace.lanes)):
        text += (" In this race its draft lane was part of the same processor as the target, so the branch "
                 "rollouts slow the target's last layers instead of running beside them for free.")
    return text


def next_step(trace, index: int):
    """The step after ``index`` when it carries a Mirror-SD rendezvous record, else None."""
    step = next((s for s in trace.steps if s.index == index + 1), None)
    return step if step is not None and step.rendezvous is not None else None


def reveal_hit(result, index: int, answer: str | None) -> str:
    """Whether step index+1 was a hit, named by its number, in the words of its own sentence; '' before
    an answer."""
    step = next_step(result.trace, index) if result is not None else None
    if not answer or step is None:
        return ""
    hit = step.rendezvous.hit
    verdict = "**Right!**" if (answer == HIT) == hit else "**Not this time.**"
    sentence = explain(result.trace, step.index, result.pieces)
    return f"{verdict} The next step, step {step.index}, was a {'hit' if hit else 'miss'}. {sentence}"
