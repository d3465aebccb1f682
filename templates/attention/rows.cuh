// The row math both attention prefill kernels share: the swizzled tile layout TMA writes,
// the mask, the online softmax, P's packing and the epilogue. One thread's rows are
// 2 * kRowBlocks rows of mma C-fragments (mma.sync's, and wgmma's, which repeat them).
// Included by attention_prefill.cu.j2 after the variant's constants (T, kHeadDim, kTileN,
// kRowBlocks, kHasTail, the span sizes).

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

// The per-thread accumulators: O in mma C-fragments, and for each of the thread's
// 2 * kRowBlocks rows the running max (scaled, log2 domain) and its share of the sum.
struct RowState {
    float o[kRowBlocks][kHeadDim / 8][4];
    float max[2 * kRowBlocks];
    float sum[2 * kRowBlocks];
};

using Scores = float[kRowBlocks][kTileN / 8][4];

// The mask: keys past the sequence end and outside the window get score -inf. It is a
// select, so a NaN score of such a key (from a NaN key row) is dropped too.
struct Mask {
    int lk, offset, window_left, window_right;

    __device__ __forceinline__ bool allows(int row, int key) const {
        return key < lk && (window_left < 0 || key >= row + offset - window_left) &&
               (window_right < 0 || key <= row + offset + window_right);
    }
};

// A CTA's work item: query tile work[blockIdx.x] of its sequence for head blockIdx.y, and the key
// tiles [n_begin, n_end) holding a key some row of the tile may attend.
struct TileWork {
    int head, kv_head, q_start, lq, k_start, lk, row0, row_last, n_begin, n_end;
    Mask mask;

    // Key tile `key0` needs the mask: it crosses the sequence end or a window edge.
    __device__ __forceinline__ bool crosses_boundary(int key0) const {
        const bool crosses_end = kHasTail && key0 + kTileN > lk;
        const bool crosses_left = mask.window_left >= 0 && key0 < row_last + mask.offset - mask.window_left;
        const bool crosses_right = mask.window_right >= 0 && key0 + kTileN - 1 > row0 + mask.offset + mask.window_right;
        return crosses_end || crosses_left || crosses_right;
    }
};

__device__ __forceinline__ TileWork tile_work(const int* work, const int* cu_seqlens_q, const int* cu_seqlens_k,
                                              long long heads_per_kv, long long window_left, long long window_right) {
    TileWork t;
    const int seq = work[2 * blockIdx.x], q_tile = work[2 * blockIdx.x + 1];
    t.head = blockIdx.y;
    t.kv_head = t.head / static_cast<int>(heads_per_kv);
    t.q_start = cu_seqlens_q[seq];
    t.lq = cu_seqlens_q[seq + 1] - t.q_start;
    t.k_start = cu_seqlens_k[seq];
    t.lk = cu_seqlens_k[seq + 1] - t.k_start;
    t.mask = Mask{t.lk, t.lk - t.lq, static_cast<int>(window_left), static_cast<int>(window_right)};
    t.row0 = q_tile * kTileM;
    t.row_last = min(t.row0 + kTileM, t.lq) - 1;
    t.n_begin = 0;
    t.n_end = (t.lk + kTileN - 1) / kTileN;
    if (t.mask.window_left >= 0) t.n_begin = max(0, t.row0 + t.mask.offset - t.mask.window_left) / kTileN;
    if (t.mask.window_right >= 0) {
        const int last_key = t.row_last + t.mask.offset + t.mask.window_right;
        t.n_end = min(t.n_end, last_key < 0 ? 0 : last_key / kTileN + 1);
    }
    return t;
}

// thread_row0: the thread's first row (row block 0, upper half); its others are 8 and 16 apart.
__device__ __forceinline__ void mask_scores(Scores& s, const Mask& mask, int key0, int thread_row0, int quad_col) {
#pragma unroll
    for (int rb = 0; rb < kRowBlocks; ++rb) {
#pragma unroll
        for (int nb = 0; nb < kTileN / 8; ++nb) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int key = key0 + nb * 8 + 2 * quad_col + (e & 1);
                if (!mask.allows(thread_row0 + rb * 16 + (e >> 1) * 8, key)) s[rb][nb][e] = -kgen::inf();
            }
        }
    }
}

