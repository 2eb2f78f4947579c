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


@pytest.mark.parametrize("name", list(SMALL))
@pytest.mark.parametrize("tokens", [1, 9, 64])
def test_torch_layer_computes_the_layer(name, tokens):
    m = SMALL[name]
    t = bench.layer_tensors(torch.Generator().manual_seed(tokens), m, "cpu")
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
    t = bench.layer_tensors(torch.Generator().manual_seed(5), m, "cpu")
    x = torch.randn(9, m.hidden, generator=torch.Generator().manual_seed(5)).bfloat16()
    logits = torch.randn(9, m.experts, generator=torch.Generator().manual_seed(6))
    wrong = bench.Model(**{**vars(m), "alpha": 1.702, "up_offset": 1.0})
    got = bench.TorchLayer(t, wrong)(x, logits).float().numpy()
    expected = mxmoe.CpuLayer(bench.mxmoe_weights(t, m))(x.float().numpy(), logits.numpy())
    assert np.linalg.norm(got - expected) / np.linalg.norm(expected) > 10 * TOLERANCE
