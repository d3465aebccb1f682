// The wgmma kernel (FlashAttention-3 style), for sm_90a.
//
// Warp roles: warpgroup 0 is the producer, in which one thread issues every TMA load;
// warpgroups 1.. are consumers, each owning 64 query rows (16 a warp). K and V stream
// through separate two-stage pipelines, each stage with a full mbarrier (TMA's bytes
// landed) and an empty one (every consumer warp is done reading). S = Q K^T reads both
// operands from shared memory; P stays in registers and is the A operand of O += P V.
// Each consumer issues S of key tile j before it waits for P V of tile j - 1, so the
// softmax of tile j runs while the tensor cores add tile j - 1.
//
// At three or more blocks an SM (tile_m 64 only) a block is one warpgroup and no producer: its first thread
// issues the loads, and K and V have one buffer each, refilled once every warp is done with it. Short items then
// overlap across blocks, not inside one (docs/prefill_short_sequences.md, step 2b). Such a block may also run a
// packed item (kPacked): 64 consecutive tokens of the batch, rows of several short sequences, each attending its own
// keys (rows.cuh, PackedWork), so that a 65-token sequence's last row shares a tile with the next one's first 63.
//
// Config: T, kHeadDim, kTileM, kTileN, kWarps, kMinBlocksPerSm, kHasIncompleteTile, kCpAsyncTail
// and kTmaTail (incomplete tiles load by cp.async, or as whole TMA boxes), kPacked; kernel.cu.j2 defines it.
// Needs common/ numeric, smem, swizzle, lse_merge, tma, wgmma (with widths tile_n and head_dim)
// and warp_roles; attention_common/ tiles and softmax; attention_prefill/ rows and shared_memory.
namespace kgen {
namespace attention_prefill {

template <class Config>
struct WgmmaKernel {
    using T = typename Config::T;
    static constexpr int kHeadDim = Config::kHeadDim, kTileM = Config::kTileM, kTileN = Config::kTileN;
    static constexpr int kWarps = Config::kWarps;
    static constexpr bool kHasIncompleteTile = Config::kHasIncompleteTile;
    static constexpr bool kCpAsyncTail = Config::kCpAsyncTail, kTmaTail = Config::kTmaTail;
    static constexpr bool kPacked = Config::kPacked;
    // One producer warpgroup (TMA) and tile_m / 64 consumer warpgroups, each consumer warp
    // owning 16 query rows; num_warps counts the consumer warps. From three blocks an SM, no producer.
    static constexpr bool kSingleWarpgroup = Config::kMinBlocksPerSm >= 3;
    static constexpr int kConsumerGroups = kTileM / 64;
    static constexpr int kConsumerThreads = kConsumerGroups * kWarpgroupThreads;
    static constexpr int kThreads = kConsumerThreads + (kSingleWarpgroup ? 0 : kWarpgroupThreads);
    static constexpr int kKVBuffers = kSingleWarpgroup ? 1 : 2;  // of K, and of V

    using QTile = attention::Tile<T, kHeadDim, kTileM>;
    using KVTile = attention::Tile<T, kHeadDim, kTileN>;
    static constexpr int kQBytes = QTile::kBytes, kKVTileBytes = KVTile::kBytes;
    static constexpr int kSpanBytes = QTile::kSpanBytes, kSpanCols = QTile::kSpanCols, kSpans = QTile::kSpans;
    static constexpr int kRowChunks = QTile::kRowChunks;
    // Full and empty mbarriers for two K and two V buffers, and Q's: 8 bytes each (a single warpgroup uses
    // the full ones of its one K and one V buffer, and Q's).
    // After them, a packed item's marks of V's non-finite rows, a bit a row (PackedWork's guard).
    static constexpr int kBarrierBytes = 128, kRowBitsOffset = 80, kRowBitWords = (kTileN + 31) / 32;
    static_assert(9 * 8 <= kRowBitsOffset && kRowBitsOffset + 4 * kRowBitWords <= kBarrierBytes,
                  "room for nine mbarriers and the row marks");
    using Smem = SharedMemory<QTile, KVTile, kBarrierBytes, kKVBuffers>;
    static constexpr int kDynamicSmemBytes = Smem::kDynamicBytes;
    // A consumer warpgroup's 64 rows: one row block of the softmax's fragments per warp.
    using RowState = attention::RowState<1, kHeadDim>;
    using Scores = attention::Scores<1, kTileN>;
    using Probabilities = attention::Probabilities<1, kTileN>;
    using RowFactors = attention::RowFactors<1>;

