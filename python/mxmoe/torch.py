"""mxmoe on a GPU through PyTorch: the whole MoE layer as a module, run on the tensor's device and
PyTorch's current stream, with no host synchronisation, so that it can be captured in a CUDA graph.

    import mxmoe, mxmoe.torch
    layer = mxmoe.torch.MoeLayer(mxmoe.load_checkpoint(path, layer=3), device="cuda")
    y = layer(x)                     # x [T, H] bf16 on that device -> y [T, H] bf16
    y = layer(x, router_logits)      # router_logits [T, E] float32
    y = layer.experts(x, topk_ids, topk_weights)   # the engine form: routing done by the caller

Under torch.compile the calls are the custom ops torch.ops.mxmoe.layer and torch.ops.mxmoe.experts
(with fake implementations), so a model that uses them traces (fullgraph too); eager calls run the
same implementation without the dispatcher's round trip through Python. Inference only: no
backward. The extension takes device pointers and a stream handle, so it does not depend on the
PyTorch version; the workspace comes from PyTorch's allocator, which a graph capture gives its own
pool.
"""

from __future__ import annotations

import itertools
import sys
import weakref
from typing import Iterable, Optional

import torch

import mxmoe
from . import _mxmoe

__all__ = ["MoeLayer", "load_model"]

# Custom ops take tensors and plain values: a layer is passed as its handle, a key of this table,
# which does not keep the layer alive (a layer dropped without free() releases its device memory).
_LAYERS: "weakref.WeakValueDictionary[int, MoeLayer]" = weakref.WeakValueDictionary()
_HANDLES = itertools.count(1)


class MoeLayer(torch.nn.Module):
    """One MoE layer's weights repacked on a CUDA device, and the layer's forward there."""

    def __init__(self, weights: mxmoe.Weights, device: torch.device | str | int | None = None,
                 max_tokens: int | None = None):
        """`max_tokens`, when given, prepares every launch up to that many tokens now (kernels loaded,
        launch geometry decided), so that no later call, and no graph capture, waits on either."""
        super().__init__()
        if not isinstance(weights, mxmoe.Weights):
            raise TypeError(f"weights: expected mxmoe.Weights, got {type(weights).__name__}")
        device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"device: expected a CUDA device, got {device}")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        self.shape = weights.shape
        self.routed_experts = weights.routed_experts
        self._runner = _mxmoe.Runner(weights._core, device.index)
        self._freed = False  # a Python flag, which torch.compile can trace (the extension's objects it cannot)
        self._handle = next(_HANDLES)
        _LAYERS[self._handle] = self
        if max_tokens is not None:
            mxmoe._check_int("max_tokens", max_tokens)
            self._runner.prepare(int(max_tokens))

    def forward(self, x: torch.Tensor, router_logits: Optional[torch.Tensor] = None) -> torch.Tensor:
        self._check_live()
        _check_tensor(x, "x", torch.bfloat16, self.device, (None, self.shape.hidden))
        if router_logits is not None:
            _check_tensor(router_logits, "router_logits", torch.float32, self.device, (x.shape[0], self.routed_experts))
        if torch.compiler.is_compiling():
            return torch.ops.mxmoe.layer(x, router_logits, self._handle)
        return _run_layer(self, x, router_logits)

    def experts(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                check_ids: Optional[bool] = None) -> torch.Tensor:
        """The engine form, as vLLM's and SGLang's fused-MoE expert calls take it: the experts and the
        weighted sum per token for the caller's routing. topk_ids [T, k] int32 or int64: each slot's
        expert among the layer's routed experts (an expert-parallel shard's are the whole layer's), or
        -1 for a slot that goes to no expert; k the layer's top-k. topk_weights [T, k] float32 (bf16
        and float16 are converted). On the device, a slot whose expert this layer does not hold, or
        whose id is outside [0, routed_experts), adds nothing.

        `check_ids`: whether to raise ValueError for ids outside [-1, routed_experts) first, which reads
        them on the host (a synchronisation). None: check in eager calls, not inside a graph capture or
        torch.compile; an engine passes False to stay free of synchronisation."""
        self._check_live()
        _check_tensor(x, "x", torch.bfloat16, self.device, (None, self.shape.hidden))
        if check_ids is None:
            check_ids = _eager(self.device)
        topk_weights = _check_routing(topk_ids, topk_weights, x.shape[0], self.shape.top_k, self.routed_experts,
                                      self.device, check_ids)
        if torch.compiler.is_compiling():
            return torch.ops.mxmoe.experts(x, topk_ids, topk_weights, self._handle)
        return _run_experts(self, x, topk_ids, topk_weights)

    def free(self) -> None:
        """Frees the layer's device memory now; a later call raises ValueError."""
        _LAYERS.pop(self._handle, None)
        self._freed = True
        self._runner.free()

    def extra_repr(self) -> str:
        s = self.shape
        shard = "" if self.routed_experts == s.num_experts else f" of {self.routed_experts}"
        return f"E={s.num_experts}{shard}, k={s.top_k}, H={s.hidden}, I={s.intermediate}, device={self.device}"

    def _check_live(self) -> None:
        if self._freed:
            raise ValueError("layer: this layer was freed")


