"""mirror-sd: speculative decoding engines, from vanilla to Mirror Speculative Decoding.

    from mirror_sd import load_pair, generate
    pair = load_pair()                      # the embedded default target and draft
    out = generate(pair, "Why is the sky blue?", method="sd", max_new_tokens=64)
    print(out.text, out.metrics["mean_accepted"])
"""
from .engine import Output, generate, stream
from .errors import MirrorSDError
from .methods import METHODS, get_method
from .models.pair import ModelPair, load_pair
from .trace import Span, Step, Trace

__all__ = ["load_pair", "generate", "stream", "Output", "ModelPair", "METHODS", "get_method", "Trace",
           "Span", "Step", "MirrorSDError"]
