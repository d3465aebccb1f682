// Warp-level tensor-core building blocks (sm_80+): ldmatrix, and mma.sync m16n8k16
// with fp32 accumulators.
// Included into rendered sources with Jinja, after common/smem.cuh; the raw block keeps
// Jinja away from the asm operand lists, whose braces and percent signs look like its tags.
{% raw %}

namespace kgen {

// Four 8x8 16-bit matrices; lanes 8i..8i+7 give the row addresses of matrix i.
// Addresses are 32-bit shared-window addresses (smem_addr): half the registers of pointers.
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned smem) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem));
}

__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], unsigned smem) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem));
}

#if __CUDA_ARCH__ >= 900
// The inverse of ldmatrix_x4 (sm_90): lane 4 r + c's r[i] is row r, columns 2 c and 2 c + 1 of matrix i,
// and lanes 8i..8i+7 give the row addresses of matrix i. One instruction writes the 16-byte rows that
// eight 4-byte stores would.
__device__ __forceinline__ void stmatrix_x4(unsigned smem, const unsigned (&r)[4]) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n"
                 :: "r"(smem), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3]) : "memory");
}
#endif

template <class T> struct MmaType;
template <> struct MmaType<__nv_bfloat16> { static constexpr bool kBf16 = true; };
template <> struct MmaType<__half> { static constexpr bool kBf16 = false; };

// c += a * b for a 16x16 A (row-major fragment) and a 16x8 B (column-major fragment).
template <class T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    if constexpr (MmaType<T>::kBf16) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}

}  // namespace kgen
{% endraw %}
