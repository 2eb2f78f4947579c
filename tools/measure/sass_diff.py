#!/usr/bin/env python3
"""Compares the SASS of every valid tactic between two builds of mxmoe.

Usage: tools/measure/sass_diff.py OLD_BUILD_DIR NEW_BUILD_DIR [--arch A|all]

Each build's `mxmoe cache prewarm` compiles the tactics its library lacks into a scratch cache; the
ahead-of-time set is read from its build's src/aot/aot_blob.bin. Every cubin is disassembled with
cuobjdump (from PATH or $CUOBJDUMP; PyPI's nvidia-cuda-cuobjdump wheel carries one) and compared
with kernel names masked, so a renamed argument type does not count as a change. Prints one line
per tactic that differs and a summary; exits 1 if any differs or is missing from one build.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

MAGIC = b"MXMOE-KERNEL 1\n"


def entries(data):
    """(tactic, arch, cubin) of every kernel entry in `data`, entries back to back or alone."""
    at = 0
    while (at := data.find(MAGIC, at)) >= 0:
        end_of_header = data.index(b"\n", at + len(MAGIC))
        header = json.loads(data[at + len(MAGIC):end_of_header])
        payload = data[end_of_header + 1:end_of_header + 1 + header["payload_bytes"]]
        yield header["tactic"], header["arch"], payload
        at = end_of_header + 1 + header["payload_bytes"]


def cubins(build, arch, scratch):
    cache = os.path.join(scratch, os.path.basename(os.path.abspath(build)))
    subprocess.run([os.path.join(build, "mxmoe"), "cache", "prewarm", "--arch", arch, "--cache-dir", cache],
                   check=True, stdout=subprocess.DEVNULL)
    found = {}
    kernels = os.path.join(cache, "kernels")
    for name in os.listdir(kernels):
        if name.endswith(".entry"):
            with open(os.path.join(kernels, name), "rb") as f:
                found.update({(t, a): c for t, a, c in entries(f.read())})
    with open(os.path.join(build, "src", "aot", "aot_blob.bin"), "rb") as f:
        found.update({(t, a): c for t, a, c in entries(f.read()) if arch in ("all", a)})
    return found


def sass(cubin, scratch):
    path = os.path.join(scratch, "kernel.cubin")
    with open(path, "wb") as f:
        f.write(cubin)
    text = subprocess.run([os.environ.get("CUOBJDUMP", "cuobjdump"), "-sass", path], check=True,
                          capture_output=True, text=True).stdout
    return re.sub(r"_Z\w+", "<kernel>", text)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    old_build, new_build = sys.argv[1], sys.argv[2]
    arch = sys.argv[sys.argv.index("--arch") + 1] if "--arch" in sys.argv else "all"
    with tempfile.TemporaryDirectory() as scratch:
        old, new = cubins(old_build, arch, scratch), cubins(new_build, arch, scratch)
        same, different = 0, 0
        for key in sorted(set(old) | set(new)):
            if key not in old or key not in new:
                print(f"{key[1]} {key[0]}: only in the {'new' if key in new else 'old'} build")
                different += 1
            elif sass(old[key], scratch) == sass(new[key], scratch):
                same += 1
            else:
                print(f"{key[1]} {key[0]}: SASS differs")
                different += 1
    print(f"{same} tactics with identical SASS, {different} different or missing")
    sys.exit(1 if different else 0)


if __name__ == "__main__":
    main()