def _check_tensor(t, name: str, dtype: torch.dtype, device: torch.device, shape) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"{name}: expected {dtype}, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{name}: expected a tensor on {device} (the layer's device), got one on {t.device}")
    if t.dim() != len(shape) or any(want is not None and got != want for got, want in zip(t.shape, shape)):
        want = ", ".join("T" if s is None else str(s) for s in shape)
        raise ValueError(f"{name}: expected shape [{want}], got {list(t.shape)}")
    if not t.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor")


def _eager(device: torch.device) -> bool:
    """Whether a call on `device` runs eagerly: not traced by torch.compile, not captured in a CUDA graph
    (where reading device data on the host is not allowed)."""
    return not (torch.compiler.is_compiling() or (device.type == "cuda" and torch.cuda.is_current_stream_capturing()))


def _check_routing(topk_ids, topk_weights, tokens: int, top_k: int, routed_experts: int, device: torch.device,
                   check_ids: bool) -> torch.Tensor:
    """Checks a caller's routing, topk_ids [T, k] int32 or int64 and topk_weights [T, k] float32 (bf16 and
    float16 converted), on `device`; with `check_ids`, also that every id is in [-1, routed_experts), which
    reads the ids on the host. Returns the float32 weights."""
    if not isinstance(topk_ids, torch.Tensor) or topk_ids.dtype not in (torch.int32, torch.int64):
        got = topk_ids.dtype if isinstance(topk_ids, torch.Tensor) else type(topk_ids).__name__
        raise TypeError(f"topk_ids: expected torch.int32 or torch.int64, got {got}")
    _check_tensor(topk_ids, "topk_ids", topk_ids.dtype, device, (tokens, top_k))
    if isinstance(topk_weights, torch.Tensor) and topk_weights.dtype in (torch.bfloat16, torch.float16):
        topk_weights = topk_weights.float()
    _check_tensor(topk_weights, "topk_weights", torch.float32, device, (tokens, top_k))
    if check_ids and tokens and bool(((topk_ids < -1) | (topk_ids >= routed_experts)).any()):
        raise ValueError(f"topk_ids: expected expert ids in [0, {routed_experts}) or -1 (no expert), got "
                         f"values in [{int(topk_ids.min())}, {int(topk_ids.max())}]")
    return topk_weights


def _run(layer: MoeLayer, x: torch.Tensor, launch) -> torch.Tensor:
    """An output like x and a workspace for x's tokens, then launch(runner, tokens, out, workspace, stream)."""
    tokens = x.shape[0]
    out = torch.empty_like(x)
    if tokens == 0:
        return out
    runner = layer._runner
    workspace = torch.empty(runner.workspace_size(tokens), dtype=torch.uint8, device=x.device)
    launch(runner, tokens, out, workspace, torch.cuda.current_stream(x.device).cuda_stream)
    return out


