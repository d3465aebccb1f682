// The chunked gated delta rule's state recurrence over one segment, chunk after chunk: the body of
// gated_delta_rule_chunk and gated_delta_rule_chunk_summary (chunk.cu.j2 says what it computes).
//
// Config: T, kHeadDim (K = V), kSliceV (value columns per state warpgroup), kThreads (a warpgroup's; the output
// kernels run more), kHasIncompleteTile and kKeyMajor (states [K, V], else [V, K]); chunk.cu.j2 defines it.
// Needs common/ numeric, smem, swizzle, mma, cp_async, tma, warp_roles and wgmma (widths kSliceV, 64
// and kHeadDim); gated_delta_rule/tiles.cuh.
namespace kgen {
namespace gdn {

// A segment row, as the host's planner writes it (its GDN_SEGMENT_FIELDS).
enum SegmentField { kSequence, kFirstToken, kEndToken, kFirstChunk, kChunks, kSummarySlot, kStartSlot, kWritesFinal,
                    kSequenceStart, kSegmentFields };

// The index of state element (key, value) of a [K, V] (kKeyMajor) or [V, K] state.
template <bool kKeyMajor, int kHeadDim>
__device__ __forceinline__ long long state_at(int key, int value) {
    return kKeyMajor ? static_cast<long long>(key) * kHeadDim + value : static_cast<long long>(value) * kHeadDim + key;
}

// Whether the call's cu_seqlens bound `sequence` otherwise than the plan, whose addresses the kernels use:
// [sequence_start, end_token) (a plan used for other lengths). None (null) refuses nothing: without cu_seqlens
// the host checks the plan against the batch's equal lengths. A refused sequence then runs from a NaN state, so
// what it writes comes out NaN, not finite and wrong.
__device__ __forceinline__ bool plan_refused(const void* cu_seqlens, long long cu_seqlens_is_int64, int sequence,
                                             int sequence_start, int end_token) {
    if (cu_seqlens == nullptr) return false;
    const long long begin = cu_seqlens_is_int64 ? static_cast<const long long*>(cu_seqlens)[sequence]
                                                : static_cast<const int*>(cu_seqlens)[sequence];
    const long long end = cu_seqlens_is_int64 ? static_cast<const long long*>(cu_seqlens)[sequence + 1]
                                              : static_cast<const int*>(cu_seqlens)[sequence + 1];
    return begin != sequence_start || end != end_token;
}

// The decay-bounded shortcut of a segment's summary: the last of the segment's `chunks` chunks (from chunk
// first_chunk of the plan; gated_delta_rule_kkt wrote each chunk's gate cumsum to gamma_log2, [chunk, v-head, token],
// log2 units, the last token's being the chunk's sum)
// from which head_v's gates to the segment's end sum below `negligible`, or -1 where there is none (always
// when negligible is -inf). What the state before that chunk passes to the segment's end is then below fp32
// rounding. Walked back from the end kThreads chunks a step, a chunk a thread; `scratch` holds 2 kThreads / 32
// floats no one else uses yet. Every thread returns the same chunk (they read the same sums). kFromStart, for the
// backward's reverse recurrence: the mirror, the first chunk up to which (itself included) the gates from the
// segment's start sum below `negligible`; what the state gradient after it passes to the segment's start is then
// below fp32 rounding.
template <int kThreads, bool kFromStart = false>
__device__ __forceinline__ int negligible_since(const float* gamma_log2, int first_chunk, int chunks, int heads_v,
                                                 int head_v, float negligible, float* scratch) {
    constexpr int kWarps = kThreads / 32;
    if (!(negligible > -inf())) return -1;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float running = 0.f;  // the gates of the chunks after this step's
    for (int top = chunks; top > 0; top -= kThreads) {  // chunks [top - kThreads, top)
        const int chunk = top - kThreads + static_cast<int>(threadIdx.x);
        const int at = kFromStart ? chunks - 1 - chunk : chunk;  // the walk's chunks, mirrored for kFromStart
        float suffix = chunk >= 0 ? kLn2 * gamma_log2[(static_cast<long long>(first_chunk + at) * heads_v + head_v) * kChunk + kChunk - 1] : 0.f;
        // The sum from this chunk to the step's end: later chunks are higher lanes, then higher warps.
#pragma unroll
        for (int offset = 1; offset < 32; offset *= 2) {
            const float later = __shfl_down_sync(0xffffffffu, suffix, offset);
            if (lane + offset < 32) suffix += later;
        }
        if (lane == 0) scratch[warp] = suffix;  // the warp's sum
        __syncthreads();
        float step = 0.f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) {
            step += scratch[w];
            if (w > warp) suffix += scratch[w];
        }
        const unsigned below = __ballot_sync(0xffffffffu, chunk >= 0 && running + suffix < negligible);
        if (lane == 0) scratch[kWarps + warp] = below ? static_cast<float>(31 - __clz(below)) : -1.f;  // its last
        __syncthreads();
        int found = -1;
        for (int w = kWarps - 1; w >= 0 && found < 0; --w) {
            if (scratch[kWarps + w] >= 0.f) found = top - kThreads + 32 * w + static_cast<int>(scratch[kWarps + w]);
        }
        __syncthreads();  // scratch is rewritten by the next step
        if (found >= 0) return kFromStart ? chunks - 1 - found : found;
        running += step;
    }
    return -1;
}

template <class Config>
struct Recurrence {
    using T = typename Config::T;
    static constexpr int kHeadDim = Config::kHeadDim, kSliceV = Config::kSliceV, kThreads = Config::kThreads;
    static constexpr bool kHasIncompleteTile = Config::kHasIncompleteTile, kKeyMajor = Config::kKeyMajor;
    static constexpr int kValueTiles = kSliceV / 8;   // accumulator column blocks of a value slice
    static constexpr int kKeyTiles = kHeadDim / 8;    // ... of S^T's key columns
    static constexpr int kPanelBytes = kChunk * 128;  // one 64-column panel of a 64-row tile
    // The wide output kernel's block covers the whole head dim: one state warpgroup per value slice, beside
    // one output warpgroup, so that Q K^T, Q S's Q, and the K, Q and Tbeta tiles serve every slice once (two
    // blocks of one slice each ran the recurrence at the SM's shared-memory bandwidth: bench/NOTES.md,
    // eighteenth session). The sliced output kernel's block owns one slice, with its output warpgroup; the
    // summary and states kernels run one state warpgroup of one slice.
    static constexpr int kWideGroups = kHeadDim / kSliceV;
    static constexpr int kWideThreads = (kWideGroups + 1) * kThreads;

