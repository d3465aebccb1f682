"""NVRTC compilation of rendered source to a cubin, and the ptxas resource report.

Compilation goes through ``cuda.core.Program``. The ``-v`` log of ptxas is
parsed into a :class:`BuildRecord` (registers, spills, stack, shared memory per
entry), which ``kgen build`` prints; the gates it must pass are kgen.build_gates.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import io
import re
import struct
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import cuda.pathfinder
from cuda.bindings import nvrtc
from cuda.core import Program, ProgramOptions

from kgen import build_gates, config

_ENTRY = re.compile(r"Compiling entry function '(\w+)'")
_PROPS = re.compile(r"Function properties for (\w+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
PROGRAM_NAME = "kgen_variant"
# Only diagnostics located in the rendered source itself; those in included headers carry the header's name.
_DIAGNOSTIC = re.compile(rf"^{PROGRAM_NAME}\((\d+)\): (error|catastrophic error)", re.M)
_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)


@dataclass
class EntryResources:
    registers: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    stack_bytes: int = 0
    static_smem_bytes: int = 0


#: Bumped whenever BuildRecord's fields or their meaning change; the cache key
#: includes it, so records of another shape are never read back.
RECORD_FORMAT = 1


@dataclass
class BuildRecord:
    """What ptxas reported for one compiled variant."""

    arch: str
    compile_ms: float
    entries: dict[str, EntryResources] = field(default_factory=dict)
    #: Spill bytes (stores + loads) of device functions ptxas did not inline.
    callee_spill_bytes: int = 0

    @property
    def spills(self) -> int:
        """Every spilled byte, the entries' and their non-inlined callees' alike."""
        return sum(e.spill_stores + e.spill_loads for e in self.entries.values()) + self.callee_spill_bytes

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "BuildRecord":
        entries = {k: EntryResources(**v) for k, v in data["entries"].items()}
        return cls(arch=data["arch"], compile_ms=data["compile_ms"], entries=entries,
                   callee_spill_bytes=data["callee_spill_bytes"])


class CompileError(RuntimeError):
    """A rendered variant did not compile into what its spec declares.

    NVRTC rejected it (the message quotes the offending lines), or the cubin
    lacks an entry the spec names.
    """


def parse_ptxas_log(log: str) -> dict[str, EntryResources]:
    entries: dict[str, EntryResources] = {}
    current = None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            current = entries.setdefault(m.group(1), EntryResources())
        elif m := _PROPS.search(line):
            # Properties of a non-inlined device function are not an entry's.
            current = entries.get(m.group(1))
        elif current is not None and (m := _FRAME.search(line)):
            current.stack_bytes, current.spill_stores, current.spill_loads = map(int, m.groups())
        elif current is not None and (m := _REGS.search(line)):
            current.registers = int(m.group(1))
            if s := _SMEM.search(line):
                current.static_smem_bytes = int(s.group(1))
    return entries


_STO_CUDA_ENTRY = 0x10  # st_other bit of a __global__ function's ELF symbol


def cubin_kernels(cubin: bytes) -> set[str]:
    """The kernels (``__global__`` entries) an ELF cubin holds, from its symbol table.

    Read from the cubin, so that a ptxas log lacking an entry's lines is caught; a
    non-inlined device function is not an entry.
    """
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2:  # 64-bit ELF
        raise ValueError("not a 64-bit ELF cubin")
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", cubin, 0x3A)
    # (type, link, offset, size, entry size) of each section
    sections = [(h[1], h[6], h[4], h[5], h[8]) for h in
                (struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum))]
    out = set()
    for kind, link, offset, size, entsize in sections:
        if kind != 2:  # SHT_SYMTAB
            continue
        strings = cubin[sections[link][2]:sections[link][2] + sections[link][3]]
        for at in range(offset, offset + size, entsize):
            name_index, info, other = struct.unpack_from("<IBB", cubin, at)
            if info & 0xF == 2 and other & _STO_CUDA_ENTRY:  # STT_FUNC, a CUDA entry
                out.add(strings[name_index:strings.index(b"\0", name_index)].decode())
    return out


def parse_callee_spills(log: str) -> int:
    """Spill bytes of the non-inlined device functions in a ptxas ``-v`` log (not entries')."""
    entries = set(_ENTRY.findall(log))
    total, in_callee = 0, False
    for line in log.splitlines():
        if m := _PROPS.search(line):
            in_callee = m.group(1) not in entries
        elif in_callee and (m := _FRAME.search(line)):
            total += int(m.group(2)) + int(m.group(3))
            in_callee = False
    return total


@functools.lru_cache(maxsize=None)
def include_dirs() -> tuple[str, ...]:
    """The CUDA runtime headers (``cuda_bf16.h`` and friends) from the ``nvidia-cuda-runtime`` wheel or a toolkit."""
    found = cuda.pathfinder.find_nvidia_header_directory("cudart")
    if found is None:
        raise RuntimeError("CUDA runtime headers not found; install nvidia-cuda-runtime (pip install nvidia-cuda-runtime)")
    return (found,)


def header_digest(source: str) -> bytes:
    """A digest of every header ``source`` includes from the include path, followed transitively.

    The cache key must change when a header changes. Like NVRTC, a header's own
    includes are looked up in its folder first, then on the include path;
    headers NVRTC provides itself (found nowhere here) are covered by the NVRTC
    version. Headers are read once per process (they belong to installed
    packages); :func:`forget_headers` makes the next call read them again.
    """
    return _closure_digest(tuple(_INCLUDE.findall(source)), include_dirs())


@functools.lru_cache(maxsize=64)
def _closure_digest(names: tuple[str, ...], folders: tuple[str, ...]) -> bytes:
    digest = hashlib.sha256()
    seen: set[Path] = set()
    pending: list[tuple[tuple[str, ...], Path | None]] = [(names, None)]
    while pending:
        includes, including_folder = pending.pop()
        for name in includes:
            search = ([including_folder] if including_folder else []) + [Path(d) for d in folders]
            path = next((f / name for f in search if (f / name).is_file()), None)
            if path is not None and path not in seen:
                seen.add(path)
                data = path.read_bytes()
                digest.update(f"{name}\0{len(data)}\0".encode() + data)
                pending.append((tuple(_INCLUDE.findall(data.decode("utf-8", "replace"))), path.parent))
    return digest.digest()


def forget_headers() -> None:
    """Drop the per-process header digests (after editing a header in place)."""
    _closure_digest.cache_clear()


@functools.lru_cache(maxsize=1)
def nvrtc_version() -> str:
    """The loaded NVRTC's version, as precisely as it can be told (``13.0 nvidia-cuda-nvrtc 13.0.88``).

    ``nvrtcVersion`` says only major.minor, and a patch release can change the
    code it generates; so the version of the wheel that holds the loaded
    library is added, or else the library's resolved file name, which a CUDA
    toolkit spells with the full version (``libnvrtc.so.13.0.88``).
    """
    result, major, minor = nvrtc.nvrtcVersion()
    if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"nvrtcVersion failed: {result}")
    library = Path(cuda.pathfinder.load_nvidia_dynamic_lib("nvrtc").abs_path).resolve()
    return f"{major}.{minor} {_wheel_version_of(library) or library.name}"


