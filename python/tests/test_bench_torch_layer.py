"""The torch layer that python/bench/torch_grouped_gemm.py times against mxmoe's (dense bf16 experts,
torch._grouped_mm, each model's router and SwiGLU) computes the layer: on the CPU, at small shapes of
each model's spec, its output against mxmoe's CPU reference on the same MXFP4 weights and logits."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the bench's torch layer is not checked")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
if not hasattr(torch, "_grouped_mm"):
    pytest.skip(f"torch {torch.__version__} has no _grouped_mm", allow_module_level=True)

import mxmoe  # noqa: E402
import torch_grouped_gemm as bench  # noqa: E402

# Both DeepSeek-V4 and gpt-oss specs at sizes the CPU takes in a moment; the bf16 rounding of the
# activation between FC1 and FC2 happens in both layers, the output rounding in both too, so what is
# left is float32 summation order and the sqrt-softplus router's own rounding.
SMALL = {name: bench.Model(**{**vars(model), "experts": 12, "hidden": 96, "intermediate": 64})
         for name, model in bench.MODELS.items() if name in ("gpt-oss-20b", "deepseek-v4-flash")}
TOLERANCE = 2e-2


def mxfp4(gen: torch.Generator, e: int, rows: int, k: int, target: float):
    blocks = torch.randint(0, 256, (e, rows, k // 32, 16), dtype=torch.uint8, generator=gen)
    base = int(round(np.log2(target / np.sqrt(k * 8.5625))))
    scales = (127 + base + torch.randint(-1, 2, (e, rows, k // 32), generator=gen)).to(torch.uint8)
    return blocks, scales


def cpu_tensors(m: bench.Model, seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    e, h, i = m.experts, m.hidden, m.intermediate
    (fc1, fc1_scales), (fc2, fc2_scales) = mxfp4(gen, e, 2 * i, h, 3.0), mxfp4(gen, e, h, i, 1.0)
    t = {"gate_up_blocks": fc1, "gate_up_scales": fc1_scales, "down_blocks": fc2, "down_scales": fc2_scales,
         "router_weight": (0.1 * torch.randn(e, h, generator=gen)).to(torch.bfloat16)}
    if m.biases:
        t.update(gate_up_bias=(0.1 * torch.randn(e, 2 * i, generator=gen)).to(torch.bfloat16),
                 down_bias=(0.1 * torch.randn(e, h, generator=gen)).to(torch.bfloat16),
                 router_bias=(0.1 * torch.randn(e, generator=gen)).to(torch.bfloat16))
    if m.routed_scaling is not None:
        t["selection_bias"] = 0.1 * torch.randn(e, generator=gen)
    return t


@pytest.mark.parametrize("name", list(SMALL))
@pytest.mark.parametrize("tokens", [1, 9, 64])
def test_torch_layer_computes_the_layer(name, tokens):
    m = SMALL[name]
    t = cpu_tensors(m, tokens)
    gen = torch.Generator().manual_seed(100 + tokens)
    x = torch.randn(tokens, m.hidden, generator=gen).bfloat16()
    logits = torch.randn(tokens, m.experts, generator=gen)
    got = bench.TorchLayer(t, m)(x, logits).float().numpy()
    weights = bench.mxmoe_weights(t, m)
    assert weights.spec.router == ("softmax-top-k" if m.routed_scaling is None else "sqrt-softplus")
    expected = mxmoe.CpuLayer(weights)(x.float().numpy(), logits.numpy())
    assert np.isfinite(got).all()
    error = np.linalg.norm(got - expected) / np.linalg.norm(expected)
    assert error <= TOLERANCE, f"{name} T={tokens}: relative error {error:.2e}"


def test_a_wrong_spec_is_caught():
    """The check can fail: the V4 layer's torch form with gpt-oss's SwiGLU is far from mxmoe's."""
    m = SMALL["deepseek-v4-flash"]
    t = cpu_tensors(m, 5)
    x = torch.randn(9, m.hidden, generator=torch.Generator().manual_seed(5)).bfloat16()
    logits = torch.randn(9, m.experts, generator=torch.Generator().manual_seed(6))
    wrong = bench.Model(**{**vars(m), "alpha": 1.702, "up_offset": 1.0})
    got = bench.TorchLayer(t, wrong)(x, logits).float().numpy()
    expected = mxmoe.CpuLayer(bench.mxmoe_weights(t, m))(x.float().numpy(), logits.numpy())
    assert np.linalg.norm(got - expected) / np.linalg.norm(expected) > 10 * TOLERANCE
