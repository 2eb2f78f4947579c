"""mxmoe on a GPU through PyTorch: the whole MoE layer as a module, run on the tensor's device and
PyTorch's current stream, with no host synchronisation, so that it can be captured in a CUDA graph.

    import mxmoe, mxmoe.torch
    layer = mxmoe.torch.MoeLayer(mxmoe.load_checkpoint(path, layer=3), device="cuda")
    layer = mxmoe.torch.MoeLayer.from_tensors(cuda_tensors, top_k=4)   # quantised/repacked on their GPU
    y = layer(x)                     # x [T, H] bf16 on that device -> y [T, H] bf16
    y = layer(x, router_logits)      # router_logits [T, E] float32
    y = layer.experts(x, topk_ids, topk_weights)   # the engine form: routing done by the caller

Under torch.compile the calls are the custom ops torch.ops.mxmoe.layer and torch.ops.mxmoe.experts
(with fake implementations), so a model that uses them traces (fullgraph too); eager calls run the
same implementation without the dispatcher's round trip through Python. Inference only: no
backward. The extension takes device pointers and a stream handle, so it does not depend on the
PyTorch version. All device memory comes from PyTorch's caching allocator: the weights a layer holds
(MoeLayer.nbytes, counted by torch.cuda.memory_allocated()), the scratch of its load, and the
workspace of each call, which a graph capture takes from its own pool.
"""

from __future__ import annotations

