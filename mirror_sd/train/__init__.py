"""Training tools for mirror-sd: distillation data for draft models, and draft training.

Run ``python -m mirror_sd.train --help``. The ``data`` subcommand builds prompts from offline corpora
(:mod:`mirror_sd.train.prompts`) and records the target model's own greedy answers
(:mod:`mirror_sd.train.distill`); ``draft`` trains the draft on them (:mod:`mirror_sd.train.draft`).
Corpus packages are pinned in ``requirements-train.txt``.
"""