    static_assert(kTileM == 64 || kTileM == 128 || kTileM == 192,
                  "attention_prefill: with mma=wgmma, tile_m must be 64, 128 or 192 (one consumer warpgroup per 64 rows)");
    static_assert(kTileN % 16 == 0 && kTileN <= 256,
                  "attention_prefill: with mma=wgmma, tile_n must be a multiple of 16 up to 256 (whole k16 steps of P V)");
    static_assert(kWarps == kTileM / 16,
                  "attention_prefill: with mma=wgmma, num_warps counts the consumer warps and must be tile_m / 16");
    static_assert(Config::kMinBlocksPerSm == 1 || kConsumerGroups == 1,
                  "attention_prefill: with mma=wgmma, min_blocks_per_sm above 1 needs tile_m 64 (one consumer warpgroup: "
                  "two blocks' halves of the register file hold one each, and from three blocks there is no producer)");
    static_assert(kSpanBytes == 128,
                  "attention_prefill: with mma=wgmma, head_dim must be at least 64 (128-byte swizzle panels)");
    static_assert(!kCpAsyncTail, "attention_prefill: with mma=wgmma, tail must be tma");
    static_assert(!kPacked || (kSingleWarpgroup && kHasIncompleteTile),
                  "attention_prefill: rows=packed needs mma=wgmma at three or more blocks an SM, has_incomplete_tile=true");

    // A block's part of the register file: 65536 over the blocks an SM.
    static constexpr int kBlockRegisters = 65536 / Config::kMinBlocksPerSm;
    // Registers per thread after the split: the producer needs few, the consumers hold S, P and O. A block's
    // warpgroups share kBlockRegisters: two blocks of one producer and one consumer warpgroup each start at 128 a
    // thread, and the producer's 104 given back make the consumer's 232.
    static constexpr int kProducerRegisters = kConsumerGroups == 3 ? 32 : 24;
    static constexpr int kConsumerRegisters = kConsumerGroups == 3 ? 160 : Config::kMinBlocksPerSm == 2 ? 232 : 240;
    static_assert(kSingleWarpgroup ||
                      kWarpgroupThreads * (kProducerRegisters + kConsumerGroups * kConsumerRegisters) <= kBlockRegisters,
                  "the register budgets exceed the block's share of the register file");
    // A consumer thread holds S (tile_n / 2 fp32), P (tile_n / 4) and O (head_dim / 2) for its 64-row
    // group, and about 32 more registers of addresses and row state; past its budget ptxas gives up
    // (or serialises wgmma), so such shapes are refused here with their axes named.
    static_assert(kSingleWarpgroup || kTileN * 3 / 4 + kHeadDim / 2 + 32 <= kConsumerRegisters,
                  "attention_prefill: with mma=wgmma, tile_n and head_dim are too large for the consumer registers of "
                  "this tile_m (S, P and O of 64 rows need 3/4 tile_n + head_dim / 2 + 32 of 240, 232 at two blocks an SM, or 160 at tile_m 192)");
    // Above one block an SM ptxas compiles the consumers' products within the registers a thread starts with
    // (the block's share over its threads, in eights): head dim 256 at two blocks failed to compile ("insufficient
    // registers (128) to compile instruction"), and a single warpgroup at four blocks serialised its wgmma, so such
    // shapes are refused here, before ptxas. A single warpgroup also holds the loads' addresses: 32 beside S, P and O.
    static constexpr int kStartRegisters = kBlockRegisters / kThreads / 8 * 8;
    static_assert(Config::kMinBlocksPerSm == 1 || kTileN * 3 / 4 + kHeadDim / 2 + (kSingleWarpgroup ? 32 : 16) <= kStartRegisters,
                  "attention_prefill: with mma=wgmma above one block an SM, tile_n, head_dim or min_blocks_per_sm is too "
                  "large: S, P and O of 64 rows need 3/4 tile_n + head_dim / 2 + 16 (32 from three blocks) of the registers "
                  "a thread starts with (65536 / (threads x min_blocks_per_sm))");
    static constexpr int kConsumerWarps = kConsumerThreads / 32;
    static constexpr int kConsumerBarrier = 1;  // named barrier of the consumer warps (0 is __syncthreads')
    // Pingpong (two consumer warpgroups, head dims up to 128, as FlashAttention-3): the groups
    // take turns on the tensor cores, so one computes its softmax while the other's products
    // run. Group g waits on named barrier kTurnBarrier + g before issuing, and hands the turn
    // over by arriving on the other's after.
    static constexpr bool kPingpong = kConsumerGroups == 2 && kHeadDim <= 128;
    static constexpr int kTurnBarrier = 2;  // ids 2 and 3
    static constexpr int kStepsPerPanel = kSpanBytes / 32;  // k16 steps of Q K^T inside one 128-byte panel

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
    __device__ static __forceinline__ int stage_of(int i) { return i & 1; }
    __device__ static __forceinline__ unsigned parity_of(int i) { return (i >> 1) & 1; }

