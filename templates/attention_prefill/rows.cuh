// The prefill kernels' row logic: the mask, the work item of a CTA, and the epilogue.
// Needs common/numeric.cuh, common/lse_merge.cuh and attention_common/softmax.cuh.
namespace kgen {
namespace attention_prefill {

// The mask: keys past the sequence end and outside the window get score -inf. It is a
// select, so a NaN score of such a key (from a NaN key row) is dropped too.
struct Mask {
    int lk, offset, window_left, window_right;

    // The keys row `row` may attend, [x, y), counted from key `base`: a key is allowed when it is inside the
    // sequence and the window. Found once per row (in 64 bits, then clamped to +-2^30, which leaves every
    // comparison with a tile's columns as it was), so that masking a score is two compares.
    __device__ __forceinline__ int2 keys_of(int row, int base) const {
        constexpr long long kFar = 1ll << 30;
        const long long diagonal = static_cast<long long>(row) + offset - base;
        const long long first = window_left < 0 ? -kFar : diagonal - window_left;
        long long end = static_cast<long long>(lk) - base;
        if (window_right >= 0) end = min(end, diagonal + window_right + 1);
        return make_int2(static_cast<int>(max(-kFar, min(kFar, first))), static_cast<int>(max(-kFar, min(kFar, end))));
    }
};

// A work item's fields (the host's ATTENTION_WORK_FIELDS).
enum WorkField { kSequence, kQueryTile, kQueryStart, kQueryEnd, kKeyStart, kKeyEnd, kWorkFields };

// A CTA's work item: query tile work[blockIdx.x] (of kTileM rows) of its sequence for head
// blockIdx.y, and the key tiles (of kTileN keys) [n_begin, n_end) holding a key some row of the
// tile may attend. Without kHasIncompleteTile every sequence is whole tiles long.
//
// The sequence's bounds are the plan's, which the host checked against the tensors, so nothing is
// addressed outside them whatever the call's cu_seqlens hold. Where those differ from the plan's
// bounds of the sequence (a plan used for other lengths), the tile's rows' softmax sums start at NaN,
// so their O and LSE come out NaN: the misuse shows instead of a finite, wrong result. Every tile of a
// sequence whose bounds moved does this, so all its rows are NaN.
template <int kTileM, int kTileN, bool kHasIncompleteTile>
struct TileWork {
    int head, kv_head, q_start, lq, k_start, lk, row0, row_last, n_begin, n_end;
    bool matches_plan;
    Mask mask;

    __device__ __forceinline__ float initial_sum() const { return matches_plan ? 0.f : quiet_nan(); }

    // Key tile `key0` needs the mask: it crosses the sequence end or a window edge.
    __device__ __forceinline__ bool crosses_boundary(int key0) const {
        const bool crosses_end = kHasIncompleteTile && key0 + kTileN > lk;
        const bool crosses_left = mask.window_left >= 0 && key0 < row_last + mask.offset - mask.window_left;
        const bool crosses_right = mask.window_right >= 0 && key0 + kTileN - 1 > row0 + mask.offset + mask.window_right;
        return crosses_end || crosses_left || crosses_right;
    }

