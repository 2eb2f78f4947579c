"""How long a gpt-oss MoE layer takes to become ready on the GPU, from each place its weights can be
(a benchmark).

    python python/bench/load.py [--models gpt-oss-20b gpt-oss-120b] [--layers 8] [--dir DIR]
                                [--host-baseline] [--json FILE]

Per model shape, each path's seconds to a ready layer (torch.cuda.synchronize() after it; median of
--repeats) and the rate in GB/s of the layer's MXFP4 checkpoint bytes:
  dense GPU      transformers' dense experts (gate_up_proj [E, H, 2I], down_proj [E, I, H], bf16, values
                 that were MXFP4) already on the GPU -> mxmoe.torch.MoeLayer.from_tensors (quantised and
                 repacked by kernels)
  MXFP4 GPU      the checkpoint's MXFP4 tensors already on the GPU -> MoeLayer.from_tensors (repacked)
  transformers   use_mxmoe() on a one-layer GptOssForCausalLM held on the GPU with dense experts
  host dense     (--host-baseline) the same dense experts from the host: mxmoe.weights_from_tensors
                 (the CPU quantiser) then MoeLayer, the path every dense model took before the GPU one
  checkpoint     a synthetic checkpoint of --layers layers with the real shapes (written once under
                 --dir, one file per layer, Hugging Face names): per layer, load_checkpoint + MoeLayer,
                 page cache warm, and cold (the files' pages dropped with posix_fadvise(DONTNEED)
                 first: the read comes from the device machine's disk)
  whole model    mxmoe.torch.load_model of all --layers layers in a child process, warm and cold:
                 seconds, GB/s, and the child's peak resident host memory above what it held before
                 loading (torch and the CUDA context)
Paths the installed mxmoe lacks are reported as absent, so the same script measures an older build.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

import mxmoe
import mxmoe.torch as mxtorch
from mxfp4_weights import dequantize, random_mxfp4
from timing import SHAPES


def seconds(make, repeats: int) -> float:
    """Median seconds of make() to a ready layer (the device idle after it), the layer freed between."""
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        layer = make()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        layer.free()
    return statistics.median(times)


def layer_tensors(e: int, h: int, i: int, seed: int) -> dict:
    """One layer's MXFP4 tensors on the GPU under Hugging Face names, with router and biases."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    fc1_blocks, fc1_scales = random_mxfp4(gen, e, 2 * i, h, 3.0)
    fc2_blocks, fc2_scales = random_mxfp4(gen, e, h, i, 1.0)
    bf16 = lambda *shape: (0.05 * torch.randn(*shape, device="cuda", generator=gen)).to(torch.bfloat16)  # noqa: E731
    return {"router.weight": bf16(e, h), "router.bias": bf16(e),
            "experts.gate_up_proj_blocks": fc1_blocks, "experts.gate_up_proj_scales": fc1_scales,
            "experts.gate_up_proj_bias": bf16(e, 2 * i), "experts.down_proj_blocks": fc2_blocks,
            "experts.down_proj_scales": fc2_scales, "experts.down_proj_bias": bf16(e, h)}


def dense_of(mx: dict) -> dict:
    """transformers' dense form of the same layer: gate_up_proj [E, H, 2I], down_proj [E, I, H], bf16."""
    return {"router.weight": mx["router.weight"], "router.bias": mx["router.bias"],
            "experts.gate_up_proj": dequantize(mx["experts.gate_up_proj_blocks"], mx["experts.gate_up_proj_scales"]),
            "experts.gate_up_proj_bias": mx["experts.gate_up_proj_bias"],
            "experts.down_proj": dequantize(mx["experts.down_proj_blocks"], mx["experts.down_proj_scales"]),
            "experts.down_proj_bias": mx["experts.down_proj_bias"]}


def checkpoint_bytes(mx: dict) -> int:
    return sum(t.numel() * t.element_size() for t in mx.values())


