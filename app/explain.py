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
    took = f" ({step_ms(trace, index):.1f} ms)"
    words = [repr(piece(pieces, t)) for t in step.committed]
    if index == 0:
        n = trace.meta.get("prompt_tokens")
        prompt = f"the {n}-token prompt" if n else "the prompt"
        return f"Step 0{took}: the target read {prompt} and produced its first token {', '.join(words)}."
    if not step.proposed:
        return f"Step {index}{took}: the target produced {', '.join(words) or 'nothing'} on its own, one forward pass."
    return f"Step {index}{took}: " + _verdict(step, pieces) + _copied(step) + _streams(step) + _draft_forwards(step) + _mirror(step, pieces)


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


def _mirror(step, pieces: dict) -> str:
    """Mirror-SD detail: did the rendezvous find the outcome among the rolled-out branches?"""
    record = step.rendezvous
    if record is None:
        return ""
    opening = " This window came from a fallback draft." if record.fallback else \
        " This window was copied from the context (no draft work)." if record.copied else \
        " This window came from the correction rollout: when the last step missed, the draft had already " \
        "rolled out from the target's own token, while the host read the verdict." if record.corrected else \
        " This window was a branch drafted during the previous step."
    if record.hit:
        return opening + (" The outcome was among the early-exit candidates and its branch was rolled out, "
                          "so the next window was already drafted (hit).")
    candidates = record.exit_candidates
    token = step.committed[-1] if step.committed else None
    row = verdict_row(step)
    at = candidates[row] if row < len(candidates) else []
    why = "was among the early-exit candidates but its branch was not rolled out" if token in at else \
        f"{piece(pieces, token)!r} was not among the early-exit candidates"
    return opening + f" The outcome {why}, so the next window is copied from the context or drafted afresh (miss)."
