"""Compile every Triton kernel of models/fused.py for sm_90 ahead of time, with no GPU: what
tests/test_tuning.py runs in a process of its own (without TRITON_INTERPRET). Prints one line per
kernel and dtype: its name, the dtype and, for the kernels with products, the instruction they use
("fma.rn.f32": IEEE fp32 on the FMA units; "mma": tensor cores; the matrix-vector kernel uses
FMA in both dtypes)."""
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile

from mirror_sd.models import fused

HOPPER = GPUTarget("cuda", 90, 32)


def build(kernel, pointers: dict, ints: str, floats: str = "", **constexprs):
    signature = {**pointers, **{n: "i32" for n in ints.split()}, **{n: "fp32" for n in floats.split()},
                 **{n: "constexpr" for n in constexprs}}
    return compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs), target=HOPPER)


def uses(compiled) -> str:
    ptx = compiled.asm["ptx"]
    return "mma" if "mma" in ptx else "fma.rn.f32" if "fma.rn.f32" in ptx else "neither"


def main():
    for t, name in (("fp32", "float32"), ("bf16", "bfloat16")):
        k = build(fused.skinny_kernel, dict(x_ptr=f"*{t}", w_ptr=f"*{t}", b_ptr=f"*{t}", y_ptr=f"*{t}"), "M N",
                  K=576, HAS_BIAS=True, IEEE=t == "fp32", BLOCK_M=16, BLOCK_N=16, BLOCK_K=64)
        print("skinny_kernel", name, uses(k))
        k = build(fused.attention_part_kernel, dict(q_ptr=f"*{t}", k_ptr=f"*{t}", v_ptr=f"*{t}", mask_ptr="*i1",
                                                    m_ptr="*fp32", l_ptr="*fp32", acc_ptr="*fp32"),
                  "H T S GROUP sqb sqh sqt skb skh sks svb svh svs smb smt sms", "scale", D=64, HAS_MASK=True,
                  CAUSAL=False, IEEE=t == "fp32", BLOCK_T=16, BLOCK_S=64, BLOCK_D=64, CHUNK=256)
        print("attention_part_kernel", name, uses(k))
        k = build(fused.matvec_kernel, dict(x_ptr=f"*{t}", w_ptr=f"*{t}", b_ptr=f"*{t}", y_ptr=f"*{t}"), "N",
                  K=576, HAS_BIAS=True, BLOCK_N=2, BLOCK_K=512)
        print("matvec_kernel", name, uses(k))
    build(fused.attention_join_kernel, dict(m_ptr="*fp32", l_ptr="*fp32", acc_ptr="*fp32", y_ptr="*fp32"),
          "H T PARTS syb syh syt", D=64, BLOCK_P=16, BLOCK_D=64)
    build(fused.rms_norm_kernel, {n: "*fp32" for n in ("x_ptr", "delta_ptr", "sum_ptr", "w_ptr", "y_ptr")}, "",
          "eps", D=576, ADD=True, BLOCK=1024)
    build(fused.rotary_kernel, {n: "*fp32" for n in ("x_ptr", "cos_ptr", "sin_ptr", "y_ptr")},
          "H T sxb sxh sxt scb sct", HALF=32, BLOCK=32)
    build(fused.rotary_store_kernel, {**{n: "*fp32" for n in ("q_ptr", "k_ptr", "v_ptr", "cos_ptr", "sin_ptr",
                                                              "out_ptr", "kc_ptr", "vc_ptr")}, "slots_ptr": "*i64"},
          "H KV T sqb sqh sqt skb skh skt svb svh svt scb sct scb_ sch_ scs_", HALF=32, BLOCK=32)
    build(fused.silu_mul_kernel, dict(both_ptr="*fp32", y_ptr="*fp32"), "", I=1536, BLOCK=1024)
    for kernel in ("attention_join_kernel", "rms_norm_kernel", "rotary_kernel", "rotary_store_kernel",
                   "silu_mul_kernel"):
        print(kernel, "float32")


if __name__ == "__main__":
    main()
