"""A wheel of cache entries: ``pip install`` it and kgen finds it as a read-only, installed layer."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import zipfile
from pathlib import Path

from kgen import __version__
from kgen.cache.manifest import MANIFEST, PackedEntry, make_manifest
from kgen.cache.store import replacing
from kgen.compiler import nvrtc_version

#: The entry-point group of caches installed as wheels; each entry point names an object holding its folder.
ENTRY_POINT_GROUP = "kgen.caches"
_WHEEL_DATE = (1980, 1, 1, 0, 0, 0)  # the earliest a zip can say: the same entries give the same wheel


def write_wheel(folder: Path, packed: list[PackedEntry]) -> Path:
    """Write a wheel holding ``packed`` that registers itself under ``kgen.caches``; return its path.

    Package ``kgen_cache_<archs>`` holds the entries and manifest in its
    ``cache/`` folder, which ``CACHE_DIR`` names and the entry point points
    to. Its version is kgen's, with NVRTC's as the local label, and it
    requires this kgen: installed with another, it would never hit.
    """
    manifest = make_manifest(packed)
    package = "kgen_cache_" + "_".join(manifest["archs"])
    nvrtc = re.sub(r"[^0-9a-z]+", ".", nvrtc_version().split()[-1].lower()).strip(".")
    version = f"{__version__}+nvrtc.{nvrtc}"
    summary = (f"Prebuilt kgen cubins for {', '.join(manifest['archs'])} ({len(packed)} entries), "
               f"made by kgen {__version__} with NVRTC {nvrtc_version()}")
    files = {
        f"{package}/__init__.py": f'"""{summary}."""\n\nimport os\n\n'
                                  f'CACHE_DIR = os.path.join(os.path.dirname(__file__), "cache")\n'.encode(),
        f"{package}/cache/{MANIFEST}": json.dumps(manifest, indent=1).encode(),
        **{f"{package}/cache/{p.file_name}": p.blob for p in packed},
    }
    info = f"{package}-{version}.dist-info"
    files[f"{info}/METADATA"] = (f"Metadata-Version: 2.1\nName: {package.replace('_', '-')}\nVersion: {version}\n"
                                 f"Summary: {summary}\nRequires-Dist: kgen=={__version__}\n").encode()
    files[f"{info}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: kgen {__version__}\nRoot-Is-Purelib: true\n"
                              f"Tag: py3-none-any\n").encode()
    files[f"{info}/entry_points.txt"] = f"[{ENTRY_POINT_GROUP}]\n{package} = {package}:CACHE_DIR\n".encode()
    files[f"{info}/RECORD"] = "".join(f"{name},sha256={_record_digest(data)},{len(data)}\n"
                                      for name, data in files.items()).encode() + f"{info}/RECORD,,\n".encode()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{package}-{version}-py3-none-any.whl"
    with replacing(path) as tmp, zipfile.ZipFile(tmp, "w") as wheel:
        for name, data in files.items():
            member = zipfile.ZipInfo(name, _WHEEL_DATE)
            member.external_attr = 0o644 << 16
            wheel.writestr(member, data, zipfile.ZIP_DEFLATED)
    return path


def _record_digest(data: bytes) -> str:
    # The wheel spec's form: urlsafe base64 of the SHA-256, without padding.
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
