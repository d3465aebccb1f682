"""Rendering and NVRTC compilation of every built-in variant, SASS checks, the ptxas log parser, compile errors.

Runs without a GPU: NVRTC compiles for ``sm_90a`` on any machine, and
cuobjdump (the ``nvidia-cuda-cuobjdump`` wheel of the test extra) reads the cubins.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
from pathlib import Path

import pytest

import kgen.arch
from kgen import compiler
import kgen.config
import kgen.jit
import kgen.registry
from kgen.contract import contract_of
from kgen.compiler import BuildRecord, CompileError, EntryResources, compile_cubin, parse_callee_spills, parse_ptxas_log
from kgen.registry import Family, Variant
from kgen.render import render

ARCH = "sm_90a"
MERGE = "merge_attention_states"


def _variant(name: str) -> Variant:
    for variant in kgen.registry.current().variants():
        if variant.name == name:
            return variant
    raise LookupError(f"no variant {name} on the spec path")


def _merge_variant(**params) -> Variant:
    return kgen.registry.current().family(MERGE).select(**params)


ALL_VARIANTS = [v.name for v in kgen.registry.current().variants()]


def test_builtin_spec_path_has_the_merge_family():
    # Guards the parametrisation below against silently collecting nothing.
    family = kgen.registry.current().family(MERGE)
    assert set(family.entries) == {"merge_states_2", "merge_states_n"}
    assert family.variants and {v.name for v in family.variants} <= set(ALL_VARIANTS)
    assert len(set(ALL_VARIANTS)) == len(ALL_VARIANTS)
    assert set(family.supported("has_incomplete_tile")) == {False, True}
    assert {"bf16", "fp16", "fp32"} <= set(family.supported("dtype"))


# --------------------------------------------------------------------------- every variant


# The exhaustive sweep: `kgen build --arch sm_90a` in .ci/run covers the same ground through the CLI's gates.
@pytest.mark.sweep
@pytest.mark.parametrize("name", ALL_VARIANTS)
def test_every_variant_compiles_without_spills(name, cache_dir):
    variant = _variant(name)
    result = kgen.jit.build(variant, ARCH)

    assert result.cache_hit is False  # a fresh cache: this call compiled it
    assert result.arch == ARCH
    assert result.cubin[:4] == b"\x7fELF"
    record = result.record
    assert record.arch == ARCH
    assert record.compile_ms > 0
    for entry in variant.family.entries:
        assert entry in record.entries, f"ptxas reported no {entry} in {sorted(record.entries)}"
        assert record.entries[entry].registers > 0, f"{entry}: {record.entries[entry]}"
    if not variant.family.allow_spills:
        assert record.spills == 0, {k: v for k, v in record.entries.items() if v.spill_stores or v.spill_loads}
    # The entry names are in the cubin's symbol table.
    for entry in variant.family.entries:
        assert entry.encode() in result.cubin


# --------------------------------------------------------------------------- SASS


@functools.lru_cache(maxsize=None)
def _compiled(name: str) -> tuple[bytes, BuildRecord]:
    variant = _variant(name)
    return compile_cubin(render(variant), ARCH, variant.name)


def _cuobjdump_bin() -> Path:
    import nvidia

    for root in nvidia.__path__:
        folder = Path(root) / "cu13" / "bin"
        if (folder / "cuobjdump").is_file() and (folder / "nvdisasm").is_file():
            return folder
    pytest.fail("cuobjdump/nvdisasm not found under nvidia/cu13/bin; install the test extra (nvidia-cuda-cuobjdump)")


def sass_by_function(cubin: bytes, tmp_path: Path) -> dict[str, str]:
    """``cuobjdump -sass`` of ``cubin``, split into one text per function."""
    folder = _cuobjdump_bin()
    path = tmp_path / "variant.cubin"
    path.write_bytes(cubin)
    env = dict(os.environ, PATH=f"{folder}{os.pathsep}{os.environ.get('PATH', '')}")
    out = subprocess.run([str(folder / "cuobjdump"), "-sass", str(path)], env=env,
                         capture_output=True, text=True, check=True).stdout
    parts = re.split(r"^\s*Function : (\S+)\s*$", out, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


_LDG_128 = re.compile(r"\bLDG\.E(?:\.EF)?\.128\b")
_STG_128 = re.compile(r"\bSTG\.E(?:\.EF)?\.128\b")
_LOCAL = re.compile(r"\b(?:LDL|STL)(?:\.|\s)")

SASS_VARIANTS = [
    dict(dtype="bf16", head_dim=128, has_incomplete_tile=True),
    dict(dtype="bf16", head_dim=128, has_incomplete_tile=False),
    dict(dtype="fp32", head_dim=256, has_incomplete_tile=True),
    dict(dtype="fp16", head_dim=64, has_incomplete_tile=False),
]


@pytest.mark.parametrize("params", SASS_VARIANTS, ids=lambda p: "-".join(f"{k}={v}" for k, v in p.items()))
def test_merge_sass_uses_128_bit_accesses_and_no_local_memory(params, tmp_path):
    variant = _merge_variant(**params)
    cubin, _ = _compiled(variant.name)
    sass = sass_by_function(cubin, tmp_path)
    assert set(sass) == set(variant.family.entries)
    for entry, text in sass.items():
        assert _LDG_128.search(text), f"{entry}: no 128-bit global load"
        assert _STG_128.search(text), f"{entry}: no 128-bit global store"
        local = [line.strip() for line in text.splitlines() if _LOCAL.search(line)]
        assert not local, f"{entry}: local memory accesses: {local[:5]}"


def _attention_instructions(params: dict) -> dict[str, re.Pattern]:
    """The instructions each attention kernel is built on, by name."""
    tma = {"UTMALDG": re.compile(r"\bUTMALDG\.3D\b")}  # TMA tile loads of full tiles
    if params["mma"] == "wgmma":
        return {**tma,
                # S = Q K^T from two shared-memory descriptors; O += P V with P from registers.
                "HGMMA SS": re.compile(rf"\bHGMMA\.64x{params['tile_n']}x16\.F32\.BF16 R\d+, gdesc\["),
                "HGMMA RS": re.compile(rf"\bHGMMA\.64x{params['head_dim']}x16\.F32\.BF16 R\d+, R\d+, gdesc\["),
                "UTMASTG": re.compile(r"\bUTMASTG\.3D\b")}  # full tiles of O stored by TMA
    return {**tma,
            "HMMA": re.compile(r"\bHMMA\.16816\.F32"),  # mma.sync m16n8k16, fp32 accumulators
            "LDSM": re.compile(r"\bLDSM\.16\.M88\.4\b"),  # ldmatrix x4 (K, Q)
            "LDSM.T": re.compile(r"\bLDSM\.16\.MT88\.4\b")}  # ldmatrix x4 transposed (V)


_CP_ASYNC = re.compile(r"\bLDGSTS\b")
_SETMAXNREG = re.compile(r"\bUSETMAXREG\b")


def _bf16_attention_variants():
    family = kgen.registry.current().family("attention_prefill")
    return [v for v in family.variants if v.param_dict["dtype"] == "bf16"]


@pytest.mark.parametrize("name", [v.name for v in _bf16_attention_variants()], ids=lambda n: n.split("[")[1])
def test_attention_sass_has_its_kernels_instructions_and_no_local_memory(name, tmp_path):
    variant = next(v for v in _bf16_attention_variants() if v.name == name)
    params = variant.param_dict
    tail, has_incomplete_tile = params["tail"], params["has_incomplete_tile"]
    cubin, _ = _compiled(variant.name)
    text = sass_by_function(cubin, tmp_path)["attention_prefill"]
    for what, pattern in _attention_instructions(params).items():
        assert pattern.search(text), f"{variant.name}: no {what}"
    # Predicated cp.async exists only where an incomplete tile may take it.
    assert bool(_CP_ASYNC.search(text)) is (has_incomplete_tile and tail == "cp_async")
    # Registers move between warpgroups only where a producer warpgroup (threads past the consumer warps, by the
    # host's contract) gives its own away.
    if params["mma"] == "wgmma":
        has_producer = contract_of(variant).threads > 32 * params["num_warps"]
        assert bool(_SETMAXNREG.search(text)) is has_producer, f"{variant.name}: setmaxnreg"
    local = [line.strip() for line in text.splitlines() if _LOCAL.search(line)]
    assert not local, f"{variant.name}: local memory accesses: {local[:5]}"


def _gdn_variants(family_name: str):
    family = kgen.registry.current().family(family_name)
    return [v for v in family.variants if v.param_dict["dtype"] == "bf16"]


# The chunked gated delta rule's recurrence on wgmma, in every kernel: (K S)^T from descriptors, Vn^T = W^T Tbeta^T
# and S^T += Vn_decayed^T K (64 x head_dim, K MN-major) with their A operands from registers; TMA for full chunks.
_GDN_RECURRENCE = {
    "HGMMA SS (K S)^T": re.compile(r"\bHGMMA\.64x64x16\.F32\.BF16 R\d+, gdesc\["),
    "HGMMA RS Vn^T": re.compile(r"\bHGMMA\.64x64x16\.F32\.BF16 R\d+, R\d+, gdesc\[[^\]]*\], "),
    "HGMMA RS S^T update": re.compile(r"\bHGMMA\.64x{head_dim}x16\.F32\.BF16 R\d+, R\d+, gdesc\[[^\]]*\]\.tnspB"),
    "UTMALDG": re.compile(r"\bUTMALDG\.3D\b"),
}


@pytest.mark.parametrize("name", [v.name for v in _gdn_variants("gated_delta_rule_chunk")], ids=lambda n: n.split("[")[1])
def test_gdn_recurrence_sass_is_wgmma_and_tma_with_no_local_memory(name, tmp_path):
    variant = next(v for v in _gdn_variants("gated_delta_rule_chunk") if v.name == name)
    params = variant.param_dict
    cubin, _ = _compiled(variant.name)
    functions = sass_by_function(cubin, tmp_path)
    for entry in ("gated_delta_rule_chunk", "gated_delta_rule_chunk_slice", "gated_delta_rule_chunk_summary"):
        text = functions[entry]
        for what, pattern in _GDN_RECURRENCE.items():
            assert re.compile(pattern.pattern.format(head_dim=params["head_dim"])).search(text), f"{entry}: no {what}"
        # Predicated cp.async exists only where a chunk may be incomplete.
        assert bool(_CP_ASYNC.search(text)) is params["has_incomplete_tile"], entry
        local = [line.strip() for line in text.splitlines() if _LOCAL.search(line)]
        assert not local, f"{entry}: local memory accesses: {local[:5]}"
    # The backward's per-chunk gradients: every product a wgmma from descriptors, a warpgroup's half of the columns
    # (of 64: n32; of head_dim: n head_dim / 2), either operand transposed; no mma.sync; no local memory.
    text = functions["gated_delta_rule_chunk_grads"]
    for width in (32, params["head_dim"] // 2):
        for transposes in ("", r"\.tnspB", r"\.tnspA\.tnspB"):
            pattern = rf"\bHGMMA\.64x{width}x16\.F32\.BF16 R\d+, gdesc\[[^\]]*\]{transposes}, "
            assert re.search(pattern, text), f"grads: no HGMMA 64x{width} {transposes}"
    assert not re.search(r"\bHMMA\.", text)
    local = [line.strip() for line in text.splitlines() if _LOCAL.search(line)]
    assert not local, f"grads: local memory accesses: {local[:5]}"


@pytest.mark.parametrize("name", [v.name for v in _gdn_variants("gated_delta_rule_kkt")], ids=lambda n: n.split("[")[1])
def test_gdn_kkt_sass_is_mma_sync_with_no_local_memory(name, tmp_path):
    cubin, _ = _compiled(name)
    text = sass_by_function(cubin, tmp_path)["gated_delta_rule_kkt"]
    assert re.search(r"\bHMMA\.16816\.F32\.BF16\b", text) and re.search(r"\bHMMA\.16816\.F32\b", text)
    assert re.search(r"\bLDSM\.16\.M88\.4\b", text) and re.search(r"\bLDSM\.16\.MT88\.4\b", text)
    local = [line.strip() for line in text.splitlines() if _LOCAL.search(line)]
    assert not local, f"{name}: local memory accesses: {local[:5]}"


@pytest.mark.parametrize("name", [v.name for v in _gdn_variants("attention_decode")], ids=lambda n: n.split("[")[1])
def test_decode_sass_is_mma_sync_with_its_loads_and_no_local_memory(name, tmp_path):
    variant = next(v for v in _gdn_variants("attention_decode") if v.name == name)
    params = variant.param_dict
    cubin, _ = _compiled(name)
    text = sass_by_function(cubin, tmp_path)["attention_decode"]
    assert re.search(r"\bHMMA\.16816\.F32\.BF16\b", text) and re.search(r"\bLDSM\.16\.MT88\.4\b", text)
    # TMA boxes only for kv_load=tma; cp.async for gathers, and for tails where they load by it.
    assert bool(re.search(r"\bUTMALDG\.3D\b", text)) is (params["kv_load"] == "tma")
    cp_async = params["kv_load"] == "cp_async" or (params["has_incomplete_tile"] and params["tail"] == "cp_async")
    assert bool(_CP_ASYNC.search(text)) is cp_async
    assert re.search(r"\bATOMG\.E\.ADD\b|\bATOMG\.ADD\b|\bRED\.E\.ADD\b", text), "no split counter"
    local = [line.strip() for line in text.splitlines() if _LOCAL.search(line)]
    assert not local, f"{name}: local memory accesses: {local[:5]}"


#: The grouped GEMM's kernel forms beyond the built-in spec, as tests/grouped_gemm_kernels.py runs them on the GPU.
GROUPED_GEMM_SPEC_FOLDERS = [Path(__file__).resolve().parent / "specs" / name for name in ("grouped_gemm_fp8_cluster", "grouped_gemm_fp8_narrow")]


def _grouped_gemm_variants() -> dict[str, Variant]:
    """The bf16 variants and the FP8 ones (their inputs e4m3, their result bf16): the built-in spec's, and those the
    test spec folders add, by name."""
    found = {}
    for folder in (None, *GROUPED_GEMM_SPEC_FOLDERS):
        with kgen.config.overrides(KGEN_SPEC_PATH=folder and str(folder)):
            for v in kgen.registry.current().family("grouped_gemm").variants:
                if v.param_dict["dtype"] in ("bf16", "e4m3") and (folder is None or v.spec_path.parent == folder):
                    found[v.name] = v
    return found


GROUPED_GEMM_VARIANTS = _grouped_gemm_variants()


@pytest.mark.parametrize("name", list(GROUPED_GEMM_VARIANTS), ids=lambda n: n.split("[")[1])
def test_grouped_gemm_sass_has_its_kernels_instructions_and_no_local_memory(name, tmp_path):
    variant = GROUPED_GEMM_VARIANTS[name]
    params = variant.param_dict
    cubin, record = compile_cubin(render(variant), ARCH, name)
    assert record.spills == 0
    text = sass_by_function(cubin, tmp_path)["grouped_gemm"]
    if params["dtype"] == "e4m3":
        # FP8: one n128 k32 product per 32 bytes of K, e4m3; A from its descriptor, or in a tile of several 128-column
        # blocks from registers (ldmatrix), loaded once for all of them; TMA loads.
        wide = params["tile_n"] > 128
        a_operand = r"R\d+, R\d+, gdesc\[" if wide else r"R\d+, gdesc\["
        assert re.search(r"\bQGMMA\.64x128x32\.F32\.E4M3\.E4M3 " + a_operand, text), f"{name}: no QGMMA 64x128x32 e4m3"
        assert bool(re.search(r"\bLDSM\.16\.M88\.4\b", text)) is wide, name
        assert re.search(r"\bUTMALDG\.3D\b", text) and not _CP_ASYNC.search(text), name
    elif params["mma"] == "wgmma":
        # One n256 product per k16 step (B's 256 rows: the column tile, or SwiGLU's gate and up), both operands
        # from descriptors; TMA loads; no cp.async.
        assert re.search(r"\bHGMMA\.64x256x16\.F32\.BF16 R\d+, gdesc\[", text), f"{name}: no HGMMA 64x256"
        assert re.search(r"\bUTMALDG\.3D\b", text), f"{name}: no TMA load"
        assert not _CP_ASYNC.search(text)
    else:
        assert re.search(r"\bHMMA\.16816\.F32\.BF16\b", text) and _CP_ASYNC.search(text), name
    # A cluster shares B tiles by multicast loads, and its blocks leave together.
    clustered = params["cluster"] > 1
    assert bool(re.search(r"\bUTMALDG\.3D\.MULTICAST\b", text)) is clustered, name
    assert bool(re.search(r"\bUCGABAR_ARV\b", text)) is clustered, name
    # The FP8 epilogue converts to e4m3 in pairs.
    assert bool(re.search(r"\bF2FP\.SATFINITE\.E4M3\.F32\.PACK_AB", text)) is (params["epilogue"] == "swiglu_quantize")
    local = [line.strip() for line in text.splitlines() if _LOCAL.search(line)]
    assert not local, f"{name}: local memory accesses: {local[:5]}"


@pytest.mark.parametrize("change, message", [
    ({"mma": "mma_sync", "tile_k": 32}, "with mma=mma_sync, cluster must be 1"),
    ({"tile_n": 128}, "with mma=wgmma, cluster must be 1, or 2 with B tiles of two 128-row boxes"),
])
def test_a_cluster_the_kernel_cannot_share_b_in_is_refused_naming_the_axis(change, message):
    built_in = kgen.registry.current().family("grouped_gemm").select(mma="wgmma", dtype="bf16", epilogue="none")
    params = tuple((k, change.get(k, 2 if k == "cluster" else v)) for k, v in built_in.params)
    with pytest.raises(CompileError, match=message):
        compile_cubin(render(Variant(built_in.family, params, built_in.spec_path)), ARCH, "refused cluster")


def test_sass_patterns_match_what_they_should():
    # The SASS checks above are only as good as these regular expressions.
    assert _LDG_128.search("/*1290*/ LDG.E.EF.128 R4, desc[UR8][R4.64] ;")
    assert _LDG_128.search("/*1290*/ LDG.E.128 R4, desc[UR8][R4.64] ;")
    assert not _LDG_128.search("/*0460*/ LDG.E.CONSTANT R29, desc[UR8][R10.64] ;")
    assert not _LDG_128.search("/*0460*/ LDG.E.64 R28, desc[UR8][R10.64] ;")
    assert _STG_128.search("/*29f0*/ STG.E.EF.128 desc[UR8][R6.64], R44 ;")
    assert not _STG_128.search("/*2a70*/ STG.E desc[UR8][R22.64], R3 ;")
    assert _LOCAL.search("/*0100*/ STL.64 [R1+0x8], R4 ;")
    assert _LOCAL.search("/*0100*/ LDL R4, [R1+0x8] ;")
    assert not _LOCAL.search("/*0100*/ LDG.E R4, desc[UR4][R2.64] ;")
    wgmma = _attention_instructions({"mma": "wgmma", "tile_n": 112, "head_dim": 96})
    assert _SETMAXNREG.search("/*0090*/ USETMAXREG.DEALLOC.CTAPOOL 0x18 ;")
    assert not _SETMAXNREG.search("/*0090*/ UISETP.GE.AND UP0, UPT, UR4, 0x18, UPT ;")
    assert wgmma["UTMASTG"].search("/*f0e0*/ UTMASTG.3D [UR8], [UR4] ;")
    assert not wgmma["UTMASTG"].search("/*f0e0*/ UTMALDG.3D [UR8], [UR18], desc[UR30] ;")
    assert wgmma["HGMMA RS"].search("/*1f00*/ HGMMA.64x96x16.F32.BF16 R24, R152, gdesc[UR4], R24 ;")
    assert wgmma["HGMMA SS"].search("/*1e00*/ HGMMA.64x112x16.F32.BF16 R88, gdesc[UR8], RZ, !UPT ;")


# --------------------------------------------------------------------------- has_incomplete_tile


_ROW_CHECK = re.compile(r"if \(row >= num_rows\) (?:continue|return);")


@pytest.mark.parametrize("dtype,head_dim", [("bf16", 128), ("fp32", 256), ("fp16", 64)])
def test_row_bound_check_only_with_incomplete_tiles(dtype, head_dim):
    with_check = render(_merge_variant(dtype=dtype, head_dim=head_dim, has_incomplete_tile=True))
    without = render(_merge_variant(dtype=dtype, head_dim=head_dim, has_incomplete_tile=False))
    # merge_two checks in its load and its store loop, merge_stacked once.
    assert len(_ROW_CHECK.findall(with_check)) == 3
    assert not _ROW_CHECK.search(without)
    assert "num_rows" in without  # still a kernel parameter, only the check is gone
    # Apart from the variant name and the checks, the two sources are the same.
    strip = lambda s: [line for line in s.splitlines()[1:] if not _ROW_CHECK.search(line)]
    assert strip(with_check) == strip(without)


def test_rendered_source_reflects_the_variant_parameters():
    variant = _merge_variant(dtype="fp16", head_dim=96, has_incomplete_tile=True)
    params = variant.param_dict
    source = render(variant)
    assert source.startswith(f"// kgen: {variant.name}\n")
    assert "using T = __half;" in source
    assert "constexpr int kHeadDim = 96;" in source
    assert re.search(rf"constexpr int kThreads = ({params['num_warps'] * 32}|{params['num_warps']} \* 32);", source)
    assert f"constexpr int kRowsPerThread = {params['rows_per_thread']};" in source
    assert f"__launch_bounds__(kThreads, {params['min_blocks_per_sm']})" in source
    assert "{{" not in source and "{%" not in source
    assert "namespace kgen {" in source  # common/numeric.cuh is inlined by Jinja


# --------------------------------------------------------------------------- ptxas log


PTXAS_LOG = """\
ptxas info    : 0 bytes gmem
ptxas info    : Function properties for _Z6helperPfi
ptxas         .     48 bytes stack frame, 40 bytes spill stores, 44 bytes spill loads
ptxas info    : Compiling entry function 'kern_a' for 'sm_90a'
ptxas info    : Function properties for kern_a
ptxas         .     24 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 168 registers, used 1 barriers, 24 bytes cumulative stack size, 16384 bytes smem
ptxas info    : Compile time = 11.406 ms
ptxas info    : Compiling entry function 'kern_b' for 'sm_90a'
ptxas info    : Function properties for kern_b
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers
ptxas info    : Compile time = 3.000 ms
ptxas info    : Function properties for _Z7reducerf
ptxas         .     16 bytes stack frame, 100 bytes spill stores, 104 bytes spill loads
ptxas info    : Used 20 registers, used 0 barriers, 72 bytes smem
"""


def test_parse_ptxas_log():
    entries = parse_ptxas_log(PTXAS_LOG)
    assert entries == {
        "kern_a": EntryResources(registers=168, spill_stores=8, spill_loads=12, stack_bytes=24,
                                 static_smem_bytes=16384),
        "kern_b": EntryResources(registers=32, spill_stores=0, spill_loads=0, stack_bytes=0,
                                 static_smem_bytes=0),
    }
    record = BuildRecord(arch=ARCH, compile_ms=1.0, entries=entries)
    assert record.spills == 8 + 12  # the device functions' spills are not the entries'
    assert BuildRecord.from_json(record.to_json()) == record


def test_spills_of_non_inlined_callees_count_too():
    assert parse_callee_spills(PTXAS_LOG) == 40 + 44 + 100 + 104
    record = BuildRecord(arch=ARCH, compile_ms=1.0, entries=parse_ptxas_log(PTXAS_LOG),
                         callee_spill_bytes=parse_callee_spills(PTXAS_LOG))
    assert record.spills == 8 + 12 + 288
    assert BuildRecord.from_json(record.to_json()) == record
    assert parse_callee_spills("") == 0


def test_parse_ptxas_log_of_a_real_compile():
    cubin, record = _compiled(_merge_variant(dtype="bf16", head_dim=128, has_incomplete_tile=True).name)
    assert set(record.entries) == {"merge_states_2", "merge_states_n"}
    for resources in record.entries.values():
        assert 0 < resources.registers <= 255
        assert resources.static_smem_bytes == 0  # the kernel uses no shared memory


def test_parse_ptxas_log_without_entries():
    assert parse_ptxas_log("") == {}
    assert parse_ptxas_log("ptxas info    : 0 bytes gmem\n") == {}


# --------------------------------------------------------------------------- compile errors


BROKEN_TEMPLATE = """\
// A template that renders fine and does not compile.
extern "C" __global__ void broken_kernel(int* out) {
    out[threadIdx.x] = {{ value }};
    out[0] += undeclared_identifier_{{ value }};
}
"""


def _broken_variant(tmp_path: Path) -> Variant:
    (tmp_path / "broken.cu.j2").write_text(BROKEN_TEMPLATE)
    family = Family(name="broken", template="broken.cu.j2", entries=("broken_kernel",),
                    template_dirs=(tmp_path,), allow_spills=False, axes=("value",), defaults={})
    variant = Variant(family, (("value", 7),), tmp_path / "broken.yaml")
    family.variants.append(variant)
    return variant


def test_compile_error_quotes_nvrtc_log_and_offending_line(tmp_path):
    variant = _broken_variant(tmp_path)
    source = render(variant)
    # Line 4 of the template is line 5 of the rendered source (kgen prepends a name comment).
    assert source.splitlines()[4] == "    out[0] += undeclared_identifier_7;"
    with pytest.raises(CompileError) as info:
        compile_cubin(source, ARCH, variant.name)
    message = str(info.value)
    assert variant.name in message and ARCH in message
    assert 'identifier "undeclared_identifier_7" is undefined' in message  # NVRTC's own text
    assert ">    5 |     out[0] += undeclared_identifier_7;" in message  # the line, marked, with its number
    assert "    4 |     out[threadIdx.x] = 7;" in message  # and its context
    assert ">    4 |" not in message


def test_compile_error_through_build_caches_nothing(tmp_path, cache_dir):
    variant = _broken_variant(tmp_path)
    with pytest.raises(CompileError, match="undeclared_identifier_7"):
        kgen.jit.build(variant, ARCH)
    assert not list(cache_dir.glob("*.cubin.kgen"))


def test_compile_error_does_not_quote_source_lines_for_header_diagnostics():
    # An error inside cuda_fp16.h (line 168 in CUDA 13.0) must not be shown as line 168 of the rendered source.
    source = "#define __half int\n#include <cuda_fp16.h>\n" + "".join(f"// filler {n}\n" for n in range(3, 400))
    with pytest.raises(CompileError) as info:
        compile_cubin(source, ARCH, "header_error")
    message = str(info.value)
    assert "cuda_fp16.h(" in message and ": error" in message
    assert not re.search(r"^>\s*\d+ \| // filler", message, re.M)


def test_compile_error_carries_no_nul_bytes():
    # NVRTC's log is a C string; its terminating NUL must not reach a terminal or a CI log.
    with pytest.raises(CompileError) as info:
        compile_cubin('extern "C" __global__ void k(int* p) { p[0] = nope; }\n', ARCH, "nul_check")
    assert "\x00" not in str(info.value)
    assert 'identifier "nope" is undefined' in str(info.value)


# --------------------------------------------------------------------------- what build checks around the compile


def _one_variant(tmp_path: Path, template: str, entries: tuple[str, ...], min_sm: int | None = None) -> Variant:
    (tmp_path / "one.cu.j2").write_text(template)
    family = Family(name="one", template="one.cu.j2", entries=entries, template_dirs=(tmp_path,),
                    allow_spills=False, axes=("value",), defaults={}, min_sm=min_sm)
    variant = Variant(family, (("value", 1),), tmp_path / "one.yaml")
    family.variants.append(variant)
    return variant


TWO_KERNELS = 'extern "C" __global__ void first(int* p) { p[0] = {{ value }}; }\n' \
              'extern "C" __global__ void second(int* p) { p[1] = {{ value }}; }\n'


def test_build_refuses_a_spec_entry_the_cubin_lacks(tmp_path, cache_dir):
    variant = _one_variant(tmp_path, TWO_KERNELS, ("first", "sceond", "third"))
    with pytest.raises(CompileError) as info:
        kgen.jit.build(variant, ARCH)
    message = str(info.value)
    assert "has no entry sceond, third named in its spec" in message
    assert str(variant.spec_path) in message and "compiled entries: first, second" in message
    # The same check on a cache hit: the cubin is fine, the spec is what is wrong.
    with pytest.raises(CompileError, match="sceond"):
        kgen.jit.build(variant, ARCH)
    assert kgen.jit.build(_one_variant(tmp_path, TWO_KERNELS, ("second", "first")), ARCH).cache_hit is True


@pytest.mark.parametrize("arch", ["compute_90a", "sm_91", "bogus", "sm_90f", "sm_89a", "", "SM_90A"])
def test_build_refuses_an_unknown_arch_before_compiling(tmp_path, cache_dir, arch):
    variant = _one_variant(tmp_path, TWO_KERNELS, ("first", "second"))
    with pytest.raises(kgen.arch.ArchError, match="supported: sm_75, sm_80"):
        kgen.jit.build(variant, arch or "sm_")
    assert not cache_dir.exists()  # compute_90a once cached an empty cubin


def test_build_of_a_variant_needing_a_newer_arch_is_a_clear_error(tmp_path, cache_dir):
    variant = _one_variant(tmp_path, TWO_KERNELS, ("first", "second"), min_sm=90)
    with pytest.raises(kgen.jit.UnsupportedArchError) as info:
        kgen.jit.build(variant, "sm_80")
    assert str(info.value) == ("one[value=1] cannot be built for sm_80: such variants need sm_90 or newer "
                               f"(min_sm in its spec), {variant.spec_path}")
    assert not cache_dir.exists()
    for arch in ("sm_90", "sm_90a", "sm_100f"):
        assert kgen.jit.build(variant, arch).cubin[:4] == b"\x7fELF"


def test_kgen_arch_is_validated(monkeypatch):
    with kgen.config.overrides(KGEN_ARCH="compute_90a"):
        with pytest.raises(kgen.arch.ArchError, match="^KGEN_ARCH: 'compute_90a' is not an arch"):
            kgen.jit.device_arch()
    with kgen.config.overrides(KGEN_ARCH="sm_100f"):
        assert kgen.jit.device_arch() == "sm_100f"


def test_loaded_modules_are_bounded(tmp_path, monkeypatch):
    # No GPU here: stand-ins for the build and the driver load; what is checked is the in-process cache.
    monkeypatch.setattr(kgen.jit, "build", lambda variant, arch: variant.name)
    monkeypatch.setattr(kgen.jit, "KernelModule", lambda result: object())
    kgen.jit._load.cache_clear()
    try:
        variant = _one_variant(tmp_path, TWO_KERNELS, ("first", "second"))
        first = kgen.jit._load(variant.name, (tmp_path,), ARCH, variant)
        assert kgen.jit._load(variant.name, (tmp_path,), ARCH, variant) is first  # reused, not rebuilt
        for n in range(2 * kgen.jit.LOADED_MODULES):
            kgen.jit._load(variant.name, (tmp_path / f"folder{n}",), ARCH, variant)
        assert kgen.jit._load.cache_info().currsize == kgen.jit.LOADED_MODULES
    finally:
        kgen.jit._load.cache_clear()


def test_cubin_kernels_lists_entries_and_not_device_functions():
    from kgen.compiler import cubin_kernels

    source = ('extern "C" __device__ __noinline__ int helper(int x) { return x * 3; }\n'
              'extern "C" __global__ void first(int* p) { p[0] = helper(p[1]); }\n'
              'extern "C" __global__ void second(int* p) { p[1] = 2; }\n')
    cubin, _ = compile_cubin(source, "sm_90a", "entries")
    assert cubin_kernels(cubin) == {"first", "second"}


def test_a_resource_report_missing_an_entry_fails_the_compile(monkeypatch):
    source = 'extern "C" __global__ void only(int* p) { p[0] = 1; }\n'
    monkeypatch.setattr(compiler, "parse_ptxas_log", lambda log: {})
    with pytest.raises(CompileError, match="ptxas reported no resources for only"):
        compile_cubin(source, "sm_90a", "never")


def test_a_program_compiled_twice_is_reported_twice():
    # NVRTC's own program cache (on where a driver is installed) would hand the second compile back
    # without ptxas' report; kgen turns it off, its cache being kgen's own.
    source = 'extern "C" __global__ void twin(float* x) { x[threadIdx.x] *= 3.f; }\n'
    assert compiler.program_options("sm_90a", "twin").no_cache
    reports = [compile_cubin(source, "sm_90a", "twin")[1].entries for _ in range(2)]
    assert reports[0] == reports[1] and reports[0]["twin"].registers > 0


# --------------------------------------------------------------------------- Hopper build gates

_SETMAXNREG_WITHOUT_BOUNDS = r'''
extern "C" __global__ void k(int* out) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
    out[threadIdx.x] = 1;
}
'''

# The accumulator is written between the wgmma's issue and its wait: ptxas must wait early.
_WGMMA_ACCUMULATOR_TOUCHED_IN_FLIGHT = r'''
extern "C" __global__ void __launch_bounds__(128, 1) k(float* out, unsigned long long a, unsigned long long b) {
    float d[4];
    for (int i = 0; i < 4; ++i) d[i] = out[i];
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, %4, %5, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "l"(a), "l"(b), "r"(1));
    d[0] += 1.f;
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    for (int i = 0; i < 4; ++i) out[threadIdx.x * 4 + i] = d[i];
}
'''


@pytest.mark.parametrize("source, code", [(_SETMAXNREG_WITHOUT_BOUNDS, "C7508"),
                                          (_WGMMA_ACCUMULATOR_TOUCHED_IN_FLIGHT, "C7517")],
                         ids=["setmaxnreg-ignored", "wgmma-wait-injected"])
def test_ptxas_saying_a_hopper_kernel_lost_its_design_fails_the_compile(source, code):
    with pytest.raises(CompileError, match=rf"loses its Hopper design:\n.*\({code}\)"):
        compile_cubin(source, "sm_90a", "gate_case")


def test_the_same_kernels_without_the_mistakes_compile():
    # The gate is the warning, not the instructions: with launch bounds of one block per SM,
    # setmaxnreg compiles clean.
    fixed = _SETMAXNREG_WITHOUT_BOUNDS.replace("__global__ void k", "__global__ void __launch_bounds__(128, 1) k")
    cubin, record = compile_cubin(fixed, "sm_90a", "gate_case")
    assert cubin[:4] == b"\x7fELF" and record.entries
