// The attention kernels' shared-memory tiles (prefill's two kernels, decode's): kRows rows of the
// head dim, kHeadDim elements of T, in TMA's swizzled layout (common/swizzle.cuh); their TMA loads,
// the clearing of rows outside a sequence, and the search for non-finite rows.
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

// Calls visit(offset, row) for each 16-byte chunk of a tile that the caller's thread takes (`thread` of
// kThreads, chunk after chunk over the tile's bytes, which keeps each row's chunks inside the row: the swizzle
// permutes chunks within a row of a span). A head dim of 96's padding chunks are visited too; TMA zeroes them.
template <class Tile, int kThreads, class Visit>
__device__ __forceinline__ void for_each_chunk(int thread, Visit visit) {
    constexpr int kChunks = Tile::kBytes / 16, kSpanTileBytes = Tile::kRows * Tile::kSpanBytes;
#pragma unroll
    for (int i = 0; i < (kChunks + kThreads - 1) / kThreads; ++i) {
        const int idx = i * kThreads + thread;
        if (kChunks % kThreads == 0 || idx < kChunks) visit(16 * idx, (16 * idx) % kSpanTileBytes / Tile::kSpanBytes);
    }
}

// Zeros over the rows outside [first_row, end_row) of a tile TMA filled as a whole box: they hold another
// sequence's values, and a NaN or Inf there would survive a zero softmax weight in P V. Plain stores, unrolled
// and predicated, let ptxas schedule them (an asm loop with a memory clobber measured slower). TMA never refills
// the buffer during these generic-proxy writes (only a sequence's first and last key tiles are cleared, and the
// buffer is refilled after the reads of P V); a reader in the async proxy (wgmma) needs the caller's
// fence_proxy_async_shared before it reads them. `thread` is the caller's index among the kClearThreads threads
// that share the work.
template <class Tile, int kClearThreads>
__device__ __forceinline__ void clear_rows_outside(unsigned char* tile, int first_row, int end_row, int thread) {
    for_each_chunk<Tile, kClearThreads>(thread, [&](int offset, int row) {
        if (row < first_row || row >= end_row) *reinterpret_cast<uint4*>(tile + offset) = make_uint4(0u, 0u, 0u, 0u);
    });
}

// A 16-bit element is Inf or NaN when its exponent bits are all ones: masked and XORed with the mask, its half of
// a 32-bit pair is then zero, which the has-zero test finds (exact for halves whose top bit is clear, as here).
template <class T> struct ExponentBits;
template <> struct ExponentBits<__nv_bfloat16> { static constexpr unsigned kPair = 0x7f807f80u; };
template <> struct ExponentBits<__half> { static constexpr unsigned kPair = 0x7c007c00u; };

template <class T>
__device__ __forceinline__ unsigned nonfinite_in(uint4 chunk) {
    const unsigned pairs[4] = {chunk.x, chunk.y, chunk.z, chunk.w};
    unsigned found = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const unsigned masked = (pairs[i] & ExponentBits<T>::kPair) ^ ExponentBits<T>::kPair;
        found |= (masked - 0x00010001u) & ~masked & 0x80008000u;
    }
    return found;
}

// Whether this thread's chunks of the tile's rows from first_row hold an Inf or NaN (the caller ORs over threads).
template <class T, class Tile, int kThreads>
__device__ __forceinline__ bool holds_nonfinite(const unsigned char* tile, int first_row, int thread) {
    unsigned found = 0;
    for_each_chunk<Tile, kThreads>(thread, [&](int offset, int row) {
        if (row >= first_row) found |= nonfinite_in<T>(*reinterpret_cast<const uint4*>(tile + offset));
    });
    return found != 0;
}

// Sets bit row % 32 of row_bits[row / 32] (shared memory, zero before) for each row from first_row holding an
// Inf or NaN.
template <class T, class Tile, int kThreads>
__device__ __forceinline__ void mark_nonfinite_rows(const unsigned char* tile, int first_row, unsigned* row_bits, int thread) {
    for_each_chunk<Tile, kThreads>(thread, [&](int offset, int row) {
        if (row >= first_row && nonfinite_in<T>(*reinterpret_cast<const uint4*>(tile + offset))) {
            atomicOr(row_bits + row / 32, 1u << (row % 32));
        }
    });
}

// Zeros over the rows marked in row_bits (as mark_nonfinite_rows left them); the same fence as clear_rows_outside.
template <class Tile, int kThreads>
__device__ __forceinline__ void clear_marked_rows(unsigned char* tile, const unsigned* row_bits, int thread) {
    for_each_chunk<Tile, kThreads>(thread, [&](int offset, int row) {
        if ((row_bits[row / 32] >> (row % 32)) & 1u) *reinterpret_cast<uint4*>(tile + offset) = make_uint4(0u, 0u, 0u, 0u);
    });
}

}  // namespace attention
}  // namespace kgen
