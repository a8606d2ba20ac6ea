"""The lean forward pass: parity with transformers, layer ranges, KV rollback, tree masks."""
import pytest
import torch
import transformers

from conftest import make_tiny_model
from mirror_sd import load_pair
from mirror_sd.models.linear import INT8, Linear, convert_to_int8, int8_view, uses_prepacked
from mirror_sd.models.loading import embedded_model_dir


@pytest.fixture(scope="module")
def target(embedded_pair):
    return embedded_pair.target


@pytest.fixture(scope="module")
def prompt_ids(embedded_pair):
    return torch.tensor([embedded_pair.encode("Why is the sky blue? Answer in one sentence.")])


def test_logits_match_transformers_on_embedded_target(target, prompt_ids):
    hf = transformers.AutoModelForCausalLM.from_pretrained(embedded_model_dir(), dtype=torch.float32).eval()
    with torch.no_grad():
        reference = hf(prompt_ids).logits
        ours = target(prompt_ids, target.new_cache(prompt_ids.shape[1]))
    # fp32 rounding over 30 layers (prepacked products; the kernels' summation order differs between
    # machines: up to 1.4e-4 on logits of size ~25 on one, under 1e-4 on others)
    assert torch.allclose(reference, ours, atol=5e-4, rtol=1e-5)
    assert torch.equal(reference.argmax(-1), ours.argmax(-1))


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3", "mistral"])
def test_llama_family_parity(tmp_path, model_type):
    folder = make_tiny_model(tmp_path / model_type, seed=7, model_type=model_type)
    ours = load_pair(target=str(folder), draft=None).target
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    with torch.no_grad():
        assert torch.allclose(hf(ids).logits, ours(ids, ours.new_cache(8)), atol=1e-5)


def test_prefix_then_suffix_equals_full(target, prompt_ids):
    with torch.no_grad():
        full = target(prompt_ids, target.new_cache(64))
        cache = target.new_cache(64)
        win = target.window(cache, prompt_ids.shape[1])
        exit_layer = target.num_layers // 2
        h = target.forward_layers(target.embed(prompt_ids), cache, win, 0, exit_layer)
        split = target.head(target.forward_layers(h, cache, win, exit_layer, None))
    assert torch.equal(full, split)


def test_kv_rollback_then_redecode(target, prompt_ids):
    """Decode a wrong continuation, roll back, decode the right one: same logits as never straying."""
    n = prompt_ids.shape[1]
    with torch.no_grad():
        cache = target.new_cache(n + 8)
        target(prompt_ids, cache)
        straight = target(torch.tensor([[42, 43]]), cache)
        assert cache.length == n + 2
        cache.rollback(n)
        target(torch.tensor([[7, 8, 9, 10]]), cache)  # a rejected window
        cache.rollback(n)
        again = target(torch.tensor([[42, 43]]), cache)
    assert torch.allclose(straight, again, atol=1e-5)


