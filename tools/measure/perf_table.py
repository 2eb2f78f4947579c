#!/usr/bin/env python3
"""Prints the table of docs/performance.md from a `mxmoe bench --json` file and, optionally, a
`python/bench/torch_grouped_gemm.py --json` file (Python 3, standard library only).

    python3 tools/measure/perf_table.py BENCH_JSON [TORCH_JSON] [--tokens 1,2,4,...]

One row per model and token count: the layer's median us, its fractions of the read ceiling and
of the bf16 rate measured in the same run, the SM clock and power-capped share over its timed
replays, the plan (FC1 + FC2 where they differ), and where the torch file has the point, the
PyTorch bf16 grouped-GEMM layer's us and its ratio to mxmoe's time measured beside it in that
script's own run. A point the bench file lacks prints as "-". The line above the table names the
device, the revision and the ceilings.
"""

from __future__ import annotations

import argparse
import json

DEFAULT_TOKENS = "1,2,4,8,16,64,128,256,512,1024,2048,4096,16384"
MODELS = ("gpt-oss-20b", "gpt-oss-120b")


def plan_name(row: dict) -> str:
    fc1, fc2 = (row[k].removesuffix(".k1") for k in ("fc1_tactic", "fc2_tactic"))
    return f"`{fc1}`" if fc1 == fc2 else f"`{fc1}` + `{fc2}`"


def clock_cell(clocks: dict | None) -> str:
    if not clocks or clocks.get("samples", 0) == 0:
        return "-"
    cap = clocks.get("power_capped_fraction", 0.0)
    mhz = f"{clocks['sm_clock_mhz_median']}"
    return f"{mhz} ({100 * cap:.0f} %)" if cap > 0 else mhz


def at_clock(clocks: dict | None) -> str:
    if not clocks or clocks.get("samples", 0) == 0:
        return ""
    cap = clocks.get("power_capped_fraction", 0.0)
    return f" at {clocks['sm_clock_mhz_median']} MHz" + (f" (power cap {100 * cap:.0f} %)" if cap > 0 else "")


def caption(bench: dict, torch: dict | None) -> str:
    c = bench["ceilings"]
    text = (f"{bench['device']['name']}, mxmoe {bench.get('git_revision', '?')}, "
            f"{bench['protocol']['layers_rotated']} layers rotated, median of {bench['protocol']['replays']} replays; "
            f"ceilings in the same run: read {c['read_gbs']:.0f} GB/s{at_clock(c.get('read_clocks'))}, "
            f"bf16 {c['bf16_tflops']:.0f} TFLOP/s{at_clock(c.get('bf16_clocks'))}")
    if torch:
        text += f"; torch {torch.get('torch', '?')} on {torch.get('device', '?')}"
    return text + "."


def table(bench: dict, torch: dict | None, tokens: list[int]) -> str:
    rows = {(r["model"], r["tokens"]): r for r in bench["rows"] if r.get("activations", "bf16") == "bf16"}
    torch_rows = {(r["model"], r["tokens"]): r for r in (torch or {}).get("rows", [])}
    lines = [
        "| model | T | us per layer | % read | % bf16 | MHz (power cap) | plan | torch bf16 us | torch / mxmoe |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |",
    ]
    for model in MODELS:
        for t in tokens:
            r, tr = rows.get((model, t)), torch_rows.get((model, t))
            cells = [model, str(t)]
            if r:
                cells += [f"{r['us_per_layer']:.1f}", f"{100 * r['read_fraction']:.1f}", f"{100 * r['bf16_fraction']:.1f}",
                          clock_cell(r.get("clocks")), plan_name(r)]
            else:
                cells += ["-"] * 5
            if tr:
                cells += [f"{tr['torch_grouped_mm_bf16_us']:.1f}", f"{tr['torch_grouped_mm_bf16_us'] / tr['mxmoe_us']:.2f}"]
            else:
                cells += ["-", "-"]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("bench", help="a `mxmoe bench --json` file")
    parser.add_argument("torch", nargs="?", help="a `python/bench/torch_grouped_gemm.py --json` file")
    parser.add_argument("--tokens", default=DEFAULT_TOKENS, help=f"token counts (default {DEFAULT_TOKENS})")
    args = parser.parse_args()
    with open(args.bench) as f:
        bench = json.load(f)
    torch = None
    if args.torch:
        with open(args.torch) as f:
            torch = json.load(f)
    tokens = [int(t) for t in args.tokens.split(",")]
    print(caption(bench, torch))
    print()
    print(table(bench, torch, tokens))


if __name__ == "__main__":
    main()
