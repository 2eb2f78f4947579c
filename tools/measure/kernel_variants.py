#!/usr/bin/env python3
"""Writes a copy of the kernel sources with one measurement variant applied, for
MXMOE_KERNEL_SOURCE_DIR (docs/tactics.md): ablations of the kind docs/performance.md cites, reproducible
on a GPU machine with no rebuild.

Usage: tools/measure/kernel_variants.py VARIANT DIR     (VARIANT: one of --list)
Then:  MXMOE_KERNEL_SOURCE_DIR=DIR build/mxmoe bench --plan TACTIC ...
       (the decode- variants with the heuristic's plans: bench --model deepseek-v4-flash --tokens 1,2,8)

A variant is a list of exact text replacements in the sources; one whose text is no longer there
fails loudly instead of measuring something else. Every variant computes wrong outputs (the bench
flags its rows INACCURATE): only its time means anything.
"""
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE_DIRS = ("kernels", "format", "device", "route")  # what the library embeds (src/CMakeLists.txt)
WGMMA = "kernels/expert_wgmma.cuh"

ZEROED_ACCUMULATORS = (
    WGMMA,
    "  float acc[kWarpRecords][kTileTokens / 2];  // the first slice's MMAs overwrite them\n",
    "  float acc[kWarpRecords][kTileTokens / 2] = {};  // variant: no MMA may write them\n",
)

# Each consumer waits for its slot and hands it back at once: nothing read, dequantised or multiplied.
DELIVERY_ONLY = (
    WGMMA,
    "      mbarrier_wait(full + barrier_offset, phase);\n"
    "      // Every record is dequantised",
    "      mbarrier_wait(full + barrier_offset, phase);\n"
    "      mbarrier_arrive(empty + barrier_offset);  // variant: the slot back at once\n"
    "      if (true) {\n"
    "        (void)slice;\n"
    "        advance();\n"
    "        return;\n"
    "      }\n"
    "      // Every record is dequantised",
)

# The producer's arrival on a slot's full barrier and its copy of the slice's records.
WEIGHT_COPY = (
    "      mbarrier_arrive_expect_tx(full + 8 * s, boxes * kBoxBytes + kRecords * kRecordBytes);\n"
    "      tensor_copy_4d(smem_base + s * kStageBytes + kActivationBytes, weights, 0, kt_begin + slice, first_row_tile,\n"
    "                     expert, full + 8 * s);\n"
)

