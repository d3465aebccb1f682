// Warpgroup matrix multiply-accumulate (wgmma, sm_90a): D[64 x N] (+)= A[64 x kWgmmaK] B[kWgmmaK x N],
// fp32 accumulators; 16-bit inputs (k16), or FP8 e4m3 (k32). A comes from shared memory (SS form) or
// from registers (RS form); B always from shared memory, described by a 64-bit matrix descriptor.
//
// Needs common/numeric.cuh, common/host_contract.cuh and common/swizzle.cuh. Two Jinja variables,
// which the includer passes in a `with` block around the include: `wgmma_widths` (the N values it
// uses) and `wgmma_input` (bf16, f16, or e4m3: K-major operands only). Each width
// gets its own asm, with one "+f" operand per accumulator, generated below.
//
// Accumulators are float[N / 8][4]: thread t of the warpgroup holds, for column block j,
// rows 16 (t / 32) + (t % 32) / 4 (+8 for elements 2, 3), columns 8 j + 2 (t % 4) (+1):
// the mma.sync C-fragment layout repeated over 8-column blocks. An A fragment (RS form)
// is four 16-bit pairs in the mma.sync m16n8k16 A layout, so accumulators of one
// product pack straight into the A operand of the next.
namespace kgen {

// ---- Shared-memory matrix descriptors ----
//
// A tile stored as TMA writes it with a 128-byte swizzle (common/swizzle.cuh): panels (spans) of
// 64 16-bit columns, each [rows][128 B], aligned to a repeat of the pattern.
enum class Swizzle : unsigned { k128B = 1, k64B = 2, k32B = 3 };  // the descriptor's encoding

__device__ __forceinline__ unsigned long long smem_descriptor(unsigned smem, unsigned leading_bytes,
                                                              unsigned stride_bytes, Swizzle swizzle) {
    return static_cast<unsigned long long>((smem & 0x3FFFF) >> 4) |
           static_cast<unsigned long long>(leading_bytes >> 4) << 16 |
           static_cast<unsigned long long>(stride_bytes >> 4) << 32 |
           static_cast<unsigned long long>(swizzle) << 62;
}

// K-major (the reduction dimension contiguous: Q and K in Q K^T), 128-byte swizzle: groups
// of 8 rows are 1024 bytes apart; the leading offset is unused. A k16 step inside a panel
// moves the start 32 bytes; the next panel is the next 64 columns.
__device__ __forceinline__ unsigned long long k_major_descriptor(unsigned smem) {
    return smem_descriptor(smem, 16, kSwizzleAlignment, Swizzle::k128B);
}

// MN-major (the output dimension contiguous: V in P V), 128-byte swizzle: 8 rows of K
// (keys) are 1024 bytes apart, and 64-column panels of N `panel_bytes` apart. The same
// describes an M-major A (the transposed-A form of wgmma_ss).
__device__ __forceinline__ unsigned long long mn_major_descriptor(unsigned smem, unsigned panel_bytes) {
    return smem_descriptor(smem, panel_bytes, kSwizzleAlignment, Swizzle::k128B);
}

// ---- Ordering ----

// Before the first wgmma of a batch: makes this thread's register and shared-memory
// writes (accumulators, A fragments) visible to the asynchronous tensor core.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }

// Closes the wgmmas issued since the last commit into one group.
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }

// Waits until at most kPending committed groups are still running.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(kPending) : "memory");
}

// A compiler-level fence on accumulators: the compiler may not move their reads or
// writes across it, so none lands between an issue and its wait (the hardware owns
// the registers there, and ptxas would serialise the wgmmas).
template <class E, int kBlocks>
__device__ __forceinline__ void fence_operands(E (&d)[kBlocks][4]) {
#pragma unroll
    for (int j = 0; j < kBlocks; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            if constexpr (SameType<E, float>::value) {
                asm volatile("" : "+f"(d[j][e]) :: "memory");  // fp32 accumulators
            } else {
                asm volatile("" : "+r"(d[j][e]) :: "memory");  // packed 16-bit A fragments
            }
        }
    }
}

// ---- The products: wgmma_ss<N> (A in shared memory) and wgmma_rs<N> (A in registers) ----
// `accumulate` false overwrites D (scale-d = 0) instead of adding to it. trans_b: B is
// MN-major (1) or K-major (0). trans_a (shared-memory A only): A is M-major (1) or K-major (0).
template <int kN, int kTransB, int kTransA = 0> __device__ void wgmma_ss(float (&d)[kN / 8][4], unsigned long long a,
                                                                       unsigned long long b, bool accumulate);
template <int kN, int kTransB> __device__ void wgmma_rs(float (&d)[kN / 8][4], const unsigned (&a)[4],
                                                          unsigned long long b, bool accumulate);
{% macro accumulators(n) %}{% for i in range(n // 2) %}"+f"(d[{{ i // 4 }}][{{ i % 4 }}]){{ ", " if not loop.last }}{% endfor %}{% endmacro %}
{% macro registers(first, count) %}{% for i in range(first, first + count) %}%{{ i }}{{ ", " if not loop.last }}{% endfor %}{% endmacro %}
{% set fp8 = wgmma_input == "e4m3" %}
{% if fp8 %}
// FP8 (e4m3): k32 a product, both operands K-major (wgmma transposes 16-bit types only). An A fragment (RS form) is
// four registers of four e4m3 values each, mma.sync m16n8k32's 8-bit A layout: rows g and g + 8 of the warp's 16
// (g = lane / 4), K bytes 4 (lane % 4) .. + 3 and 16 more.
constexpr int kWgmmaK = 32;
{% else %}
constexpr int kWgmmaK = 16;  // the reduction of one product
{% endif %}
{% set shape = "m64n{}k" ~ (32 if fp8 else 16) ~ ".f32." ~ wgmma_input ~ "." ~ wgmma_input %}
{% set transposes = (0,) if fp8 else (0, 1) %}
{% for n in wgmma_widths %}
{% for trans_b in transposes %}
{% for trans_a in transposes %}

template <> __device__ __forceinline__ void wgmma_ss<{{ n }}, {{ trans_b }}, {{ trans_a }}>(
        float (&d)[{{ n // 8 }}][4], unsigned long long a, unsigned long long b, bool accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %{{ n // 2 + 2 }}, 0;\n"
        "wgmma.mma_async.sync.aligned.{{ shape.format(n) }} "
        "{ {{- registers(0, n // 2) -}} }, %{{ n // 2 }}, %{{ n // 2 + 1 }}, p, 1, 1{{ "" if fp8 else ", %d, %d" % (trans_a, trans_b) }};\n}\n"
        : {{ accumulators(n) }}
        : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)));
}
{% endfor %}

template <> __device__ __forceinline__ void wgmma_rs<{{ n }}, {{ trans_b }}>(float (&d)[{{ n // 8 }}][4], const unsigned (&a)[4],
                                                              unsigned long long b, bool accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %{{ n // 2 + 5 }}, 0;\n"
        "wgmma.mma_async.sync.aligned.{{ shape.format(n) }} "
        "{ {{- registers(0, n // 2) -}} }, { {{- registers(n // 2, 4) -}} }, %{{ n // 2 + 4 }}, p, 1, 1{{ "" if fp8 else ", %d" % trans_b }};\n}\n"
        : {{ accumulators(n) }}
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(static_cast<int>(accumulate)));
}
{% endfor %}
{% endfor %}

}  // namespace kgen