def test_tree_mask_and_positions_match_sequential_branches(target, prompt_ids):
    """Two branches (a b) and (c) verified in one window with a tree mask give the logits each
    branch gets alone; keep() then compacts branch (c) into place."""
    n = prompt_ids.shape[1]
    a, b, c = 100, 200, 300
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [0, 0, 1]], dtype=torch.bool)  # a; a->b; c
    positions = torch.tensor([[n, n + 1, n]])
    with torch.no_grad():
        cache = target.new_cache(n + 8)
        target(prompt_ids, cache)
        tree_logits = target(torch.tensor([[a, b, c]]), cache, positions=positions, tree_mask=tree, commit=False)
        alone = target.new_cache(n + 8)
        target(prompt_ids, alone)
        ab = target(torch.tensor([[a, b]]), alone)
        alone.rollback(n)
        c_alone = target(torch.tensor([[c]]), alone)
        assert torch.allclose(tree_logits[0, :2], ab[0], atol=1e-4)
        assert torch.allclose(tree_logits[0, 2], c_alone[0, 0], atol=1e-4)
        cache.keep([n + 2], at=n)  # accept branch (c): its KV entries move to slot n
        next_after_c = target(torch.tensor([[5]]), cache)
        alone.rollback(n + 1)
        expected = target(torch.tensor([[5]]), alone)
    assert cache.length == n + 2
    assert torch.allclose(next_after_c, expected, atol=1e-4)


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 16])
def test_prepacked_linear_matches_f_linear(rows):
    """Decoding's products (a few rows) through oneDNN's prepacked weights give F.linear's result."""
    torch.manual_seed(0)
    layer = Linear(24, 40, bias=True)
    x = torch.randn(2, rows, 24)
    with torch.no_grad():
        expected = torch.nn.functional.linear(x, layer.weight, layer.bias)
        assert torch.allclose(layer(x), expected, atol=1e-5)
        assert uses_prepacked(x, layer.weight)  # more than one row (here 2 x rows) is prepacked
        layer.weight.mul_(2)  # an in-place change (as an optimiser step makes) repacks the weight
        assert torch.allclose(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias), atol=1e-5)


def test_inference_products_are_prepacked_even_for_one_row_and_training_ones_are_not():
    weight = torch.randn(1536, 576, requires_grad=True)  # a decoder-layer weight
    with torch.no_grad():
        assert uses_prepacked(torch.randn(1, 1, 576), weight)  # one token: vanilla's every product
        assert uses_prepacked(torch.randn(1, 5, 576), weight)  # a draft window
    assert not uses_prepacked(torch.randn(1, 5, 576), weight)  # gradients needed: plain F.linear


def test_prepacked_linear_trains_like_nn_linear():
    torch.manual_seed(0)
    layer = Linear(8, 4)
    x = torch.randn(3, 8, requires_grad=True)
    layer(x).sum().backward()  # with gradients it is F.linear
    assert torch.allclose(x.grad, layer.weight.sum(0).expand(3, 8))
    assert torch.allclose(layer.weight.grad, x.detach().sum(0).expand(4, 8))


@pytest.mark.skipif(not INT8, reason="this PyTorch build has no int8 CPU kernels")
def test_int8_products_run_only_in_converted_layers_and_stay_close():
    """A layer converted to int8 products (what only drafts, at load) multiplies by an int8 copy of its
    weight: close to fp32, not equal; converted back, and for layers marked int8=False, and with
    gradients, the fp32 product is unchanged. An int8 view converts a copy, the layer itself stays."""
    torch.manual_seed(0)
    layer, kept = Linear(576, 1536, bias=True), Linear(576, 1536, bias=True, int8=False)
    kept.load_state_dict(layer.state_dict())
    x = torch.randn(1, 3, 576)
    with torch.no_grad():
        exact = torch.nn.functional.linear(x, layer.weight, layer.bias)
        view = int8_view(torch.nn.Sequential(layer))[0]
        assert view is not layer and view.weight is layer.weight and not layer.int8_products
        assert torch.allclose(layer(x), exact, atol=1e-5)  # the layer itself: fp32
        convert_to_int8(layer), convert_to_int8(kept)
        approx, fp32_kept = layer(x), kept(x)
        assert torch.equal(view(x), approx)
        assert not torch.allclose(approx, exact, atol=1e-5)  # really int8: not the fp32 product
        assert (approx - exact).abs().max() < 0.02 * exact.abs().max()
        assert torch.allclose(fp32_kept, exact, atol=1e-5)
        layer.weight.mul_(2)  # an in-place change remakes the int8 copy too
        assert (layer(x) - 2 * exact + layer.bias).abs().max() < 0.04 * exact.abs().max()
        convert_to_int8(layer, False)
        assert torch.allclose(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias), atol=1e-5)
    convert_to_int8(layer)
    y = layer(x)  # gradients needed (training): the plain fp32 product
    assert torch.allclose(y, torch.nn.functional.linear(x, layer.weight, layer.bias), atol=1e-5)