def transformers_seconds(dense: dict, e: int, k: int, h: int, i: int) -> float | None:
    """use_mxmoe() on a one-layer GptOssForCausalLM on the GPU whose experts are `dense`."""
    try:
        from transformers import GptOssConfig, GptOssForCausalLM
        import mxmoe.integrations.transformers as mxt
    except ImportError:
        return None
    config = GptOssConfig(hidden_size=h, intermediate_size=i, num_local_experts=e, num_experts_per_tok=k,
                          num_hidden_layers=1, vocab_size=512, num_attention_heads=64, num_key_value_heads=8,
                          head_dim=64, eos_token_id=None, pad_token_id=0)
    with torch.device("cuda"):
        model = GptOssForCausalLM(config).to(torch.bfloat16).eval()
    mlp = model.model.layers[0].mlp
    with torch.no_grad():
        mlp.router.weight.copy_(dense["router.weight"])
        mlp.router.bias.copy_(dense["router.bias"])
        for name in ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias"):
            getattr(mlp.experts, name).copy_(dense[f"experts.{name}"])
    torch.cuda.synchronize()
    start = time.perf_counter()
    mxt.use_mxmoe(model)
    torch.cuda.synchronize()
    result = time.perf_counter() - start
    del model
    torch.cuda.empty_cache()
    return result


def host_dense_seconds(dense: dict, k: int) -> float:
    """The dense experts quantised on the host (weights_from_tensors on CPU tensors), then MoeLayer."""
    host = {name: t.cpu() for name, t in dense.items()}
    start = time.perf_counter()
    layer = mxtorch.MoeLayer(mxmoe.weights_from_tensors(host, top_k=k), device="cuda")
    torch.cuda.synchronize()
    result = time.perf_counter() - start
    layer.free()
    return result


def write_checkpoint(directory: Path, model: str, layers: int) -> int:
    """A synthetic checkpoint of `layers` layers of `model`'s shape (one file per layer, Hugging Face
    names, config.json and the index), written once; returns the bytes of one layer's tensors."""
    e, k, h, i = SHAPES[model]
    done = directory / "model.safetensors.index.json"
    if not done.exists():
        from safetensors.torch import save_file
        directory.mkdir(parents=True, exist_ok=True)
        weight_map = {}
        for layer in range(layers):
            file = f"model-{layer:05d}-of-{layers:05d}.safetensors"
            tensors = {f"model.layers.{layer}.mlp.{name}": t.cpu()
                       for name, t in layer_tensors(e, h, i, seed=layer).items()}
            save_file(tensors, str(directory / file))
            weight_map.update(dict.fromkeys(tensors, file))
        (directory / "config.json").write_text(json.dumps({
            "model_type": "gpt_oss", "num_hidden_layers": layers, "num_local_experts": e,
            "num_experts_per_tok": k, "hidden_size": h, "intermediate_size": i}))
        done.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return sum(f.stat().st_size for f in directory.glob("*.safetensors")) // layers


def drop_page_cache(directory: Path) -> None:
    """Evicts the checkpoint's files from the page cache (clean pages: written back first)."""
    os.sync()
    for f in directory.glob("*.safetensors"):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def checkpoint_layer_seconds(directory: Path, layers: int) -> float:
    """Median seconds per layer of load_checkpoint + MoeLayer over the checkpoint's first `layers` layers."""
    times = []
    for layer in range(layers):
        start = time.perf_counter()
        moe = mxtorch.MoeLayer(mxmoe.load_checkpoint(str(directory), layer), device="cuda")
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        moe.free()
    return statistics.median(times)


def warm_page_cache(directory: Path) -> None:
    """Reads the checkpoint's files once, so that the next load finds them in the page cache."""
    for f in directory.glob("*.safetensors"):
        with open(f, "rb", buffering=0) as fh:
            while fh.read(64 << 20):
                pass


