"""Tuned kernels (models/tuning.py), on the CPU: every formulation of a matrix product, attention,
RMSNorm (alone or after a residual add), the rotary embedding, q, k and v and the gated MLP computes
what the default one does, the tuner keeps the fastest by its timer, and a forward in any
formulation gives the plain forward's logits. The Triton kernels run in Triton's interpreter here
(conftest sets TRITON_INTERPRET=1 on machines without CUDA; on a CUDA machine the tests that run
them are skipped); tests/test_cuda.py times and checks them on a GPU."""
import os

import pytest
import torch
import torch.nn.functional as F

from mirror_sd import load_pair
from mirror_sd.errors import MirrorSDError
from mirror_sd.models import tuning
from mirror_sd.models.linear import Linear, linear
from mirror_sd.models.loading import load_model
from mirror_sd.models.tuning import FORMULATIONS, MARGIN, Plan
from mirror_sd.tools.gpu_check import tuning_section

pytest.importorskip("triton")
TRITON = {"skinny", "skinny-wide", "matvec", "matvec-wide", "triton", "joined-triton"}  # formulations running Triton


def needs_interpreter(*names: str):
    """Skip where Triton runs CPU tensors not at all: its interpreter does (conftest turns it on
    where there is no CUDA); on a CUDA machine tests/test_cuda.py checks these kernels instead."""
    if TRITON & set(names) and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton's kernels run CPU tensors in its interpreter only: tests/test_cuda.py checks them here")


@pytest.fixture(autouse=True)
def fresh_plan(monkeypatch):
    """Each test tunes from an empty plan."""
    monkeypatch.setattr(tuning, "PLAN", {})
    monkeypatch.setattr(tuning, "TIMES", {})


def timer_for(times: dict[str, float]):
    """A stand-in for graph_us: each formulation's 'time' from ``times`` (a name missing raises)."""
    def timer(fn):
        name = fn.__defaults__[0]  # tune's lambda binds the formulation's name
        if name not in times:
            raise RuntimeError(f"{name} cannot run here")
        return times[name]
    return timer


def fastest(*chosen: str):
    """A timer under which ``chosen`` (a formulation per op, in FORMULATIONS' order) win."""
    winners = dict(zip(FORMULATIONS, chosen))
    return lambda fn: 1.0 if winners.get(fn.__defaults__[1]) == fn.__defaults__[0] else 10.0


@pytest.mark.parametrize("name", FORMULATIONS["product"])
@pytest.mark.parametrize("rows, n, k, bias", [(1, 96, 64, False), (3, 40, 70, True), (16, 64, 128, False),
                                              (17, 33, 64, True), (2, 13, 600, True)])  # the last: K in steps
def test_every_product_formulation_is_f_linears_product(name, rows, n, k, bias):
    needs_interpreter(name)
    gen = torch.Generator().manual_seed(rows * n)
    x, w = torch.randn(rows, k, generator=gen), torch.randn(n, k, generator=gen)
    b = torch.randn(n, generator=gen) if bias else None
    y = tuning.run_product(name, x, w, b)
    assert y.shape == (rows, n) and y.is_contiguous()
    torch.testing.assert_close(y, F.linear(x, w, b), rtol=1e-5, atol=1e-5)  # only the order of sums differs


def test_the_matvec_kernel_refuses_a_k_of_too_many_unrolled_steps():
    """The matrix-vector kernel unrolls its loop over K: a K of more than MAX_STEPS steps is refused
    (the tuner records why and leaves it out) rather than compiled into a huge kernel."""
    block_k = tuning.MATVEC["matvec-wide"][1]
    x, w = torch.randn(2, block_k * tuning.MAX_STEPS + 1), torch.randn(8, block_k * tuning.MAX_STEPS + 1)
    with pytest.raises(ValueError, match=f"unrolls at most {tuning.MAX_STEPS} steps"):
        tuning.run_product("matvec-wide", x, w, None)