    // A consumer warp is done with a buffer: one arrival per warp, after its wgmma wait.
    __device__ static __forceinline__ void release(unsigned bar, int lane) {
        if (lane == 0) mbarrier_arrive(bar);
    }

    // This group's turn to issue products (pingpong), and its hand-over to the other group.
    __device__ static __forceinline__ void take_turn(int group) {
        if constexpr (kPingpong) named_barrier_sync(kTurnBarrier + group, kConsumerThreads);
    }

    __device__ static __forceinline__ void pass_turn(int group) {
        if constexpr (kPingpong) named_barrier_arrive(kTurnBarrier + (group ^ 1), kConsumerThreads);
    }

    // S = Q K^T of this warpgroup's 64 rows and one key tile, issued and committed, not waited for.
    __device__ static __forceinline__ void issue_scores(Scores& s, unsigned q_rows, unsigned k_tile) {
        fence_operands(s[0]);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kHeadDim / 16; ++kk) {
            const int panel = kk / kStepsPerPanel, step = kk % kStepsPerPanel;
            const unsigned long long a = k_major_descriptor(q_rows + panel * kQBytes / kSpans + step * 32);
            const unsigned long long b = k_major_descriptor(k_tile + panel * kKVTileBytes / kSpans + step * 32);
            wgmma_ss<kTileN, 0>(s[0], a, b, kk > 0);
        }
        wgmma_commit();
        fence_operands(s[0]);
    }

    // O += P V for one key tile, issued and committed, not waited for.
    __device__ static __forceinline__ void issue_pv(RowState& state, Probabilities& p, unsigned v_tile) {
        fence_operands(state.o[0]);
        fence_operands(p[0]);
        wgmma_fence();
#pragma unroll
        for (int kb = 0; kb < kTileN / 16; ++kb) {
            // 16 keys are 16 rows of every panel; the panels (64 head-dim columns each) are kKVTileBytes / kSpans apart.
            const unsigned long long b = mn_major_descriptor(v_tile + kb * 16 * kSpanBytes, kKVTileBytes / kSpans);
            wgmma_rs<kHeadDim, 1>(state.o[0], p[0][kb], b, true);
        }
        wgmma_commit();
        fence_operands(state.o[0]);
        fence_operands(p[0]);
    }

