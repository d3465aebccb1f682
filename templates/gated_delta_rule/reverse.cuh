// The backward's reverse recurrence of the state gradient, chunk after chunk from a sequence's end:
// with dS' the gradient of the state after a chunk (the sequence's last: d_final_state, or 0),
//     dVn = diag(e^{Gamma_last - Gamma}) K dS' + scale (Q K^T * LowerIncl * e^{Gamma_i - Gamma_j})^T dO
//     dS  = e^{Gamma_last} dS' + scale (diag(e^Gamma) dO)^T Q - (diag(e^Gamma) Tbeta^T dVn)^T K
// (the gradient of chunk.cu.j2's S = e^{Gamma_last} S + K^T diag(e^{Gamma_last - Gamma}) Vn and O through
// S, with Vn = Tbeta (V - diag(e^Gamma) K S)). It writes every chunk's dS' (16-bit, transposed,
// [chunk, v-head, V, K]) for the per-chunk gradients, with what that rounding lost unless d_state_residuals is
// null (tiles.cuh's store_residual_rows), and the sequence's dS before its first chunk.
// A block (one warpgroup) owns (segment, v-head, slice of kSliceV value columns) and keeps dS'^T [kSliceV, K] in
// fp32 wgmma accumulators, with a 16-bit copy in shared memory as K dS''s B operand. The chunk before this one
// loads by cp.async while this one computes: its Q and K into a second buffer from the step's start, its dO slice
// and Tbeta into their single tiles once this chunk has read its own, so that the tiles (104 KB at head dim 128)
// leave room for two blocks an SM (one block of four warps an SM was latency-bound: ncu, bench/NOTES.md,
// thirty-second session). An incomplete chunk's rows past the sequence are zero-filled and
// never read (has_incomplete_tile=false has no such code). Every gate difference is taken with i <= j, so nothing
// overflows. A sequence the call's cu_seqlens bound otherwise than the plan (plan_refused) starts from a NaN dS',
// so all its gradients come out NaN.
//
// Split sequences, as the forward's: dS is linear in (dS', dO), so a segment maps the dS' at its end to the dS at
// its start as dS = M dS' + h. gated_delta_rule_chunk_reverse_summary (kSummary) runs each segment but its
// sequence's first on the augmented [M | h] (K + V columns), M's from dS' = I with no dO and h's from dS' = 0 with
// the dO, and writes it to the segment's start slot. gated_delta_rule_chunk_chain walks each sequence's summaries
// from its last segment back (reverse_order), from d_final_state, writing each segment's end dS' to its summary
// slot; gated_delta_rule_chunk_reverse then runs every segment from its exact end, and the sequence's first
// segment writes the gradient of the initial state. The forward's decay-bounded shortcut, turned around: where the
// gates from the segment's start to some chunk sum below negligible_log_decay, what the dS' after that chunk
// passes to the start is below fp32 rounding, so M is 0 (flagged for the chain, never computed) and h runs only
// the chunks up to it.
//
// Config as for recurrence.cuh. Needs common/ numeric, smem, swizzle, mma, cp_async and wgmma (widths
// kSliceV, 64 and kHeadDim); gated_delta_rule/tiles.cuh and recurrence.cuh (segment rows, state_at).
namespace kgen {
namespace gdn {

template <class Config>
struct Reverse {
    using T = typename Config::T;
    static constexpr int kHeadDim = Config::kHeadDim, kSliceV = Config::kSliceV, kThreads = Config::kThreads;
    static constexpr bool kHasIncompleteTile = Config::kHasIncompleteTile, kKeyMajor = Config::kKeyMajor;
    static constexpr int kValueTiles = kSliceV / 8, kKeyTiles = kHeadDim / 8;
    static constexpr int kPanelBytes = kChunk * 128;

