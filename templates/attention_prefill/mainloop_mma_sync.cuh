// The mma.sync kernel (FlashAttention-2 style), for any arch the family runs on.
//
// One CTA computes one query tile (kTileM rows) of one sequence for one query head. Each
// warp owns kRowBlocks blocks of 16 query rows: Q stays in shared memory for the whole
// CTA, K/V tiles stream through shared memory, double-buffered one tile ahead, and
// fragments are read with ldmatrix.

static_assert(kWarps == 4 || kWarps == 8, "attention_prefill: with mma=mma_sync, num_warps must be 4 or 8");
static_assert(kTileM == 64 || kTileM == 128, "attention_prefill: with mma=mma_sync, tile_m must be 64 or 128");
static_assert(kTileN == 32 || kTileN == 64 || kTileN == 128, "attention_prefill: with mma=mma_sync, tile_n must be 32, 64 or 128");
static_assert(kHeadDim == 32 || kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256,
              "attention_prefill: with mma=mma_sync, head_dim must be 32, 64, 128 or 256 (a power of two of whole swizzle spans)");
static_assert(kTileN * kRowChunks % kThreads == 0,
              "attention_prefill: tile_n rows of 16-byte chunks must split evenly over the threads");
static_assert(kTileM % (16 * kWarps) == 0,
              "attention_prefill: tile_m must be a multiple of 16 * num_warps (each warp owns whole 16-row blocks)");

// ---- Loads ----

// kRows rows by predicated cp.async: rows past the sequence end read nothing
// (source size 0) and become zeros, so a tail never reads the next sequence.
template <int kRows>
__device__ __forceinline__ void load_tile_cp_async(unsigned tile, const T* gmem, long long row_stride, int valid_rows) {
    static_assert(kRows * kRowChunks % kThreads == 0,
                  "attention_prefill: with tail=cp_async, tile_m and tile_n rows of 16-byte chunks must split evenly over the threads");
#pragma unroll
    for (int i = 0; i < kRows * kRowChunks / kThreads; ++i) {
        const int idx = i * kThreads + threadIdx.x;
        const int row = idx / kRowChunks, chunk = idx % kRowChunks;
        const bool valid = row < valid_rows;
        kgen::cp_async_16_zfill(tile + chunk_offset<kRows>(row, chunk), valid ? gmem + row * row_stride + chunk * 8 : gmem, valid);
    }
}

}  // namespace

