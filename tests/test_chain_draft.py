"""A draft's greedy chain as one stage (models/chain_draft.py): the tokens, cache length and keys
that ``draft_window`` gives a forward at a time, from one replay (tests/test_capture_safe.py: its
padding runs)."""
from types import SimpleNamespace

import pytest
import torch

from mirror_sd import load_pair
from mirror_sd.drafting.token_by_token import chain_on_stage, chain_stages, draft_window
from mirror_sd.drafting.tree import read_trees
from mirror_sd.models.chain_draft import ChainDraft
from mirror_sd.models.forwards import FULL, forward, stage_cache
from mirror_sd.sampling import draft_argmax


@pytest.mark.parametrize("draft", ["draft", "reduced_draft"])  # picks over the whole vocabulary, or a draft's rows
@pytest.mark.parametrize("gamma,unseen", [(1, 1), (3, 1), (4, 2), (6, 3)])
def test_one_replay_drafts_the_chain_a_forward_at_a_time_gives(tiny_dirs, draft, gamma, unseen):
    pair = load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs[draft]), target_device="cpu",
                     draft_device="cpu", int8_drafting=False)  # int8 would quantise the padding rows with the real ones
    model, V = pair.draft, pair.target.args.vocab_size
    plain, staged = model.new_cache(100), stage_cache({}, model, 100, [FULL, ChainDraft(gamma, V)])
    sequence = [1, 5, 2, 9, 4, 7, 3]
    run = SimpleNamespace(pair=pair, sequence=sequence, draft_sampler=SimpleNamespace(greedy=True),
                          draft_picks=lambda logits: draft_argmax(logits, model.vocab_map, V))
    windows = []
    for cache in (plain, staged):
        forward(model, torch.tensor([sequence[:len(sequence) - unseen]]), cache)
        windows.append(draft_window(run, cache, gamma))
    assert windows[1] == windows[0] and len(windows[0][0]) == gamma
    assert staged.length == plain.length == len(sequence) + gamma - 1
    assert torch.allclose(staged.k[:, :, :, :plain.length], plain.k[:, :, :, :plain.length], atol=1e-5)


def test_as_a_tree_the_chain_is_one_branch_of_the_same_picks(tiny_dirs):
    """``ChainDraft.as_tree`` (sd's one-read steps): the same picks as a tree's fields, each node the
    child of the one before, the cache moved as for the picks."""
    pair = load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["reduced_draft"]), target_device="cpu",
                     draft_device="cpu")
    model, V, gamma, sequence = pair.draft, pair.target.args.vocab_size, 4, [1, 5, 2, 9, 4, 7, 3]
    run = SimpleNamespace(pair=pair, sequence=sequence)
    drafted = []
    for chain in (ChainDraft(gamma, V), ChainDraft(gamma, V, as_tree=True)):
        cache = stage_cache({}, model, 100, [FULL, chain])
        forward(model, torch.tensor([sequence[:-1]]), cache)
        drafted.append(chain_on_stage(run, chain_stages(run, cache, chain), cache, chain))
        assert cache.length == len(sequence) + gamma - 1
    (tree,) = read_trees(drafted[1])
    assert tree.tokens == drafted[0].tolist() and tree.parents == [-1, 0, 1, 2] and tree.depths == [1, 2, 3, 4]
