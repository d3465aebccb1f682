// Swizzled K/V/Q tiles as TMA writes them, and their loads: shared by the attention kernels
// (prefill's two, decode's). Included after the variant's constants (T, the span sizes).

__device__ __forceinline__ int swizzle(int row) {
    return kSpanBytes == 128 ? (row & 7) : ((row >> 1) & 3);  // TMA's 128- and 64-byte swizzle patterns
}

template <int kRows>
__device__ __forceinline__ unsigned chunk_offset(int row, int chunk) {
    return (chunk / kSpanChunks) * (kRows * kSpanBytes) + row * kSpanBytes + ((chunk % kSpanChunks) ^ swizzle(row)) * 16;
}

// kRows rows of the head dim by TMA, one box per column block; `policy` is an optional L2 policy.
template <int kRows, class... Policy>
__device__ __forceinline__ void load_tile_tma(unsigned tile, const kgen::TmaDescriptor& map, int first_row, int head, unsigned bar,
                                              Policy... policy) {
#pragma unroll
    for (int b = 0; b < kSpans; ++b) {
        kgen::tma_load_3d(tile + b * kRows * kSpanBytes, &map, b * kSpanCols, head, first_row, bar, policy...);
    }
}

// Zeros over the rows [valid_rows, kRows) of a tile TMA filled as a whole box: they hold the
// next sequence's values, and a NaN or Inf there would survive a zero softmax weight in P V.
// Plain stores, unrolled and predicated, let ptxas schedule them (an asm loop with a memory
// clobber measured slower). Only a sequence's last key tile is incomplete, so TMA never
// refills this buffer after these generic-proxy writes; a reader in the async proxy
// (wgmma) needs the caller's fence_proxy_async_shared before it reads them.
// `thread` is the caller's index among the kClearThreads threads that share the work.
template <int kRows, int kClearThreads>
__device__ __forceinline__ void clear_rows_past(unsigned char* tile, int valid_rows, int thread) {
    constexpr int kChunks = kRows * kRowChunks;
#pragma unroll
    for (int i = 0; i < (kChunks + kClearThreads - 1) / kClearThreads; ++i) {
        const int idx = i * kClearThreads + thread;
        if (idx >= valid_rows * kRowChunks && (kChunks % kClearThreads == 0 || idx < kChunks)) {
            *reinterpret_cast<uint4*>(tile + chunk_offset<kRows>(idx / kRowChunks, idx % kRowChunks)) = make_uint4(0u, 0u, 0u, 0u);
        }
    }
}

