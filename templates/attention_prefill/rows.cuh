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

// Masks the scores of each of the thread's rows outside its allowed columns: columns_of(rb, half) gives them,
// [x, y), counted from the thread's first column (2 * quad_col of the key tile), so that each score's column is a
// compile-time constant and masking it is two compares and a select.
template <int kRowBlocks, int kBlocksN, class ColumnsOf>
__device__ __forceinline__ void mask_columns(float (&s)[kRowBlocks][kBlocksN][4], ColumnsOf columns_of) {
#pragma unroll
    for (int rb = 0; rb < kRowBlocks; ++rb) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int2 keys = columns_of(rb, half);
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

// A work item's fields (the host's ATTENTION_WORK_FIELDS).
enum WorkField { kSequence, kQueryTile, kQueryStart, kQueryEnd, kKeyStart, kKeyEnd, kWorkFields };

// The block's work item and query head. The grid is (work items, heads); with heads_fastest (the host's choice, see
// kgen.families.attention_prefill.op.heads_fastest) its blocks take them heads fastest in launch order instead: the
// blocks resident at once then read every head of their tokens (whole rows of q, k and v), and the query heads that
// share a K/V head run together.
struct BlockWork {
    int item, head;
};

__device__ __forceinline__ BlockWork block_work(long long heads_fastest) {
    if (!heads_fastest) return {static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y)};
    const unsigned linear = blockIdx.x + gridDim.x * blockIdx.y;
    return {static_cast<int>(linear / gridDim.y), static_cast<int>(linear % gridDim.y)};
}

