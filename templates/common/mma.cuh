// Warp-level tensor-core building blocks (sm_80+): cp.async with zero-fill,
// ldmatrix, mma.sync m16n8k16 with fp32 accumulators, and packing to 16-bit pairs.
// Included into rendered sources with Jinja, after common/numeric.cuh; the raw block keeps
// Jinja away from the asm operand lists, whose braces and percent signs look like its tags.
{% raw %}

namespace kgen {

__device__ __forceinline__ unsigned smem_addr(const void* ptr) {
    return static_cast<unsigned>(__cvta_generic_to_shared(ptr));
}

// 16-byte global->shared copy that bypasses registers and L1 (smem: a shared-window address).
__device__ __forceinline__ void cp_async_16(unsigned smem, const void* gmem) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(smem), "l"(gmem));
}

// The same, predicated: when !valid the source size is 0, so nothing is read
// (gmem may point past the data) and the 16 shared bytes are zero-filled.
__device__ __forceinline__ void cp_async_16_zfill(unsigned smem, const void* gmem, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(smem), "l"(gmem), "r"(valid ? 16 : 0));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int kPending>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(kPending)); }

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

// Two floats as one 32-bit pair of T (the low half is `lo`).
template <class T>
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
    T pair[2] = {from_f32<T>(lo), from_f32<T>(hi)};
    unsigned out;
    memcpy(&out, pair, sizeof(out));
    return out;
}

}  // namespace kgen
{% endraw %}
