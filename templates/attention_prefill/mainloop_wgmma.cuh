// The wgmma kernel (FlashAttention-3 style), for sm_90a.
//
// Warp roles: warpgroup 0 is the producer, in which one thread issues every TMA load;
// warpgroups 1.. are consumers, each owning 64 query rows (16 a warp). K and V stream
// through separate two-stage pipelines, each stage with a full mbarrier (TMA's bytes
// landed) and an empty one (every consumer warp is done reading). S = Q K^T reads both
// operands from shared memory; P stays in registers and is the A operand of O += P V.
// Each consumer issues S of key tile j before it waits for P V of tile j - 1, so the
// softmax of tile j runs while the tensor cores add tile j - 1.

static_assert(kTileM == 64 || kTileM == 128 || kTileM == 192,
              "attention_prefill: with mma=wgmma, tile_m must be 64, 128 or 192 (one consumer warpgroup per 64 rows)");
static_assert(kTileN % 16 == 0 && kTileN <= 256,
              "attention_prefill: with mma=wgmma, tile_n must be a multiple of 16 up to 256 (whole k16 steps of P V)");
static_assert(kWarps == kTileM / 16,
              "attention_prefill: with mma=wgmma, num_warps counts the consumer warps and must be tile_m / 16");
static_assert({{ min_blocks_per_sm }} == 1,
              "attention_prefill: with mma=wgmma, min_blocks_per_sm must be 1 (setmaxnreg needs one block per SM)");
static_assert(kSpanBytes == 128,
              "attention_prefill: with mma=wgmma, head_dim must be at least 64 (128-byte swizzle panels)");
static_assert(!kCpAsyncTail, "attention_prefill: with mma=wgmma, tail must be tma");


// Registers per thread after the split: the producer needs few, the consumers hold S, P and O.
constexpr int kProducerRegisters = kConsumerGroups == 3 ? 32 : 24;
constexpr int kConsumerRegisters = kConsumerGroups == 3 ? 160 : 240;
static_assert(kgen::kWarpgroupThreads * (kProducerRegisters + kConsumerGroups * kConsumerRegisters) <= 65536,
              "the register budgets exceed the register file");
// A consumer thread holds S (tile_n / 2 fp32), P (tile_n / 4) and O (head_dim / 2) for its 64-row
// group, and about 32 more registers of addresses and row state; past its budget ptxas gives up
// (or serialises wgmma), so such shapes are refused here with their axes named.
static_assert(kTileN * 3 / 4 + kHeadDim / 2 + 32 <= kConsumerRegisters,
              "attention_prefill: with mma=wgmma, tile_n and head_dim are too large for the consumer registers of "
              "this tile_m (S, P and O of 64 rows need 3/4 tile_n + head_dim / 2 + 32 of 240, or of 160 at tile_m 192)");
constexpr int kConsumerWarps = kConsumerThreads / 32;
constexpr int kConsumerBarrier = 1;  // named barrier of the consumer warps (0 is __syncthreads')
// Pingpong (two consumer warpgroups, head dims up to 128, as FlashAttention-3): the groups
// take turns on the tensor cores, so one computes its softmax while the other's products
// run. Group g waits on named barrier kTurnBarrier + g before issuing, and hands the turn
// over by arriving on the other's after.
constexpr bool kPingpong = kConsumerGroups == 2 && kHeadDim <= 128;
constexpr int kTurnBarrier = 2;  // ids 2 and 3
constexpr int kStepsPerPanel = kSpanBytes / 32;  // k16 steps of Q K^T inside one 128-byte panel

// The pipelines' mbarriers, 8 bytes each in the barrier area.
struct Barriers {
    unsigned base;
    __device__ unsigned k_full(int stage) const { return base + 8 * stage; }
    __device__ unsigned k_empty(int stage) const { return base + 16 + 8 * stage; }
    __device__ unsigned v_full(int stage) const { return base + 32 + 8 * stage; }
    __device__ unsigned v_empty(int stage) const { return base + 48 + 8 * stage; }
    __device__ unsigned q_full() const { return base + 64; }
};

