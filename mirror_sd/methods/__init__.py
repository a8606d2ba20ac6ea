"""The registry of decoding methods: CLI, bench and app list methods from here.

A method is a generator ``decode(run: Decoding, **options) -> Iterator[Step]``: it works on the
lanes of ``run.pair``, records spans through them, and yields each committed step via
``run.commit``. Adding a method is one module plus one ``register`` call below.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..drafting import drafter_options, make_drafter
from ..errors import MirrorSDError
from ..options import Option, resolve


@dataclass(frozen=True)
class Method:
    name: str
    title: str
    summary: str
    decode: Callable
    needs_draft: bool  # uses the draft model
    parallel_lanes: bool  # its lanes work at the same time (so CPU cores are split between them)
    options: tuple[Option, ...] = field(default=())
    check: Callable | None = None  # check(pair, options): refuse options that do not fit the models

    def resolve_options(self, given: dict) -> dict:
        """The method's options with defaults filled in; unknown or out-of-range values refused, and a
        drafter's options refused where another drafter is chosen (``options.resolve``)."""
        return resolve(self.options, given, f"method {self.name!r}")

    def lanes(self, pair) -> list:
        """The lanes this method's work runs on: the target's, and the draft's where it runs the draft
        model (the engine shares the cores among them; the bench names them)."""
        return [pair.target_lane, pair.draft_lane] if self.needs_draft else [pair.target_lane]


METHODS: dict[str, Method] = {}


def register(method: Method):
    METHODS[method.name] = method


def get_method(name: str) -> Method:
    if name not in METHODS:
        raise MirrorSDError(f"unknown method {name!r}: choose from {', '.join(METHODS)}")
    return METHODS[name]


GAMMA = Option("gamma", 2, 1, 32, "draft tokens per step (window length)")
SS_GAMMA = Option("gamma", 4, 1, 32, "stream levels in the draft (at most the trained streams, 4 for the shipped ones)")
KAPPA = Option("kappa", 4, 1, 64, "early-exit candidates per window position (token channel width)")
EXIT_LAYER = Option("exit_layer", 0, 0, 1024, "target layer feeding the token channel (0: three quarters of the "
                    "target's layers), read through the early-exit head trained for that layer where the pair has one "
                    "(the embedded target ships heads for layers 3, 6, 10, 14, 18 and 22; --add-on attaches others), "
                    "else through the target's own final norm and LM head alone (a logit lens)")
DEPTH = Option("depth", 3, 1, 16, "EAGLE tree levels (draft tokens along a path)")
TOP_K = Option("top_k", 4, 1, 16, "children per expanded node, and nodes expanded per level")
TOTAL_TOKENS = Option("total_tokens", 8, 1, 64, "draft tree nodes the target verifies in one forward "
                      "(temperature 0 only: at T > 0 the head samples a chain of depth tokens)", greedy_only=True)
SS_TOP_K = Option("top_k", 2, 1, 16, "candidates per stream in the draft tree (1: a flat chain of the streams' "
                  "argmaxes)")
SS_TOTAL_TOKENS = Option("total_tokens", 4, 1, 64, "draft tree nodes the target verifies in one forward "
                         "(temperature 0 only: at T > 0 the draft is a chain of gamma tokens)", greedy_only=True)
SS_ONE_FORWARD = Option("one_forward", 0, 0, 1, "1: the streams of every window row run in the verify step, before "
                        "its correction is known (the paper's form, with streams trained without the next-token "
                        "input); 0: the streams of the accepted row run after it, and see the step's correction")
LOOKUP = Option("lookup", 8, 0, 64, "tokens copied from the context into the draft tree as one more branch "
                "(prompt lookup; 0: off; temperature 0 only)", greedy_only=True)
MIRROR_LOOKUP = Option("lookup", 8, 0, 64, "after a miss, copy up to this many tokens from the context as the next "
                       "window instead of a fallback draft, when the context holds a continuation (0: off; temperature 0 only)",
                       greedy_only=True)