{{ kernel_declaration }} {
    // The host adds kSwizzleAlignment bytes of slack so the tiles can start on a swizzle boundary.
    extern __shared__ unsigned char smem_raw[];
    const unsigned s_q = (kgen::smem_addr(smem_raw) + (kSwizzleAlignment - 1)) & ~(kSwizzleAlignment - 1u);
    const unsigned s_k = s_q + kQBytes;                   // two buffers
    const unsigned s_v = s_k + 2 * kKVTileBytes;          // two buffers
    const unsigned kv_bar = s_q + kBarrierOffset;         // one mbarrier per K/V buffer
    const unsigned q_bar = kv_bar + 16;
    if (threadIdx.x == 0) {
        kgen::mbarrier_init(kv_bar, 1);
        kgen::mbarrier_init(kv_bar + 8, 1);
        kgen::mbarrier_init(q_bar, 1);
        kgen::mbarrier_init_fence();
    }
    __syncthreads();

    const TileWork tile = tile_work(work, cu_seqlens_q, cu_seqlens_k, heads_per_kv, window_left, window_right);

    // Which tiles TMA loads: full ones, or all of them unless incomplete ones take cp.async.
    auto by_tma = [&](int first_row, int rows, int length) { return !kCpAsyncTail || first_row + rows <= length; };
    auto load_kv = [&](int n, int buf) {
        const unsigned bar = kv_bar + 8 * buf;
        if (by_tma(n * kTileN, kTileN, tile.lk)) {
            if (threadIdx.x == 0) {
                // The barrier before this call ordered every warp's reads of the buffer; this
                // orders them before the TMA unit's writes.
                kgen::fence_proxy_async_shared();
                kgen::mbarrier_arrive_expect_tx(bar, 2 * kKVTileBytes);
                load_tile_tma<kTileN>(s_k + buf * kKVTileBytes, map_k, tile.k_start + n * kTileN, tile.kv_head, bar);
                load_tile_tma<kTileN>(s_v + buf * kKVTileBytes, map_v, tile.k_start + n * kTileN, tile.kv_head, bar);
            }
        } else if constexpr (kCpAsyncTail) {
            const long long key0 = static_cast<long long>(tile.k_start) + n * kTileN;
            load_tile_cp_async<kTileN>(s_k + buf * kKVTileBytes, k + key0 * k_stride_t + tile.kv_head * k_stride_h,
                                       k_stride_t, tile.lk - n * kTileN);
            load_tile_cp_async<kTileN>(s_v + buf * kKVTileBytes, v + key0 * v_stride_t + tile.kv_head * v_stride_h,
                                       v_stride_t, tile.lk - n * kTileN);
        }
        if constexpr (kCpAsyncTail) kgen::cp_async_commit();
    };
    const bool q_by_tma = by_tma(tile.row0, kTileM, tile.lq);
    if (q_by_tma) {
        if (threadIdx.x == 0) {
            kgen::mbarrier_arrive_expect_tx(q_bar, kQBytes);
            load_tile_tma<kTileM>(s_q, map_q, tile.q_start + tile.row0, tile.head, q_bar);
        }
    } else if constexpr (kCpAsyncTail) {
        load_tile_cp_async<kTileM>(s_q, q + static_cast<long long>(tile.q_start + tile.row0) * q_stride_t + tile.head * q_stride_h,
                                   q_stride_t, tile.lq - tile.row0);
        kgen::cp_async_commit();
    }
    if (tile.n_begin < tile.n_end) load_kv(tile.n_begin, 0);
    // Q is needed by every key tile; a CTA with none still waits, so no copy outlives it.
    if (q_by_tma) kgen::mbarrier_wait(q_bar, 0);
    unsigned kv_phase = 0;  // bit b: the parity to wait for on buffer b's mbarrier

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int quad_row = lane / 4, quad_col = lane % 4;
    // This thread's rows: for row block rb, warp_row0 + 16 rb + quad_row and 8 below it
    // (thread row i = 2 rb + half).
    const int warp_row0 = tile.row0 + warp * 16 * kRowBlocks;
    auto row_of = [&](int i) { return warp_row0 + (i / 2) * 16 + (i % 2) * 8 + quad_row; };
    // ldmatrix lanes: Q as the A operand, K as B, V as B transposed (see the mma fragment layouts).
    const LdsmLane q_lane(warp * 16 * kRowBlocks + lane % 16, lane / 16);
    const LdsmLane k_lane((lane / 16) * 8 + lane % 8, (lane / 8) % 2);
    const LdsmLane v_lane(((lane / 8) % 2) * 8 + lane % 8, lane / 16);

    QFragments q_frag;
    RowState state;
#pragma unroll
    for (int rb = 0; rb < kRowBlocks; ++rb)
#pragma unroll
        for (int db = 0; db < kHeadDim / 8; ++db)
#pragma unroll
            for (int e = 0; e < 4; ++e) state.o[rb][db][e] = 0.f;
#pragma unroll
    for (int i = 0; i < 2 * kRowBlocks; ++i) state.max[i] = -kgen::inf(), state.sum[i] = 0.f;

    for (int n = tile.n_begin; n < tile.n_end; ++n) {
        const int buf = (n - tile.n_begin) & 1;
        const int key0 = n * kTileN;
        const unsigned k_tile = s_k + buf * kKVTileBytes;
        const unsigned v_tile = s_v + buf * kKVTileBytes;
        // Tile n has landed for every thread, and every warp is done with tile n-1,
        // so one barrier both publishes tile n and frees the other buffer.
        if (by_tma(key0, kTileN, tile.lk)) {
            kgen::mbarrier_wait(kv_bar + 8 * buf, (kv_phase >> buf) & 1);
            kv_phase ^= 1u << buf;
        }
        if constexpr (kTmaTail) {
            // K's rows past the end need no clearing: their scores are masked by a select.
            if (key0 + kTileN > tile.lk) clear_rows_past<kTileN, kThreads>(smem_raw + (v_tile - kgen::smem_addr(smem_raw)), tile.lk - key0, threadIdx.x);
        }
        if constexpr (kCpAsyncTail) kgen::cp_async_wait<0>();
        __syncthreads();
        if (n + 1 < tile.n_end) load_kv(n + 1, buf ^ 1);
        if constexpr (kQInRegisters) {
            if (n == tile.n_begin) {
#pragma unroll
                for (int rb = 0; rb < kRowBlocks; ++rb)
#pragma unroll
                    for (int kk = 0; kk < kHeadDim / 16; ++kk) kgen::ldmatrix_x4(q_frag[rb][kk], q_lane.at<kTileM>(s_q, rb * 16, kk));
            }
        }

        Scores s;
        compute_scores(s, q_frag, s_q, k_tile, q_lane, k_lane);
        if (tile.crosses_boundary(key0)) mask_scores(s, tile.mask, key0, warp_row0 + quad_row, quad_col);
        RowFactors correction;
        softmax_update(s, state, scale_log2, correction);
        rescale_output(state, correction);
        accumulate_pv(state, s, v_tile, v_lane);
    }
    if constexpr (kCpAsyncTail) kgen::cp_async_wait<0>();

    const float sink_log2 = sink != nullptr ? sink[tile.head] * kgen::kLog2e : -kgen::inf();
    T* const out_head = out + static_cast<long long>(tile.q_start) * o_stride_t + tile.head * o_stride_h + 2 * quad_col;
    write_output(state, lse + tile.head * lse_stride_h + tile.q_start, tile.lq, sink_log2, quad_col, row_of,
                 [&](int row, int db, unsigned pair) { *reinterpret_cast<unsigned*>(out_head + row * o_stride_t + db * 8) = pair; });
}