// Key tile i of a CTA's run lives in stage i % 2, and its phases alternate every two tiles.
__device__ __forceinline__ int stage_of(int i) { return i & 1; }
__device__ __forceinline__ unsigned parity_of(int i) { return (i >> 1) & 1; }

// A consumer warp is done with a buffer: one arrival per warp, after its wgmma wait.
__device__ __forceinline__ void release(unsigned bar, int lane) {
    if (lane == 0) kgen::mbarrier_arrive(bar);
}

// This group's turn to issue products (pingpong), and its hand-over to the other group.
__device__ __forceinline__ void take_turn(int group) {
    if constexpr (kPingpong) kgen::named_barrier_sync(kTurnBarrier + group, kConsumerThreads);
}

__device__ __forceinline__ void pass_turn(int group) {
    if constexpr (kPingpong) kgen::named_barrier_arrive(kTurnBarrier + (group ^ 1), kConsumerThreads);
}

// S = Q K^T of this warpgroup's 64 rows and one key tile, issued and committed, not waited for.
__device__ __forceinline__ void issue_scores(Scores& s, unsigned q_rows, unsigned k_tile) {
    kgen::fence_operands(s[0]);
    kgen::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        const int panel = kk / kStepsPerPanel, step = kk % kStepsPerPanel;
        const unsigned long long a = kgen::k_major_descriptor(q_rows + panel * kQBytes / kSpans + step * 32);
        const unsigned long long b = kgen::k_major_descriptor(k_tile + panel * kKVTileBytes / kSpans + step * 32);
        kgen::wgmma_ss<kTileN, 0>(s[0], a, b, kk > 0);
    }
    kgen::wgmma_commit();
    kgen::fence_operands(s[0]);
}

// O += P V for one key tile, issued and committed, not waited for.
__device__ __forceinline__ void issue_pv(RowState& state, Probabilities& p, unsigned v_tile) {
    kgen::fence_operands(state.o[0]);
    kgen::fence_operands(p[0]);
    kgen::wgmma_fence();
#pragma unroll
    for (int kb = 0; kb < kTileN / 16; ++kb) {
        // 16 keys are 16 rows of every panel; the panels (64 head-dim columns each) are kKVTileBytes / kSpans apart.
        const unsigned long long b = kgen::mn_major_descriptor(v_tile + kb * 16 * kSpanBytes, kKVTileBytes / kSpans);
        kgen::wgmma_rs<kHeadDim, 1>(state.o[0], p[0][kb], b, true);
    }
    kgen::wgmma_commit();
    kgen::fence_operands(state.o[0]);
    kgen::fence_operands(p[0]);
}

}  // namespace

