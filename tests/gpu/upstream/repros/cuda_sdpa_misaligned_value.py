"""torch on CUDA: scaled_dot_product_attention gives wrong bfloat16 results, or `CUDA error: misaligned address`,
when the value tensor is a view whose storage offset is not 16 bytes aligned.

DeepSeek-V3's attention (transformers' modeling_deepseek_v3, MLA) splits keys and values out of one projection:
`k_nope, value = torch.split(kv, [qk_nope_head_dim, v_head_dim], dim=-1)`, so the value starts qk_nope_head_dim
elements into each row. With a head dim of 4 in bfloat16 that is 8 bytes: the fused kernels read it as if it were
aligned. Here (H200, torch 2.11.0+cu130, cuDNN 9.19):
- torch's own choice of kernel: the output is wrong for most rows, up to about 1 in size (the MATH kernel, or the
  same view made contiguous, agrees with the CPU to bfloat16 rounding);
- EFFICIENT_ATTENTION forced: `CUDA error: misaligned address` (the context is lost afterwards);
- float32, where 4 elements are 16 bytes, is right with every kernel.
In the suite it is `test_experts_implementation_on_this_device[deepseek_v3-*-bfloat16]`: 171 of 16384 logits off by
up to 0.71 against a bound of 0.311 (the CPU's own bfloat16 error is 0.0084). Real DeepSeek-V3 sizes (nope 128) are
aligned; the tiny model's 4 is a legal configuration all the same.

Run by hand on a GPU: python tests/gpu/upstream/repros/cuda_sdpa_misaligned_value.py
(each kernel in a process of its own, since a misaligned access loses the CUDA context)
"""

import subprocess
import sys

import torch
import torch.nn.functional as F

BATCH, HEADS, LENGTH, NOPE, VALUE = 8, 16, 16, 4, 8


def inputs(dtype: torch.dtype, device: str):
    generator = torch.Generator().manual_seed(0)
    query, key = (torch.randn(BATCH, HEADS, LENGTH, NOPE + 4, generator=generator) for _ in range(2))
    kv = torch.randn(BATCH, LENGTH, HEADS, NOPE + VALUE, generator=generator).transpose(1, 2)
    query, key, kv = (t.to(dtype).to(device) for t in (query, key, kv))
    _, value = torch.split(kv, [NOPE, VALUE], dim=-1)  # as the modeling file does: a view, NOPE elements in
    return query, key, value


def run(backend: str, dtype_name: str) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dtype = getattr(torch, dtype_name)
    query, key, value = inputs(dtype, "cuda")
    truth = F.scaled_dot_product_attention(*(t.cpu().double() for t in (query, key, value)), is_causal=True)
    context = sdpa_kernel(getattr(SDPBackend, backend)) if backend != "default" else torch.no_grad()
    try:
        with context:
            out = F.scaled_dot_product_attention(query, key, value, is_causal=True)
            # what transformers passes where the mask is causal and head dims are equal
            gqa = F.scaled_dot_product_attention(query, key, value, is_causal=True, enable_gqa=True)
            contiguous = F.scaled_dot_product_attention(query, key, value.contiguous(), is_causal=True)
        torch.cuda.synchronize()
    except Exception as error:  # the answer is the error
        print(f"{dtype_name:8s} {backend:20s} raised {type(error).__name__}: {str(error).splitlines()[0]}")
        return
    wrong, with_gqa, right = ((t.cpu().double() - truth).abs().max().item() for t in (out, gqa, contiguous))
    print(
        f"{dtype_name:8s} {backend:20s} max error {wrong:.3g}, with enable_gqa {with_gqa:.3g}"
        f" (value made contiguous: {right:.3g})"
    )


if __name__ == "__main__":
    if len(sys.argv) == 3:
        run(*sys.argv[1:])
    else:
        print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, {torch.cuda.get_device_name()}")
        for dtype_name in ("bfloat16", "float16", "float32"):
            for backend in ("default", "MATH", "EFFICIENT_ATTENTION", "FLASH_ATTENTION", "CUDNN_ATTENTION"):
                subprocess.run([sys.executable, __file__, backend, dtype_name], check=False)
