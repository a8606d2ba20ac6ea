"""Hypothesis trees from a step's records, as a flat list of nodes (drawn by figures.tree).

Two records are drawn, so new methods that record one need no app change:

* ``step.rendezvous`` (Mirror-SD): the draft window (a chain, or the step's tree with mirror's tree
  option), the early-exit candidates hanging off each window position, the branches the draft lane
  rolled out (chains or trees), and the one used at the rendezvous (a hit) or the target's token
  that no branch foresaw (a miss: fallback).
* ``step.tree``, any draft tree (``DraftTree``: tokens, parents (-1 for children of the root),
  scores, the accepted path and the nodes copied from the context), as eagle and ss record.
"""
from __future__ import annotations

from dataclasses import dataclass

# Node kinds, from the step's point of view (figures.NODE_STYLES gives each a colour and a legend name).
ROOT, ACCEPTED, REJECTED, CANDIDATE, ROLLED, USED, TARGET_MISS, NODE, COPIED = (
    "root", "accepted", "rejected", "candidate", "rolled out", "used", "target token, no branch", "draft node",
    "copied from context")


@dataclass
class Node:
    token: int | None  # None for the root (the committed text)
    parent: int | None  # index of the parent node
    kind: str
    note: str = ""  # hover detail


def step_tree(step) -> list[Node]:
    """The step's tree, or [] when the step recorded none."""
    if step.rendezvous is not None:
        return mirror_tree(step)
    if step.tree is not None:
        return draft_tree(step.tree)
    return []


def verdict_row(step) -> int:
    """The window row where the target's verdict fell: after the accepted draft tokens of a chain, or
    at the end of the accepted path of a tree window (row 0: the last committed token)."""
    if step.tree is None:
        return step.accepted
    return step.tree.path[-1] + 1 if step.tree.path else 0


def mirror_tree(step) -> list[Node]:
    record = step.rendezvous
    nodes = [Node(None, None, ROOT, "committed text")]
    window = step.tree  # a tree window (mirror's tree option), or None: a chain
    parents = window.parents if window is not None else list(range(-1, len(step.proposed) - 1))
    accepted = set(window.path) if window is not None else set(range(step.accepted))
    row_node = [0]  # node index of window row r (row 0: the last committed token; row i + 1: draft token i)
    children = [set() for _ in range(len(step.proposed) + 1)]  # the draft tokens that follow each row
    for i, (token, parent) in enumerate(zip(step.proposed, parents)):
        kind = ACCEPTED if i in accepted else REJECTED
        nodes.append(Node(token, row_node[parent + 1], kind, f"draft token d{i + 1}"))
        row_node.append(len(nodes) - 1)
        children[parent + 1].add(token)
    shapes = record.branch_parents or [list(range(-1, len(b[2]) - 1)) for b in record.branches]  # chains
    rolled = {(int(b[0]), int(b[1])): (list(b[2]), shape) for b, shape in zip(record.branches, shapes)}
    used = record.branches[record.branch_used][:2] if record.hit else None
    target = (verdict_row(step), step.committed[-1]) if step.origins and step.origins[-1] in ("correction", "bonus") \
        else None  # what the target emitted where the verdict fell
    missed = target if used is None else None
    for r, candidates in enumerate(record.exit_candidates[:len(row_node)]):
        for rank, v in enumerate(candidates):
            if v in children[r]:
                continue  # a draft token itself: that is the window, not a branch
            is_used = used is not None and (r, v) == (int(used[0]), int(used[1]))
            kind = USED if is_used else TARGET_MISS if (r, v) == missed else ROLLED if (r, v) in rolled else CANDIDATE
            nodes.append(Node(v, row_node[r], kind, f"early-exit candidate #{rank + 1} at position {r}"))
            rollout = [len(nodes) - 1]  # node index of the branch root, then of each rolled-out token
            tokens, shape = rolled.get((r, v), ([], []))
            for k, (token, parent) in enumerate(zip(tokens, shape)):
                nodes.append(Node(token, rollout[parent + 1], kind, f"draft rollout token {k + 1}"))
                rollout.append(len(nodes) - 1)
    if missed and not any(n.kind == TARGET_MISS for n in nodes) and missed[0] < len(row_node):
        nodes.append(Node(missed[1], row_node[missed[0]], TARGET_MISS, "the target's token: not an early-exit candidate"))
    return nodes


def draft_tree(tree) -> list[Node]:
    """A drafted tree (``DraftTree``): node tokens, parents (-1 for children of the root), scores,
    accepted path, nodes copied from the context."""
    path, copied, scores = set(tree.path), set(tree.copied), tree.scores
    nodes = [Node(None, None, ROOT, "committed text")]
    for i, (token, parent) in enumerate(zip(tree.tokens, tree.parents)):
        score = scores[i] if i < len(scores) else None
        note = f"node {i}" + (", copied from the context" if i in copied else "") + \
            (f", score {score:.3g}" if score is not None else "")
        kind = ACCEPTED if i in path else COPIED if i in copied else NODE
        nodes.append(Node(int(token), 0 if parent is None or parent < 0 else int(parent) + 1, kind, note))
    return nodes


GAP = 3  # characters from a column's widest label to the next column: the next marker and a space


def layout(nodes: list[Node], labels: list[str]) -> tuple[list[float], list[float], list[float]]:
    """Where figures.tree draws each node, so that no label (drawn right of its node) runs into another.

    y: a node sits on the row of its first child (accepted or used children first, so the path the
    target kept reads left to right like a line of text); a leaf takes the next free row. Nodes of one
    depth lie in different subtrees, so they never share a row.
    x: each depth a column as wide as its longest label, in characters, plus ``GAP``: a label ends
    before the next column's node. Returns (xs, ys, columns): columns[d] is depth d's x, and the last
    entry the right edge of the widest last label.
    """
    children: dict[int, list[int]] = {}
    for i, n in enumerate(nodes):
        if n.parent is not None:
            children.setdefault(n.parent, []).append(i)
    depth, row, rows = [0] * len(nodes), [0] * len(nodes), [0]

    def place(i: int, d: int):
        depth[i] = d
        kids = sorted(children.get(i, []), key=lambda k: nodes[k].kind not in (ACCEPTED, USED))
        for k in kids:
            place(k, d + 1)
        if kids:
            row[i] = row[kids[0]]
        else:
            row[i], rows[0] = rows[0], rows[0] + 1

    for root in (i for i, n in enumerate(nodes) if n.parent is None):
        place(root, 0)
    widths = [0] * (max(depth) + 1)
    for d, label in zip(depth, labels):
        widths[d] = max(widths[d], len(label))
    columns = [0.0]
    for width in widths:
        columns.append(columns[-1] + width + GAP)
    return [columns[d] for d in depth], [-float(r) for r in row], columns
