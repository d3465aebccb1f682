// The mma.sync kernel (FlashAttention-2 style), for any arch the family runs on.
//
// One CTA computes one query tile (kTileM rows) of one sequence for one query head. Each
// warp owns kRowBlocks blocks of 16 query rows: Q stays in shared memory for the whole
// CTA, K/V tiles stream through shared memory, double-buffered one tile ahead, and
// fragments are read with ldmatrix.
//
// Config: T, kHeadDim, kTileM, kTileN, kWarps, kHasIncompleteTile, kCpAsyncTail (incomplete tiles
// load by cp.async) and kTmaTail (they load as whole TMA boxes); kernel.cu.j2 defines it.
// Needs common/ numeric, smem, swizzle, lse_merge, tma, mma and cp_async; attention_common/ tiles,
// softmax and mma_sync_math; attention_prefill/ rows and shared_memory.
namespace kgen {
namespace attention_prefill {

template <class Config>
struct MmaSyncKernel {
    using T = typename Config::T;
    static constexpr int kHeadDim = Config::kHeadDim, kTileM = Config::kTileM, kTileN = Config::kTileN;
    static constexpr int kWarps = Config::kWarps;
    static constexpr bool kHasIncompleteTile = Config::kHasIncompleteTile;
    static constexpr bool kCpAsyncTail = Config::kCpAsyncTail, kTmaTail = Config::kTmaTail;
    static constexpr int kThreads = kWarps * 32;
    // Each warp owns kRowBlocks blocks of 16 query rows; every K and V fragment read
    // from shared memory then feeds 2 * kRowBlocks mma, easing shared-memory bandwidth.
    static constexpr int kRowBlocks = kTileM / (16 * kWarps);

    using QTile = attention::Tile<T, kHeadDim, kTileM>;
    using KVTile = attention::Tile<T, kHeadDim, kTileN>;
    using Warp = attention::MmaSyncWarp<T, kHeadDim, kTileM, kTileN, kRowBlocks>;
    static constexpr int kRowChunks = QTile::kRowChunks;
    static constexpr int kBarrierBytes = 64;  // one mbarrier per K/V buffer and one for Q, 8 bytes each
    static_assert(3 * 8 <= kBarrierBytes, "room for three mbarriers");
    using Smem = SharedMemory<QTile, KVTile, kBarrierBytes>;
    static constexpr int kDynamicSmemBytes = Smem::kDynamicBytes;

    static_assert(kWarps == 4 || kWarps == 8, "attention_prefill: with mma=mma_sync, num_warps must be 4 or 8");
    static_assert(!Config::kPacked, "attention_prefill: rows=packed needs mma=wgmma (this kernel reads per-sequence work items)");
    static_assert(kTileM == 64 || kTileM == 128, "attention_prefill: with mma=mma_sync, tile_m must be 64 or 128");
    static_assert(kTileN == 32 || kTileN == 64 || kTileN == 128, "attention_prefill: with mma=mma_sync, tile_n must be 32, 64 or 128");
    static_assert(kHeadDim == 32 || kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256,
                  "attention_prefill: with mma=mma_sync, head_dim must be 32, 64, 128 or 256 (a power of two of whole swizzle spans)");
    static_assert(kTileN * kRowChunks % kThreads == 0,
                  "attention_prefill: tile_n rows of 16-byte chunks must split evenly over the threads");
    static_assert(kTileM % (16 * kWarps) == 0,
                  "attention_prefill: tile_m must be a multiple of 16 * num_warps (each warp owns whole 16-row blocks)");

    // A tile's rows by predicated cp.async: rows past the sequence end read nothing (source
    // size 0) and become zeros, so an incomplete tile never reads the next sequence.
    template <class Tile>
    __device__ static __forceinline__ void load_tile_cp_async(unsigned tile, const T* gmem, long long row_stride, int valid_rows) {
        static_assert(Tile::kRows * kRowChunks % kThreads == 0,
                      "attention_prefill: with tail=cp_async, tile_m and tile_n rows of 16-byte chunks must split evenly over the threads");
#pragma unroll
        for (int i = 0; i < Tile::kRows * kRowChunks / kThreads; ++i) {
            const int idx = i * kThreads + threadIdx.x;
            const int row = idx / kRowChunks, chunk = idx % kRowChunks;
            const bool valid = row < valid_rows;
            cp_async_16_zfill(tile + attention::chunk_offset<Tile>(row, chunk), valid ? gmem + row * row_stride + chunk * 8 : gmem, valid);
        }
    }

