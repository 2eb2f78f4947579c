"""A gpt-oss MoE layer in NumPy float64, written from the model's definition (openai/gpt-oss
gpt_oss/torch/model.py, transformers' GptOssExperts) and not from mxmoe's code: the tests' oracle.
Also random MXFP4 layers in the checkpoint layout and a minimal safetensors writer."""

from __future__ import annotations

import json
import struct

import numpy as np

FP4_VALUES = np.array([+0.0, +0.5, +1.0, +1.5, +2.0, +3.0, +4.0, +6.0,
                       -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def bf16_round(a: np.ndarray) -> np.ndarray:
    """float64 values rounded to bf16 (nearest even), as float64."""
    u = np.asarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint32) << 16
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


def bf16_bits(a: np.ndarray) -> np.ndarray:
    u = np.asarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16_bits(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def dequantize(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """[..., K/32, 16] uint8 codes (even element in the low nibble) and [..., K/32] E8M0 -> [..., K]."""
    low, high = FP4_VALUES[blocks & 0x0F], FP4_VALUES[blocks >> 4]
    values = np.stack([low, high], axis=-1).reshape(*blocks.shape[:-1], 32)
    values = values * np.exp2(scales.astype(np.float64) - 127)[..., None]
    return values.reshape(*blocks.shape[:-2], blocks.shape[-2] * 32)


def random_layer(rng: np.random.Generator, e: int, h: int, i: int) -> dict:
    """One layer's tensors, Hugging Face names, scaled so that FC1 outputs reach the +-7 clamp."""
    def scales(shape, k, target):
        base = int(round(np.log2(target / np.sqrt(k * 8.5625))))
        return (127 + base + rng.integers(-1, 2, size=shape)).astype(np.uint8)

    def bf16(shape, std):
        return bf16_bits(rng.normal(0.0, std, size=shape))

    return {
        "router.weight": bf16((e, h), 1.0 / np.sqrt(h)),
        "router.bias": bf16((e,), 0.1),
        "experts.gate_up_proj_blocks": rng.integers(0, 256, size=(e, 2 * i, h // 32, 16), dtype=np.uint8),
        "experts.gate_up_proj_scales": scales((e, 2 * i, h // 32), h, 3.0),
        "experts.gate_up_proj_bias": bf16((e, 2 * i), 0.5),
        "experts.down_proj_blocks": rng.integers(0, 256, size=(e, h, i // 32, 16), dtype=np.uint8),
        "experts.down_proj_scales": scales((e, h, i // 32), i * 40.0, 1.0),
        "experts.down_proj_bias": bf16((e, h), 0.1),
    }


def routing(t: dict, x: np.ndarray, top_k: int):
    """Top-k (ties to the lower expert) and the softmax over the selected logits, in float64."""
    logits = x @ from_bf16_bits(t["router.weight"]).T + from_bf16_bits(t["router.bias"])
    ids = np.argsort(-logits, axis=1, kind="stable")[:, :top_k]
    chosen = np.take_along_axis(logits, ids, axis=1)
    weights = np.exp(chosen - chosen.max(axis=1, keepdims=True))
    return ids, weights / weights.sum(axis=1, keepdims=True)


def e4m3_round(v: np.ndarray) -> np.ndarray:
    """The nearest E4M3 value (ties to even; 3 mantissa bits, subnormals at 2^-9), for |v| <= 448."""
    a = np.abs(v)
    exponent = np.floor(np.log2(np.where(a > 0, a, 1.0)))
    quantum = np.exp2(np.maximum(exponent, -6) - 3)
    return np.round(v / quantum) * quantum


def fp8_row(row: np.ndarray) -> np.ndarray:
    """A GEMM input row as FP8 activations compute with it (DeepSeek-V4's quantiser): rounded to bf16,
    then per 128 along K to E4M3 under the power-of-two scale 2^ceil(log2(max(amax, 1e-4) / 448)),
    the scale's argument taken in float32 as the quantiser does."""
    row = bf16_round(row)
    out = np.empty_like(row)
    for first in range(0, row.size, 128):
        block = row[first:first + 128]
        t = np.float32(max(np.float32(np.abs(block).max()), np.float32(1e-4))) * np.float32(1.0 / 448.0)
        mantissa, exponent = np.frexp(t)
        scale = np.exp2(float(exponent if mantissa > 0.5 else exponent - 1))
        out[first:first + 128] = e4m3_round(block / scale) * scale
    return out


def layer(t: dict, x_bits: np.ndarray, top_k: int | None = None, ids=None, weights=None,
          held=None, activations: str = "bf16") -> np.ndarray:
    """The layer's output in float64 (before its final bf16 rounding) for bf16 inputs. Slots with id -1,
    and with `held` (an expert-parallel shard's experts) those routed to experts not in it, add nothing.
    activations "fp8": both GEMMs' input rows as fp8_row rounds them (the router reads x as it is)."""
    rows = fp8_row if activations == "fp8" else (lambda row: row)
    x = from_bf16_bits(x_bits)
    if ids is None:
        ids, weights = routing(t, x, top_k)
    w1 = dequantize(t["experts.gate_up_proj_blocks"], t["experts.gate_up_proj_scales"])  # [E, 2I, H]
    w2 = dequantize(t["experts.down_proj_blocks"], t["experts.down_proj_scales"])        # [E, H, I]
    b1, b2 = from_bf16_bits(t["experts.gate_up_proj_bias"]), from_bf16_bits(t["experts.down_proj_bias"])
    out = np.zeros_like(x)
    for token in range(x.shape[0]):
        for slot in range(ids.shape[1]):
            e = ids[token, slot]
            if e < 0 or (held is not None and e not in held):
                continue
            h1 = w1[e] @ rows(x[token]) + b1[e]
            glu, lin = np.minimum(h1[0::2], 7.0), np.clip(h1[1::2], -7.0, 7.0)
            a = glu / (1.0 + np.exp(-1.702 * glu)) * (lin + 1.0)
            out[token] += weights[token, slot] * (w2[e] @ rows(a) + b2[e])
    return out


def write_safetensors(path, tensors: dict, dtype_names: dict | None = None) -> None:
    """A safetensors file of NumPy arrays (uint16 arrays are written as BF16); `dtype_names` gives the
    safetensors dtype of tensors that NumPy holds as another of the same size (F8_E8M0 scales as uint8)."""
    dtypes = {np.dtype(np.uint8): "U8", np.dtype(np.int8): "I8", np.dtype(np.uint16): "BF16",
              np.dtype(np.int32): "I32", np.dtype(np.float32): "F32"}
    header, data, offset = {}, [], 0
    for name, a in tensors.items():
        raw = np.ascontiguousarray(a).tobytes()
        dtype = (dtype_names or {}).get(name, dtypes[a.dtype])
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [offset, offset + len(raw)]}
        data.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(data))


def relative_error(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))