    // Every tile a whole number of swizzle repeats, from a base aligned to one. Value tiles hold kGroups
    // slices, one 64-column panel each, in a state warpgroup's order. What the state warpgroups read is
    // double-buffered, so the next chunk's loads go out at a chunk's first barrier.
    enum Load { kLoadK0, kLoadK1, kLoadTbeta0, kLoadTbeta1, kLoadV0, kLoadV1, kLoadQ, kLoads };  // an mbarrier each
    template <int kGroups>
    struct alignas(64) Tiles {
        T k[2][kChunk * kHeadDim];     // this chunk's and the next one's
        T tbeta[2][kChunk * kChunk];   // likewise
        T v[2][kChunk * kSliceV * kGroups];
        T q[kChunk * kHeadDim];
        T state[kSliceV * kGroups * kHeadDim];  // S^T's 16-bit copy: K S's A operand, and Q S's B operand
        T vn[kSliceV * kGroups * kChunk];       // Vn^T for the output's P Vn (value rows, one panel of tokens)
        unsigned long long loaded[kLoads];      // TMA loads of a full chunk have landed
        float q_scale[kChunk], k_scale[kChunk];  // 1 / |row| with in-kernel l2norm
        float k_scale_output[kChunk];            // k's, the output warpgroup's own copy
        // Each state warp's gate factors of the chunk's tokens (column_factors: e^Gamma / |k| and
        // e^{Gamma_last - Gamma} / |k|), made once per lane pair instead of once per accumulator column.
        float2 token_factors[kGroups * kThreads / 32][kChunk];
    };
    // Named barriers (0 is __syncthreads'): the state warpgroups'; the output warpgroup's own; then, between
    // them in the output kernel, one for each hand-over: what one side arrives at when its part is done, the
    // other waits at before it reads.
    enum { kStateBarrier = 1, kOutputBarrier, kStateReady, kOutputDone, kVnReady, kVnFree };
    static_assert(sizeof(T) * kChunk * kSliceV % kSwizzleAlignment == 0 &&
                  sizeof(T) * kSliceV * kHeadDim % kSwizzleAlignment == 0, "tiles of whole swizzle repeats");
    // Each with the slack to align it.
    static constexpr int kDynamicSmemBytes = sizeof(Tiles<1>) + kSwizzleAlignment;
    static constexpr int kWideDynamicSmemBytes = sizeof(Tiles<kWideGroups>) + kSwizzleAlignment;