def _run_layer(layer: MoeLayer, x: torch.Tensor, router_logits: Optional[torch.Tensor]) -> torch.Tensor:
    logits = 0 if router_logits is None else router_logits.data_ptr()
    return _run(layer, x, lambda runner, tokens, out, ws, stream: runner.forward(
        x.data_ptr(), logits, out.data_ptr(), tokens, ws.data_ptr(), ws.numel(), stream))


def _run_experts(layer: MoeLayer, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
    return _run(layer, x, lambda runner, tokens, out, ws, stream: runner.forward_experts(
        x.data_ptr(), topk_ids.data_ptr(), topk_ids.dtype == torch.int64, topk_weights.data_ptr(), out.data_ptr(),
        tokens, ws.data_ptr(), ws.numel(), stream))


def _layer_of(handle: int) -> MoeLayer:
    layer = _LAYERS.get(handle)
    if layer is None:
        raise ValueError("layer: this layer was freed")
    return layer


@torch.library.custom_op("mxmoe::layer", mutates_args=())
def _layer(x: torch.Tensor, router_logits: Optional[torch.Tensor], handle: int) -> torch.Tensor:
    return _run_layer(_layer_of(handle), x, router_logits)


@_layer.register_fake
def _(x: torch.Tensor, router_logits: Optional[torch.Tensor], handle: int) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("mxmoe::experts", mutates_args=())
def _experts(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, handle: int) -> torch.Tensor:
    return _run_experts(_layer_of(handle), x, topk_ids, topk_weights)


@_experts.register_fake
def _(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, handle: int) -> torch.Tensor:
    return torch.empty_like(x)


# ---- Whole-model loading ----
def load_model(path: str, layers: Iterable[int] | None = None, device: torch.device | str | int | None = None,
               quiet: bool = False, max_tokens: int | None = None, *, scheme: str | None = None,
               quantize_bf16_experts: bool = False) -> list[MoeLayer]:
    """A MoeLayer for each of `layers` (default: every layer the checkpoint holds) of a gpt-oss
    checkpoint, in order, loaded a layer at a time: each layer's tensors are checked, read from the
    files into pinned memory and repacked on `device`, while the next layer is read ahead, so the
    process holds one layer's host memory at most. Prints a line per layer to stderr (layers done,
    GB, GB/s) and a summary unless `quiet`. `max_tokens`, `scheme` and `quantize_bf16_experts` are
    MoeLayer's and mxmoe.load_checkpoint's."""
    if scheme not in (None, "openai", "hf"):
        raise ValueError(f"scheme: expected 'openai', 'hf' or None, got {scheme!r}")
    wanted: list[int] = []
    if layers is not None:
        for layer in layers:
            mxmoe._check_int("layers", layer)
            if layer < 0:
                raise ValueError(f"layers: expected layer indices >= 0, got {layer}")
            wanted.append(int(layer))
        if not wanted:
            raise ValueError("layers: expected at least one layer")
    loaded: list[MoeLayer] = []
    totals = {"bytes_done": 0, "seconds_done": 0.0}

    def on_layer(index: int, core) -> None:
        loaded.append(MoeLayer(mxmoe.Weights(core), device, max_tokens))

    def on_progress(p: dict) -> None:
        totals.update(p)
        if not quiet:
            print(f"mxmoe: layer {p['layer']} ({p['layers_done']}/{p['layers_total']}): "
                  f"{p['layer_bytes'] / 1e9:.2f} GB in {p['layer_seconds']:.3f} s, "
                  f"{p['layer_bytes'] / 1e9 / p['layer_seconds']:.2f} GB/s", file=sys.stderr, flush=True)

    _mxmoe.for_each_layer(str(path), wanted, scheme, bool(quantize_bf16_experts), on_layer, on_progress)
    if not quiet and loaded:
        gb, seconds = totals["bytes_done"] / 1e9, totals["seconds_done"]
        print(f"mxmoe: loaded {len(loaded)} layers, {gb:.2f} GB in {seconds:.2f} s, {gb / seconds:.2f} GB/s",
              file=sys.stderr, flush=True)
    return loaded
# ---- end of whole-model loading ----
