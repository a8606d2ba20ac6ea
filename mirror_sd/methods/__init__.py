"""The registry of decoding methods: CLI, bench and app list methods from here.

A method is a generator ``decode(run: Decoding, **options) -> Iterator[Step]``: it works on the
lanes of ``run.pair``, records spans through them, and yields each committed step via
``run.commit``. Adding a method is one module plus one ``register`` call below.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..errors import MirrorSDError


@dataclass(frozen=True)
class Option:
    name: str
    default: int | float
    low: int | float  # smallest allowed value
    high: int | float  # largest allowed value
    help: str
    kind: type = int

    def check(self, value):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (self.kind is int and value != int(value)):
            raise MirrorSDError(f"{self.name} must be {'an integer' if self.kind is int else 'a number'}, got {value!r}")
        if not self.low <= value <= self.high:
            raise MirrorSDError(f"{self.name} must be between {self.low} and {self.high}, got {value}")
        return self.kind(value)


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
        """The method's options with defaults filled in; unknown or out-of-range values refused."""
        known = {o.name: o for o in self.options}
        unknown = sorted(set(given) - set(known))
        if unknown:
            takes = f"takes {', '.join(known)}" if known else "takes no options"
            raise MirrorSDError(f"method {self.name!r} {takes}; got {', '.join(unknown)}")
        return {name: opt.check(given[name]) if name in given else opt.default for name, opt in known.items()}


METHODS: dict[str, Method] = {}


def register(method: Method):
    METHODS[method.name] = method


def get_method(name: str) -> Method:
    if name not in METHODS:
        raise MirrorSDError(f"unknown method {name!r}: choose from {', '.join(METHODS)}")
    return METHODS[name]


SD_GAMMA = Option("gamma", 2, 1, 32, "draft tokens per step (window length); 2: docs/sweeps/sd_gamma_prepacked.csv")
SS_GAMMA = Option("gamma", 4, 1, 32, "stream levels in the draft (at most the trained streams, 4 for the shipped ones)")
KAPPA = Option("kappa", 2, 1, 64, "early-exit candidates per window position (token channel width); "
                                   "2: best in docs/sweeps/mirror_kappa.csv")
EXIT_LAYER = Option("exit_layer", 0, 0, 1024, "target layer feeding the token channel (0 = three quarters of the "
                                              "target's layers: best in docs/sweeps/mirror_exit_layer.csv)")
DEPTH = Option("depth", 3, 1, 16, "EAGLE tree levels (draft tokens along a path); 3: best in "
                                  "docs/sweeps/eagle_ttt_depth.csv")
TOP_K = Option("top_k", 4, 1, 16, "children per expanded node, and nodes expanded per level")
TOTAL_TOKENS = Option("total_tokens", 8, 1, 64, "draft tree nodes the target verifies in one forward "
                      "(greedy only; T > 0 verifies a chain of depth tokens)")
SS_TOP_K = Option("top_k", 2, 1, 16, "candidates per stream in the draft tree (1: a flat chain of the streams' "
                  "argmaxes); 2 with total_tokens 4: fastest in docs/sweeps/ss_tree.csv")
SS_TOTAL_TOKENS = Option("total_tokens", 4, 1, 64, "draft tree nodes the target verifies in one forward "
                         "(greedy only; T > 0 verifies a chain of gamma tokens)")
SS_ONE_FORWARD = Option("one_forward", 0, 0, 1, "1: the streams ride in the verify forward, one target forward "
                        "per step (the paper's form, with streams trained without the next-token input); 0: the "
                        "streams run in a pass of their own after it, and see the step's correction")
LOOKUP = Option("lookup", 8, 0, 64, "tokens copied from the context into the draft tree as one more branch "
                "(prompt lookup, methods/lookup.py; 0: off; greedy only); 8: docs/sweeps/eagle_lookup.csv, "
                "ss_lookup.csv")