    // Descriptors of k16 step kk: K-major tiles of kRows rows (the reduction over 64-column panels),
    // and MN-major 64-row tiles (the reduction over rows, 16 of them per step).
    template <int kRows>
    __device__ static __forceinline__ unsigned long long k_major(unsigned tile, int kk) {
        return k_major_descriptor(tile + (kk / 4) * kRows * 128 + (kk % 4) * 32);
    }
    __device__ static __forceinline__ unsigned long long mn_major(unsigned tile, int kk) {
        return mn_major_descriptor(tile + kk * 16 * 128, kPanelBytes);
    }

    // The kernels' parameters in the contract's order (chunk.cu.j2 passes them by the contract's
    // names). Taken one by one, not as one struct, whose loads ptxas schedules differently.
    // kSummary: the segment's summary (chunk.cu.j2). kStates (the backward's recompute): no output; ``out``
    // receives, before every chunk, the 16-bit S^T of this block's value slice, [chunk, v-head, V, K], and
    // state_residuals (unless null) what that rounding lost (tiles.cuh's store_residual_rows), in the same places.
    // The output kernels (neither) run one state warpgroup per slice (kWide: kWideGroups, else one) and an
    // output warpgroup: the state ones carry their slices of the state from chunk to chunk, in step; the last
    // computes O from what they leave in shared memory, so that the state's chain of products waits for none
    // of O's (a single warpgroup doing both spent two thirds of each chunk on O's products, masks and stores:
    // bench/NOTES.md, seventeenth session). The others run one state warpgroup alone.
    template <bool kSummary, bool kStates = false, bool kWide = false>
    __device__ static __forceinline__ void run(const kgen::TmaDescriptor& map_q, const kgen::TmaDescriptor& map_k,
                                               const kgen::TmaDescriptor& map_v, const kgen::TmaDescriptor& map_tbeta,
                                               const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                               const T* __restrict__ tbeta, const float* __restrict__ gamma_log2,
                                               const int* __restrict__ segments,
                                               const void* __restrict__ cu_seqlens, long long cu_seqlens_is_int64, const float* __restrict__ initial_state,
                                               const float* __restrict__ start_states, float* __restrict__ summary,
                                               int* __restrict__ negligible_summaries,
                                               T* __restrict__ out, unsigned char* __restrict__ state_residuals,
                                               float* __restrict__ final_state, long long num_heads,
                                               long long num_heads_v, float scale, long long use_qk_l2norm,
                                               float negligible_log_decay) {
        constexpr bool kOutput = !kSummary && !kStates;  // reads Q and writes O, in a warpgroup of its own
        constexpr int kGroups = kOutput && kWide ? kWideGroups : 1;  // state warpgroups
        constexpr int kStateThreads = kGroups * kThreads, kBlockThreads = kStateThreads + (kOutput ? kThreads : 0);
        constexpr int kBlockValues = kGroups * kSliceV;  // value columns of the block's tiles
        extern __shared__ unsigned char smem_bytes[];
        auto& smem = *reinterpret_cast<Tiles<kGroups>*>(kgen::align_up<kgen::kSwizzleAlignment>(smem_bytes));
        const int warpgroup = kgen::warp_index() / 4;
        const bool output_role = kOutput && warpgroup == kGroups;
        const int group = kGroups == 1 || output_role ? 0 : warpgroup;  // a state warpgroup's slice of the block's
        const int thread = threadIdx.x % kThreads, warp = thread / 32, lane = threadIdx.x % 32;  // in the warpgroup
        // Issues the TMA loads: the output warpgroup's of Q, the first state warpgroup's of the others.
        const bool issuer = thread == 0 && (output_role || group == 0);
        const int* const segment = segments + kSegmentFields * blockIdx.z;
        const int sequence = segment[kSequence], end_token = segment[kEndToken];
        int first_token = segment[kFirstToken], first_chunk = segment[kFirstChunk], chunks = segment[kChunks];
        const int heads_v = static_cast<int>(num_heads_v), head_v = blockIdx.y;
        const int head = head_v / (heads_v / static_cast<int>(num_heads));
        const int column0 = blockIdx.x * kBlockValues + group * kSliceV;
        // Summary: the first K augmented columns are M's (start I, no values), the rest h's.
        const bool transition = kSummary && column0 < kHeadDim;
        const int value0 = kSummary && !transition ? column0 - kHeadDim : column0;  // this warpgroup's first
        const int block_value0 = value0 - group * kSliceV;  // the block's first value column
        const long long qk_stride = num_heads * kHeadDim, v_stride = static_cast<long long>(heads_v) * kHeadDim;

        if (threadIdx.x == 0) {
#pragma unroll
            for (int i = 0; i < kLoads; ++i) kgen::mbarrier_init(kgen::smem_addr(&smem.loaded[i]), 1);
            kgen::mbarrier_init_fence();
        }
        __syncthreads();
        // The decay-bounded shortcut (negligible_log_decay = -inf: never): where the gates from some chunk to the
        // segment's end sum below it, the state before that chunk reaches the end below fp32 rounding (transitions
        // have norm at most e^sum for non-expanding tokens: see the planner's exact_split). So M is 0 and runs no
        // chunk, and h runs from that chunk on, from a zero state.
        bool negligible = false;
        if (kSummary) {
            const int from = negligible_since<kThreads>(gamma_log2, first_chunk, chunks, heads_v, head_v,
                                                        negligible_log_decay, smem.q_scale);
            negligible = from >= 0;
            const int skipped = negligible ? from : 0;
            first_token += skipped * kChunk, first_chunk += skipped, chunks -= skipped;
            if (negligible && transition) chunks = 0;
            // The chain skips a negligible M (all zeros) instead of reading it: one flag per summary, from its first block.
            if (blockIdx.x == 0 && threadIdx.x == 0) {
                negligible_summaries[static_cast<long long>(segment[kSummarySlot]) * heads_v + head_v] = negligible;
            }
        }
        auto token_of = [&](int c) { return first_token + c * kChunk; };
        // Only a segment's last chunk can be incomplete, so a full chunk's loads are its barriers'
        // (c / 2)-th (K) and c-th (the others) phases.
        auto is_full = [&](int c) { return !kHasIncompleteTile || end_token - token_of(c) >= kChunk; };
        // One tile of a full chunk by TMA (its warpgroup's issuer only): K, Q, V or Tbeta.
        auto load_full = [&](Load which, int c) {
            if (!issuer) return;
            const unsigned bar = kgen::smem_addr(&smem.loaded[which]);
            const int token = token_of(c);
            if (which == kLoadK0 || which == kLoadK1 || which == kLoadQ) {
                T* const tile = which == kLoadQ ? smem.q : smem.k[which - kLoadK0];
                kgen::mbarrier_arrive_expect_tx(bar, kChunk * kHeadDim * sizeof(T));
#pragma unroll
                for (int panel = 0; panel < kHeadDim / 64; ++panel) {
                    kgen::tma_load_3d(kgen::smem_addr(tile + panel * kChunk * 64), which == kLoadQ ? &map_q : &map_k, 64 * panel,
                                      head, token, bar);
                }
            } else if (which == kLoadV0 || which == kLoadV1) {
                kgen::mbarrier_arrive_expect_tx(bar, kChunk * kBlockValues * sizeof(T));
#pragma unroll
                for (int panel = 0; panel < kGroups; ++panel) {
                    kgen::tma_load_3d(kgen::smem_addr(smem.v[which - kLoadV0] + panel * kChunk * kSliceV), &map_v, block_value0 + panel * kSliceV,
                                      head_v, token, bar);
                }
            } else {
                kgen::mbarrier_arrive_expect_tx(bar, kChunk * kChunk * sizeof(T));
                kgen::tma_load_3d(kgen::smem_addr(smem.tbeta[which - kLoadTbeta0]), &map_tbeta, 0, 0,
                                  ((first_chunk + c) * heads_v + head_v) * kChunk, bar);
            }
        };
        // Every tile of an incomplete chunk by cp.async, rows past the sequence zero-filled, from the warpgroup
        // that loads them (the output's where there is one, which has registers to spare, once it has read the
        // chunk before's Vn; the buffers the state reads next are free by then).
        const bool tail_loader = kOutput ? output_role : true;
        auto load_incomplete = [&](int c) {
            const int token = token_of(c), valid = end_token - token;
            if (kOutput) load_tile<kHeadDim, kThreads, kHasIncompleteTile>(smem.q, q + token * qk_stride + head * kHeadDim, qk_stride, valid, thread);
            load_tile<kHeadDim, kThreads, kHasIncompleteTile>(smem.k[c % 2], k + token * qk_stride + head * kHeadDim, qk_stride, valid, thread);
            if (!transition) {
                load_tile<kBlockValues, kThreads, kHasIncompleteTile>(smem.v[c % 2], v + token * v_stride + head_v * kHeadDim + block_value0,
                                                                      v_stride, valid, thread);
            }
            load_tile<kChunk, kThreads, false>(smem.tbeta[c % 2], tbeta + (static_cast<long long>(first_chunk + c) * heads_v + head_v) * kChunk * kChunk,
                                               kChunk, kChunk, thread);
            kgen::cp_async_commit();
        };
        // Waits for the tiles of chunk c this warpgroup reads (the output's: K and Q; the state's: K, V and Tbeta).
        auto wait_chunk = [&](int c, bool output_role) {
            if (is_full(c)) {
                kgen::mbarrier_wait(kgen::smem_addr(&smem.loaded[kLoadK0 + c % 2]), (c / 2) % 2);
                if (output_role) {
                    kgen::mbarrier_wait(kgen::smem_addr(&smem.loaded[kLoadQ]), c % 2);
                } else {
                    if (!transition) kgen::mbarrier_wait(kgen::smem_addr(&smem.loaded[kLoadV0 + c % 2]), (c / 2) % 2);
                    kgen::mbarrier_wait(kgen::smem_addr(&smem.loaded[kLoadTbeta0 + c % 2]), (c / 2) % 2);
                }
            } else {
                kgen::cp_async_wait<0>();
            }
        };
        // Chunk c's Gamma (log2 units) of tokens 2 lane and 2 lane + 1, one chunk ahead of its use.
        auto load_gamma = [&](int c) {
            return reinterpret_cast<const float2*>(gamma_log2 + (static_cast<long long>(first_chunk + c) * heads_v + head_v) * kChunk)[lane];
        };
        float2 gamma_next;
        if (chunks > 0) {  // an empty sequence's segment only passes its start state on
            if (is_full(0)) {
                if (output_role) {
                    load_full(kLoadQ, 0);
                } else {
                    load_full(kLoadK0, 0);
                    if (!transition) load_full(kLoadV0, 0);
                    load_full(kLoadTbeta0, 0);
                }
            } else if (tail_loader) {
                load_incomplete(0);
            }
            gamma_next = load_gamma(0);
        }
        // Accumulator rows 16 warp + lane / 4 (+ 8), columns 8 n + 2 (lane % 4) (+ 1), in any warpgroup.
        const int row = 16 * warp + lane / 4, fragment_column = 2 * (lane % 4);
        const unsigned state_tile = kgen::smem_addr(smem.state), vn_tile = kgen::smem_addr(smem.vn);
        // A state warpgroup's rows of S^T's copy.
        const unsigned state_rows = state_tile + group * kSliceV * 128;

        if (output_role) {
            // O = scale (diag(e^Gamma) Q S + P Vn), P = Q K^T * LowerIncl * e^{Gamma_i - Gamma_j}. P needs no
            // state, so it is made while the state warpgroups finish the chunk before; Q S once S^T's copy is
            // in (beside the state's K S), P Vn once Vn is (beside the state's update). It computes every
            // value column of O.
            const unsigned q_tile = kgen::smem_addr(smem.q);
            for (int c = 0; c < chunks; ++c) {
                const bool next_full = c + 1 < chunks && is_full(c + 1);
                const int token = first_token + c * kChunk, valid = end_token - token;
                const float2 gamma = gamma_next;  // log2 units
                wait_chunk(c, true);
                if (!is_full(c)) {  // this warpgroup loaded it by cp.async, for all
                    kgen::fence_proxy_async_shared();
                    __syncthreads();
                }
                if (c + 1 < chunks) gamma_next = load_gamma(c + 1);
                float q_scale[2] = {1.f, 1.f};
                if (use_qk_l2norm) {
                    inverse_row_norms<kHeadDim>(smem.q, smem.q_scale, thread);
                    inverse_row_norms<kHeadDim>(smem.k[c % 2], smem.k_scale_output, thread);
                    kgen::named_barrier_sync(kOutputBarrier, kThreads);
#pragma unroll
                    for (int half = 0; half < 2; ++half) q_scale[half] = smem.q_scale[row + 8 * half];
                }
                const float gamma_row[2] = {gamma_of(gamma, row), gamma_of(gamma, row + 8)};
                const unsigned k_tile = kgen::smem_addr(smem.k[c % 2]);
                float p[kChunk / 8][4];
                kgen::wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < kHeadDim / 16; ++kk) {
                    kgen::wgmma_ss<kChunk, 0>(p, k_major<kChunk>(q_tile, kk), k_major<kChunk>(k_tile, kk), kk > 0);
                }
                kgen::wgmma_commit();
                kgen::wgmma_wait<0>();
                kgen::fence_operands(p);
                // P's 16-bit A fragments.
                unsigned p_frag[kChunk / 16][4];
#pragma unroll
                for (int n = 0; n < kChunk / 8; ++n) {
                    const float2 columns = gamma_of_columns(gamma, n, lane);
                    const float gamma_column[2] = {columns.x, columns.y};
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int i = row + (e / 2) * 8, j = 8 * n + fragment_column + e % 2;
                        const float norms = use_qk_l2norm ? q_scale[e / 2] * smem.k_scale_output[j] : 1.f;
                        p[n][e] = j <= i ? norms * p[n][e] * kgen::exp2_ftz(gamma_row[e / 2] - gamma_column[e % 2]) : 0.f;
                    }
                }
                kgen::gdn::accumulators_as_a<T, kChunk / 8>(p_frag, p);

                kgen::named_barrier_sync(kStateReady, kBlockThreads);  // S^T's copy for this chunk
                float qs[kGroups * kValueTiles][4];
                kgen::wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < kHeadDim / 16; ++kk) {
                    kgen::wgmma_ss<kBlockValues, 0>(qs, k_major<kChunk>(q_tile, kk), k_major<kBlockValues>(state_tile, kk), kk > 0);
                }
                kgen::wgmma_commit();
                kgen::wgmma_wait<0>();
                kgen::fence_operands(qs);
                kgen::named_barrier_arrive(kOutputDone, kBlockThreads);  // S^T's copy and this chunk's K are read
                if (next_full) load_full(kLoadQ, c + 1);  // and Q
                // O's first term, diag(e^Gamma) Q S.
#pragma unroll
                for (int n = 0; n < kGroups * kValueTiles; ++n) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) qs[n][e] *= kgen::exp2_ftz(gamma_row[e / 2]) * q_scale[e / 2];
                }

                kgen::named_barrier_sync(kVnReady, kBlockThreads);  // Vn^T is in its tile
                kgen::fence_operands(p_frag);
                kgen::wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < kChunk / 16; ++kk) kgen::wgmma_rs<kBlockValues, 0>(qs, p_frag[kk], k_major<kBlockValues>(vn_tile, kk), true);
                kgen::wgmma_commit();
                kgen::wgmma_wait<0>();
                kgen::fence_operands(qs);
                if (c + 1 < chunks) kgen::named_barrier_arrive(kVnFree, kBlockThreads);  // the next W may overwrite it
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                    const int r = row + 8 * half;
                    if (kHasIncompleteTile && r >= valid) continue;
                    T* const o = out + (static_cast<long long>(token + r) * heads_v + head_v) * kHeadDim + value0 + fragment_column;
