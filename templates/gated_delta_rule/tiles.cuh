// Shared-memory tiles of the chunked gated delta rule and their mma.sync fragments.
// Needs common/numeric.cuh, smem.cuh, swizzle.cuh, mma.cuh, cp_async.cuh and fp8.cuh (the states' rounding losses).
//
// A tile is [kRows][kCols] 16-bit elements, kCols a multiple of 64, in TMA's 128-byte swizzled
// layout (common/swizzle.cuh), which wgmma's descriptors read too; the eight row addresses of an
// ldmatrix then hit eight different bank groups. Fragment loads follow the m16n8k16 operand
// layouts: A (16x16) row-major, B (16x8) column-major, and the fp32 accumulator C with rows lane/4
// and lane/4 + 8, columns 2 (lane % 4) + {0, 1}.
namespace kgen {
namespace gdn {

constexpr int kChunk = 64;  // tokens per chunk; a chunk never crosses a sequence

// The element index of (row, col) in a [kRows][kCols] tile.
template <int kCols, int kRows = kChunk>
__device__ __forceinline__ int swizzled(int row, int col) {
    static_assert(kCols % 64 == 0, "tiles of whole 64-column (128-byte) spans");
    return kgen::swizzled<128, kRows, 2, 2>(row, col);
}

// A fragment of rows [m0, m0 + 16) x columns [k0, k0 + 16) of a row-major [m][k] tile.
template <int kCols, class E>
__device__ __forceinline__ void load_a(unsigned (&a)[4], const E* tile, int m0, int k0, int lane) {
    ldmatrix_x4(a, smem_addr(tile + swizzled<kCols>(m0 + lane % 16, k0 + (lane / 16) * 8)));
}

// A fragment of A = X^T for a tile X stored [k][m]: rows m0.. of A are columns m0.. of X.
template <int kCols, class E>
__device__ __forceinline__ void load_a_transposed(unsigned (&a)[4], const E* tile, int m0, int k0, int lane) {
    ldmatrix_x4_trans(a, smem_addr(tile + swizzled<kCols>(k0 + lane % 8 + (lane / 16) * 8, m0 + ((lane / 8) % 2) * 8)));
}

// B fragments of n-tiles n0 and n0 + 8 (b[0..1], b[2..3]) over k [k0, k0 + 16), from a tile stored [k][n].
template <int kCols, class E>
__device__ __forceinline__ void load_b_kn(unsigned (&b)[4], const E* tile, int k0, int n0, int lane) {
    ldmatrix_x4_trans(b, smem_addr(tile + swizzled<kCols>(k0 + lane % 8 + ((lane / 8) % 2) * 8, n0 + (lane / 16) * 8)));
}

// The same from a tile stored [n][k] (B = X^T for a row-major X).
template <int kCols, class E>
__device__ __forceinline__ void load_b_nk(unsigned (&b)[4], const E* tile, int k0, int n0, int lane) {
    ldmatrix_x4(b, smem_addr(tile + swizzled<kCols>(n0 + lane % 8 + (lane / 16) * 8, k0 + ((lane / 8) % 2) * 8)));
}

// The accumulators of a 16x(8 kTiles) product as A fragments of the next product (k = their columns).
template <class E, int kTiles>
__device__ __forceinline__ void accumulators_as_a(unsigned (&a)[kTiles / 2][4], const float (&c)[kTiles][4]) {
#pragma unroll
    for (int s = 0; s < kTiles / 2; ++s) {
        a[s][0] = pack2<E>(c[2 * s][0], c[2 * s][1]);
        a[s][1] = pack2<E>(c[2 * s][2], c[2 * s][3]);
        a[s][2] = pack2<E>(c[2 * s + 1][0], c[2 * s + 1][1]);
        a[s][3] = pack2<E>(c[2 * s + 1][2], c[2 * s + 1][3]);
    }
}

// Accumulators of rows [m0, m0 + 16) x columns [0, 8 kTiles) into a [kRows][kCols] tile, as E: on sm_90,
// two column blocks per stmatrix (four 8x8 matrices in the order accumulators_as_a packs them).
template <int kCols, class E, int kTiles, int kRows = kChunk>
__device__ __forceinline__ void store_accumulators(E* tile, const float (&c)[kTiles][4], int m0, int lane) {
#if __CUDA_ARCH__ >= 900
    if constexpr (kTiles % 2 == 0) {
        unsigned pairs[kTiles / 2][4];
        accumulators_as_a<E, kTiles>(pairs, c);
        const int row = m0 + (lane / 8 % 2) * 8 + lane % 8, col = (lane / 16) * 8;
#pragma unroll
        for (int s = 0; s < kTiles / 2; ++s) stmatrix_x4(smem_addr(tile + swizzled<kCols, kRows>(row, 16 * s + col)), pairs[s]);
        return;
    }
#endif
    const int row = m0 + lane / 4, col = 2 * (lane % 4);
#pragma unroll
    for (int n = 0; n < kTiles; ++n) {
        *reinterpret_cast<unsigned*>(tile + swizzled<kCols, kRows>(row, 8 * n + col)) = pack2<E>(c[n][0], c[n][1]);
        *reinterpret_cast<unsigned*>(tile + swizzled<kCols, kRows>(row + 8, 8 * n + col)) = pack2<E>(c[n][2], c[n][3]);
    }
}

// A 4 x 4 transpose of 32-bit words over the four lanes of a quad: lane q's word i becomes lane i's word q. Two
// exchanges with the lane differing in bit b (b = 1, 2) of the words whose index differs from the lane's there;
// the words are picked by selects, not by an index into the array (which would put it in local memory).
__device__ __forceinline__ void quad_transpose(unsigned (&w)[4], int lane) {
#pragma unroll
    for (int b = 1; b <= 2; b *= 2) {
        const int other = 3 - b;  // the words of index bit b clear are 0 and `other`; b and other + b have it set
        const bool high = (lane & b) != 0;  // a lane sends the words whose bit b is not its own, and takes the partner's
        const unsigned send0 = high ? w[0] : w[b], send1 = high ? w[other] : w[other + b];
        const unsigned got0 = __shfl_xor_sync(0xffffffffu, send0, b), got1 = __shfl_xor_sync(0xffffffffu, send1, b);
        if (high) {
            w[0] = got0, w[other] = got1;
        } else {
            w[b] = got0, w[other + b] = got1;
        }
    }
}

// Accumulators of rows row0 and row0 + 8 x columns [0, 8 kTiles) (lane's columns 8 n + 2 (lane % 4) + {0, 1}), into
// a row-major global matrix of kStride columns, as E (the backward's 16-bit copies of S^T and dS'^T). A quad's
// lanes first trade pairs (quad_transpose) so that each stores a whole column block, 16 bytes: a warp's store then
// writes 64 bytes of each of its 8 rows, whole 32-byte sectors, four times fewer stores than a pair a lane (whose
// half-filled sectors doubled the states recompute's time when a second such store was added: bench/NOTES.md,
// thirty-fourth session).
template <class E, int kStride, int kTiles>
__device__ __forceinline__ void store_rows(E* dest, const float (&c)[kTiles][4], int row0, int lane) {
    static_assert(kTiles % 4 == 0, "store_rows: column blocks four at a time");
    const int quad_lane = lane % 4;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
#pragma unroll
        for (int m = 0; m < kTiles / 4; ++m) {
            unsigned w[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) w[j] = pack2<E>(c[4 * m + j][2 * half], c[4 * m + j][2 * half + 1]);
            quad_transpose(w, lane);  // w: column block 4 m + quad_lane, columns 2 j, 2 j + 1
            *reinterpret_cast<uint4*>(dest + static_cast<long long>(row0 + 8 * half) * kStride + 8 * (4 * m + quad_lane)) =
                make_uint4(w[0], w[1], w[2], w[3]);
        }
    }
}

// What rounding a value to E (16-bit) loses, kept in a byte for the one sum that needs it: dg's whole-state
// inner product e^{G_L} <S, dS'> of a chunk, 16,384 terms that cancel, which 16-bit S and dS' alone leave at
// about the 1e-2 bar (bench/NOTES.md, thirty-second session). The byte is the loss v - E(v) times kResidualScale
// as FP8 e5m2 (two mantissa bits; normal from 2^-14 to 57344): E(v) + loss is v to 2^-11 of it for bf16 (its own
// 2^-9 made four times finer or more; fp16's 2^-12 becomes 2^-15) for |v| from about 2^-17 to 7000, and never
// further from v than E(v) (a float32 model over 2 x 10^6 random values); a NaN or infinite v keeps a NaN loss.
constexpr float kResidualScale = 4096.f;

// store_rows' rounding losses (see above), a byte each at the same places. A lane's two bytes of column blocks
// 8 m + 2 i and 8 m + 2 i + 1 go to quad lane i in one word (quad_transpose), which then holds both blocks' 16
// bytes and stores them at once.
template <class E, int kStride, int kTiles>
__device__ __forceinline__ void store_residual_rows(unsigned char* dest, const float (&c)[kTiles][4], int row0, int lane) {
    static_assert(kTiles % 8 == 0, "store_residual_rows: column blocks eight at a time");
    const int quad_lane = lane % 4;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
#pragma unroll
        for (int m = 0; m < kTiles / 8; ++m) {
            unsigned short lost[8];
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const float* pair = &c[8 * m + j][2 * half];
                const float2 kept = unpack2<E>(pack2<E>(pair[0], pair[1]));  // store_rows' rounding
                lost[j] = to_e5m2x2((pair[0] - kept.x) * kResidualScale, (pair[1] - kept.y) * kResidualScale);
            }
            unsigned w[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) w[i] = lost[2 * i] | static_cast<unsigned>(lost[2 * i + 1]) << 16;
            quad_transpose(w, lane);  // w[p]: lane p's bytes of blocks 8 m + 2 quad_lane (low half) and + 1 (high)
            *reinterpret_cast<uint4*>(dest + static_cast<long long>(row0 + 8 * half) * kStride + 8 * (8 * m + 2 * quad_lane)) =
                make_uint4(__byte_perm(w[0], w[1], 0x5410), __byte_perm(w[2], w[3], 0x5410),
                           __byte_perm(w[0], w[1], 0x7632), __byte_perm(w[2], w[3], 0x7632));
        }
    }
}