MIRROR_LOOKUP = Option("lookup", 8, 0, 64, "after a miss, copy up to this many tokens from the context as the next "
                       "window instead of a fallback draft, when the context holds a continuation (methods/lookup.py; "
                       "0: off; greedy only); 8: docs/sweeps/mirror_lookup.csv")
STREAMS = Option("streams", 0, 0, 1, "1: the draft proposes each window (each branch) in one forward with its "
                 "trained speculative streams; 0: token by token")
SD_STREAMS = Option("streams", 0, 0, 2, "0: the draft proposes token by token; 1: each window in one forward with its "
                    "trained speculative streams; 2: each draft forward checks the lookahead its streams proposed "
                    "in the one before (the tokens of 0, in fewer forwards)")
SD_TOP_K = Option("top_k", 8, 1, 16, "streams=2: candidates per stream in the lookahead tree each draft forward "
                  "checks (1: a chain of the streams' argmaxes)")
SD_TOTAL_TOKENS = Option("total_tokens", 4, 1, 64, "streams=2: lookahead tree nodes each draft forward checks; 4 with "
                         "top_k 8 and lookup 8: fastest in docs/sweeps/sd_lookahead_12_prompts.csv")
SD_LOOKUP = Option("lookup", 8, 0, 64, "streams=2: tokens copied from the context into the lookahead tree as one more "
                   "branch (methods/lookup.py; 0: off)")
SD_OVERSHOOT = Option("overshoot", 0, 0, 1, "streams=2: 1, every draft forward checks its streams' full depth and "
                      "the window keeps lookahead accepted past gamma (gamma to gamma + streams tokens); 0, windows "
                      "of exactly gamma")
SD_COPY_BELOW = Option("copy_below", 0.0, 0.0, 1.0, "streams=0: where the draft's top-1 probability is below this "
                       "and the context continues the last 3 or 2 tokens, it proposes the copied token instead "
                       "(methods/lookup.py; 0: off)", kind=float)
BRANCH_BUDGET = Option("branch_budget", 16, 1, 256, "branches the draft rolls out per step; 16: best in "
                       "docs/sweeps/mirror_branch_budget.csv")
MIRROR_GAMMA = Option("gamma", 2, 1, 32, "draft tokens per step (window length); 2: docs/sweeps/mirror_gamma_prepacked.csv")


def _check_exit_layer(pair, options):
    layers = pair.target.num_layers
    if not options["exit_layer"] < layers:
        raise MirrorSDError(f"exit_layer must be below the target's {layers} layers (0 = {mirror.default_exit_layer(layers)}), "
                            f"got {options['exit_layer']}")


def _check_mirror(pair, options):
    _check_exit_layer(pair, options)
    sd.check_streams(pair, options)


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
                sd.decode, needs_draft=True, parallel_lanes=False, options=(SD_GAMMA, SD_STREAMS, SD_TOP_K, SD_TOTAL_TOKENS, SD_LOOKUP,
                                                                SD_OVERSHOOT, SD_COPY_BELOW),
                check=sd.check_streams))
register(Method("ss", "Speculative Streaming", "the target drafts for itself: trained streams on its top layers "
                "propose the next gamma tokens while its main stream verifies", ss.decode, needs_draft=False,
                parallel_lanes=False, options=(SS_GAMMA, SS_TOP_K, SS_TOTAL_TOKENS, LOOKUP, SS_ONE_FORWARD), check=_check_streams))
register(Method("mirror", "Mirror-SD", "the target's early exit steers branch rollouts on the draft lane, "
                "which run while the target finishes its layers", mirror.decode, needs_draft=True,
                parallel_lanes=True, options=(MIRROR_GAMMA, KAPPA, EXIT_LAYER, BRANCH_BUDGET, STREAMS, MIRROR_LOOKUP), check=_check_mirror))
register(Method("eagle", "EAGLE-2", "a feature-level head on the target's lane drafts a dynamic tree; "
                "the target verifies the whole tree in one forward", eagle.decode, needs_draft=False,
                parallel_lanes=False, options=(DEPTH, TOP_K, TOTAL_TOKENS, LOOKUP), check=_check_eagle))