// One key tile's online softmax: new row maxima (over the quad that shares a row), the
// sums rescaled and the scores exponentiated in place; `correction` is the factor O must
// be rescaled by (rescale_output) before this tile's P V is added.
using RowFactors = float[2 * kRowBlocks];
__device__ __forceinline__ void softmax_update(Scores& s, RowState& state, float scale_log2, RowFactors& correction) {
    float base[2 * kRowBlocks];
#pragma unroll
    for (int i = 0; i < 2 * kRowBlocks; ++i) {
        // The scale is positive (the host checks), so the max of raw scores, scaled once, is the scaled max.
        float raw_max = -kgen::inf();
#pragma unroll
        for (int nb = 0; nb < kTileN / 8; ++nb) {
            raw_max = fmaxf(raw_max, fmaxf(s[i / 2][nb][2 * (i % 2)], s[i / 2][nb][2 * (i % 2) + 1]));
        }
        raw_max = fmaxf(raw_max, __shfl_xor_sync(0xffffffffu, raw_max, 1));
        raw_max = fmaxf(raw_max, __shfl_xor_sync(0xffffffffu, raw_max, 2));
        const float tile_max = fmaxf(state.max[i], raw_max * scale_log2);
        // A row with no allowed key so far keeps max -inf; exponentiate against 0 instead of -inf - -inf.
        base[i] = tile_max == -kgen::inf() ? 0.f : tile_max;
        correction[i] = kgen::exp2_ftz(state.max[i] - base[i]);
        state.max[i] = tile_max;
        state.sum[i] *= correction[i];
    }
#pragma unroll
    for (int rb = 0; rb < kRowBlocks; ++rb) {
#pragma unroll
        for (int nb = 0; nb < kTileN / 8; ++nb) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int i = 2 * rb + (e >> 1);
                s[rb][nb][e] = kgen::exp2_ftz(fmaf(s[rb][nb][e], scale_log2, -base[i]));
                state.sum[i] += s[rb][nb][e];
            }
        }
    }
}

__device__ __forceinline__ void rescale_output(RowState& state, const RowFactors& correction) {
#pragma unroll
    for (int rb = 0; rb < kRowBlocks; ++rb) {
#pragma unroll
        for (int db = 0; db < kHeadDim / 8; ++db) {
            state.o[rb][db][0] *= correction[2 * rb];
            state.o[rb][db][1] *= correction[2 * rb];
            state.o[rb][db][2] *= correction[2 * rb + 1];
            state.o[rb][db][3] *= correction[2 * rb + 1];
        }
    }
}

// P as 16-bit A-fragments of the P V product, packed straight from the S accumulators
// (the C- and A-fragment layouts agree): half the registers of S while O is live.
using Probabilities = unsigned[kRowBlocks][kTileN / 16][4];
__device__ __forceinline__ void pack_probabilities(const Scores& s, Probabilities& p) {
#pragma unroll
    for (int rb = 0; rb < kRowBlocks; ++rb) {
#pragma unroll
        for (int kb = 0; kb < kTileN / 16; ++kb) {
            p[rb][kb][0] = kgen::pack2<T>(s[rb][2 * kb][0], s[rb][2 * kb][1]);
            p[rb][kb][1] = kgen::pack2<T>(s[rb][2 * kb][2], s[rb][2 * kb][3]);
            p[rb][kb][2] = kgen::pack2<T>(s[rb][2 * kb + 1][0], s[rb][2 * kb + 1][1]);
            p[rb][kb][3] = kgen::pack2<T>(s[rb][2 * kb + 1][2], s[rb][2 * kb + 1][3]);
        }
    }
}

// Fold in the sink, normalise, and store O and the natural-log LSE of the rows inside the sequence.
// store_pair(row, db, pair) puts the thread's two packed elements of row `row` (of the sequence)
// and column block db (8 columns, the pair at 2 * quad_col) where O goes: global memory, or a
// shared-memory tile for a TMA store.
template <class RowOf, class StorePair>
__device__ __forceinline__ void write_output(const RowState& state, float* lse_head, int lq, float sink_log2,
                                             int quad_col, RowOf row_of, StorePair store_pair) {
#pragma unroll
    for (int i = 0; i < 2 * kRowBlocks; ++i) {
        float total = state.sum[i];
        total += __shfl_xor_sync(0xffffffffu, total, 1);
        total += __shfl_xor_sync(0xffffffffu, total, 2);
        const float row_max_all = fmaxf(state.max[i], sink_log2);
        const float base = row_max_all == -kgen::inf() ? 0.f : row_max_all;
        const float denominator = total * exp2f(state.max[i] - base) + exp2f(sink_log2 - base);
        // One term of the denominator is 2^0 (the row's or the sink's maximum), so it is >= 1 when
        // positive, where the fast division is exact to 2 ulp; IEEE division calls a slow path.
        const float o_scale = denominator > 0.f ? __fdividef(exp2f(state.max[i] - base), denominator) : 0.f;
        const int row = row_of(i);
        if (kHasTail && row >= lq) continue;
        const float (&acc)[kHeadDim / 8][4] = state.o[i / 2];
#pragma unroll
        for (int db = 0; db < kHeadDim / 8; ++db) {
            store_pair(row, db, kgen::pack2<T>(acc[db][2 * (i % 2)] * o_scale, acc[db][2 * (i % 2) + 1] * o_scale));
        }
        if (quad_col == 0) lse_head[row] = denominator > 0.f ? (base + log2f(denominator)) * kLn2 : -kgen::inf();
    }
}