#pragma unroll
                    for (int n = 0; n < kGroups * kValueTiles; ++n) {
                        *reinterpret_cast<unsigned*>(o + 8 * n) = kgen::pack2<T>(scale * qs[n][2 * half], scale * qs[n][2 * half + 1]);
                    }
                }
                // Q is read; the next chunk's K, V and Tbeta buffers were last read by the chunk before, which the
                // state warpgroups finished before kVnReady.
                if (c + 1 < chunks && !next_full) load_incomplete(c + 1);
            }
            return;
        }

        // The state: S^T's accumulators, value rows x key columns.
        float s[kKeyTiles][4];
        {
            const float* start = nullptr;  // [K, V] as the layout stores it; none: zero (NaN when refused)
            bool key_major = kKeyMajor;
            const bool refused = !kSummary && plan_refused(cu_seqlens, cu_seqlens_is_int64, sequence,
                                                           segment[kSequenceStart], end_token);
            if (!kSummary && !refused) {
                if (segment[kStartSlot] >= 0) {
                    start = start_states + (static_cast<long long>(segment[kStartSlot]) * heads_v + head_v) * kHeadDim * kHeadDim;
                    key_major = true;  // the chain writes [K, V]
                } else if (initial_state != nullptr) {
                    start = initial_state + (static_cast<long long>(sequence) * heads_v + head_v) * kHeadDim * kHeadDim;
                }
            }
#pragma unroll
            for (int n = 0; n < kKeyTiles; ++n) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int column = row + (e / 2) * 8, key = 8 * n + fragment_column + e % 2;
                    if (kSummary) {
                        s[n][e] = transition && !negligible && key == column0 + column ? 1.f : 0.f;
                    } else {
                        const int value = value0 + column;
                        s[n][e] = start == nullptr ? (refused ? quiet_nan() : 0.f)
                                  : start[key_major ? static_cast<long long>(key) * kHeadDim + value
                                                    : static_cast<long long>(value) * kHeadDim + key];
                    }
                }
            }
            store_accumulators<kHeadDim, T, kKeyTiles, kBlockValues>(smem.state, s, kSliceV * group + 16 * warp, lane);
            if (chunks > 0) {
                kgen::fence_proxy_async_shared();  // read by wgmma (K S's, and the output's Q S)
                if (kOutput) kgen::named_barrier_arrive(kStateReady, kBlockThreads);
            }
        }

        // The chain runs transposed, with each product's A operand in registers: (K S)^T = S^T K^T from S^T's copy,
        // Vn^T = W^T Tbeta^T from W^T's fragments, S^T += Vn_decayed^T K from Vn_decayed^T's, so that W and Vn never
        // go through shared memory (in the other orientation each was stored, fenced and waited for at a barrier,
        // and every product read both operands from shared memory: bench/NOTES.md, nineteenth session).
        // Accumulator column j of these products is token j of the chunk.
        for (int c = 0; c < chunks; ++c) {
            const bool next_full = c + 1 < chunks && is_full(c + 1);
            const float2 gamma = gamma_next;  // log2 units
            if (kStates) {  // S^T before this chunk, 16-bit, as the backward reads it, and what that rounding lost
                const long long at = (static_cast<long long>(first_chunk + c) * heads_v + head_v) * kHeadDim * kHeadDim;
                store_rows<T, kHeadDim>(out + at, s, value0 + row, lane);
                if (state_residuals != nullptr) store_residual_rows<T, kHeadDim>(state_residuals + at, s, value0 + row, lane);
            }
            wait_chunk(c, false);
            if (!is_full(c)) kgen::fence_proxy_async_shared();  // cp.async tiles are read by wgmma
            if (kOutput && !is_full(c)) {
                __syncthreads();  // the output warpgroup loaded this chunk
            } else {
                kgen::named_barrier_sync(kStateBarrier, kStateThreads);
            }
            // The other buffers' last readers are done: the state warpgroups' chunk before and, before
            // kOutputDone, the output's P and Q S of it.
            if (next_full) {
                load_full(Load(kLoadK0 + (c + 1) % 2), c + 1);
                if (!transition) load_full(Load(kLoadV0 + (c + 1) % 2), c + 1);
                load_full(Load(kLoadTbeta0 + (c + 1) % 2), c + 1);
            }
            const unsigned k_tile = kgen::smem_addr(smem.k[c % 2]);
            // Each step below issues its product, then does what does not depend on it while the product runs.
            float ks[kChunk / 8][4];  // (K S)^T
            kgen::wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < kHeadDim / 16; ++kk) {
                kgen::wgmma_ss<kChunk, 0>(ks, k_major<kBlockValues>(state_rows, kk), k_major<kChunk>(k_tile, kk), kk > 0);
            }
            kgen::wgmma_commit();

            if (c + 1 < chunks) gamma_next = load_gamma(c + 1);
            // In-kernel l2norm: rows of k scale the products instead of being rounded normalised.
            if (use_qk_l2norm) {
                inverse_row_norms<kHeadDim>(smem.k[c % 2], smem.k_scale, thread + group * kThreads);  // the first's
                kgen::named_barrier_sync(kStateBarrier, kStateThreads);
            }
            // This warp's factors of tokens 2 lane and 2 lane + 1, for every lane to read its columns'.
            const float gamma_last = __shfl_sync(0xffffffffu, gamma.y, 31);
            float2* const token_factors = smem.token_factors[group * (kThreads / 32) + warp];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const float key = use_qk_l2norm ? smem.k_scale[2 * lane + e] : 1.f, gamma_token = e ? gamma.y : gamma.x;
                token_factors[2 * lane + e] = make_float2(kgen::exp2_ftz(gamma_token) * key, kgen::exp2_ftz(gamma_last - gamma_token) * key);
            }
            __syncwarp();
            // The factors of accumulator column block n's columns 8 n + fragment_column (+ 1).
            auto column_factors = [&](int n, int e) { return token_factors[8 * n + fragment_column + e]; };
            kgen::wgmma_wait<0>();
            kgen::fence_operands(ks);

            // W^T = V^T - (K S)^T diag(e^Gamma / |k|), as A fragments (accumulators_as_a's packing: fragment n / 2,
            // register 2 (n % 2) + half holds column block n's rows + 8 half), V^T's read in the same packing by
            // ldmatrix.trans of this warpgroup's panel of V.
            const T* const v_panel = smem.v[c % 2] + group * kChunk * kSliceV;
            unsigned w[kChunk / 16][4];