// A CTA's work item (block_work's): a query tile (of kTileM rows) of its sequence for one head, and the key tiles
// (of kTileN keys) [n_begin, n_end) holding a key some row of the tile may attend. Without kHasIncompleteTile every
// sequence is whole tiles long.
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

    // Of the thread's row i (every row of the tile alike here).
    __device__ __forceinline__ float initial_sum(int) const { return matches_plan ? 0.f : quiet_nan(); }

    // Key tile `key0` needs the mask: it crosses the sequence end or a window edge.
    __device__ __forceinline__ bool crosses_boundary(int key0) const {
        const bool crosses_end = kHasIncompleteTile && key0 + kTileN > lk;
        const bool crosses_left = mask.window_left >= 0 && key0 < row_last + mask.offset - mask.window_left;
        const bool crosses_right = mask.window_right >= 0 && key0 + kTileN - 1 > row0 + mask.offset + mask.window_right;
        return crosses_end || crosses_left || crosses_right;
    }

    // The mask of key tile key0 (counted from k_start), where it crosses a boundary. thread_row0: the thread's first
    // row (row block 0, upper half); its others are 8 and 16 apart, and each finds its keys once.
    template <int kRowBlocks, int kBlocksN>
    __device__ __forceinline__ void mask_tile(float (&s)[kRowBlocks][kBlocksN][4], int key0, int thread_row0, int quad_col) const {
        if (!crosses_boundary(key0)) return;
        mask_columns(s, [&](int rb, int half) { return mask.keys_of(thread_row0 + rb * 16 + half * 8, key0 + 2 * quad_col); });
    }

    __device__ static __forceinline__ TileWork of_block(const int* work, const int* cu_seqlens_q, const int* cu_seqlens_k,
                                                        long long heads_per_kv, long long window_left, long long window_right,
                                                        long long heads_fastest) {
        TileWork t;
        // The item as three 8-byte pairs (sequence and tile, query bounds, key bounds): rows of 24 bytes.
        static_assert(kWorkFields == 6 && kQueryTile == kSequence + 1 && kQueryStart % 2 == 0 && kKeyStart % 2 == 0 &&
                      kQueryEnd == kQueryStart + 1 && kKeyEnd == kKeyStart + 1, "work items are three int pairs");
        const BlockWork block = block_work(heads_fastest);
        const int2* const item = reinterpret_cast<const int2*>(work + kWorkFields * block.item);
        const int2 index = item[kSequence / 2], q_bounds = item[kQueryStart / 2], k_bounds = item[kKeyStart / 2];
        const int seq = index.x, q_tile = index.y;
        t.head = block.head;
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

// A packed work item (rows=packed; self-attention, unbounded left window): tokens [t0, t1) of the batch, at most
// kTileM, from sequences first..last, and the keys [k0, k1) some row of it attends (k0 the first sequence's start;
// k1 = t1 under the causal mask, else the last sequence's end). Its fields: (first, last, t0, t1, k0, k1). The key
// tiles end at k1, so the causal diagonal's is the last, and the first may begin before k0: the rows there are
// another sequence's (cleared before P V), or before the tensor (TMA fills zeros).
//
// Each row finds its sequence in the plan's cu_seqlens and attends that sequence's keys alone; a sequence whose
// bounds in the call's cu_seqlens differ from the plan's gets NaN rows, as in TileWork. Its scores of other
// sequences' keys are masked by a select, but P V multiplies every row by every V row of the tile, and 0 x Inf is
// NaN: so where the tile holds several sequences, V's Inf and NaN rows are found and zeroed before P V (the
// kernel's guard), and the rows of their own sequence set NaN (`poison_owners`).
template <int kTileM, int kTileN>
struct PackedWork {
    int head, kv_head, q_start, lq, k_start, lk, row0, n_begin, n_end;
    int first_item_key;     // k0 - k_start: rows of the first key tile before it are another sequence's
    int first_sequence, last_sequence;
    bool mixed;             // rows of more than one sequence
    int2 keys[2];           // the thread's rows' allowed keys [x, y), counted from k_start
    int2 sequence_keys[2];  // the keys of the thread's rows' sequences [x, y), counted from k_start
    bool matches_plan[2];

    __device__ __forceinline__ float initial_sum(int i) const { return matches_plan[i] ? 0.f : quiet_nan(); }

    // Every key tile is masked: its rows' sequences begin and end inside it.
    template <int kBlocksN>
    __device__ __forceinline__ void mask_tile(float (&s)[1][kBlocksN][4], int key0, int, int quad_col) const {
        const int base = key0 + 2 * quad_col;
        mask_columns(s, [&](int, int half) { return make_int2(keys[half].x - base, keys[half].y - base); });
    }

    // Sets NaN sums on the thread's rows whose sequence owns a row of key tile key0 marked in row_bits. A loop over
    // the marked rows (the same for every thread, and rare), each compared with the rows' sequences: a range mask
    // of shifts, the first form, marked the complement of the owners on the GPU (bench/NOTES.md, session 26).
    template <int kHeadDim>
    __device__ __forceinline__ void poison_owners(attention::RowState<1, kHeadDim>& state, const unsigned* row_bits, int key0) const {
        bool owns[2] = {false, false};
        for (int w = 0; w < (kTileN + 31) / 32; ++w) {
            for (unsigned marked = row_bits[w]; marked != 0u; marked &= marked - 1u) {
                const int key = key0 + 32 * w + __ffs(marked) - 1;
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                    owns[half] |= sequence_keys[half].x <= key && key < sequence_keys[half].y;
                }
            }
        }
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            if (owns[half]) state.sum[half] = quiet_nan();
        }
    }

    // The item's fields; its rows' are find_rows'.
    __device__ static __forceinline__ PackedWork of_block(const int* work, long long heads_per_kv, long long heads_fastest) {
        PackedWork t;
        const BlockWork block = block_work(heads_fastest);
        const int2* const item = reinterpret_cast<const int2*>(work + kWorkFields * block.item);
        const int2 sequences = item[0], tokens = item[1], key_bounds = item[2];
        t.head = block.head;
        t.kv_head = t.head / static_cast<int>(heads_per_kv);
        t.q_start = tokens.x;
        t.lq = tokens.y - tokens.x;
        t.row0 = 0;
        t.n_begin = 0;
        t.n_end = (key_bounds.y - key_bounds.x + kTileN - 1) / kTileN;
        t.k_start = key_bounds.y - t.n_end * kTileN;
        t.lk = key_bounds.y - t.k_start;
        t.first_item_key = key_bounds.x - t.k_start;
        t.first_sequence = sequences.x;
        t.last_sequence = sequences.y;
        t.mixed = sequences.x != sequences.y;
        return t;
    }

    // Each of the thread's rows (thread_row0 in the tile and 8 below) finds its sequence in the plan's cu_seqlens,
    // its keys, and whether the call's cu_seqlens agree. Called once the item's loads are issued: the search's
    // dependent loads would otherwise hold them back (ncu, bench/NOTES.md, session 26).
    __device__ __forceinline__ void find_rows(const int* plan_cu_seqlens, const int* cu_seqlens_q, const int* cu_seqlens_k,
                                              bool causal, int thread_row0) {
        const int t0 = q_start, t1 = q_start + lq;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int token = t0 + thread_row0 + 8 * half;
            if (token >= t1) {  // past the batch: no keys, never stored
                keys[half] = sequence_keys[half] = make_int2(0, 0);
                matches_plan[half] = true;
                continue;
            }
            // The last of first..last starting at or before the token (empty sequences start where the next does).
            int lo = first_sequence, hi = last_sequence;
            while (lo < hi) {
                const int mid = (lo + hi + 1) / 2;
                if (plan_cu_seqlens[mid] <= token) lo = mid; else hi = mid - 1;
            }
            const int start = plan_cu_seqlens[lo], end = plan_cu_seqlens[lo + 1];
            sequence_keys[half] = make_int2(start - k_start, end - k_start);
            keys[half] = make_int2(start - k_start, (causal ? token + 1 : end) - k_start);
            matches_plan[half] = (cu_seqlens_q[lo] == start) & (cu_seqlens_q[lo + 1] == end) &
                                 (cu_seqlens_k[lo] == start) & (cu_seqlens_k[lo + 1] == end);
        }
    }
};

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