    // Args: the kernel's arguments by name (kernel.cu.j2 renders them from the host's contract).
    template <class Args>
    __device__ static __forceinline__ void run(const Args& args) {
        extern __shared__ unsigned char smem_raw[];
        const Smem smem(smem_raw);
        const unsigned kv_bar = smem.barriers;  // one mbarrier per K/V buffer
        const unsigned q_bar = kv_bar + 16;
        if (threadIdx.x == 0) {
            mbarrier_init(kv_bar, 1);
            mbarrier_init(kv_bar + 8, 1);
            mbarrier_init(q_bar, 1);
            mbarrier_init_fence();
        }
        __syncthreads();

        const auto tile = TileWork<kTileM, kTileN, kHasIncompleteTile>::of_block(args.work, args.cu_seqlens_q, args.cu_seqlens_k,
                                                                                 args.heads_per_kv, args.window_left, args.window_right,
                                                                                 args.heads_fastest);

        // Which tiles TMA loads: full ones, or all of them unless incomplete ones take cp.async.
        auto by_tma = [&](int first_row, int rows, int length) { return !kCpAsyncTail || first_row + rows <= length; };
        auto load_kv = [&](int n, int buf) {
            const unsigned bar = kv_bar + 8 * buf;
            if (by_tma(n * kTileN, kTileN, tile.lk)) {
                if (threadIdx.x == 0) {
                    // The barrier before this call ordered every warp's reads of the buffer; this
                    // orders them before the TMA unit's writes.
                    fence_proxy_async_shared();
                    mbarrier_arrive_expect_tx(bar, 2 * KVTile::kBytes);
                    const int first_key = tile.k_start + n * kTileN;
                    attention::load_tile_tma<KVTile>(smem.k + buf * KVTile::kBytes, args.map_k, first_key, tile.kv_head, bar);
                    attention::load_tile_tma<KVTile>(smem.v + buf * KVTile::kBytes, args.map_v, first_key, tile.kv_head, bar);
                }
            } else if constexpr (kCpAsyncTail) {
                const long long key0 = static_cast<long long>(tile.k_start) + n * kTileN;
                load_tile_cp_async<KVTile>(smem.k + buf * KVTile::kBytes, args.k + key0 * args.k_stride_t + tile.kv_head * args.k_stride_h,
                                           args.k_stride_t, tile.lk - n * kTileN);
                load_tile_cp_async<KVTile>(smem.v + buf * KVTile::kBytes, args.v + key0 * args.v_stride_t + tile.kv_head * args.v_stride_h,
                                           args.v_stride_t, tile.lk - n * kTileN);
            }
            if constexpr (kCpAsyncTail) cp_async_commit();
        };
        const bool q_by_tma = by_tma(tile.row0, kTileM, tile.lq);
        if (q_by_tma) {
            if (threadIdx.x == 0) {
                mbarrier_arrive_expect_tx(q_bar, QTile::kBytes);
                attention::load_tile_tma<QTile>(smem.q, args.map_q, tile.q_start + tile.row0, tile.head, q_bar);
            }
        } else if constexpr (kCpAsyncTail) {
            load_tile_cp_async<QTile>(smem.q, args.q + static_cast<long long>(tile.q_start + tile.row0) * args.q_stride_t +
                                                  tile.head * args.q_stride_h,
                                      args.q_stride_t, tile.lq - tile.row0);
            cp_async_commit();
        }
        if (tile.n_begin < tile.n_end) load_kv(tile.n_begin, 0);
        // Q is needed by every key tile; a CTA with none still waits, so no copy outlives it.
        if (q_by_tma) mbarrier_wait(q_bar, 0);
        unsigned kv_phase = 0;  // bit b: the parity to wait for on buffer b's mbarrier

        const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
        const int quad_row = lane / 4, quad_col = lane % 4;
        // This thread's rows: for row block rb, warp_row0 + 16 rb + quad_row and 8 below it
        // (thread row i = 2 rb + half).
        const int warp_row0 = tile.row0 + warp * 16 * kRowBlocks;
        auto row_of = [&](int i) { return warp_row0 + (i / 2) * 16 + (i % 2) * 8 + quad_row; };
        // ldmatrix lanes: Q as the A operand, K as B, V as B transposed (see the mma fragment layouts).
        const attention::LdsmLane<QTile> q_lane(warp * 16 * kRowBlocks + lane % 16, lane / 16);
        const attention::LdsmLane<KVTile> k_lane((lane / 16) * 8 + lane % 8, (lane / 8) % 2);
        const attention::LdsmLane<KVTile> v_lane(((lane / 8) % 2) * 8 + lane % 8, lane / 16);

        typename Warp::QFragments q_frag;
        attention::RowState<kRowBlocks, kHeadDim> state;
#pragma unroll
        for (int rb = 0; rb < kRowBlocks; ++rb)
#pragma unroll
            for (int db = 0; db < kHeadDim / 8; ++db)
#pragma unroll
                for (int e = 0; e < 4; ++e) state.o[rb][db][e] = 0.f;
#pragma unroll
        for (int i = 0; i < 2 * kRowBlocks; ++i) state.max[i] = -inf(), state.sum[i] = tile.initial_sum(i);

        for (int n = tile.n_begin; n < tile.n_end; ++n) {
            const int buf = (n - tile.n_begin) & 1;
            const int key0 = n * kTileN;
            const unsigned k_tile = smem.k + buf * KVTile::kBytes;
            const unsigned v_tile = smem.v + buf * KVTile::kBytes;
            // Tile n has landed for every thread, and every warp is done with tile n-1,
            // so one barrier both publishes tile n and frees the other buffer.
            if (by_tma(key0, kTileN, tile.lk)) {
                mbarrier_wait(kv_bar + 8 * buf, (kv_phase >> buf) & 1);
                kv_phase ^= 1u << buf;
            }
            if constexpr (kTmaTail) {
                // K's rows past the end need no clearing: their scores are masked by a select.
                if (key0 + kTileN > tile.lk) {
                    attention::clear_rows_outside<KVTile, kThreads>(smem_raw + (v_tile - smem_addr(smem_raw)), 0, tile.lk - key0, threadIdx.x);
                }
            }
            if constexpr (kCpAsyncTail) cp_async_wait<0>();
            __syncthreads();
            if (n + 1 < tile.n_end) load_kv(n + 1, buf ^ 1);
            if constexpr (Warp::kQInRegisters) {
                if (n == tile.n_begin) Warp::load_q(q_frag, smem.q, q_lane);
            }

            attention::Scores<kRowBlocks, kTileN> s;
            Warp::compute_scores(s, q_frag, smem.q, k_tile, q_lane, k_lane);
            tile.mask_tile(s, key0, warp_row0 + quad_row, quad_col);
            attention::RowFactors<kRowBlocks> correction;
            attention::softmax_update(s, state, args.scale_log2, correction);
            attention::rescale_output(state, correction);
            Warp::accumulate_pv(state, s, v_tile, v_lane);
        }
        if constexpr (kCpAsyncTail) cp_async_wait<0>();

        const float sink_log2 = args.sink != nullptr ? args.sink[tile.head] * kLog2e : -inf();
        T* const out_head = args.out + static_cast<long long>(tile.q_start) * args.o_stride_t + tile.head * args.o_stride_h + 2 * quad_col;
        write_output<T, kHasIncompleteTile>(state, args.lse + tile.head * args.lse_stride_h + tile.q_start, tile.lq, sink_log2,
                                            quad_col, row_of, [&](int, int row, int db, unsigned pair) {
                                                if (kHasIncompleteTile && row >= tile.lq) return;  // past the sequence
                                                *reinterpret_cast<unsigned*>(out_head + row * args.o_stride_t + db * 8) = pair;
                                            });
    }
};

}  // namespace attention_prefill
}  // namespace kgen