#pragma unroll
            for (int kk = 0; kk < kChunk / 16; ++kk) {
                unsigned values[4] = {0u, 0u, 0u, 0u};  // the transition's columns have no values
                if (!transition) load_a_transposed<kSliceV>(values, v_panel, 16 * warp, 16 * kk, lane);
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int n = 2 * kk + i / 2, half = i % 2;
                    const float2 value = kgen::unpack2<T>(values[i]);
                    w[kk][i] = kgen::pack2<T>(value.x - column_factors(n, 0).x * ks[n][2 * half],
                                              value.y - column_factors(n, 1).x * ks[n][2 * half + 1]);
                }
            }

            // Vn^T = W^T Tbeta^T; meanwhile S^T's decay over the chunk.
            float vn[kChunk / 8][4];
            const unsigned tbeta_tile = kgen::smem_addr(smem.tbeta[c % 2]);
            kgen::fence_operands(w);
            kgen::wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < kChunk / 16; ++kk) kgen::wgmma_rs<kChunk, 0>(vn, w[kk], k_major<kChunk>(tbeta_tile, kk), kk > 0);
            kgen::wgmma_commit();
            scale_accumulators(s, kgen::exp2_ftz(gamma_last));
            kgen::wgmma_wait<0>();
            kgen::fence_operands(vn);

            // S^T = e^{Gamma_last} S^T + (diag(e^{Gamma_last - Gamma} / |k|) Vn)^T K; meanwhile Vn^T's copy for O's
            // P Vn.
            unsigned vn_decayed[kChunk / 16][4];