// Every accumulator times `factor`.
template <int kTiles>
__device__ __forceinline__ void scale_accumulators(float (&c)[kTiles][4], float factor) {
#pragma unroll
    for (int n = 0; n < kTiles; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) c[n][e] *= factor;
    }
}

// Rows [0, kChunk) x columns [0, kCols) of a global matrix (row stride `stride` elements) into a tile
// by cp.async, kThreads threads (`thread` 0 .. kThreads - 1) sharing the 16-byte chunks. With kIncompleteTile,
// rows from `valid` on are zero-filled and never read: a chunk never reads the next sequence's rows.
template <int kCols, int kThreads, bool kIncompleteTile, class E>
__device__ __forceinline__ void load_tile(E* tile, const E* src, long long stride, int valid, int thread) {
    constexpr int kPiecesPerRow = kCols / 8;
    constexpr int kRowsPerStep = kThreads / kPiecesPerRow;
    // A thread keeps its column, and its rows step by a whole number of the swizzle's 8-row repeats, so
    // each step's addresses are the first step's plus constants.
    static_assert(kThreads % kPiecesPerRow == 0 && kRowsPerStep % 8 == 0 && kChunk % kRowsPerStep == 0,
                  "load_tile: each thread's rows a multiple of 8 apart");
    const int row0 = thread / kPiecesPerRow, col = (thread % kPiecesPerRow) * 8;
    const unsigned first = smem_addr(tile + swizzled<kCols>(row0, col));
    const E* const from = src + row0 * stride + col;
#pragma unroll
    for (int step = 0; step < kChunk / kRowsPerStep; ++step) {
        const bool inside = !kIncompleteTile || row0 + step * kRowsPerStep < valid;
        cp_async_16_zfill(first + swizzled<kCols>(step * kRowsPerStep, 0) * static_cast<int>(sizeof(E)),
                          inside ? from + step * kRowsPerStep * stride : src, inside);
    }
}

