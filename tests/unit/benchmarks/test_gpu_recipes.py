"""The GPU kit's recipe rows (benchmarks/gpu/recipes.py) and where a step's time goes (benchmarks/gpu/profile.py),
in process on the CPU: the kernel classes by real CUDA kernel names (cuBLAS, nvjet, FlashAttention, memory-efficient,
cuDNN attention, Inductor's Triton kernels, NCCL, multi-tensor optimizers), the idle time from overlapping kernel
intervals, the rows each recipe gets, and a time budget that leaves rows out with the command that finishes them."""

from __future__ import annotations

import time

import pytest
import torch

from benchmarks.gpu import profile, recipes
from benchmarks.gpu.request import Request

KERNELS = {
    "sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas": "gemm",
    "nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NNT": "gemm",
    "void cutlass::Kernel2<cutlass_80_wmma_tensorop_s161616gemm_f16_32x32_128x2_tn_align8>(Params)": "gemm",
    "sm90_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize128x128x64": "gemm",
    "triton_tem_fused_addmm_0": "gemm",
    "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, cutlass::half_t>>": "attention",
    "fmha_cutlassF_f16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::half_t>::Params)": "attention",
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x64_4x1x1_kernel0_0": "attention",
    "triton_per_fused__to_copy_add_native_layer_norm_0": "norms and element-wise",
    "triton_poi_fused__scaled_dot_product_flash_attention_view_3": "norms and element-wise",
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >": "norms and element-wise",
    "Memcpy DtoD (Device -> Device)": "norms and element-wise",
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::TensorListMetadata<2>>": "optimizer",
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)": "communication",
}


def test_kernels_fall_in_their_class_and_the_attention_backend_is_named():
    assert {k: profile.kernel_class(k) for k in KERNELS} == KERNELS
    names = list(KERNELS)
    assert profile.attention_backend([names[5], names[0]]) == "flash"
    assert profile.attention_backend([names[6]]) == "efficient"
    assert profile.attention_backend([names[7], names[5]]) == "cudnn"  # cuDNN's kernel names say flash too
    assert profile.attention_backend([names[0], names[9]]) == "none"  # the math path: GEMMs and a softmax


def test_idle_is_the_step_less_the_union_of_overlapping_kernels():
    assert profile._union([(0, 10), (5, 12), (20, 25), (21, 22)]) == 17


def test_rows_per_recipe_and_the_gemm_shapes_of_a_vit():
    assert [n for n, _ in recipes.rows_for("vit_b16", "fp16", True)] == [
        "compiled_fp16",
        "eager_fp16",
        "compiled_bf16",
        "compiled_fp16_nodrop",
        "bare_compiled_fp16",
    ]
    assert [n for n, _ in recipes.rows_for("vit_h14", "bf16", False)] == ["compiled_bf16", "eager_bf16"]
    cfg = recipes.recipe_config("vit_b16", "fp16", True, None, False, [])
    assert (cfg.train.micro_batch, cfg.train.global_batch, cfg.model.attn_drop_rate) == (256, 256, 0.1)
    assert recipes.recipe_config("vit_b16", "fp16", True, None, False, [], nodrop=True).model.attn_drop_rate == 0.0
    from vitlarge.model.vit import build_model

    shapes = {(m, k, n): c for m, k, n, c in profile.linear_shapes(build_model(cfg, "meta"), 256)}
    tokens = 256 * 197
    assert shapes[(tokens, 768, 2304)] == 12 and shapes[(tokens, 3072, 768)] == 12  # qkv, fc2 of each block
    assert shapes[(256, 768, 1000)] == 1 and shapes[(256 * 196, 768, 768)] == 1  # the head; the patch embedding


def test_a_time_budget_leaves_rows_out_with_the_command_that_finishes_them():
    torch.set_num_threads(1)
    peak = {"measured": {"bf16": {"flops_per_s": 1e9}}, "datasheet": None}
    sizes = dict(warmup=1, steps=1, rounds=1, profile_steps=1, gemm_iters=1)
    saved = []
    out = recipes.run(torch.device("cpu"), "plain", sizes, peak, Request(tiny=True), time.perf_counter(), saved.append)
    assert all(not e["rows"] for e in out.values()) and not saved  # nothing ran, nothing to save
    left = recipes.finish_command(out)
    assert left.startswith("python -m benchmarks.gpu --only recipes --rows vit_b16.compiled_fp32 vit_b16.eager_fp32")
    assert "vit_h14.compiled_fp32" in left and not any("gemm_reference" in e for e in out.values())  # no row ran
    with pytest.raises(Exception, match="--rows vit_b16: expected RECIPE.ROW"):
        recipes.check_arguments([], ["vit_b16"], True)