    struct ChunkKeys {  // one chunk's Q and K
        T q[kChunk * kHeadDim], k[kChunk * kHeadDim];
    };
    struct alignas(64) Shared {
        ChunkKeys chunk[2];                // this chunk's, and the one before it as it loads
        T d_out[kChunk * kSliceV];         // dO's slice; then, gated in place, scale diag(e^Gamma) dO, transposed A of dS's update
        T tbeta[kChunk * kChunk];          // Tbeta
        T d_state[kSliceV * kHeadDim];     // dS'^T, K dS''s B operand
        T d_vn[kChunk * kSliceV];          // dVn, Tbeta^T dVn's B operand; then -diag(e^Gamma) Tbeta^T dVn, transposed A
    };
    static_assert(sizeof(T) * kChunk * kSliceV % kSwizzleAlignment == 0 &&
                  sizeof(T) * kChunk * kChunk % kSwizzleAlignment == 0, "tiles of whole swizzle repeats");
    static constexpr int kDynamicSmemBytes = sizeof(Shared) + kSwizzleAlignment;

    template <int kRows>
    __device__ static __forceinline__ unsigned long long k_major(unsigned tile, int kk) {
        return k_major_descriptor(tile + (kk / 4) * kRows * 128 + (kk % 4) * 32);
    }
    __device__ static __forceinline__ unsigned long long mn_major(unsigned tile, int kk) {
        return mn_major_descriptor(tile + kk * 16 * 128, kPanelBytes);
    }