import itertools
import sys
import weakref
from collections.abc import Iterable, Mapping
from typing import Any, Optional

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
                 max_tokens: int | None = None, activations: str = "bf16"):
        """Host weights, uploaded to `device` (default: the current CUDA device) and repacked there.
        `max_tokens`, when given, prepares every launch up to that many tokens now (kernels loaded,
        launch geometry decided), so that no later call, and no graph capture, waits on either.
        `activations` (mxmoe.ACTIVATIONS, kept as `self.activations`): the rows the expert GEMMs take,
        bf16 by default; mxmoe.CpuLayer with the same option computes the same function (where mxfp8's
        block-scaled kernels fail their first-use check on a device, the layer computes in bf16)."""
        super().__init__()
        if not isinstance(weights, mxmoe.Weights):
            raise TypeError(f"weights: expected mxmoe.Weights, got {type(weights).__name__}")
        mxmoe._check_activations(activations)
        device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"device: expected a CUDA device, got {device}")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self._build(device, weights.shape, weights.routed_experts, max_tokens,
                    lambda memory: _mxmoe.Runner(weights._core, device.index, memory.allocate, memory.release,
                                                 activations))

    @classmethod
    def from_tensors(cls, tensors: Mapping[str, Any], *, top_k: int | None = None,
                     routed_scaling: float | None = None, max_tokens: int | None = None,
                     activations: str = "bf16") -> MoeLayer:
        """One layer from its tensors on a CUDA device, by the names mxmoe.weights_from_tensors takes.
        gpt-oss's (Hugging Face or openai MXFP4 blocks and scales, or transformers' dense experts
        gate_up_proj [E, H, 2I] and down_proj [E, I, H]) are built on their device with no copy through
        the host: MXFP4 experts are repacked there, dense ones (bf16 or float32; float16 is widened to
        float32) quantised to MXFP4 there from their own values, bit for bit as weights_from_tensors
        quantises the same values on the host where they are bf16 values (it rounds others to bf16
        first). Router weights and biases may be bf16, float32 or float16 (widened); the layer keeps
        the router weight in bf16 (rounded to nearest even) and the biases in float32 (exactly, where
        weights_from_tensors rounds them to bf16). A tensor that is not contiguous, or not 16-byte
        aligned, is copied. The load runs on PyTorch's current stream and has finished when this
        returns, so the tensors may be freed or changed after.
        DeepSeek-V4's MXFP4 tensors (either naming) are read to the host, checked and built there by
        weights_from_tensors (with `routed_scaling`, config.routed_scaling_factor, which its
        score-routed layers need), and uploaded to their device: the device-side load takes gpt-oss
        layers only.
        top_k: the experts per token (default the model's: 4 for gpt-oss, 6 for DeepSeek-V4).
        activations: as the constructor's."""
        mxmoe._check_activations(activations)
        if top_k is not None:
            mxmoe._check_int("top_k", top_k)
        if not isinstance(tensors, Mapping):
            raise TypeError(f"tensors: expected a mapping of names to CUDA tensors, got {type(tensors).__name__}")
        if mxmoe._is_deepseek_v4(tensors):
            return cls._from_deepseek_v4_tensors(tensors, top_k, routed_scaling, max_tokens, activations)
        if routed_scaling is not None:
            raise ValueError("routed_scaling: gpt-oss layers have none (it is DeepSeek-V4's routed_scaling_factor)")
        shape, device, members = _device_tensors(tensors, 4 if top_k is None else top_k)
        layer = cls.__new__(cls)
        torch.nn.Module.__init__(layer)
        stream = torch.cuda.current_stream(device).cuda_stream
        described = {name: (t.data_ptr(), _DEVICE_DTYPES[t.dtype], list(t.shape)) for name, t in members.items()}
        layer._build(device, shape, shape.num_experts, max_tokens,
                     lambda memory: _mxmoe.Runner(tuple(shape), described, stream, device.index, memory.allocate,
                                                  memory.release, activations))
        return layer

    @classmethod
    def _from_deepseek_v4_tensors(cls, tensors: Mapping[str, Any], top_k, routed_scaling, max_tokens,
                                  activations) -> MoeLayer:
        """A DeepSeek-V4 layer from its CUDA tensors, through the host (from_tensors)."""
        device = None
        host = {}
        for name, t in tensors.items():
            if not isinstance(t, torch.Tensor) or t.device.type != "cuda":
                got = t.device if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"{name}: expected a CUDA tensor, got {got} (mxmoe.weights_from_tensors takes host arrays)")
            if device is not None and t.device != device:
                raise ValueError(f"{name}: expected a tensor on {device} (where the others are), got one on {t.device}")
            device = t.device
            t = t.detach()
            if t.dtype in _BYTE_DTYPES:  # E2M1 pairs and E8M0 scales as their bytes
                t = t.view(torch.uint8)
            host[name] = t.contiguous().cpu()
        weights = mxmoe.weights_from_tensors(host, top_k=top_k, routed_scaling=routed_scaling)
        return cls(weights, device=device, max_tokens=max_tokens, activations=activations)

    def _build(self, device: torch.device, shape: mxmoe.Shape, routed_experts: int, max_tokens, make_runner) -> None:
        if max_tokens is not None:
            mxmoe._check_int("max_tokens", max_tokens)
        self.device = device
        self.shape = shape
        self.routed_experts = routed_experts
        self._memory = _TorchMemory(device)
        # Blocks torch hands out may still be in use by work queued on its current stream, which
        # orders only that stream's later work; a host load writes them from a stream of its own.
        torch.cuda.current_stream(device).synchronize()
        try:
            self._runner = make_runner(self._memory)
        except mxmoe.Error as e:
            # A failed allocation: PyTorch's out-of-memory error stays one (engines catch it), with
            # mxmoe's message naming the layer, the allocation and its bytes.
            cause = self._memory.error
            if isinstance(cause, torch.cuda.OutOfMemoryError):
                raise torch.cuda.OutOfMemoryError(f"mxmoe: {e}: {cause}") from cause
            if cause is not None:
                raise mxmoe.Error(f"{e}: {type(cause).__name__}: {cause}") from cause
            raise
        self.activations = self._runner.activations
        self._freed = False  # a Python flag, which torch.compile can trace (the extension's objects it cannot)
        self._handle = next(_HANDLES)
        _LAYERS[self._handle] = self
        if max_tokens is not None:
            self._runner.prepare(int(max_tokens))

    @property
    def nbytes(self) -> int:
        """Device memory the layer holds: its packed weights, taken from PyTorch's caching allocator
        (so torch.cuda.memory_allocated() counts them) in 512-byte blocks; 0 once freed. A call's
        workspace is not held: each call takes workspace_size(T) bytes from the same allocator and
        gives them back as it returns (inside a CUDA graph, from the graph's pool), as any op's
        temporaries, so an engine's memory profiling sees it as activation memory."""
        return self._memory.nbytes

    def workspace_size(self, tokens: int) -> int:
        """Bytes of workspace a call of `tokens` tokens takes from PyTorch's allocator."""
        self._check_live()
        mxmoe._check_int("tokens", tokens)
        return self._runner.workspace_size(int(tokens))

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
        """Gives the layer's device memory back to PyTorch's allocator now (after the device has
        finished its work, as cudaFree would); a later call raises ValueError. A layer that is
        collected without free() gives it back then."""
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