MIRROR_STREAMS = Option("streams", 0, 0, 1, "how the draft drafts: 0 token by token; 1 each window (each branch) "
                        "in one forward with its trained speculative streams")
SD_STREAMS = Option("streams", 0, 0, 2, "how the draft drafts: 0 token by token; 1 each window in one forward with "
                    "its trained speculative streams; 2 each draft forward checks the lookahead its streams proposed "
                    "in the one before (the tokens of 0, in fewer forwards)")
MIRROR_TREE = Option("tree", 0, 0, 63, "tree windows (temperature 0 only): the fallback draft and "
                     "every branch's rollout grow a tree gamma levels deep, 4 children per expanded node, and keep "
                     "this many nodes, and the target verifies the window as a tree; 0: chains of gamma",
                     greedy_only=True).scoped("streams", 0)
BRANCH_BUDGET = Option("branch_budget", 16, 1, 256, "branches the draft rolls out per step")


def _check_exit_layer(pair, options):
    layers = pair.target.num_layers
    if not options["exit_layer"] < layers:
        raise MirrorSDError(f"exit_layer must be below the target's {layers} layers (0 = {mirror.default_exit_layer(layers)}), "
                            f"got {options['exit_layer']}")


def _check_mirror(pair, options):
    _check_exit_layer(pair, options)
    make_drafter(options["streams"]).check(pair, options["gamma"])  # the fresh draft after a miss


def _one_device_target(pair, method: str):
    if pair.target.layer_devices:
        raise MirrorSDError(f"method {method!r} does not support a target sharded over several devices "
                            f"({pair.target_lane.display_device}); vanilla, sd and mirror do")


def _check_eagle(pair, options):
    _one_device_target(pair, "eagle")
    eagle.check(pair, options)


def _check_streams(pair, options):
    from ..models.streams import target_streams

    _one_device_target(pair, "ss")
    trained = target_streams(pair, one_forward=bool(options["one_forward"])).num_streams
    if options["gamma"] > trained:
        raise MirrorSDError(f"gamma must be at most {trained} for method 'ss' (its trained streams), "
                            f"got {options['gamma']}")


from . import eagle, mirror, sd, ss, vanilla  # noqa: E402  (modules use Option/Method above)

register(Method("vanilla", "Vanilla", "autoregressive: one target forward per token",
                vanilla.decode, needs_draft=False, parallel_lanes=False))
register(Method("sd", "Speculative decoding", "a draft model proposes gamma tokens, the target verifies them in one forward",
                sd.decode, needs_draft=True, parallel_lanes=False, options=(GAMMA, SD_STREAMS, *drafter_options()),
                check=sd.check))
register(Method("ss", "Speculative Streaming", "the target drafts for itself: trained streams on its top layers "
                "propose the next gamma tokens while its main stream verifies", ss.decode, needs_draft=False,
                parallel_lanes=False, options=(SS_GAMMA, SS_TOP_K, SS_TOTAL_TOKENS, LOOKUP, SS_ONE_FORWARD), check=_check_streams))
register(Method("mirror", "Mirror-SD", "the target's early exit steers branch rollouts on the draft lane, "
                "which run while the target finishes its layers", mirror.decode, needs_draft=True,
                parallel_lanes=True, options=(GAMMA, KAPPA, EXIT_LAYER, BRANCH_BUDGET, MIRROR_STREAMS, MIRROR_LOOKUP, MIRROR_TREE),
                check=_check_mirror))
register(Method("eagle", "EAGLE-2", "a feature-level head on the target's lane drafts a dynamic tree; "
                "the target verifies the whole tree in one forward", eagle.decode, needs_draft=False,
                parallel_lanes=False, options=(DEPTH, TOP_K, TOTAL_TOKENS, LOOKUP), check=_check_eagle))