    // kSummary: the segment's [M | h] (see above), blockIdx.x a slice of its K + V augmented columns.
    template <bool kSummary>
    __device__ static __forceinline__ void run(const T* __restrict__ q, const T* __restrict__ k, const float* __restrict__ g,
                                               const T* __restrict__ tbeta, const T* __restrict__ d_out,
                                               const float* __restrict__ d_final_state, const void* __restrict__ cu_seqlens,
                                               long long cu_seqlens_is_int64, const int* __restrict__ segments,
                                               const float* __restrict__ gamma_log2, const float* __restrict__ end_states,
                                               float* __restrict__ summary, int* __restrict__ negligible_summaries,
                                               T* __restrict__ d_states, unsigned char* __restrict__ d_state_residuals,
                                               float* __restrict__ d_initial_state,
                                               long long num_heads, long long num_heads_v, float scale,
                                               float negligible_log_decay) {
        extern __shared__ unsigned char smem_bytes[];
        Shared& smem = *reinterpret_cast<Shared*>(kgen::align_up<kgen::kSwizzleAlignment>(smem_bytes));
        const int* const segment = segments + kSegmentFields * blockIdx.z;
        if (kSummary && segment[kStartSlot] < 0) return;  // a sequence's first segment: the chain ends there
        const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
        const int sequence = segment[kSequence], end_token = segment[kEndToken], start_token = segment[kSequenceStart];
        const int first_chunk = segment[kFirstChunk], first_token = segment[kFirstToken];
        int chunks = segment[kChunks];
        const int heads_v = static_cast<int>(num_heads_v), head_v = blockIdx.y;
        const int head = head_v / (heads_v / static_cast<int>(num_heads));
        // The slice's first augmented column (summary) or value column; M's columns carry no dO.
        const int column0 = blockIdx.x * kSliceV;
        const bool carries_d_out = !kSummary || column0 >= kHeadDim;
        const int value0 = carries_d_out && kSummary ? column0 - kHeadDim : column0;
        const long long qk_stride = num_heads * kHeadDim, v_stride = static_cast<long long>(heads_v) * kHeadDim;
        auto token_of = [&](int c) { return first_token + c * kChunk; };  // a segment starts on a chunk boundary

        if (kSummary) {  // the shortcut (negligible_log_decay = -inf: never); dVn's tile is not in use yet
            const int until = negligible_since<kThreads, true>(gamma_log2, first_chunk, chunks, heads_v, head_v,
                                                               negligible_log_decay, reinterpret_cast<float*>(smem.d_vn));
            const bool negligible = until >= 0;
            // The chain skips a negligible M instead of reading it: one flag per summary, from its first block.
            if (blockIdx.x == 0 && threadIdx.x == 0) {
                negligible_summaries[static_cast<long long>(segment[kStartSlot]) * heads_v + head_v] = negligible;
            }
            if (negligible && !carries_d_out) return;
            if (negligible) chunks = until + 1;
        }
        if (!carries_d_out) {  // dO = 0 for M's columns: its tile is zeroed once and never loaded (gating keeps 0)
            for (int i = threadIdx.x; i < kChunk * kSliceV; i += kThreads) smem.d_out[i] = kgen::from_f32<T>(0.f);
        }
        // A chunk's inputs by cp.async, not committed: Q and K into a buffer of their own, dO's slice and Tbeta.
        auto load_keys = [&](int c, ChunkKeys& tiles) {
            const int token = token_of(c), valid = end_token - token;
            load_tile<kHeadDim, kThreads, kHasIncompleteTile>(tiles.q, q + token * qk_stride + head * kHeadDim, qk_stride, valid, threadIdx.x);
            load_tile<kHeadDim, kThreads, kHasIncompleteTile>(tiles.k, k + token * qk_stride + head * kHeadDim, qk_stride, valid, threadIdx.x);
        };
        auto load_d_out_tbeta = [&](int c) {
            const int token = token_of(c), valid = end_token - token;
            if (carries_d_out) {
                load_tile<kSliceV, kThreads, kHasIncompleteTile>(smem.d_out, d_out + token * v_stride + head_v * kHeadDim + value0,
                                                                v_stride, valid, threadIdx.x);
            }
            load_tile<kChunk, kThreads, false>(smem.tbeta, tbeta + (static_cast<long long>(first_chunk + c) * heads_v + head_v) * kChunk * kChunk,
                                               kChunk, kChunk, threadIdx.x);
        };

        // dS'^T's accumulators: value rows 16 warp + lane / 4 (+ 8), key columns 8 n + 2 (lane % 4) (+ 1).
        const int row = 16 * warp + lane / 4, fragment_column = 2 * (lane % 4);
        float ds[kKeyTiles][4];
        {
            // dS' at the segment's end: the sequence's last gets d_final_state (or 0), the others the chain's
            // ([K, V] rows in their summary slot); a summary M's identity columns, or h's zeros.
            const bool refused = plan_refused(cu_seqlens, cu_seqlens_is_int64, sequence, start_token, end_token);
            const long long head_slot = static_cast<long long>(segment[kWritesFinal] ? sequence : segment[kSummarySlot]) * heads_v + head_v;
            const float* const seed = kSummary || refused ? nullptr
                                      : segment[kWritesFinal] ? (d_final_state == nullptr ? nullptr : d_final_state + head_slot * kHeadDim * kHeadDim)
                                                              : end_states + head_slot * kHeadDim * kHeadDim;
            const bool key_major = kKeyMajor || !segment[kWritesFinal];  // the chain's states are [K, V]
#pragma unroll
            for (int n = 0; n < kKeyTiles; ++n) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int value = value0 + row + (e / 2) * 8, key = 8 * n + fragment_column + e % 2;
                    ds[n][e] = refused ? quiet_nan()
                               : kSummary ? (!carries_d_out && value == key ? 1.f : 0.f)
                               : seed == nullptr ? 0.f
                                                 : seed[key_major ? state_at<true, kHeadDim>(key, value) : state_at<false, kHeadDim>(key, value)];
                }
            }
        }
        if (chunks > 0) {
            load_keys(chunks - 1, smem.chunk[0]);
            load_d_out_tbeta(chunks - 1);
            kgen::cp_async_commit();
        }
        store_accumulators<kHeadDim, T, kKeyTiles, kSliceV>(smem.d_state, ds, 16 * warp, lane);
        const unsigned d_state_tile = kgen::smem_addr(smem.d_state), d_vn_tile = kgen::smem_addr(smem.d_vn);
        const unsigned d_out_tile = kgen::smem_addr(smem.d_out), tbeta_tile = kgen::smem_addr(smem.tbeta);