def _empty(nbytes: int, device: torch.device) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=device)


class _TorchMemory:
    """A layer's device memory from PyTorch's caching allocator: the runner's allocate and release
    callbacks. Each allocation is a uint8 tensor, held until the runner releases its address. Torch
    hands out 512-byte-aligned blocks in multiples of 512 bytes; the runner needs 256-byte alignment
    (and checks it), and asks in multiples of 256, so a request is rounded up to torch's block and
    nbytes is what torch counts."""

    def __init__(self, device: torch.device):
        self.device = device
        self.error: Optional[BaseException] = None  # the exception of an allocate that failed
        self._held: dict[int, torch.Tensor] = {}

    @property
    def nbytes(self) -> int:
        return sum(t.numel() for t in self._held.values())

    def allocate(self, nbytes: int) -> int:
        """A device address of at least `nbytes` bytes, or 0 (the exception kept in `error`): no
        exception may cross the extension's C callback."""
        try:
            t = _empty(-(-nbytes // 512) * 512, self.device)
        except Exception as e:  # noqa: BLE001 - torch.cuda.OutOfMemoryError above all; re-raised by MoeLayer
            self.error = e
            return 0
        self._held[t.data_ptr()] = t
        return t.data_ptr()

    def release(self, address: int) -> None:
        t = self._held.pop(address, None)
        # The device may still be reading the memory from another stream than the one torch would
        # next hand it out on: wait for it, as cudaFree does (not inside a capture, which a sync
        # breaks, nor at exit).
        if t is not None and not sys.is_finalizing() and not torch.cuda.is_current_stream_capturing():
            torch.cuda.synchronize(self.device)


# One-byte dtypes of MXFP4 codes and E8M0 scales that NumPy has not (their bytes go to the host).
_BYTE_DTYPES = tuple(d for d in (getattr(torch, "float8_e8m0fnu", None), getattr(torch, "float4_e2m1fn_x2", None))
                     if d is not None)
# The extension's names of a device tensor's dtypes, and where each tensor of from_tensors goes.
_DEVICE_DTYPES = {torch.uint8: "U8", torch.bfloat16: "BF16", torch.float32: "F32"}
_DENSE_MEMBERS = {"router_weight": "router_weight", "router_bias": "router_bias", "gate_up": "gate_up",
                  "gate_up_bias": "fc1_bias", "down": "down", "down_bias": "fc2_bias"}


def _device_tensors(tensors: Mapping[str, Any], top_k: int):
    """(shape, device, {DeviceLayerTensors member: tensor}) of one layer's CUDA tensors, each checked
    against the layer's shape, float16 widened to float32 and made contiguous."""
    for names in (mxmoe._HF_NAMES, mxmoe._OPENAI_NAMES):
        if mxmoe._find(tensors, names["fc1_blocks"], required=False) is not None:
            break
    else:
        names = mxmoe._DENSE_NAMES
        if mxmoe._find(tensors, names["gate_up"], required=False) is None:
            raise ValueError("tensors: no MoE expert tensors (looked for names ending in "
                             f"'{mxmoe._HF_NAMES['fc1_blocks']}', '{mxmoe._OPENAI_NAMES['fc1_blocks']}' or "
                             f"'{mxmoe._DENSE_NAMES['gate_up']}')")
    found = {key: mxmoe._find(tensors, suffix) for key, suffix in names.items()}
    dense = names is mxmoe._DENSE_NAMES
    first = names["gate_up" if dense else "fc1_blocks"]
    lead = found["gate_up" if dense else "fc1_blocks"]
    if not isinstance(lead, torch.Tensor) or lead.device.type != "cuda":
        got = lead.device if isinstance(lead, torch.Tensor) else type(lead).__name__
        raise ValueError(f"{first}: expected a CUDA tensor, got {got} (mxmoe.weights_from_tensors takes host arrays)")
    device = lead.device
    if dense:
        if lead.dim() != 3 or lead.shape[2] % 2:
            raise ValueError(f"{first}: expected [E, H, 2I], got {list(lead.shape)}")
        e, h, rows1 = lead.shape
        expected = {"router_weight": [(e, h)], "router_bias": [(e,)], "gate_up": [(e, h, rows1)],
                    "gate_up_bias": [(e, rows1)], "down": [(e, rows1 // 2, h)], "down_bias": [(e, h)]}
    else:
        if lead.dim() != 4 or lead.shape[3] != 16 or lead.shape[1] % 2:
            raise ValueError(f"{first}: expected [E, 2I, H/32, 16] uint8, got {list(lead.shape)}")
        e, rows1, h_blocks, _ = lead.shape
        h, i = 32 * h_blocks, rows1 // 2
        expected = {"router_weight": [(e, h)], "router_bias": [(e,)], "fc1_blocks": [(e, rows1, h_blocks, 16)],
                    "fc1_scales": [(e, rows1, h_blocks)], "fc1_bias": [(e, rows1)],
                    "fc2_blocks": [(e, h, i // 32, 16), (e, h, i // 2)], "fc2_scales": [(e, h, i // 32)],
                    "fc2_bias": [(e, h)]}
    members = {}
    for key, shapes in expected.items():
        name, t = names[key], found[key]
        codes = key.endswith(("_blocks", "_scales"))
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a CUDA torch.Tensor, got {type(t).__name__}")
        if t.device != device:
            raise ValueError(f"{name}: expected a tensor on {device} (where {first} is), got one on {t.device}")
        if codes and t.dtype != torch.uint8:
            raise TypeError(f"{name}: expected torch.uint8 (packed E2M1 codes or E8M0 scales), got {t.dtype}")
        if not codes and t.dtype not in (torch.bfloat16, torch.float32, torch.float16):
            raise TypeError(f"{name}: expected torch.bfloat16, torch.float32 or torch.float16, got {t.dtype}")
        if tuple(t.shape) not in shapes:
            raise ValueError(f"{name}: expected shape {' or '.join(str(list(s)) for s in shapes)}, got {list(t.shape)}")
        t = t.detach()
        if t.dtype == torch.float16:
            t = t.float()
        t = t.contiguous()
        if t.data_ptr() % 16:  # a view into another tensor: the runner reads 16-byte words
            t = t.clone()
        members[_DENSE_MEMBERS[key] if dense else key] = t
    mxmoe._check_top_k(top_k, e)
    return mxmoe.Shape(int(e), top_k, int(h), int(rows1) // 2), device, members


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
    if scheme not in (None, "openai", "hf", "deepseek", "deepseek-hf"):
        raise ValueError(f"scheme: expected 'openai', 'hf', 'deepseek', 'deepseek-hf' or None, got {scheme!r}")
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