    // A key tile (K's or V's rows from first_key) into a buffer by TMA, its bytes counted on the buffer's full barrier.
    __device__ static __forceinline__ void load_key_tile(unsigned buffer, const TmaDescriptor& map, int first_key, int kv_head,
                                                         unsigned full, unsigned long long policy) {
        mbarrier_arrive_expect_tx(full, kKVTileBytes);
        attention::load_tile_tma<KVTile>(buffer, map, first_key, kv_head, full, policy);
    }

    // Args: the kernel's arguments by name (kernel.cu.j2 renders them from the host's contract).
    template <class Args>
    __device__ static __forceinline__ void run(const Args& args) {
        extern __shared__ unsigned char smem_raw[];
        const Smem smem(smem_raw);
        const unsigned s_q = smem.q, s_k = smem.k, s_v = smem.v;  // K and V: kKVBuffers stages each
        const Barriers bars{smem.barriers};
        unsigned* const row_bits = reinterpret_cast<unsigned*>(smem_raw + (smem.barriers + kRowBitsOffset - smem_addr(smem_raw)));
        if (threadIdx.x == 0) {
            for (int stage = 0; stage < kKVBuffers; ++stage) {
                mbarrier_init(bars.k_full(stage), 1);
                mbarrier_init(bars.v_full(stage), 1);
                if constexpr (!kSingleWarpgroup) {
                    mbarrier_init(bars.k_empty(stage), kConsumerWarps);
                    mbarrier_init(bars.v_empty(stage), kConsumerWarps);
                }
            }
            mbarrier_init(bars.q_full(), 1);
            mbarrier_init_fence();
            if constexpr (kPacked) {
                for (int w = 0; w < kRowBitWords; ++w) row_bits[w] = 0u;
            }
        }
        __syncthreads();

        auto tile = [&] {  // a packed item's rows are found after its loads are issued (find_rows)
            if constexpr (kPacked) {
                return PackedWork<kTileM, kTileN>::of_block(args.work, args.heads_per_kv, args.heads_fastest);
            } else {
                return TileWork<kTileM, kTileN, kHasIncompleteTile>::of_block(args.work, args.cu_seqlens_q, args.cu_seqlens_k,
                                                                             args.heads_per_kv, args.window_left, args.window_right,
                                                                             args.heads_fastest);
            }
        }();
        const int num_tiles = max(tile.n_end - tile.n_begin, 0);
        const int warp = warp_index(), lane = threadIdx.x % 32;
        auto first_key = [&](int i) { return tile.k_start + (tile.n_begin + i) * kTileN; };  // of the run's key tile i

        if constexpr (!kSingleWarpgroup) {
            if (warp < 4) {
                // ---- Producer: one thread loads Q once and K/V tile by tile, as the consumers free stages. ----
                release_registers<kProducerRegisters>();
                if (threadIdx.x == 0 && num_tiles > 0) {
                    const unsigned long long read_once = l2_evict_first(), read_again = l2_evict_last();
                    mbarrier_arrive_expect_tx(bars.q_full(), kQBytes);
                    attention::load_tile_tma<QTile>(s_q, args.map_q, tile.q_start + tile.row0, tile.head, bars.q_full(), read_once);
                    for (int i = 0; i < num_tiles; ++i) {
                        const int stage = stage_of(i);
                        // A fresh barrier's previous phase counts as complete, so the first pass does not wait.
                        mbarrier_wait(bars.k_empty(stage), parity_of(i) ^ 1);
                        load_key_tile(s_k + stage * kKVTileBytes, args.map_k, first_key(i), tile.kv_head, bars.k_full(stage), read_again);
                        mbarrier_wait(bars.v_empty(stage), parity_of(i) ^ 1);
                        load_key_tile(s_v + stage * kKVTileBytes, args.map_v, first_key(i), tile.kv_head, bars.v_full(stage), read_again);
                    }
                }
                return;
            }
        }

        // ---- Consumers ----
        if constexpr (!kSingleWarpgroup) claim_registers<kConsumerRegisters>();
        const int consumer_thread = threadIdx.x - (kSingleWarpgroup ? 0 : kWarpgroupThreads);
        const int group = consumer_thread / kWarpgroupThreads;
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
        for (int i = 0; i < 2; ++i) {
            state.max[i] = -inf();
            if constexpr (!kPacked) state.sum[i] = tile.initial_sum(i);
        }

        auto mask_if_crossing = [&](Scores& s, int key0) { tile.mask_tile(s, key0, thread_row0, quad_col); };
        // Only a sequence's last key tile can be incomplete, and it is the run's last: the rows of its V buffer past
        // the sequence (TMA loaded the whole box) are cleared before P V reads them.
        auto clear_values_past_end = [&](unsigned v_buffer, int key0) {
            if constexpr (kTmaTail) {
                if (key0 + kTileN > tile.lk) {
                    unsigned char* const v_tile = smem_raw + (v_buffer - smem_addr(smem_raw));
                    attention::clear_rows_outside<KVTile, kConsumerThreads>(v_tile, 0, tile.lk - key0, consumer_thread);
                    fence_proxy_async_shared();  // wgmma reads through the async proxy
                    named_barrier_sync(kConsumerBarrier, kConsumerThreads);
                }
            }
        };

        // A packed item's V tile before P V (single warpgroup: the block's threads are the consumers): the first key
        // tile's rows before the item's keys are cleared; where the rows are of several sequences, V's rows holding
        // an Inf or NaN are zeroed, and their sequences' rows set NaN (PackedWork). The usual case costs one scan.
        auto guard_packed_values = [&](int i) {
            if constexpr (kPacked) {
                unsigned char* const v_tile = smem_raw + (s_v - smem_addr(smem_raw));
                const int first_row = i == 0 ? tile.first_item_key : 0;
                bool wrote = first_row > 0;
                if (wrote) attention::clear_rows_outside<KVTile, kConsumerThreads>(v_tile, first_row, kTileN, consumer_thread);
                if (tile.mixed &&
                    __syncthreads_or(attention::holds_nonfinite<T, KVTile, kConsumerThreads>(v_tile, first_row, consumer_thread))) {
                    attention::mark_nonfinite_rows<T, KVTile, kConsumerThreads>(v_tile, first_row, row_bits, consumer_thread);
                    __syncthreads();
                    tile.poison_owners(state, row_bits, (tile.n_begin + i) * kTileN);
                    attention::clear_marked_rows<KVTile, kConsumerThreads>(v_tile, row_bits, consumer_thread);
                    __syncthreads();  // every thread has read the marks
                    if (consumer_thread == 0) {
                        for (int w = 0; w < kRowBitWords; ++w) row_bits[w] = 0u;  // before the next tile's marks, a barrier on
                    }
                    wrote = true;
                }
                if (wrote) {
                    fence_proxy_async_shared();  // wgmma reads through the async proxy
                    named_barrier_sync(kConsumerBarrier, kConsumerThreads);
                }
            }
        };

        if constexpr (kSingleWarpgroup) {
            if (num_tiles > 0) {
                Scores s;
                Probabilities p;
                RowFactors correction;
                // L2 policies as the producer's: Q is read once, K and V again by the sequence's other tiles and heads.
                const unsigned long long read_once = l2_evict_first(), read_again = l2_evict_last();
                if (consumer_thread == 0) {
                    mbarrier_arrive_expect_tx(bars.q_full(), kQBytes);
                    attention::load_tile_tma<QTile>(s_q, args.map_q, tile.q_start + tile.row0, tile.head, bars.q_full(), read_once);
                    load_key_tile(s_k, args.map_k, first_key(0), tile.kv_head, bars.k_full(0), read_again);
                    load_key_tile(s_v, args.map_v, first_key(0), tile.kv_head, bars.v_full(0), read_again);
                }
                if constexpr (kPacked) {
                    tile.find_rows(args.plan_cu_seqlens, args.cu_seqlens_q, args.cu_seqlens_k, args.window_right >= 0, thread_row0);
                    for (int i = 0; i < 2; ++i) state.sum[i] = tile.initial_sum(i);
                }
                mbarrier_wait(bars.q_full(), 0);
                for (int i = 0; i < num_tiles; ++i) {
                    // Tile i is the i-th fill of the one K and one V buffer: phase i of their full barriers.
                    const unsigned parity = i & 1;
                    const int key0 = (tile.n_begin + i) * kTileN;
                    mbarrier_wait(bars.k_full(0), parity);
                    issue_scores(s, q_rows, s_k);
                    wgmma_wait<0>();
                    fence_operands(s[0]);
                    named_barrier_sync(kConsumerBarrier, kConsumerThreads);  // every warp's S has read K
                    if (consumer_thread == 0 && i + 1 < num_tiles) {
                        load_key_tile(s_k, args.map_k, first_key(i + 1), tile.kv_head, bars.k_full(0), read_again);
                    }
                    mask_if_crossing(s, key0);
                    attention::softmax_update(s, state, args.scale_log2, correction);
                    if (i > 0) attention::rescale_output(state, correction);  // O holds tiles 0..i-1, all added
                    attention::pack_probabilities<T>(s, p);
                    mbarrier_wait(bars.v_full(0), parity);
                    if constexpr (kPacked) guard_packed_values(i); else clear_values_past_end(s_v, key0);
                    issue_pv(state, p, s_v);
                    wgmma_wait<0>();
                    fence_operands(state.o[0]);
                    if (i + 1 < num_tiles) {  // the epilogue does not touch V
                        named_barrier_sync(kConsumerBarrier, kConsumerThreads);  // every warp's P V has read V
                        if (consumer_thread == 0) {
                            load_key_tile(s_v, args.map_v, first_key(i + 1), tile.kv_head, bars.v_full(0), read_again);
                        }
                    }
                }
            }
        } else if (num_tiles > 0) {
            Scores s;
            Probabilities p;
            RowFactors correction;
            // Every turn taken is handed over: group 1 hands group 0 its first, and group 0 takes
            // one more turn at the end, the hand-over of group 1's last.
            if (group == 1) pass_turn(group);
            mbarrier_wait(bars.q_full(), 0);
            mbarrier_wait(bars.k_full(0), 0);
            take_turn(group);
            issue_scores(s, q_rows, s_k);
            pass_turn(group);
            wgmma_wait<0>();
            fence_operands(s[0]);
            release(bars.k_empty(0), lane);
            mask_if_crossing(s, tile.n_begin * kTileN);
            attention::softmax_update(s, state, args.scale_log2, correction);  // O is still 0: no rescale
            attention::pack_probabilities<T>(s, p);
            for (int i = 1; i < num_tiles; ++i) {
                const int stage = stage_of(i), previous = stage_of(i - 1);
                mbarrier_wait(bars.k_full(stage), parity_of(i));
                mbarrier_wait(bars.v_full(previous), parity_of(i - 1));
                take_turn(group);
                issue_scores(s, q_rows, s_k + stage * kKVTileBytes);
                issue_pv(state, p, s_v + previous * kKVTileBytes);
                pass_turn(group);
                wgmma_wait<1>();  // S of tile i has landed; P V of tile i - 1 may still run
                fence_operands(s[0]);
                release(bars.k_empty(stage), lane);
                mask_if_crossing(s, (tile.n_begin + i) * kTileN);
                attention::softmax_update(s, state, args.scale_log2, correction);
                wgmma_wait<0>();
                fence_operands(state.o[0]);
                release(bars.v_empty(previous), lane);
                attention::rescale_output(state, correction);
                attention::pack_probabilities<T>(s, p);
            }
            const int last = num_tiles - 1, last_key0 = (tile.n_begin + last) * kTileN;
            mbarrier_wait(bars.v_full(stage_of(last)), parity_of(last));
            clear_values_past_end(s_v + stage_of(last) * kKVTileBytes, last_key0);
            take_turn(group);
            issue_pv(state, p, s_v + stage_of(last) * kKVTileBytes);
            pass_turn(group);
            if (group == 0) take_turn(group);
            wgmma_wait<0>();
            fence_operands(state.o[0]);
        }

        const float sink_log2 = args.sink != nullptr ? args.sink[tile.head] * kLog2e : -inf();
        float* const lse_head = args.lse + tile.head * args.lse_stride_h + tile.q_start;
        // O goes through shared memory: into the Q buffer, whose last reader (this group's last S) is
        // done, each warp writing only its own 16 rows (those past the sequence too: they are never copied out).
        // One stmatrix stores two column blocks of both of a thread's rows: matrices (rows, column block) (r, db),
        // (r + 8, db), (r, db + 1), (r + 8, db + 1), lane 8 m + j addressing row j of matrix m.
        unsigned char* const o_tile = smem_raw + (s_q - smem_addr(smem_raw));
        const int warp_row0 = 64 * group + 16 * ((consumer_thread / 32) % 4);
        unsigned pairs[2][kHeadDim / 8];  // [row i][column block]: the thread's packed elements, for stmatrix
        write_output<T, kHasIncompleteTile>(state, lse_head, tile.lq, sink_log2, quad_col, row_of,
                                            [&](int i, int, int db, unsigned pair) { pairs[i][db] = pair; });
        const int matrix = lane / 8, matrix_row = warp_row0 + lane % 8 + 8 * (matrix % 2);
#pragma unroll
        for (int db = 0; db < kHeadDim / 8; db += 2) {
            const unsigned four[4] = {pairs[0][db], pairs[1][db], pairs[0][db + 1], pairs[1][db + 1]};
            stmatrix_x4(s_q + attention::chunk_offset<QTile>(matrix_row, db + matrix / 2), four);
        }
        if (kPacked || !kHasIncompleteTile || tile.row0 + kTileM <= tile.lq) {
            // A full tile, or a packed one (its rows are the batch's up to the tensor's end, where TMA stops): out by
            // one TMA store per column block, once every consumer has written its rows.
            fence_proxy_async_shared();  // the TMA store reads through the async proxy
            named_barrier_sync(kConsumerBarrier, kConsumerThreads);
            if (consumer_thread == 0) {
#pragma unroll
                for (int b = 0; b < kSpans; ++b) {
                    tma_store_3d(&args.map_o, s_q + b * kTileM * kSpanBytes, b * kSpanCols, tile.head, tile.q_start + tile.row0);
                }
                tma_store_commit();
                tma_store_wait_read();  // the block's shared memory must outlive the store's reads
            }
            return;
        }
        // An incomplete tile: each warp copies out the rows it wrote (16 from warp_row0), those inside the
        // sequence only, 16 bytes a lane at a time.
        __syncwarp();
        const int rows = min(16, tile.lq - tile.row0 - warp_row0);
        T* const out_rows = args.out + static_cast<long long>(tile.q_start + tile.row0 + warp_row0) * args.o_stride_t +
                            tile.head * args.o_stride_h;
        for (int idx = lane; idx < rows * kRowChunks; idx += 32) {
            const int row = idx / kRowChunks, chunk = idx % kRowChunks;
            *reinterpret_cast<uint4*>(out_rows + row * args.o_stride_t + chunk * 8) =
                *reinterpret_cast<const uint4*>(o_tile + attention::chunk_offset<QTile>(warp_row0 + row, chunk));
        }
    }
};

}  // namespace attention_prefill
}  // namespace kgen
