"""The SASS of the block-scaled path, disassembled by cuobjdump (the CUDA toolkit's, or the one in
PyPI's nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm, test dependencies), which no GPU here can
run: the inner step (src/kernels/block_scaled_mma.cuh) compiled by nvcc for each arch from
tests/sass/block_scaled_probe.cu, and every tactic of the block-scaled tile family as the library
compiles it (NVRTC, through `mxmoe cache prewarm --family bsmma`). On sm_120a and sm_121a the SM12x
form is the block-scaled E4M3 x E4M3 QMMA with E8M0 scales. No GPU needed."""

from __future__ import annotations

import json
import os
import re
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


def disassemble(cubin: Path) -> str:
    cuobjdump = tool("cuobjdump")
    if not cuobjdump:
        pytest.skip("needs cuobjdump")
    env = dict(os.environ)
    if nvdisasm := tool("nvdisasm"):  # cuobjdump -sass runs it
        env["NVDISASM_PATH"] = str(Path(nvdisasm).parent)
    listing = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True, env=env)
    assert listing.returncode == 0, f"cuobjdump:\n{listing.stderr}"
    return listing.stdout


def sass(arch: str, tmp_path: Path) -> str:
    nvcc, cuobjdump = tool("nvcc"), tool("cuobjdump")
    if not nvcc or not cuobjdump:
        pytest.skip(f"needs nvcc and cuobjdump (nvcc: {nvcc}, cuobjdump: {cuobjdump})")
    cubin = tmp_path / f"probe_{arch}.cubin"
    compiled = subprocess.run(
        [nvcc, "-std=c++20", "-cubin", f"-arch={arch}", f"-I{ROOT / 'src'}", str(PROBE), "-o", str(cubin)],
        capture_output=True, text=True)
    assert compiled.returncode == 0, f"nvcc for {arch}:\n{compiled.stderr}"
    return disassemble(cubin)


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


def mxmoe_cli() -> Path | None:
    """The built mxmoe command: $MXMOE_CLI, else $BUILD_DIR/mxmoe (build/mxmoe by default)."""
    path = Path(os.environ.get("MXMOE_CLI") or ROOT / os.environ.get("BUILD_DIR", "build") / "mxmoe")
    return path if path.is_file() else None


def family_kernels(arch: str, tmp_path: Path) -> dict[str, str]:
    """Every tactic of the block-scaled family compiled by the library for `arch` (into a scratch
    kernel cache), as tactic -> SASS listing of its module (FC1's and FC2's kernels)."""
    cli = mxmoe_cli()
    if not cli or not tool("cuobjdump"):
        pytest.skip(f"needs the built mxmoe command (found: {cli}) and cuobjdump")
    cache = tmp_path / "cache"
    prewarm = subprocess.run([str(cli), "cache", "prewarm", "--arch", arch, "--family", "bsmma", "--cache-dir",
                              str(cache)], capture_output=True, text=True)
    assert prewarm.returncode == 0, prewarm.stderr
    tactics = int(re.search(r"prewarm: (\d+) tactics", prewarm.stdout).group(1))
    listings = {}
    for entry in sorted((cache / "kernels").glob("*.entry")):
        data = entry.read_bytes()
        magic = data.index(b"\n") + 1
        header_end = data.index(b"\n", magic)
        header = json.loads(data[magic:header_end])
        cubin = tmp_path / f"{header['tactic']}.{header['arch']}.cubin"
        cubin.write_bytes(data[header_end + 1:])
        listings[header["tactic"]] = disassemble(cubin)
    assert len(listings) == tactics >= 4, (prewarm.stdout, sorted(listings))
    return listings


def functions(listing: str) -> list[str]:
    return listing.split("Function : ")[1:]


@pytest.mark.parametrize("arch", ["sm_120a", "sm_121a"])
def test_block_scaled_family_issues_the_block_scaled_mma(arch, tmp_path):
    for tactic, listing in family_kernels(arch, tmp_path).items():
        kernels = functions(listing)
        assert len(kernels) == 2, tactic  # FC1 and FC2
        for kernel in kernels:
            assert "BlockScaledMmaSm120" in kernel.splitlines()[0], (tactic, kernel.splitlines()[0])
            assert kernel.count(BLOCK_SCALED) >= 8, (tactic, kernel.splitlines()[0])
            assert "QMMA.16832" not in kernel, tactic  # no unscaled MMA: the twin is not in it


def test_block_scaled_family_runs_its_twin_on_hopper(tmp_path):
    for tactic, listing in family_kernels("sm_90a", tmp_path).items():
        for kernel in functions(listing):
            assert "BlockScaledMmaTwin" in kernel.splitlines()[0], tactic
            assert BLOCK_SCALED not in kernel and "HMMA.16816.F32" in kernel, tactic