VARIANTS = {
    # The ring alone: each consumer waits for its slot and hands it back at once; no record is
    # read, dequantised or multiplied. The time of the tensor copies' delivery.
    "wgmma-delivery-only": [ZEROED_ACCUMULATORS, DELIVERY_ONLY],
    # The ring's weights alone: as delivery-only, with no activation box copied.
    "wgmma-delivery-weights-only": [
        ZEROED_ACCUMULATORS, DELIVERY_ONLY,
        (WGMMA,
         "    const int boxes = (tokens + kWgmmaBoxTokens - 1) / kWgmmaBoxTokens;\n",
         "    const int boxes = 0 * tokens;  // variant: no activations\n"),
    ],
    # The ring's activations alone: as delivery-only, with no record copied.
    "wgmma-delivery-activations-only": [
        ZEROED_ACCUMULATORS, DELIVERY_ONLY,
        (WGMMA,
         WEIGHT_COPY,
         "      mbarrier_arrive_expect_tx(full + 8 * s, boxes * kBoxBytes);  // variant: no records\n"),
    ],
    # The slot handed back as soon as the consumer has read its records, before the MMAs read its
    # activations (which the next copy into the slot may overwrite): the time the kernel would take
    # if the weights' ring were released at once and the activations arrived in time.
    "wgmma-early-release": [
        (WGMMA,
         "      dequantize_records(values, scale_words, a[set.value], one_multiply);\n",
         "      mbarrier_arrive(empty + barrier_offset);  // variant: released before the MMAs\n"
         "      dequantize_records(values, scale_words, a[set.value], one_multiply);\n"),
        (WGMMA,
         "      if (slice > 0) mbarrier_arrive(empty + previous_barrier_offset);\n",
         ""),
    ],
    # The consumers alone: the producer copies nothing and arrives on each slot's full barrier at
    # once, so the consumers dequantise and multiply whatever the slots hold as fast as they can
    # (by the path the host's scale test chose, one multiply for real weights, whatever the slots'
    # scale bytes). With the delivery-only variants, it splits the kernel's time between its two
    # halves.
    "wgmma-consumers-only": [
        (WGMMA, WEIGHT_COPY, "      mbarrier_arrive(full + 8 * s);  // variant: nothing copied\n"),
        (WGMMA,
         "      for (int box = 0; box < boxes; ++box) {\n",
         "      for (int box = 0; box < 0 * boxes; ++box) {  // variant: nothing copied\n"),
    ],
    # Records read and dequantised, no MMA: the fragments are kept alive by empty asm statements.
    "wgmma-no-mma": [
        ZEROED_ACCUMULATORS,
        (WGMMA,
         "      multiply_slice<kN>(acc, a[set.value], descriptor0 + stage_offset / 16, slice == 0);\n"
         "      wgmma_wait<1>();\n",
         "      (void)descriptor0;  // variant: no MMA; the fragments must still be made\n"
         "#pragma unroll\n"
         "      for (int r = 0; r < kWarpRecords; ++r)\n"
         "#pragma unroll\n"
         "        for (int j = 0; j < 4; ++j)\n"
         "#pragma unroll\n"
         "          for (int i = 0; i < 4; ++i) asm volatile(\"\" ::\"r\"(a[set.value][r][j][i]));\n"),
    ],
    # Records read and multiplied with their bit extraction left out: each fragment register is a
    # raw word (one xor to keep the four apart) times the scale factor, inside the one-multiply
    # path (the integer rotations and masks, 36 of its ~61 instructions a record, are gone).
    # Fragments made outside that path make ptxas serialise the MMAs (C7511-C7513).
    "wgmma-no-extraction": [
        ("kernels/mxfp4_fragment.cuh",
         "      a[j][reg] = bf16x2_mul(e2m1_pair_bits(words[j], reg), factor[2 * (j / 2) + upper_rows]);\n",
         "      a[j][reg] = bf16x2_mul(words[j] ^ reg, factor[2 * (j / 2) + upper_rows]);  // variant: no extraction\n"),
    ],
    # Decode: a small batch's top-k replaced by a fixed assignment (token t's slot s to expert
    # (t k + s) x 37 + 11 mod E, distinct within a token, weights 1 / k), in the routing kernel and
    # in FC1 where the batch routes itself: the time the top-k's scores and ranking take on the
    # layer's path. The logits are not read.
    "decode-fixed-routing": [
        ("route/small_batch_routing.cuh",
         "  const int warps = blockDim.x / 32;\n"
         "  const int group = select_group(warps, num_tokens, num_experts, top_k, router.sqrt_softplus != 0);\n",
         "  const int warps = blockDim.x / 32;\n"
         "  if (true) {  // variant: a fixed assignment, no scores or ranking\n"
         "    for (int token = threadIdx.x / 32; token < num_tokens; token += warps) {\n"
         "      const int lane = threadIdx.x % 32, pair = token * top_k + lane;\n"
         "      if (lane < top_k) {\n"
         "        experts[pair] = (pair * 37 + 11) % num_experts;\n"
         "        weights[pair] = 1.0f / top_k;\n"
         "      }\n"
         "    }\n"
         "    return;\n"
         "  }\n"
         "  const int group = select_group(warps, num_tokens, num_experts, top_k, router.sqrt_softplus != 0);\n"),
    ],
    # Every family's records read and multiplied with no dequantisation: each fragment register is
    # a raw word xor its scale factor (one instruction for the extraction's ~2 a pair, the multiply
    # and none of its range test), inside the one-multiply path. The time the GEMVs' issue of the
    # dequantisation takes.
    "decode-no-dequantisation": [
        ("kernels/mxfp4_fragment.cuh",
         "      a[j][reg] = bf16x2_mul(e2m1_pair_bits(words[j], reg), factor[2 * (j / 2) + upper_rows]);\n",
         "      a[j][reg] = words[j] ^ factor[2 * (j / 2) + upper_rows];  // variant: no dequantisation\n"),
    ],
}

# The consumers alone, with the extraction or the MMAs left out as in the variants above.
VARIANTS["wgmma-consumers-only-no-extraction"] = VARIANTS["wgmma-consumers-only"] + VARIANTS["wgmma-no-extraction"]
VARIANTS["wgmma-consumers-only-no-mma"] = VARIANTS["wgmma-consumers-only"] + VARIANTS["wgmma-no-mma"]


def write_variant(name: str, out: Path) -> None:
    if name not in VARIANTS:
        raise SystemExit(f"kernel_variants: unknown variant '{name}' (known: {', '.join(VARIANTS)})")
    for d in SOURCE_DIRS:
        shutil.rmtree(out / d, ignore_errors=True)
        shutil.copytree(ROOT / "src" / d, out / d)
    for path, old, new in VARIANTS[name]:
        text = (out / path).read_text()
        if text.count(old) != 1:
            raise SystemExit(f"kernel_variants: {name}: {path} no longer holds (exactly once):\n{old}")
        (out / path).write_text(text.replace(old, new))


def main(argv: list[str]) -> None:
    if argv[1:] == ["--list"]:
        print("\n".join(VARIANTS))
        return
    if len(argv) != 3:
        raise SystemExit(__doc__)
    write_variant(argv[1], Path(argv[2]))


if __name__ == "__main__":
    main(sys.argv)
