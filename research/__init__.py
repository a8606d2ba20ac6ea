"""Research tools behind docs/experiments: the measurements the experiment records cite.

Not part of the product (nothing under mirror_sd/ or app/ imports them). Run each from the
repository root as ``python -m research.NAME`` (``--help`` lists its options); what they share
is in :mod:`research.comparison`. The tools the app, gpu-check and the docs' how-tos run live in
scripts/.
"""