def whole_model(directory: Path, cold: bool) -> dict | None:
    """load_model of every layer in a child process: {seconds, rss_before_gb, rss_peak_gb}."""
    if not hasattr(mxtorch, "load_model"):
        return None
    if cold:
        drop_page_cache(directory)
    else:
        warm_page_cache(directory)
    run = subprocess.run([sys.executable, __file__, "--child-load", str(directory)], capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"the child load failed:\n{run.stderr}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def child_load(directory: str) -> None:
    """The child of whole_model(): CUDA up, then the whole model; prints one JSON line."""
    torch.cuda.init()
    torch.empty(1, device="cuda")
    before = resident_gb()
    start = time.perf_counter()
    layers = mxtorch.load_model(directory, device="cuda", quiet=True)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    print(json.dumps({"layers": len(layers), "seconds": elapsed, "rss_before_gb": before,
                      "rss_peak_gb": resident_gb("VmHWM")}))


def resident_gb(field: str = "VmRSS") -> float:
    """This process's resident memory now (VmRSS) or at its peak (VmHWM), in GiB. Not getrusage's
    ru_maxrss: a child started by fork and exec inherits its parent's peak there."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--layers", type=int, default=8, help="layers of the synthetic checkpoints")
    parser.add_argument("--dir", default="/tmp/mxmoe-load-bench", help="where the checkpoints are written")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--per-layer", type=int, default=3, help="layers timed one by one from the checkpoint")
    parser.add_argument("--host-baseline", action="store_true", help="also time the host quantiser path")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--child-load", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_load:
        child_load(args.child_load)
        return

    rows = []
    for model in args.models:
        e, k, h, i = SHAPES[model]
        mx = layer_tensors(e, h, i, seed=0)
        gb = checkpoint_bytes(mx) / 1e9
        row = {"model": model, "layer_gb": gb}
        if hasattr(mxtorch.MoeLayer, "from_tensors"):
            row["mxfp4_gpu_s"] = seconds(lambda: mxtorch.MoeLayer.from_tensors(mx, top_k=k), args.repeats)
            dense = dense_of(mx)
            row["dense_gpu_s"] = seconds(lambda: mxtorch.MoeLayer.from_tensors(dense, top_k=k), args.repeats)
        else:
            dense = dense_of(mx)
        row["transformers_s"] = transformers_seconds(dense, e, k, h, i)
        if args.host_baseline:
            row["host_dense_s"] = host_dense_seconds(dense, k)
        del mx, dense
        torch.cuda.empty_cache()

        directory = Path(args.dir) / f"{model}-{args.layers}"
        row["checkpoint_layer_gb"] = write_checkpoint(directory, model, args.layers) / 1e9
        per_layer = min(args.per_layer, args.layers)
        warm_page_cache(directory)
        row["checkpoint_warm_s"] = checkpoint_layer_seconds(directory, per_layer)
        drop_page_cache(directory)
        row["checkpoint_cold_s"] = checkpoint_layer_seconds(directory, per_layer)
        row["model_warm"] = whole_model(directory, cold=False)
        row["model_cold"] = whole_model(directory, cold=True)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)

    print(f"mxmoe {getattr(mxmoe, '__version__', '?')} on {torch.cuda.get_device_name()}; seconds to a ready layer "
          f"(GB/s of the layer's MXFP4 checkpoint bytes)")
    fmt = lambda s, gb: "absent" if s is None else f"{s:.3f} ({gb / s:.1f})"  # noqa: E731
    print("| model | layer GB | MXFP4 GPU | dense GPU | transformers | host dense | checkpoint warm | checkpoint cold |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        gb = r["layer_gb"]
        print(f"| {r['model']} | {gb:.2f} | {fmt(r.get('mxfp4_gpu_s'), gb)} | {fmt(r.get('dense_gpu_s'), gb)} | "
              f"{fmt(r.get('transformers_s'), gb)} | {fmt(r.get('host_dense_s'), gb)} | "
              f"{fmt(r['checkpoint_warm_s'], r['checkpoint_layer_gb'])} | "
              f"{fmt(r['checkpoint_cold_s'], r['checkpoint_layer_gb'])} |")
    print(f"\nwhole model, {args.layers} layers: seconds (GB/s), peak host RSS above the {'{'}torch + CUDA{'}'} baseline")
    print("| model | warm | cold | peak host GB (warm / cold) | one layer GB |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        total = r["checkpoint_layer_gb"] * args.layers
        warm, cold = r["model_warm"], r["model_cold"]
        if warm is None:
            print(f"| {r['model']} | absent | absent | - | {r['checkpoint_layer_gb']:.2f} |")
            continue
        print(f"| {r['model']} | {fmt(warm['seconds'], total)} | {fmt(cold['seconds'], total)} | "
              f"{warm['rss_peak_gb'] - warm['rss_before_gb']:.2f} / {cold['rss_peak_gb'] - cold['rss_before_gb']:.2f} | "
              f"{r['checkpoint_layer_gb']:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "layers": args.layers,
                                               "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
