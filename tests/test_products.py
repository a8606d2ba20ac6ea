"""Planned matrix products (models/products.py), on the CPU: every formulation is the same product
as F.linear, the tuner keeps the fastest by its timer, and a forward in any formulation gives the
plain forward's logits. The skinny Triton kernel runs in Triton's interpreter here (conftest sets
TRITON_INTERPRET=1 on machines without CUDA); tests/test_cuda.py times and checks them on a GPU."""
import pytest
import torch
import torch.nn.functional as F

from mirror_sd import load_pair
from mirror_sd.errors import MirrorSDError
from mirror_sd.gpu_check import products_section
from mirror_sd.models import products
from mirror_sd.models.linear import linear
from mirror_sd.models.loading import load_model
from mirror_sd.models.products import FORMULATIONS, MARGIN, planned, tune

pytest.importorskip("triton")


@pytest.fixture(autouse=True)
def fresh_plan(monkeypatch):
    """Each test tunes from an empty plan."""
    monkeypatch.setattr(products, "PLAN", {})
    monkeypatch.setattr(products, "TIMES", {})


def timer_for(times: dict[str, float]):
    """A stand-in for graph_us: each formulation's 'time' from ``times`` (a name missing raises)."""
    def timer(fn):
        name = fn.__defaults__[0]  # tune's lambda binds the formulation's name
        if name not in times:
            raise RuntimeError(f"{name} cannot run here")
        return times[name]
    return timer


def fastest(name: str):
    return timer_for({n: (1.0 if n == name else 10.0) for n in FORMULATIONS})


@pytest.mark.parametrize("name", FORMULATIONS)
@pytest.mark.parametrize("rows, n, k, bias", [(1, 96, 64, False), (3, 40, 70, True), (16, 64, 128, False),
                                              (17, 33, 64, True)])
def test_every_formulation_is_the_same_product_as_f_linear(name, rows, n, k, bias):
    gen = torch.Generator().manual_seed(rows * n)
    x, w = torch.randn(rows, k, generator=gen), torch.randn(n, k, generator=gen)
    b = torch.randn(n, generator=gen) if bias else None
    y = products.run(name, x, w, b)
    assert y.shape == (rows, n) and y.is_contiguous()
    torch.testing.assert_close(y, F.linear(x, w, b), rtol=1e-5, atol=1e-5)  # only the order of sums differs


def test_the_tuner_keeps_the_fastest_and_records_every_time():
    x, w = torch.randn(4, 32), torch.randn(48, 32)
    times = {"cublas": 9.0, "swapped": 7.0, "skinny": 2.0, "skinny-wide": 3.0}
    assert tune(x, w, None, timer_for(times)) == "skinny"
    key = products.kind(x, w, None)
    assert products.PLAN[key] == "skinny" and products.TIMES[key] == times
    [row] = products.plan_table()
    assert (row["weight"], row["rows"], row["chosen"], row["skinny"]) == ("48 x 32", 4, "skinny", 2.0)


def test_the_tuner_keeps_cublas_unless_another_saves_more_than_the_margin():
    x, w = torch.randn(2, 32), torch.randn(48, 32)
    almost = 10.0 * (1 - MARGIN / 2)
    assert tune(x, w, None, timer_for({"cublas": 10.0, "swapped": almost, "skinny": 11.0})) == "cublas"


def test_a_formulation_that_cannot_run_is_recorded_and_left_out():
    x, w = torch.randn(8, 32), torch.randn(48, 32)
    assert tune(x, w, None, timer_for({"cublas": 10.0, "swapped": 4.0})) == "swapped"
    times = products.TIMES[products.kind(x, w, None)]
    assert times["skinny"] == "RuntimeError: skinny cannot run here"
    section = "\n".join(products_section(products.plan_table()))
    assert "| 48 x 32 | 8 | swapped | 10.0 | **4.0** | - | - |" in section
    assert "skinny could not run: RuntimeError: skinny cannot run here" in section


def test_products_take_their_plan_only_inside_planned():
    x, w = torch.randn(1, 5, 32), torch.randn(48, 32)
    linear(x, w)
    assert products.PLAN == {}  # outside planned(): F.linear (the CPU's own paths), nothing tuned
    with planned(True, timer=fastest("swapped")):
        y = linear(x, w)
        linear(x, w)  # the same kind again: planned already
    assert list(products.PLAN.values()) == ["swapped"] and len(products.TIMES) == 1
    assert y.shape == (1, 5, 48)
    torch.testing.assert_close(y, F.linear(x, w), rtol=1e-5, atol=1e-5)
    with planned(False):
        assert not products.planning()


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])  # qwen2: q, k and v products with biases
@pytest.mark.parametrize("name", FORMULATIONS)
def test_a_forward_in_any_formulation_gives_the_plain_logits(tiny_dirs, tmp_path, model_type, name):
    from conftest import make_tiny_model

    folder = tiny_dirs["target"] if model_type == "llama" else make_tiny_model(tmp_path / "qwen2", 5, "qwen2")
    model, _ = load_model(folder, torch.device("cpu"), torch.float32)
    ids = torch.tensor([[1, 5, 2, 9, 3]])
    with torch.inference_mode():
        plain = model.forward(ids, model.new_cache(16))
        with planned(True, timer=fastest(name)):
            tuned = model.forward(ids, model.new_cache(16))
    assert set(products.PLAN.values()) == {name}
    torch.testing.assert_close(tuned, plain, rtol=1e-5, atol=1e-5)


def test_the_pair_passes_its_products_setting_to_its_stages(tiny_dirs):
    pair = load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["draft"]), graphs="on", products="cublas")
    cache = pair.new_cache(pair.target, 32)
    assert cache.stages.planned_products is False
    assert all(not stage.planned_products for stage in cache.stages._stages.values())
    pair.products = "tuned"
    assert pair.new_cache(pair.target, 32).stages.planned_products is True
    assert pair.describe()["products"] == "tuned"
    with pytest.raises(MirrorSDError, match="products must be one of tuned, cublas"):
        load_pair(target=str(tiny_dirs["target"]), draft=None, products="fast")
