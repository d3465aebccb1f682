// TMA's swizzled shared-memory layout, which ldmatrix reads and wgmma's descriptors describe.
//
// A tile of kRows rows is cut into spans (column blocks) of kSpanBytes, 128 bytes or, for rows
// that short, 64; each span is stored [kRows][kSpanBytes], and the 16-byte chunk c of row r at
// chunk position c ^ swizzle_pattern(r). The 8 rows one ldmatrix phase (or one wgmma core matrix)
// reads then hit 8 different bank groups. The 128-byte pattern repeats every 8 rows, 1024 bytes:
// a tile starts on such a boundary, and so does every span when kRows is a multiple of 8.
namespace kgen {

constexpr int kSwizzleAlignment = 1024;  // 8 rows of 128 bytes: one repeat of the pattern

template <int kSpanBytes>
__device__ __forceinline__ int swizzle_pattern(int row) {
    static_assert(kSpanBytes == 128 || kSpanBytes == 64, "TMA's 128- and 64-byte swizzles");
    return kSpanBytes == 128 ? (row & 7) : ((row >> 1) & 3);  // 64 bytes: two rows share a 128-byte line
}

// Where element `col` (of kElementBytes, up to 16: a whole chunk) of row `row` of a kRows-row tile
// lies, counted in units of kUnitBytes: bytes, or the elements themselves.
template <int kSpanBytes, int kRows, int kElementBytes, int kUnitBytes>
__device__ __forceinline__ int swizzled(int row, int col) {
    static_assert(kElementBytes == 2 || kElementBytes == 4 || kElementBytes == 8 || kElementBytes == 16,
                  "elements of 2, 4, 8 or 16 bytes (a 16-byte chunk)");
    static_assert(kUnitBytes == 1 || kUnitBytes == kElementBytes, "offsets in bytes or in elements");
    constexpr int kSpanCols = kSpanBytes / kElementBytes;
    constexpr int kChunkCols = 16 / kElementBytes;
    constexpr int kChunkShift = kElementBytes == 2 ? 3 : kElementBytes == 4 ? 2 : kElementBytes == 8 ? 1 : 0;
    return (col / kSpanCols) * (kRows * kSpanBytes / kUnitBytes) + row * (kSpanBytes / kUnitBytes) +
           ((((col % kSpanCols) >> kChunkShift) ^ swizzle_pattern<kSpanBytes>(row)) * (16 / kUnitBytes)) +
           (col & (kChunkCols - 1)) * (kElementBytes / kUnitBytes);
}

}  // namespace kgen