        // A chunk's gates (two tokens a lane), loaded a step ahead: read at the step's start they waited for their
        // round trip on the chain (ncu: 18% of the kernel's stall samples, bench/NOTES.md, thirty-first session).
        auto gates_of = [&](int c, float (&gate)[2]) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int t = token_of(c) + 2 * lane + e;
                gate[e] = !kHasIncompleteTile || t < end_token ? g[static_cast<long long>(t) * heads_v + head_v] : 0.f;
            }
        };
        float gate[2] = {0.f, 0.f};
        if (chunks > 0) gates_of(chunks - 1, gate);

        for (int i = 0; i < chunks; ++i) {
            const int c = chunks - 1 - i;
            ChunkKeys& tiles = smem.chunk[i % 2];
            // The other buffer was last read in step i - 1, which every thread has left (its last barrier). All
            // but this newest group are this chunk's: its Q and K (a step back), its dO and Tbeta (mid-step).
            if (c > 0) {
                load_keys(c - 1, smem.chunk[(i + 1) % 2]);
                kgen::cp_async_commit();
                kgen::cp_async_wait<1>();
            } else {
                kgen::cp_async_wait<0>();
            }
            if constexpr (!kSummary) {  // dS'^T of this chunk, 16-bit, for the per-chunk gradients, and what that lost
                const long long at = (static_cast<long long>(first_chunk + c) * heads_v + head_v) * kHeadDim * kHeadDim;
                store_rows<T, kHeadDim>(d_states + at, ds, value0 + row, lane);
                if (d_state_residuals != nullptr) store_residual_rows<T, kHeadDim>(d_state_residuals + at, ds, value0 + row, lane);
            }
            const float2 gamma = chunk_cumsum(gate[0], gate[1], lane);
            if (c > 0) gates_of(c - 1, gate);
            const float gamma_last = __shfl_sync(0xffffffffu, gamma.y, 31);
            const float gamma_row[2] = {gamma_of(gamma, row), gamma_of(gamma, row + 8)};
            kgen::fence_proxy_async_shared();
            __syncthreads();  // this chunk's tiles and dS'^T's copy are in
            const unsigned q_tile = kgen::smem_addr(tiles.q), k_tile = kgen::smem_addr(tiles.k);

            // K Q^T and K dS' in one batch.
            float kq[kChunk / 8][4], d_vn[kValueTiles][4];
            kgen::wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < kHeadDim / 16; ++kk) {
                kgen::wgmma_ss<kChunk, 0>(kq, k_major<kChunk>(k_tile, kk), k_major<kChunk>(q_tile, kk), kk > 0);
                kgen::wgmma_ss<kSliceV, 0>(d_vn, k_major<kChunk>(k_tile, kk), k_major<kSliceV>(d_state_tile, kk), kk > 0);
            }
            kgen::wgmma_commit();
            kgen::wgmma_wait<0>();
            kgen::fence_operands(kq), kgen::fence_operands(d_vn);

            // scale P^T (row i, column j: P_ji, zero for j < i) as 16-bit A fragments; dVn's first term.
            unsigned pt_frag[kChunk / 16][4];
#pragma unroll
            for (int n = 0; n < kChunk / 8; ++n) {
                const float2 columns = gamma_of_columns(gamma, n, lane);
                const float gamma_column[2] = {columns.x, columns.y};
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int r = row + (e / 2) * 8, j = 8 * n + fragment_column + e % 2;
                    kq[n][e] = j >= r ? scale * kq[n][e] * __expf(gamma_column[e % 2] - gamma_row[e / 2]) : 0.f;
                }
            }
            accumulators_as_a<T, kChunk / 8>(pt_frag, kq);
#pragma unroll
            for (int n = 0; n < kValueTiles; ++n) {
#pragma unroll
                for (int e = 0; e < 4; ++e) d_vn[n][e] *= __expf(gamma_last - gamma_row[e / 2]);
            }
            kgen::fence_operands(pt_frag);
            kgen::wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < kChunk / 16; ++kk) kgen::wgmma_rs<kSliceV, 1>(d_vn, pt_frag[kk], mn_major(d_out_tile, kk), true);
            kgen::wgmma_commit();
            kgen::wgmma_wait<0>();
            kgen::fence_operands(d_vn);
            store_accumulators<kSliceV, T>(smem.d_vn, d_vn, 16 * warp, lane);
            __syncthreads();  // every warp's products have read dO's slice, gated in place below
            // scale diag(e^Gamma) dO, from this thread's places of the same layout.
