"""One plain sentence per step, written from what the trace recorded (tokens, spans, step records)."""
from __future__ import annotations

from mirror_sd.trace import Trace

from .tokens import copied_marks, piece
from .trees import verdict_row


def step_ms(trace: Trace, index: int) -> float:
    """Wall time of a step: from its first span's start to its last span's end, in ms."""
    spans = [s for s in trace.spans if s.step == index]
    return 1000 * (max(s.end for s in spans) - min(s.start for s in spans)) if spans else 0.0


def explain(trace: Trace, index: int, pieces: dict) -> str:
    step = next((s for s in trace.steps if s.index == index), None)
    if step is None:
        return f"Step {index} was not recorded."
    took = f" ({step_ms(trace, index):.1f} ms, this step alone)"
    words = [repr(piece(pieces, t)) for t in step.committed]
    if index == 0:
        n = trace.meta.get("prompt_tokens")
        prompt = f"the {n}-token prompt" if n else "the prompt"
        return f"Step 0{took}: the target read {prompt} and produced its first token {', '.join(words)}."
    if not step.proposed:
        return f"Step {index}{took}: the target produced {', '.join(words) or 'nothing'} on its own, one forward pass."
    return f"Step {index}{took}: " + _verdict(step, pieces) + _copied(step) + _streams(step) + _draft_forwards(step) + \
        _mirror(step, pieces, last=index == trace.steps[-1].index)


def _verdict(step, pieces: dict) -> str:
    n, a = len(step.proposed), step.accepted
    last = step.origins[-1] if step.origins else None
    token = repr(piece(pieces, step.committed[-1])) if step.committed else ""
    if step.tree is not None:  # a tree: the target accepts one path, not the whole draft
        path = f"the target accepted a path of {a} of the tree's {n} draft tokens"
        if last == "bonus":
            return f"{path}, down to a leaf, and added the bonus token {token}."
        if last == "correction":
            return f"{path}; its correction was {token}."
        return f"{path} and the run ended here."
    if last == "bonus":
        return f"the target accepted all {n} draft tokens and added the bonus token {token}."
    if last == "correction":
        return f"the target accepted {a} of {n} draft tokens; its correction was {token}."
    return f"the target accepted {a} of {n} draft tokens and the run ended here."


def _copied(step) -> str:
    """Context lookup detail: how many draft tokens were copied from the context (eagle, ss: tree
    nodes; sd with copy_below: window positions), and how many of them were accepted."""
    copied = step.copied
    if not copied or step.rendezvous is not None:  # Mirror-SD's copied windows: said in _mirror
        return ""
    used = sum(copied_marks(step)[0])
    return (f" {len(copied)} of the draft tokens were copied from the context (not drafted by a model); "
            f"{used} of them {'was' if used == 1 else 'were'} accepted.")


def _streams(step) -> str:
    """Speculative Streaming in the paper's form: the streams of every window row ran in the verify step."""
    rows = step.tree.stream_rows if step.tree is not None else 0
    if not rows:
        return ""
    return (f" In that same step, {rows} speculative stream rows, one set per verified token, drafted the next tree "
            "before the step's correction was known (the paper's form).")


def _draft_forwards(step) -> str:
    """sd drafting with its streams: how many draft forwards the window took."""
    if step.draft is None:
        return ""
    forwards, n = step.draft.forwards, len(step.proposed)
    if not forwards or forwards == n:
        return ""
    if forwards == 1:
        return f" The draft proposed the {n} tokens in one forward, with its speculative streams."
    checks = step.draft.lookahead
    counts = ""
    if checks:  # (lookahead tokens checked, kept) per forward
        counts = (f" ({', '.join(str(c) for c, _ in checks)} tokens checked, "
                  f"{', '.join(str(k) for _, k in checks)} kept)")
    return (f" The draft proposed the {n} tokens in {forwards} forwards, not {n}: each forward checked the lookahead "
            f"its streams had proposed in the one before and kept what its main stream agreed with{counts}.")


def _mirror(step, pieces: dict, last: bool = False) -> str:
    """Mirror-SD detail, in two parts that name their steps, so "hit" never reads as this step's window:
    where this step's window came from (what step k-1's outcome left), then this step's outcome (a hit
    or a miss), which decides how step k+1's window is made (``last``: there is no step k+1)."""
    record = step.rendezvous
    if record is None:
        return ""
    return _window_source(record, step.index) + _outcome(step, pieces, last)


def _window_source(record, k: int) -> str:
    """Where step k's window came from, and the outcome of step k-1 that it follows."""
    before = f"step {k - 1} was a miss" if k > 1 else "step 0 only read the prompt, so no branch was ready"
    if record.fallback:
        return f" Its window was drafted afresh at the start of this step (a fallback draft): {before}."
    if record.copied:
        return f" Its window was copied from the context (no draft work): {before}."
    if record.corrected:
        return (f" Its window came from the correction rollout: {before}, and the draft rolled out from the "
                "target's own token while the host read the verdict.")
    return f" Its window was a branch drafted during step {k - 1}: step {k - 1} was a hit."


def _outcome(step, pieces: dict, last: bool) -> str:
    """Step k's outcome: a hit when the target's own token was an early-exit guess whose branch the draft
    rolled out during step k, so step k+1 starts with its window drafted; else a miss."""
    record, k = step.rendezvous, step.index
    token = step.committed[-1] if step.committed else None
    said = repr(piece(pieces, token))
    if record.hit:
        then = "the run ended here" if last else f"so step {k + 1}'s window is already drafted"
        return (f" This step was a hit: the target's own token {said} was among the early-exit guesses and its "
                f"branch was rolled out during this step, {then}.")
    row = verdict_row(step)
    at = record.exit_candidates[row] if row < len(record.exit_candidates) else []
    why = "was among the early-exit guesses but its branch was not rolled out" if token in at else \
        "was not among the early-exit guesses"
    then = "the run ended here" if last else \
        f"so step {k + 1} starts with no window drafted: it copies one from the context or drafts one afresh"
    return f" This step was a miss: the target's own token {said} {why}, {then}."
