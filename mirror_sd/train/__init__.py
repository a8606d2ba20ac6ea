"""Training tools for mirror-sd: distillation data, and the drafts trained on it.

Run ``python -m mirror_sd.train --help``. The ``data`` subcommand builds prompts from offline corpora
(:mod:`mirror_sd.train.prompts`) or has the target write them (:mod:`mirror_sd.train.instruct`), and
records the target model's own greedy answers (:mod:`mirror_sd.train.distill`, with the generation loop
of :mod:`mirror_sd.train.generate`); ``draft``, ``eagle`` and ``ss`` train the draft model, the EAGLE
head and the speculative streams on them (:mod:`mirror_sd.train.draft`, :mod:`mirror_sd.train.eagle`,
:mod:`mirror_sd.train.ss`). The trainers share how they read the data folders
(:mod:`mirror_sd.train.data`), their options (:mod:`mirror_sd.train.options`), the training loop
(:mod:`mirror_sd.train.loop`) and the model-card writer (:mod:`mirror_sd.train.card`).
Corpus packages are pinned in ``requirements-train.txt``.
"""