    __device__ static __forceinline__ TileWork of_block(const int* work, const int* cu_seqlens_q, const int* cu_seqlens_k,
                                                        long long heads_per_kv, long long window_left, long long window_right) {
        TileWork t;
        // The item as three 8-byte pairs (sequence and tile, query bounds, key bounds): rows of 24 bytes.
        static_assert(kWorkFields == 6 && kQueryTile == kSequence + 1 && kQueryStart % 2 == 0 && kKeyStart % 2 == 0 &&
                      kQueryEnd == kQueryStart + 1 && kKeyEnd == kKeyStart + 1, "work items are three int pairs");
        const int2* const item = reinterpret_cast<const int2*>(work + kWorkFields * blockIdx.x);
        const int2 index = item[kSequence / 2], q_bounds = item[kQueryStart / 2], k_bounds = item[kKeyStart / 2];
        const int seq = index.x, q_tile = index.y;
        t.head = blockIdx.y;
        t.kv_head = t.head / static_cast<int>(heads_per_kv);
        t.q_start = q_bounds.x;
        t.lq = q_bounds.y - q_bounds.x;
        t.k_start = k_bounds.x;
        t.lk = k_bounds.y - k_bounds.x;
        // Loads and addresses never wait for this: only the rows' starting sums do (see initial_sum).
        t.matches_plan = (cu_seqlens_q[seq] == q_bounds.x) & (cu_seqlens_q[seq + 1] == q_bounds.y) &
                         (cu_seqlens_k[seq] == k_bounds.x) & (cu_seqlens_k[seq + 1] == k_bounds.y);
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
};

// thread_row0: the thread's first row (row block 0, upper half); its others are 8 and 16 apart. Each of the
// thread's rows finds its keys once; a score's column offset is then a compile-time constant.
template <int kRowBlocks, int kBlocksN>
__device__ __forceinline__ void mask_scores(float (&s)[kRowBlocks][kBlocksN][4], const Mask& mask, int key0, int thread_row0,
                                            int quad_col) {
#pragma unroll
    for (int rb = 0; rb < kRowBlocks; ++rb) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int2 keys = mask.keys_of(thread_row0 + rb * 16 + half * 8, key0 + 2 * quad_col);
#pragma unroll
            for (int nb = 0; nb < kBlocksN; ++nb) {
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    const int column = nb * 8 + j;
                    if (column < keys.x || column >= keys.y) s[rb][nb][2 * half + j] = -inf();
                }
            }
        }
    }
}

// Fold in the sink, normalise, and store O (as T) and the natural-log LSE of the rows inside the sequence (all rows
// without kHasIncompleteTile). store_pair(i, row, db, pair) puts the thread's two packed elements of its row i (row
// `row` of the sequence) and column block db (8 columns, the pair at 2 * quad_col) where O goes, and is called for
// rows past the sequence too: the mma.sync kernel skips them, the wgmma kernel stages every row in shared memory.
// Storing O inside the normalising loop keeps each row's products and stores together (normalising all of O in
// place first made the mma.sync kernel 3-4% slower at seed 000's L = 64 and 129: bench/NOTES.md).
template <class T, bool kHasIncompleteTile, int kRowBlocks, int kHeadDim, class RowOf, class StorePair>
__device__ __forceinline__ void write_output(const attention::RowState<kRowBlocks, kHeadDim>& state, float* lse_head, int lq,
                                             float sink_log2, int quad_col, RowOf row_of, StorePair store_pair) {
#pragma unroll
    for (int i = 0; i < 2 * kRowBlocks; ++i) {
        float total = state.sum[i];
        total += __shfl_xor_sync(0xffffffffu, total, 1);
        total += __shfl_xor_sync(0xffffffffu, total, 2);
        const SinkFold fold = fold_sink(state.max[i], total, sink_log2);
        // One term of the denominator is 2^0 (the row's or the sink's maximum), so it is >= 1 when
        // positive, where the fast division is exact to 2 ulp; IEEE division calls a slow path.
        // A NaN denominator (a refused tile's, see TileWork) makes O NaN.
        const float o_scale = fold.denominator <= 0.f ? 0.f : __fdividef(fold.row_weight, fold.denominator);
        const int row = row_of(i);
        const float (&acc)[kHeadDim / 8][4] = state.o[i / 2];
#pragma unroll
        for (int db = 0; db < kHeadDim / 8; ++db) {
            store_pair(i, row, db, pack2<T>(acc[db][2 * (i % 2)] * o_scale, acc[db][2 * (i % 2) + 1] * o_scale));
        }
        if ((!kHasIncompleteTile || row < lq) && quad_col == 0) lse_head[row] = fold.natural_lse();
    }
}

}  // namespace attention_prefill
}  // namespace kgen