// 1 / sqrt(sum(x^2) + 1e-6) of each row of a [kChunk][kCols] tile into scales[kChunk]: fla's in-kernel
// l2norm, x / sqrt(sum(x^2) + eps), applied by the kernels as row (and column) scales of their
// products, so the normalised vectors are never rounded to 16 bits. Two threads share a row;
// threads `thread` 0 .. 2 kChunk - 1 (of a warpgroup: neighbours by twos in one warp) take part.
template <int kCols, class E>
__device__ __forceinline__ void inverse_row_norms(const E* tile, float* scales, int thread) {
    constexpr int kPieces = kCols / 2 / 8;
    if (thread < 2 * kChunk) {
        const int row = thread / 2, col0 = (thread % 2) * (kCols / 2);
        float sum = 0.f;
#pragma unroll
        for (int i = 0; i < kPieces; ++i) {
            const Vec16<E> piece = *reinterpret_cast<const Vec16<E>*>(tile + swizzled<kCols>(row, col0 + 8 * i));
#pragma unroll
            for (int c = 0; c < 8; ++c) sum += to_f32<E>(piece.elem[c]) * to_f32<E>(piece.elem[c]);
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        if (thread % 2 == 0) scales[row] = rsqrtf(sum + 1e-6f);
    }
}

// The in-chunk inclusive cumsum of a warp's 64 values, lane l holding tokens 2l and 2l + 1 (of the gates: gates
// past the sequence end are 0, so they repeat the last token's sum). Returns both of the lane's sums.
__device__ __forceinline__ float2 chunk_cumsum(float g0, float g1, int lane) {
    float pair = g0 + g1;
#pragma unroll
    for (int offset = 1; offset < 32; offset *= 2) {
        const float before = __shfl_up_sync(0xffffffffu, pair, offset);
        if (lane >= offset) pair += before;
    }
    return make_float2(pair - g1, pair);
}

// Gamma of accumulator columns 8 n + 2 (lane % 4) and the next: lane 4 n + lane % 4 holds that pair.
__device__ __forceinline__ float2 gamma_of_columns(float2 gamma, int n, int lane) {
    return make_float2(__shfl_sync(0xffffffffu, gamma.x, 4 * n + lane % 4), __shfl_sync(0xffffffffu, gamma.y, 4 * n + lane % 4));
}

// Gamma of token i (0..63) from the lanes' cumsums.
__device__ __forceinline__ float gamma_of(float2 gamma, int i) {
    const float2 pair = make_float2(__shfl_sync(0xffffffffu, gamma.x, i / 2), __shfl_sync(0xffffffffu, gamma.y, i / 2));
    return i % 2 ? pair.y : pair.x;
}

}  // namespace gdn
}  // namespace kgen