#pragma unroll
            for (int n = 0; n < kChunk / 8; ++n) {
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                    vn_decayed[n / 2][2 * (n % 2) + half] =
                        kgen::pack2<T>(column_factors(n, 0).y * vn[n][2 * half], column_factors(n, 1).y * vn[n][2 * half + 1]);
                }
            }
            kgen::fence_operands(vn_decayed);
            kgen::fence_operands(s);
            kgen::wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < kChunk / 16; ++kk) kgen::wgmma_rs<kHeadDim, 1>(s, vn_decayed[kk], mn_major(k_tile, kk), true);
            kgen::wgmma_commit();
            if (kOutput) {
                if (c > 0) kgen::named_barrier_sync(kVnFree, kBlockThreads);  // O's P Vn of the chunk before is done
                store_accumulators<kChunk, T, kChunk / 8, kBlockValues>(smem.vn, vn, kSliceV * group + 16 * warp, lane);
                kgen::fence_proxy_async_shared();
                kgen::named_barrier_arrive(kVnReady, kBlockThreads);
            }
            kgen::wgmma_wait<0>();
            kgen::fence_operands(s);
            if (kOutput) kgen::named_barrier_sync(kOutputDone, kBlockThreads);  // O has read S^T's copy
            store_accumulators<kHeadDim, T, kKeyTiles, kBlockValues>(smem.state, s, kSliceV * group + 16 * warp, lane);
            if (c + 1 < chunks) {
                kgen::fence_proxy_async_shared();  // read by wgmma (K S's, and the output's Q S)
                if (kOutput) kgen::named_barrier_arrive(kStateReady, kBlockThreads);
            }
            // An incomplete next chunk loads now that this one reads no tile any more.
            if (!kOutput && c + 1 < chunks && !next_full) load_incomplete(c + 1);
        }

        // The segment's end state: its summary columns, or the sequence's final state.
        float* dest = nullptr;
        long long key_stride = 0, value_stride = 1;
        if (kSummary) {
            dest = summary + (static_cast<long long>(segment[kSummarySlot]) * heads_v + head_v) * kHeadDim * 2 * kHeadDim + column0;
            key_stride = 2 * kHeadDim;
        } else if (segment[kWritesFinal] && final_state != nullptr) {
            dest = final_state + (static_cast<long long>(sequence) * heads_v + head_v) * kHeadDim * kHeadDim + state_at<kKeyMajor, kHeadDim>(0, value0);
            key_stride = kKeyMajor ? kHeadDim : 1, value_stride = kKeyMajor ? 1 : kHeadDim;
        }
        if (dest == nullptr) return;
#pragma unroll
        for (int n = 0; n < kKeyTiles; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int column = row + (e / 2) * 8, key = 8 * n + fragment_column + e % 2;
                dest[key * key_stride + column * value_stride] = s[n][e];
            }
        }
    }
};

}  // namespace gdn
}  // namespace kgen
