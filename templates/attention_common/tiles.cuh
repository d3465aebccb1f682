// The attention kernels' shared-memory tiles (prefill's two kernels, decode's): kRows rows of the
// head dim, kHeadDim elements of T, in TMA's swizzled layout (common/swizzle.cuh); their TMA loads,
// and the clearing of rows past a sequence's end.
// Needs common/numeric.cuh, smem.cuh, swizzle.cuh and tma.cuh.
namespace kgen {
namespace attention {

// The head dim is cut into spans of 128 bytes, or of the whole row at head dim 32 (64 bytes). A head
// dim of 96 or 192 at 16 bits ends in half a span (96) or whole ones (192): the last span's TMA box
// reaches past the head dim, TMA fills those columns with zeros, and no product reads them.
template <class T, int kHeadDim, int kTileRows>
struct Tile {
    static constexpr int kRows = kTileRows;
    static constexpr int kRowBytes = kHeadDim * sizeof(T);
    static constexpr int kSpanBytes = kRowBytes < 128 ? kRowBytes : 128;
    static constexpr int kSpanCols = kSpanBytes / sizeof(T);
    static constexpr int kSpans = (kHeadDim + kSpanCols - 1) / kSpanCols;
    static constexpr int kSpanChunks = kSpanBytes / 16;
    static constexpr int kRowChunks = kRowBytes / 16;  // the 16-byte chunks of a row that hold the head dim
    static constexpr int kTileRowBytes = kSpans * kSpanBytes;  // a row's bytes in shared memory, the last span whole
    static constexpr int kBytes = kRows * kTileRowBytes;
};

// The byte offset of 16-byte chunk `chunk` of row `row` in a tile.
template <class Tile>
__device__ __forceinline__ unsigned chunk_offset(int row, int chunk) {
    return swizzled<Tile::kSpanBytes, Tile::kRows, 16, 1>(row, chunk);
}

// A tile's rows from `first_row` of the tensor `map` by TMA, one box per span; `policy` is an
// optional L2 policy.
template <class Tile, class... Policy>
__device__ __forceinline__ void load_tile_tma(unsigned tile, const TmaDescriptor& map, int first_row, int head, unsigned bar,
                                              Policy... policy) {
#pragma unroll
    for (int b = 0; b < Tile::kSpans; ++b) {
        tma_load_3d(tile + b * Tile::kRows * Tile::kSpanBytes, &map, b * Tile::kSpanCols, head, first_row, bar, policy...);
    }
}

// Zeros over the rows [valid_rows, kRows) of a tile TMA filled as a whole box: they hold the
// next sequence's values, and a NaN or Inf there would survive a zero softmax weight in P V.
// Plain stores, unrolled and predicated, let ptxas schedule them (an asm loop with a memory
// clobber measured slower). Only a sequence's last key tile is incomplete, so TMA never
// refills this buffer after these generic-proxy writes; a reader in the async proxy
// (wgmma) needs the caller's fence_proxy_async_shared before it reads them.
// `thread` is the caller's index among the kClearThreads threads that share the work.
template <class Tile, int kClearThreads>
__device__ __forceinline__ void clear_rows_past(unsigned char* tile, int valid_rows, int thread) {
    constexpr int kChunks = Tile::kRows * Tile::kRowChunks;
#pragma unroll
    for (int i = 0; i < (kChunks + kClearThreads - 1) / kClearThreads; ++i) {
        const int idx = i * kClearThreads + thread;
        if (idx >= valid_rows * Tile::kRowChunks && (kChunks % kClearThreads == 0 || idx < kChunks)) {
            *reinterpret_cast<uint4*>(tile + chunk_offset<Tile>(idx / Tile::kRowChunks, idx % Tile::kRowChunks)) =
                make_uint4(0u, 0u, 0u, 0u);
        }
    }
}

}  // namespace attention
}  // namespace kgen
