"""A digest of every built-in variant's SASS, to show that a refactor changed no kernel.

    python3 tools/sass_digest.py --arch sm_90a > digests.tsv

Prints one line per variant: its name, the number of SASS instructions and the
SHA-256 of its ``cuobjdump -sass`` text with the file header dropped (the cubin's
own bytes also hold section order and symbol names, which say nothing about code).
Compare two runs with ``diff`` or ``join``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from kgen import jit, registry


def _cuobjdump() -> Path:
    import nvidia

    for root in nvidia.__path__:
        folder = Path(root) / "cu13" / "bin"
        if (folder / "cuobjdump").is_file():
            return folder
    sys.exit("cuobjdump not found under nvidia/cu13/bin: install the test extra")


_INSTRUCTION = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s+(\S.*?);", re.M)


def sass_text(cubin: bytes, folder: Path) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "v.cubin"
        path.write_bytes(cubin)
        env = dict(os.environ, PATH=f"{folder}{os.pathsep}{os.environ.get('PATH', '')}")
        out = subprocess.run([str(folder / "cuobjdump"), "-sass", str(path)], env=env,
                             capture_output=True, text=True, check=True).stdout
    # The first lines name the temporary file; the functions follow.
    return out[out.find("Function :"):]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="sm_90a")
    parser.add_argument("--family", action="append", help="only these families (repeatable)")
    args = parser.parse_args()
    folder = _cuobjdump()
    for variant in registry.current().variants():
        if args.family and variant.family.name not in args.family:
            continue
        if variant.arch_refusal(int(args.arch[3:].rstrip("a"))) is not None:
            continue
        text = sass_text(jit.build(variant, args.arch).cubin, folder)
        count = len(_INSTRUCTION.findall(text))
        print(f"{variant.name}\t{count}\t{hashlib.sha256(text.encode()).hexdigest()[:16]}", flush=True)


if __name__ == "__main__":
    main()
