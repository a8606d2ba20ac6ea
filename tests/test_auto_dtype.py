"""dtype="auto": bf16 only where the CPU computes it natively, the exact target's rows check out and
it runs faster; fp32 everywhere else. Each case forced by replacing the detection or a check."""
import pytest
import torch

from conftest import needs_native_bf16, read_native_bf16
from mirror_sd import generate, load_pair
from mirror_sd.models import auto_dtype, exact
from mirror_sd.models.loading import load_model, load_tokenizer, resolve_model_dir


def test_the_native_flag_is_read_from_the_processor_s_flags(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("flags\t\t: fpu sse avx2 avx512f\n")
    assert read_native_bf16(cpuinfo) is None
    cpuinfo.write_text("flags\t\t: fpu avx512f avx512_bf16 amx_tile amx_bf16\n")
    assert read_native_bf16(cpuinfo) == "amx_bf16"
    cpuinfo.write_text("flags\t\t: fpu avx512f avx512_bf16\n")
    assert read_native_bf16(cpuinfo) == "avx512_bf16"
    assert read_native_bf16(tmp_path / "absent") is None  # not Linux


def never(*args):
    raise AssertionError("a check ran that this case must not reach")


def tiny(tiny_dirs, **options):
    return load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["draft"]), **options)


def test_without_native_bf16_auto_runs_fp32_unchanged(tiny_dirs, monkeypatch):
    monkeypatch.setattr(auto_dtype, "rows_agree", never)  # never loads or checks bf16
    pair = tiny(tiny_dirs)
    assert str(pair.dtype) == "fp32: no native bf16" and pair.describe()["dtype"] == "fp32: no native bf16"
    assert pair.target.dtype == pair.draft.dtype == torch.float32 and not pair.target.exact
    fp32 = tiny(tiny_dirs, dtype="fp32")
    assert str(fp32.dtype) == "fp32: asked for"
    for method in ("vanilla", "sd"):
        assert (generate(pair, "t1 t2 t3", method=method, max_new_tokens=12, raw=True).token_ids
                == generate(fp32, "t1 t2 t3", method=method, max_new_tokens=12, raw=True).token_ids)


def test_with_native_bf16_a_passing_and_faster_check_picks_exact_bf16(tiny_dirs, monkeypatch):
    monkeypatch.setattr(auto_dtype, "native_bf16", lambda: "avx512_bf16")
    monkeypatch.setattr(auto_dtype, "rows_agree", lambda model, ids: None)
    monkeypatch.setattr(auto_dtype, "bf16_speedup", lambda bf16, fp32, ids: 1.5)
    pair = tiny(tiny_dirs)
    assert str(pair.dtype) == "bf16: native avx512_bf16, self-check passed (1.50x fp32)"
    assert pair.target.dtype == pair.draft.dtype == torch.bfloat16 and pair.target.exact
    assert pair.target.new_cache(4).kv.dtype == exact.WIDE
    out = generate(pair, "t1 t2 t3", method="sd", max_new_tokens=12, raw=True)
    assert out.error is None and out.token_ids == generate(pair, "t1 t2 t3", method="vanilla", max_new_tokens=12,
                                                           raw=True).token_ids


def test_a_failing_self_check_falls_back_to_fp32(tiny_dirs, monkeypatch):
    monkeypatch.setattr(auto_dtype, "native_bf16", lambda: "amx_bf16")
    monkeypatch.setattr(auto_dtype, "rows_agree", lambda model, ids: "a window of 2 rows")
    monkeypatch.setattr(auto_dtype, "bf16_speedup", never)
    pair = tiny(tiny_dirs)
    assert str(pair.dtype) == "fp32: bf16 self-check failed (a window of 2 rows)"
    assert pair.target.dtype == pair.draft.dtype == torch.float32 and not pair.target.exact


def test_a_self_check_that_raises_falls_back_to_fp32(tiny_dirs, monkeypatch):
    def broken(model, ids):
        raise RuntimeError("no bf16 kernel here\nmore")
    monkeypatch.setattr(auto_dtype, "native_bf16", lambda: "avx512_bf16")
    monkeypatch.setattr(auto_dtype, "rows_agree", broken)
    pair = tiny(tiny_dirs)
    assert str(pair.dtype) == "fp32: bf16 self-check failed (RuntimeError: no bf16 kernel here)"
    assert pair.target.dtype == torch.float32


def test_slower_bf16_falls_back_to_fp32(tiny_dirs, monkeypatch):
    monkeypatch.setattr(auto_dtype, "native_bf16", lambda: "avx512_bf16")
    monkeypatch.setattr(auto_dtype, "rows_agree", lambda model, ids: None)
    monkeypatch.setattr(auto_dtype, "bf16_speedup", lambda bf16, fp32, ids: 0.8)
    pair = tiny(tiny_dirs)
    assert str(pair.dtype) == "fp32: bf16 slower here (0.80x fp32)"
    assert pair.target.dtype == pair.draft.dtype == torch.float32


def test_lanes_off_the_cpu_stay_fp32(monkeypatch):
    monkeypatch.setattr(auto_dtype, "native_bf16", lambda: "amx_bf16")
    choice, model = auto_dtype.choose(lambda dtype: dtype, None, [torch.device("cpu"), torch.device("cuda", 0)])
    assert str(choice) == "fp32: not a CPU lane" and model == torch.float32


def test_the_real_checks_run_on_a_tiny_bf16_target(tiny_dirs):
    """rows_agree and bf16_speedup on real (tiny) models: they run and answer in kind."""
    model, _ = load_model(resolve_model_dir(str(tiny_dirs["target"])), torch.device("cpu"), torch.bfloat16)
    fp32, _ = load_model(resolve_model_dir(str(tiny_dirs["target"])), torch.device("cpu"), torch.float32)
    ids = torch.tensor([load_tokenizer(tiny_dirs["target"])(auto_dtype.CHECK_TEXT)["input_ids"]])
    with torch.no_grad():
        answer = auto_dtype.rows_agree(exact.convert(model), ids)
        assert answer is None or answer in {f"a window of {n} rows" for n in auto_dtype.ROW_COUNTS} | {"a tree window"}
        assert auto_dtype.bf16_speedup(model, fp32, ids) > 0


@needs_native_bf16
def test_the_self_check_passes_exact_bf16_and_catches_plain_bf16():
    """On the embedded target: the exact formulations give every verified row vanilla's logits bit
    for bit; PyTorch's plain bf16 kernels do not, and the check says so."""
    folder = resolve_model_dir(None)
    ids = torch.tensor([load_tokenizer(folder)(auto_dtype.CHECK_TEXT)["input_ids"]])
    exact_model, _ = load_model(folder, torch.device("cpu"), torch.bfloat16)
    plain, _ = load_model(folder, torch.device("cpu"), torch.bfloat16)
    with torch.no_grad():
        assert auto_dtype.rows_agree(exact.convert(exact_model), ids) is None
        assert auto_dtype.rows_agree(plain, ids) is not None
