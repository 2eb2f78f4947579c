"""The SASS of the block-scaled inner step (src/kernels/block_scaled_mma.cuh), compiled by nvcc for
each arch from tests/sass/block_scaled_probe.cu and disassembled by cuobjdump (the CUDA toolkit's,
or the one in PyPI's nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm, test dependencies): on
sm_120a and sm_121a the SM12x form is the block-scaled E4M3 x E4M3 QMMA with E8M0 scales, which no
GPU here can run. No GPU needed."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "tests" / "sass" / "block_scaled_probe.cu"
BLOCK_SCALED = "QMMA.SF.16832.F32.E4M3.E4M3.E8"


def tool(name: str) -> str | None:
    """The toolkit's `name`, or the copy a PyPI nvidia-cuda-* wheel carries."""
    found = os.environ.get(name.upper()) or shutil.which(name) or shutil.which(name, path="/usr/local/cuda/bin")
    if found:
        return found
    try:
        import nvidia  # the namespace package of NVIDIA's wheels
    except ImportError:
        return None
    for base in nvidia.__path__:
        for candidate in Path(base).glob(f"cu*/bin/{name}"):
            return str(candidate)
    return None


def sass(arch: str, tmp_path: Path) -> str:
    nvcc, cuobjdump = tool("nvcc"), tool("cuobjdump")
    if not nvcc or not cuobjdump:
        pytest.skip(f"needs nvcc and cuobjdump (nvcc: {nvcc}, cuobjdump: {cuobjdump})")
    cubin = tmp_path / f"probe_{arch}.cubin"
    compiled = subprocess.run(
        [nvcc, "-std=c++20", "-cubin", f"-arch={arch}", f"-I{ROOT / 'src'}", str(PROBE), "-o", str(cubin)],
        capture_output=True, text=True)
    assert compiled.returncode == 0, f"nvcc for {arch}:\n{compiled.stderr}"
    env = dict(os.environ)
    if nvdisasm := tool("nvdisasm"):  # cuobjdump -sass runs it
        env["NVDISASM_PATH"] = str(Path(nvdisasm).parent)
    listing = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True, env=env)
    assert listing.returncode == 0, f"cuobjdump:\n{listing.stderr}"
    return listing.stdout


def kernel_sass(listing: str, form: str) -> str:
    """The SASS of the probe kernel instantiated with `form` (its mangled name contains it)."""
    parts = listing.split("Function : ")
    matching = [part for part in parts[1:] if form in part.splitlines()[0]]
    assert len(matching) == 1, f"one {form} kernel expected in the listing"
    return matching[0]


@pytest.mark.parametrize("arch", ["sm_120a", "sm_121a"])
def test_sm12x_form_is_the_block_scaled_mma(arch, tmp_path):
    listing = sass(arch, tmp_path)
    sm120 = kernel_sass(listing, "BlockScaledMmaSm120")
    assert sm120.count(BLOCK_SCALED) == 2, sm120
    twin = kernel_sass(listing, "BlockScaledMmaTwin")
    assert BLOCK_SCALED not in twin and "QMMA.16832.F32.E4M3.E4M3" in twin


def test_twin_on_hopper_is_plain_mma(tmp_path):
    # sm_90a has no E4M3 mma.sync in hardware: ptxas widens it to f16 HMMAs (exact for E4M3).
    twin = kernel_sass(sass("sm_90a", tmp_path), "BlockScaledMmaTwin")
    assert BLOCK_SCALED not in twin and "HMMA.16816.F32" in twin