{{ kernel_declaration }} {
    // The host adds kSwizzleAlignment bytes of slack so the tiles can start on a swizzle boundary.
    extern __shared__ unsigned char smem_raw[];
    const unsigned s_q = (kgen::smem_addr(smem_raw) + (kSwizzleAlignment - 1)) & ~(kSwizzleAlignment - 1u);
    const unsigned s_k = s_q + kQBytes;           // two stages
    const unsigned s_v = s_k + 2 * kKVTileBytes;  // two stages
    const Barriers bars{s_q + kBarrierOffset};
    if (threadIdx.x == 0) {
        for (int stage = 0; stage < 2; ++stage) {
            kgen::mbarrier_init(bars.k_full(stage), 1);
            kgen::mbarrier_init(bars.v_full(stage), 1);
            kgen::mbarrier_init(bars.k_empty(stage), kConsumerWarps);
            kgen::mbarrier_init(bars.v_empty(stage), kConsumerWarps);
        }
        kgen::mbarrier_init(bars.q_full(), 1);
        kgen::mbarrier_init_fence();
    }
    __syncthreads();

    const TileWork tile = tile_work(work, cu_seqlens_q, cu_seqlens_k, heads_per_kv, window_left, window_right);
    const int num_tiles = max(tile.n_end - tile.n_begin, 0);
    const int warp = kgen::warp_index(), lane = threadIdx.x % 32;

    if (warp < 4) {
        // ---- Producer: one thread loads Q once and K/V tile by tile, as the consumers free stages. ----
        kgen::release_registers<kProducerRegisters>();
        if (threadIdx.x == 0 && num_tiles > 0) {
            const unsigned long long read_once = kgen::l2_evict_first(), read_again = kgen::l2_evict_last();
            kgen::mbarrier_arrive_expect_tx(bars.q_full(), kQBytes);
            load_tile_tma<kTileM>(s_q, map_q, tile.q_start + tile.row0, tile.head, bars.q_full(), read_once);
            for (int i = 0; i < num_tiles; ++i) {
                const int stage = stage_of(i), first_key = tile.k_start + (tile.n_begin + i) * kTileN;
                // A fresh barrier's previous phase counts as complete, so the first pass does not wait.
                kgen::mbarrier_wait(bars.k_empty(stage), parity_of(i) ^ 1);
                kgen::mbarrier_arrive_expect_tx(bars.k_full(stage), kKVTileBytes);
                load_tile_tma<kTileN>(s_k + stage * kKVTileBytes, map_k, first_key, tile.kv_head, bars.k_full(stage), read_again);
                kgen::mbarrier_wait(bars.v_empty(stage), parity_of(i) ^ 1);
                kgen::mbarrier_arrive_expect_tx(bars.v_full(stage), kKVTileBytes);
                load_tile_tma<kTileN>(s_v + stage * kKVTileBytes, map_v, first_key, tile.kv_head, bars.v_full(stage), read_again);
            }
        }
        return;
    }

    // ---- Consumers ----
    kgen::claim_registers<kConsumerRegisters>();
    const int consumer_thread = threadIdx.x - kgen::kWarpgroupThreads;
    const int group = consumer_thread / kgen::kWarpgroupThreads;
    const int quad_row = lane / 4, quad_col = lane % 4;
    // This thread's rows: thread_row0 and 8 below it (wgmma's accumulator layout).
    const int thread_row0 = tile.row0 + 64 * group + 16 * ((consumer_thread / 32) % 4) + quad_row;
    auto row_of = [&](int i) { return thread_row0 + 8 * i; };
    const unsigned q_rows = s_q + 64 * group * kSpanBytes;  // the group's rows of the first panel

    RowState state;
#pragma unroll
    for (int db = 0; db < kHeadDim / 8; ++db)
#pragma unroll
        for (int e = 0; e < 4; ++e) state.o[0][db][e] = 0.f;
#pragma unroll
    for (int i = 0; i < 2; ++i) state.max[i] = -kgen::inf(), state.sum[i] = 0.f;

    auto mask_if_crossing = [&](Scores& s, int key0) {
        if (tile.crosses_boundary(key0)) mask_scores(s, tile.mask, key0, thread_row0, quad_col);
    };

    if (num_tiles > 0) {
        Scores s;
        Probabilities p;
        RowFactors correction;
        // Every turn taken is handed over: group 1 hands group 0 its first, and group 0 takes
        // one more turn at the end, the hand-over of group 1's last.
        if (group == 1) pass_turn(group);
        kgen::mbarrier_wait(bars.q_full(), 0);
        kgen::mbarrier_wait(bars.k_full(0), 0);
        take_turn(group);
        issue_scores(s, q_rows, s_k);
        pass_turn(group);
        kgen::wgmma_wait<0>();
        kgen::fence_operands(s[0]);
        release(bars.k_empty(0), lane);
        mask_if_crossing(s, tile.n_begin * kTileN);
        softmax_update(s, state, scale_log2, correction);  // O is still 0: no rescale
        pack_probabilities(s, p);
        for (int i = 1; i < num_tiles; ++i) {
            const int stage = stage_of(i), previous = stage_of(i - 1);
            kgen::mbarrier_wait(bars.k_full(stage), parity_of(i));
            kgen::mbarrier_wait(bars.v_full(previous), parity_of(i - 1));
            take_turn(group);
            issue_scores(s, q_rows, s_k + stage * kKVTileBytes);
            issue_pv(state, p, s_v + previous * kKVTileBytes);
            pass_turn(group);
            kgen::wgmma_wait<1>();  // S of tile i has landed; P V of tile i - 1 may still run
            kgen::fence_operands(s[0]);
            release(bars.k_empty(stage), lane);
            mask_if_crossing(s, (tile.n_begin + i) * kTileN);
            softmax_update(s, state, scale_log2, correction);
            kgen::wgmma_wait<0>();
            kgen::fence_operands(state.o[0]);
            release(bars.v_empty(previous), lane);
            rescale_output(state, correction);
            pack_probabilities(s, p);
        }
        const int last = num_tiles - 1, last_key0 = (tile.n_begin + last) * kTileN;
        kgen::mbarrier_wait(bars.v_full(stage_of(last)), parity_of(last));
        if constexpr (kTmaTail) {
            // Only a sequence's last key tile can be incomplete, and it is the run's last.
            if (last_key0 + kTileN > tile.lk) {
                clear_rows_past<kTileN, kConsumerThreads>(smem_raw + (s_v + stage_of(last) * kKVTileBytes - kgen::smem_addr(smem_raw)),
                                                          tile.lk - last_key0, consumer_thread);
                kgen::fence_proxy_async_shared();  // wgmma reads through the async proxy
                kgen::named_barrier_sync(kConsumerBarrier, kConsumerThreads);
            }
        }
        take_turn(group);
        issue_pv(state, p, s_v + stage_of(last) * kKVTileBytes);
        pass_turn(group);
        if (group == 0) take_turn(group);
        kgen::wgmma_wait<0>();
        kgen::fence_operands(state.o[0]);
    }

    const float sink_log2 = sink != nullptr ? sink[tile.head] * kgen::kLog2e : -kgen::inf();
    float* const lse_head = lse + tile.head * lse_stride_h + tile.q_start;
    // O goes through shared memory: into the Q buffer, whose last reader (this group's last S) is
    // done, each group writing only its own rows.
    unsigned char* const o_tile = smem_raw + (s_q - kgen::smem_addr(smem_raw));
    write_output(state, lse_head, tile.lq, sink_log2, quad_col, row_of, [&](int row, int db, unsigned pair) {
        *reinterpret_cast<unsigned*>(o_tile + chunk_offset<kTileM>(row - tile.row0, db) + 4 * quad_col) = pair;
    });
    if (!kHasTail || tile.row0 + kTileM <= tile.lq) {
        // A full tile: out by one TMA store per column block, once every consumer has written its rows.
        kgen::fence_proxy_async_shared();  // the TMA store reads through the async proxy
        kgen::named_barrier_sync(kConsumerBarrier, kConsumerThreads);
        if (consumer_thread == 0) {
#pragma unroll
            for (int b = 0; b < kSpans; ++b) {
                kgen::tma_store_3d(&map_o, s_q + b * kTileM * kSpanBytes, b * kSpanCols, tile.head, tile.q_start + tile.row0);
            }
            kgen::tma_store_commit();
            kgen::tma_store_wait_read();  // the block's shared memory must outlive the store's reads
        }
        return;
    }
    // The tail tile: each warp copies out the rows it wrote (16 from warp_row0), those inside the
    // sequence only, 16 bytes a lane at a time.
    __syncwarp();
    const int warp_row0 = 64 * group + 16 * ((consumer_thread / 32) % 4);
    const int rows = min(16, tile.lq - tile.row0 - warp_row0);
    T* const out_rows = out + static_cast<long long>(tile.q_start + tile.row0 + warp_row0) * o_stride_t + tile.head * o_stride_h;
    for (int idx = lane; idx < rows * kRowChunks; idx += 32) {
        const int row = idx / kRowChunks, chunk = idx % kRowChunks;
        *reinterpret_cast<uint4*>(out_rows + row * o_stride_t + chunk * 8) =
            *reinterpret_cast<const uint4*>(o_tile + chunk_offset<kTileM>(warp_row0 + row, chunk));
    }

}
