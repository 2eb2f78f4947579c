"""Random MXFP4 expert weights on the GPU, and their exact bf16 values, for the benchmarks."""

from __future__ import annotations

import numpy as np
import torch

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def random_mxfp4(gen: torch.Generator, e: int, rows: int, k: int, target: float, device: str = "cuda"):
    """Random E2M1 codes [e, rows, k/32, 16] and E8M0 scales [e, rows, k/32] on `device` (`gen`'s) for
    outputs of about `target`."""
    blocks = torch.randint(0, 256, (e, rows, k // 32, 16), dtype=torch.uint8, device=device, generator=gen)
    base = int(round(np.log2(target / np.sqrt(k * 8.5625))))
    scales = (127 + base + torch.randint(-1, 2, (e, rows, k // 32), device=device, generator=gen)).to(torch.uint8)
    return blocks, scales


def dequantize(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """[e, rows, k/32, 16] codes and [e, rows, k/32] scales -> bf16 [e, k, rows] (torch._grouped_mm's B),
    an expert at a time."""
    e, rows, k_blocks, _ = blocks.shape
    lut = E2M1.to(blocks.device)
    out = torch.empty(e, 32 * k_blocks, rows, dtype=torch.bfloat16, device=blocks.device)
    for expert in range(e):
        codes = blocks[expert].long()
        values = torch.stack((lut[codes & 0x0F], lut[codes >> 4]), dim=-1).flatten(-3)  # [rows, k]
        values *= torch.exp2(scales[expert].float() - 127).repeat_interleave(32, dim=-1)
        out[expert] = values.T.to(torch.bfloat16)
    return out