def _wheel_version_of(library: Path) -> str | None:
    try:
        wheel = importlib.metadata.distribution("nvidia-cuda-nvrtc")
    except importlib.metadata.PackageNotFoundError:
        return None
    owned = any(Path(wheel.locate_file(f)).resolve() == library for f in wheel.files or ())
    return f"nvidia-cuda-nvrtc {wheel.version}" if owned else None


def program_options(arch: str, name: str) -> ProgramOptions:
    """The NVRTC options of every compile.

    The cache key is made from them, so a knob that changes the cubin (``KGEN_LINEINFO``) belongs here.
    """
    return ProgramOptions(
        name=name,
        arch=arch,
        std="c++17",
        include_path=list(include_dirs()),
        ptxas_options=["-v"],
        use_fast_math=False,
        lineinfo=config.lineinfo(),
        # Where a driver is installed, NVRTC keeps its own cache of compiled programs (~/.nv/ComputeCache),
        # and a program it finds there comes back without ptxas' report: no registers, no spills, none of
        # the warnings the build gates on. kgen's cache is the only one.
        no_cache=True,
    )


def _quote_errors(source: str, nvrtc_log: str, context: int = 2) -> str:
    lines = source.splitlines()
    shown = []
    for m in _DIAGNOSTIC.finditer(nvrtc_log):
        at = int(m.group(1))
        for n in range(max(1, at - context), min(len(lines), at + context) + 1):
            shown.append(f"{'>' if n == at else ' '}{n:5d} | {lines[n - 1]}")
        shown.append("")
    return "\n".join(shown)


def compile_cubin(source: str, arch: str, variant_name: str) -> tuple[bytes, BuildRecord]:
    """Compile ``source`` for ``arch`` (``sm_90a``); raise :class:`CompileError` with context on failure.

    The record's ptxas report covers every kernel of the cubin, or this raises.
    """
    cubin, record = _compile_once(source, arch, variant_name)
    unreported = build_gates.unreported_kernels(variant_name, cubin_kernels(cubin), record.entries)
    if unreported:
        raise CompileError(unreported)
    return cubin, record


def _compile_once(source: str, arch: str, variant_name: str) -> tuple[bytes, BuildRecord]:
    log = io.StringIO()
    started = time.perf_counter()
    try:
        code = Program(source, "c++", options=program_options(arch, PROGRAM_NAME)).compile("cubin", logs=log)
    except Exception as exc:  # cuda.core raises its NVRTCError (not public API) with the log in the message
        # The log is a C string: its terminating NUL comes along, and must not reach a terminal or a CI log.
        message = str(exc).replace("\x00", "")
        raise CompileError(
            f"NVRTC failed to compile {variant_name} for {arch}:\n{message}\n"
            f"Rendered lines (run `kgen render` for the whole source):\n{_quote_errors(source, message)}"
        ) from None
    elapsed_ms = (time.perf_counter() - started) * 1e3
    text = log.getvalue()
    lost = build_gates.lost_design(variant_name, arch, text)
    if lost:
        raise CompileError(lost)
    record = BuildRecord(arch=arch, compile_ms=elapsed_ms, entries=parse_ptxas_log(text),
                         callee_spill_bytes=parse_callee_spills(text))
    return bytes(code.code), record