@pytest.mark.parametrize("name", FORMULATIONS["attention"])
@pytest.mark.parametrize("causal", [False, True])
def test_every_attention_formulation_is_grouped_query_attention(name, causal):
    needs_interpreter(name)
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(1, 6, 5, 8, generator=gen)
    k, v = torch.randn(1, 2, 5 if causal else 12, 8, generator=gen), torch.randn(1, 2, 5 if causal else 12, 8, generator=gen)
    mask = None if causal else torch.rand(1, 1, 5, 12, generator=gen) > 0.3
    if mask is not None:
        mask[..., 0] = True  # every row sees something
    expected = F.scaled_dot_product_attention(q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1),
                                              attn_mask=mask, is_causal=causal)
    torch.testing.assert_close(tuning.run_attention(name, q, k, v, mask, causal), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", FORMULATIONS["norm"])
@pytest.mark.parametrize("shape", [(1, 1, 64), (2, 5, 96), (3, 4, 6, 8)])  # the last: a per-head norm (qk_norm)
def test_every_norm_formulation_is_the_llama_rms_norm(name, shape):
    needs_interpreter(name)
    gen = torch.Generator().manual_seed(len(shape))
    x, w = torch.randn(*shape, generator=gen) * 3, torch.randn(shape[-1], generator=gen)
    expected = w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))  # Hugging Face's Llama RMSNorm
    torch.testing.assert_close(tuning.run_norm(name, x, w, 1e-5), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", FORMULATIONS["added_norm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_added_norm_formulation_adds_then_normalises(name, dtype):
    needs_interpreter(name)
    from mirror_sd.models.llama import RMSNorm

    gen = torch.Generator().manual_seed(3)
    x, delta = (torch.randn(2, 5, 96, generator=gen).to(dtype) for _ in range(2))
    rms = RMSNorm(96, 1e-5).to(dtype)
    with torch.no_grad():
        rms.weight.copy_(torch.randn(96, generator=gen))
    total, normed = tuning.run_added_norm(name, x, delta, rms)
    # the sum in x's dtype: the same in fp32; in bf16 within one rounding (Triton's interpreter
    # truncates to bf16 where PyTorch and a GPU round to nearest)
    exact = dtype == torch.float32
    torch.testing.assert_close(total, x + delta, rtol=0 if exact else 2 ** -7, atol=0)
    torch.testing.assert_close(normed, rms(x + delta), rtol=1e-5 if exact else 2 ** -6, atol=1e-5 if exact else 2e-2)
    assert tuning.added_norm(x, None, rms)[1].equal(rms(x))  # no delta: the norm alone


def test_triton_attention_skips_hidden_blocks_and_zeroes_rows_that_see_nothing():
    """The split attention kernel over many chunks of slots, most of them hidden (a stage's unused
    slots), a batch whose second row sees no slot (zero, as PyTorch's attention gives it) and q, k
    in the strides Attention hands it."""
    needs_interpreter("triton")
    gen = torch.Generator().manual_seed(11)
    q = torch.randn(2, 3, 6, 16, generator=gen).transpose(1, 2)  # [B, H, T, D], not contiguous
    k, v = (torch.randn(2, 2, 700, 16, generator=gen)[:, :, :600] for _ in range(2))  # 3 chunks, 2 key heads
    mask = torch.zeros(2, 1, 3, 600, dtype=torch.bool)
    mask[..., :20] = torch.rand(2, 1, 3, 20, generator=gen) > 0.3
    mask[..., 580:] = True  # scratch slots at the end
    mask[1, 0, 1] = False
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    got = tuning.run_attention("triton", q, k, v, mask, False)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert got[1, :, 1].eq(0).all()
    assert got.transpose(1, 2).is_contiguous()  # [B, T, H, D] memory: the output product reads it as it is


@pytest.mark.parametrize("name", FORMULATIONS["rotary"])
@pytest.mark.parametrize("cos_batch", [1, 2])
def test_every_rotary_formulation_turns_q_as_rotate_half_does(name, cos_batch):
    needs_interpreter(name)
    gen = torch.Generator().manual_seed(cos_batch)
    q = torch.randn(2, 5, 6, 16, generator=gen).transpose(1, 2)  # [B, H, T, D] as Attention makes it: not contiguous
    angles = torch.rand(cos_batch, 1, 5, 8, generator=gen) * 6
    cos, sin = torch.cat([angles.cos()] * 2, dim=-1), torch.cat([angles.sin()] * 2, dim=-1)  # [B|1, 1, T, D]
    q1, q2 = q.chunk(2, dim=-1)
    expected = q * cos + torch.cat((-q2, q1), dim=-1) * sin
    torch.testing.assert_close(tuning.run_rotary(name, q, cos, sin), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", FORMULATIONS["rotary_store"])
@pytest.mark.parametrize("cos_batch", [1, 2])
def test_every_rotary_store_formulation_turns_q_and_k_and_stores_k_and_v_at_their_slots(name, cos_batch):
    needs_interpreter(name)
    gen = torch.Generator().manual_seed(5 + cos_batch)
    qkv = torch.randn(2, 3, (6 + 2 + 2) * 16, generator=gen)  # [B, T, q | k | v], as one joined product gives it
    q, k, v = (x.view(2, 3, -1, 16).transpose(1, 2) for x in qkv.split([96, 32, 32], dim=-1))  # [B, heads, T, D]
    angles = torch.rand(cos_batch, 1, 3, 8, generator=gen) * 6
    cos, sin = torch.cat([angles.cos()] * 2, dim=-1), torch.cat([angles.sin()] * 2, dim=-1)
    slots = torch.tensor([4, 5, 9])  # a window's two real rows, then a padding row's scratch slot
    k_cache, v_cache = torch.randn(2, 2, 10, 16, generator=gen), torch.randn(2, 2, 10, 16, generator=gen)
    before = k_cache.clone()
    turned, k_all, v_all = tuning.run_rotary_store(name, q, k, v, cos, sin, k_cache, v_cache, slots)
    expected_q, expected_k = tuning.run_rotary("composite", q, cos, sin), tuning.run_rotary("composite", k, cos, sin)
    torch.testing.assert_close(turned, expected_q, rtol=1e-6, atol=1e-6)
    assert k_all is k_cache and v_all is v_cache  # stored in place, every slot returned
    torch.testing.assert_close(k_cache[:, :, slots], expected_k, rtol=1e-6, atol=1e-6)
    assert v_cache[:, :, slots].equal(v)
    others = [s for s in range(10) if s not in slots.tolist()]
    assert k_cache[:, :, others].equal(before[:, :, others])  # no other slot touched


@pytest.mark.parametrize("name", FORMULATIONS["projections"])
def test_every_projections_formulation_is_each_product(name):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 64)
    linears = [Linear(64, n, bias=bias) for n, bias in ((48, True), (16, False), (16, True))]  # biases: some
    got = tuning.run_projections(name, x, linears)
    assert [tuple(y.shape) for y in got] == [(2, 3, 48), (2, 3, 16), (2, 3, 16)]
    for y, linear in zip(got, linears):
        torch.testing.assert_close(y, F.linear(x, linear.weight, linear.bias), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", FORMULATIONS["gated"])
def test_every_gated_formulation_is_silu_of_gate_times_up(name):
    needs_interpreter(name)
    torch.manual_seed(1)
    x, gate, up = torch.randn(2, 5, 64), Linear(64, 40, bias=False), Linear(64, 40, bias=False)
    expected = F.silu(F.linear(x, gate.weight)) * F.linear(x, up.weight)
    torch.testing.assert_close(tuning.run_gated(name, x, gate, up), expected, rtol=1e-5, atol=1e-5)


def test_joined_weights_are_made_once_and_again_for_other_weights():
    linears = [Linear(8, 4), Linear(8, 2, bias=False)]
    weight, bias = tuning.joined(linears)
    assert weight.shape == (6, 8) and bias[4:].eq(0).all()  # the missing bias as zeros
    assert tuning.joined(linears)[0] is weight  # kept
    linears[1].weight = torch.nn.Parameter(torch.randn(2, 8))
    again, _ = tuning.joined(linears)
    assert again is not weight and torch.equal(again[4:], linears[1].weight)


def test_attention_is_tuned_on_random_inputs_that_use_every_block_of_slots(monkeypatch):
    """A stage's warm-up gives attention padding rows, each seeing one slot. A formulation wrong
    only where a row sees several slots (here: the value of the first slot it sees) passes on
    those; the tuner times and checks attention on random inputs instead, so it is left out."""
    q, k, v = torch.randn(1, 4, 2, 8), torch.zeros(1, 2, 300, 8), torch.zeros(1, 2, 300, 8)
    mask = torch.zeros(1, 1, 2, 300, dtype=torch.bool)
    mask[..., 0] = True  # padding rows: one slot each
    rq, rk, rv, seen = tuning.trial_attention_inputs(q, k, v, mask)
    assert rq.shape == q.shape and rk.shape == k.shape and seen.shape == mask.shape and rk.abs().sum() > 0
    assert seen[..., 0].all() and all(seen[..., i:i + 64].any() for i in range(0, 300, 64))  # every block in use
    real = tuning.run_attention

    def first_slot_only(name, q, k, v, mask, causal):
        if name != "expanded":
            return real(name, q, k, v, mask, causal)
        return v[:, :, :1].repeat_interleave(2, dim=1).expand(-1, -1, q.shape[2], -1)
    monkeypatch.setattr(tuning, "run_attention", first_slot_only)
    tuning.attention(q, k, v, mask, False, Plan(timer_for({"sdpa": 5.0, "expanded": 1.0})))
    [(key, chosen)] = tuning.PLAN.items()
    assert chosen == "sdpa" and tuning.TIMES[key]["expanded"].startswith("wrong")


def test_the_tuner_keeps_the_fastest_and_records_every_time():
    needs_interpreter("skinny")  # it wins, and runs
    x, w = torch.randn(4, 32), torch.randn(48, 32)
    times = {"cublas": 9.0, "swapped": 7.0, "skinny": 2.0, "skinny-wide": 3.0, "matvec": 4.0, "matvec-wide": 5.0}
    linear(x, w, plan=Plan(timer_for(times)))
    [(key, chosen)] = tuning.PLAN.items()
    assert key[:4] == ("product", "cpu", "48 x 32", 4) and chosen == "skinny" and tuning.TIMES[key] == times
    [row] = tuning.plan_table()
    assert (row["op"], row["shape"], row["rows"], row["chosen"], row["skinny"]) == ("product", "48 x 32", 4, "skinny", 2.0)


def test_the_tuner_keeps_the_default_unless_another_saves_more_than_the_margin():
    x, w = torch.randn(2, 32), torch.randn(48, 32)
    linear(x, w, plan=Plan(timer_for({"cublas": 10.0, "swapped": 10.0 * (1 - MARGIN / 2), "skinny": 11.0})))
    assert list(tuning.PLAN.values()) == ["cublas"]


def test_a_formulation_that_cannot_run_is_recorded_and_left_out():
    x, w = torch.randn(8, 32), torch.randn(48, 32)
    linear(x, w, plan=Plan(timer_for({"cublas": 10.0, "swapped": 4.0})))
    [(key, chosen)] = tuning.PLAN.items()
    assert chosen == "swapped" and tuning.TIMES[key]["skinny"] == "RuntimeError: skinny cannot run here"
    section = "\n".join(tuning_section(tuning.plan_table()))
    assert "| 48 x 32 | 8 | swapped | 10.0 | **4.0** | - | - | - | - |" in section
    assert "skinny left out: RuntimeError: skinny cannot run here" in section


def test_a_fast_formulation_with_a_wrong_result_is_left_out(monkeypatch):
    needs_interpreter("skinny")  # it wins, and runs
    run = tuning.run_product
    monkeypatch.setattr(tuning, "run_product", lambda name, *a: run(name, *a) * (1.01 if name == "swapped" else 1))
    x, w = torch.randn(8, 32), torch.randn(48, 32)
    y = linear(x, w, plan=Plan(timer_for({"cublas": 10.0, "swapped": 1.0, "skinny": 5.0, "skinny-wide": 6.0})))
    [(key, chosen)] = tuning.PLAN.items()
    assert chosen == "skinny" and tuning.TIMES[key]["swapped"] == "wrong: off by 1.0e-02 of the largest value"
    torch.testing.assert_close(y, F.linear(x, w), rtol=1e-5, atol=1e-5)


def test_differs_allows_rounding_only():
    expected = torch.tensor([100.0, -3.0, float("nan")])
    assert tuning.differs(expected + 1e-3, expected) is None  # 1e-5 of the largest value
    assert tuning.differs(expected + 0.5, expected) == "wrong: off by 5.0e-03 of the largest value"
    assert tuning.differs(expected + 0.5, expected, loose=True) is None  # bf16, TF32
    assert tuning.differs(expected[:2], expected).startswith("wrong: shape (2,)")


def test_modules_take_a_plan_only_while_converted():
    """A module's kernel is its ``plan``: None (the default calls, nothing tuned) but inside
    ``tuning.converted``, as a stage's capture sets it, and as it was again after."""
    layer, x = Linear(32, 48, bias=False), torch.randn(1, 5, 32)
    with torch.no_grad():
        layer(x)
        assert tuning.PLAN == {} and layer.plan is None  # no plan: the default calls (the CPU's own paths)
        plan = Plan(fastest("swapped"))
        with tuning.converted([torch.nn.Sequential(layer)], plan):
            assert layer.plan is plan
            y = layer(x)
            layer(x)  # the same kind again: planned already
        assert layer.plan is None
    assert list(tuning.PLAN.values()) == ["swapped"] and len(tuning.TIMES) == 1
    assert y.shape == (1, 5, 48)
    torch.testing.assert_close(y, F.linear(x, layer.weight), rtol=1e-5, atol=1e-5)


COMBINATIONS = [  # a formulation per op, in FORMULATIONS' order: product, attention, norm, added_norm, rotary,
    # rotary_store, projections, gated
    ("swapped", "expanded", "fused", "triton", "composite", "triton", "joined", "joined"),
    ("skinny", "triton", "triton", "triton", "triton", "triton", "joined", "joined-triton"),
    ("skinny-wide", "sdpa", "fused", "separate", "triton", "separate", "separate", "joined-triton"),
    ("cublas", "sdpa", "composite", "separate", "composite", "separate", "separate", "separate"),
    ("matvec-wide", "triton", "fused", "triton", "triton", "triton", "joined", "joined-triton")]


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3"])  # qwen2: biases; qwen3: q and k norms
@pytest.mark.parametrize("chosen", COMBINATIONS, ids=["-".join(c) for c in COMBINATIONS])
def test_a_stage_in_any_formulation_gives_the_plain_logits(tiny_dirs, tmp_path, model_type, chosen):
    """A stage's body (models/tuned.py's layers), each operation in any formulation, gives the plain
    forward's logits."""
    needs_interpreter(*chosen)
    from conftest import make_tiny_model

    from mirror_sd.models.stages import Stage, StageCache

    folder = tiny_dirs["target"] if model_type == "llama" else make_tiny_model(tmp_path / model_type, 5, model_type)
    model, _ = load_model(folder, torch.device("cpu"), torch.float32)
    ids = torch.tensor([[1, 5, 2, 9, 3]])
    with torch.inference_mode():
        plain = model.forward(ids, model.new_cache(16))
    stage = Stage(model, 8, StageCache(model, 16))
    with stage.planned(fastest(*chosen)):  # as its capture converts the modules its body runs
        tuned = stage.run(ids)
    assert {op: name for (op, *_), name in tuning.PLAN.items()} == dict(zip(FORMULATIONS, chosen))
    torch.testing.assert_close(tuned, plain, rtol=1e-5, atol=1e-5)


def test_the_pair_passes_its_kernels_setting_to_its_stages(tiny_dirs):
    pair = load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["draft"]), graphs="on", kernels="default")
    cache = pair.new_cache(pair.target, 32)
    assert cache.stages.tuned_kernels is False
    assert all(not stage.tuned_kernels for stage in cache.stages._stages.values())
    pair.kernels = "tuned"
    assert pair.new_cache(pair.target, 32).stages.tuned_kernels is True
    assert pair.describe()["kernels"] == "tuned"
    with pytest.raises(MirrorSDError, match="kernels must be one of tuned, default"):
        load_pair(target=str(tiny_dirs["target"]), draft=None, kernels="fast")


def test_every_triton_kernel_compiles_for_a_hopper_gpu():
    """Triton's interpreter (the CPU tests) runs Python; a GPU compiles the kernels. Each is compiled
    here ahead of time for sm_90 (an H100's or H200's) with Triton's own ptxas, so that a kernel the
    compiler rejects shows here, not in a rare GPU session; the products and attention in fp32 (on
    the FMA units: IEEE, no TF32) and in bf16 (tensor cores). In a process of its own: Triton's
    library functions are made for the interpreter in this one (conftest's TRITON_INTERPRET=1)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).with_name("compile_kernels.py")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"PYTHONPATH": str(script.parent.parent)}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.split("\n")
    for kernel in ("skinny_kernel", "attention_part_kernel"):
        assert f"{kernel} float32 fma.rn.f32" in lines and f"{kernel} bfloat16 mma" in lines
    assert "matvec_kernel float32 fma.rn.f32" in lines and "matvec_kernel bfloat16 fma.rn.f32" in lines
    for kernel in ("attention_join_kernel", "rms_norm_kernel", "rotary_kernel", "rotary_store_kernel",
                   "silu_mul_kernel"):
        assert f"{kernel} float32" in lines