#pragma unroll
            for (int n = 0; n < kValueTiles; ++n) {
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                    const int r = row + 8 * half, column = 8 * n + fragment_column;
                    unsigned& pair = *reinterpret_cast<unsigned*>(smem.d_out + swizzled<kSliceV>(r, column));
                    T value[2];
                    memcpy(value, &pair, sizeof(value));
                    const float factor = scale * __expf(gamma_row[half]);
                    pair = kgen::pack2<T>(factor * kgen::to_f32<T>(value[0]), factor * kgen::to_f32<T>(value[1]));
                }
            }
            scale_accumulators(ds, __expf(gamma_last));
            kgen::fence_proxy_async_shared();
            __syncthreads();  // dVn and the gated dO are whole

            // Y = Tbeta^T dVn (Tbeta's tile read M-major) and dS^T's first update, e^{Gamma_last} dS'^T +
            // (scale diag(e^Gamma) dO)^T Q, in one batch, after which dO's and Tbeta's tiles are free for the chunk
            // before's (the same tensor work before Y's store as the old order's after it).
            float y[kValueTiles][4];
            kgen::wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < kChunk / 16; ++kk) {
                kgen::wgmma_ss<kSliceV, 1, 1>(y, mn_major(tbeta_tile, kk), mn_major(d_vn_tile, kk), kk > 0);
            }
#pragma unroll
            for (int kk = 0; kk < kChunk / 16; ++kk) {
                kgen::wgmma_ss<kHeadDim, 1, 1>(ds, mn_major(d_out_tile, kk), mn_major(q_tile, kk), true);
            }
            kgen::wgmma_commit();
            kgen::wgmma_wait<0>();
            kgen::fence_operands(y), kgen::fence_operands(ds);
#pragma unroll
            for (int n = 0; n < kValueTiles; ++n) {
#pragma unroll
                for (int e = 0; e < 4; ++e) y[n][e] *= -__expf(gamma_row[e / 2]);
            }
            __syncthreads();  // dVn, Tbeta and the gated dO are read no more: the chunk before's load into theirs
            if (c > 0) {
                load_d_out_tbeta(c - 1);
                kgen::cp_async_commit();
            }
            store_accumulators<kSliceV, T>(smem.d_vn, y, 16 * warp, lane);
            kgen::fence_proxy_async_shared();
            __syncthreads();  // the gated Y is whole

            // dS^T -= (diag(e^Gamma) Y)^T K.
            kgen::wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < kChunk / 16; ++kk) {
                kgen::wgmma_ss<kHeadDim, 1, 1>(ds, mn_major(d_vn_tile, kk), mn_major(k_tile, kk), true);
            }
            kgen::wgmma_commit();
            kgen::wgmma_wait<0>();
            kgen::fence_operands(ds);
            // Every warp is past the first batch (barriers back), the copy's only reader.
            store_accumulators<kHeadDim, T, kKeyTiles, kSliceV>(smem.d_state, ds, 16 * warp, lane);
            __syncthreads();  // this chunk's tiles are read no more: the next step reloads their buffer
        }

        if constexpr (kSummary) {  // [M | h]: rows [K][K + V] of the segment's start slot
            float* const rows = summary + (static_cast<long long>(segment[kStartSlot]) * heads_v + head_v) * kHeadDim * 2 * kHeadDim;
#pragma unroll
            for (int n = 0; n < kKeyTiles; ++n) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int column = column0 + row + (e / 2) * 8, key = 8 * n + fragment_column + e % 2;
                    rows[key * 2 * kHeadDim + column] = ds[n][e];
                }
            }
            return;
        }
        if (d_initial_state == nullptr || first_token != start_token) return;  // the sequence's first segment writes it
        float* const dest = d_initial_state + (static_cast<long long>(sequence) * heads_v + head_v) * kHeadDim * kHeadDim;
#pragma unroll
        for (int n = 0; n < kKeyTiles; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int value = value0 + row + (e / 2) * 8, key = 8 * n + fragment_column + e % 2;
                dest[state_at<kKeyMajor, kHeadDim>(key, value)] = ds[n][e];
            }
        }
    }
};

}  // namespace gdn
}  // namespace kgen
