"""The measurement variants of kernel_variants.py (beside this file) still apply to the kernel
sources, and every tactic of the heuristic in the families a variant is measured on (wgmma for the
wgmma- variants, the GEMVs for the decode- ones) compiles from each (through `mxmoe cache prewarm
--default-set` with MXMOE_KERNEL_SOURCE_DIR) with none of its MMAs serialised: a variant that ptxas
serialises would time something else than what it names. The variants are measured on the
heuristic's tiles; the rest of the table would triple the test's time. No GPU needed.

pytest puts this file's directory on sys.path (its default, prepend, import mode: the directory
has no __init__.py), so kernel_variants imports as a sibling module."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import kernel_variants
import pytest

ROOT = Path(__file__).resolve().parents[2]


def cli() -> Path:
    """The built mxmoe command: $MXMOE_CLI, else $BUILD_DIR/mxmoe (build/mxmoe by default)."""
    return Path(os.environ.get("MXMOE_CLI") or ROOT / os.environ.get("BUILD_DIR", "build") / "mxmoe")


@pytest.mark.parametrize("variant", sorted(kernel_variants.VARIANTS))
def test_variant_compiles_without_serialised_mmas(variant: str, tmp_path: Path) -> None:
    if not cli().exists():
        pytest.skip(f"needs the built mxmoe command (found: {cli()})")
    sources = tmp_path / "src"
    kernel_variants.write_variant(variant, sources)
    env = dict(os.environ, MXMOE_KERNEL_SOURCE_DIR=str(sources))
    for family in ("gemv", "sk") if variant.startswith("decode-") else ("wgmma",):
        prewarm = subprocess.run([str(cli()), "cache", "prewarm", "--arch", "sm_90a", "--family", family, "--default-set",
                                  "--cache-dir", str(tmp_path / "cache")], capture_output=True, text=True, env=env)
        assert prewarm.returncode == 0, prewarm.stderr
        assert f"compiling kernels from {sources}" in prewarm.stderr
        assert "serialized" not in prewarm.stderr, prewarm.stderr
        assert "built in" not in prewarm.stdout, "the library's own kernels were used"
        compiled = re.search(r"prewarm: (\d+) tactics, (\d+) compiled", prewarm.stdout)
        assert compiled and int(compiled[1]) == int(compiled[2]) > 0, (family, prewarm.stdout)


def test_a_variant_whose_text_is_gone_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name, edits = next(iter(kernel_variants.VARIANTS.items()))
    path, old, new = edits[-1]
    monkeypatch.setitem(kernel_variants.VARIANTS, name, [(path, old + "// no longer in the source\n", new)])
    with pytest.raises(SystemExit, match="no longer holds"):
        kernel_variants.write_variant(name, tmp_path / "src")
