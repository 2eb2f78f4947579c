"""mxmoe's layer against transformers' own gpt-oss experts module on the same weights, dequantised
by transformers' own MXFP4 code, at both model shapes (skipped without transformers, PyTorch or a
CUDA device). Both sides take the same routing, from float32 router logits, so that the comparison is
of the experts, not of near-ties a bf16 router breaks differently. The module runs in float32: in
bf16 (its usual dtype) it rounds every intermediate, which by itself puts it ~5e-3 from the exact
layer, where mxmoe keeps float32 intermediates (its bf16 difference is printed too)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible: the transformers comparison is skipped", allow_module_level=True)

from transformers import GptOssConfig  # noqa: E402
from transformers.integrations.mxfp4 import convert_moe_packed_tensors  # noqa: E402
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts  # noqa: E402

import mxmoe  # noqa: E402
import mxmoe.torch  # noqa: E402
import oracle  # noqa: E402

TOLERANCE = 5e-3  # relative error by norm against the float32 module


def bf16(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16).cuda()


@pytest.mark.parametrize("experts", [32, 128], ids=["gpt-oss-20b", "gpt-oss-120b"])
def test_layer_matches_transformers_experts(experts):
    hidden = intermediate = 2880
    rng = np.random.default_rng(experts)
    t = oracle.random_layer(rng, experts, hidden, intermediate)
    layer = mxmoe.torch.MoeLayer(mxmoe.weights_from_tensors(t, top_k=4), max_tokens=1024)

    config = GptOssConfig(hidden_size=hidden, intermediate_size=intermediate, num_local_experts=experts,
                          num_experts_per_tok=4)
    references = {}
    for dtype in (torch.float32, torch.bfloat16):
        module = GptOssExperts(config).to(device="cuda", dtype=dtype)
        with torch.no_grad():
            for proj in ("gate_up_proj", "down_proj"):
                blocks = torch.from_numpy(t[f"experts.{proj}_blocks"]).cuda()
                scales = torch.from_numpy(t[f"experts.{proj}_scales"]).cuda()
                getattr(module, proj).copy_(convert_moe_packed_tensors(blocks, scales, dtype=dtype))
                getattr(module, f"{proj}_bias").copy_(bf16(t[f"experts.{proj}_bias"]).to(dtype))
        references[dtype] = module
    router_weight, router_bias = bf16(t["router.weight"]).float(), bf16(t["router.bias"]).float()

    for tokens in (1, 7, 64, 1024):
        x = bf16(oracle.bf16_bits(rng.normal(size=(tokens, hidden))))
        logits = x.float() @ router_weight.T + router_bias
        top = torch.topk(logits, 4, dim=1)
        scores = torch.softmax(top.values, dim=1)
        got = layer(x, logits).float()
        errors = {}
        with torch.no_grad():
            for dtype, module in references.items():
                expected = module(x.to(dtype), top.indices, scores.to(dtype)).float()
                errors[dtype] = (torch.linalg.norm(got - expected) / torch.linalg.norm(expected)).item()
        print(f"E={experts} T={tokens}: relative error {errors[torch.float32]:.2e} against the float32 module, "
              f"{errors[torch.bfloat16]:.2e} against the bf16 one")
        assert errors[torch.float32] <= TOLERANCE, f"T={tokens}"
    layer.free()
