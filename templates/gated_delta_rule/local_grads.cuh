// The backward's per-chunk gradients, per (chunk, q/k head) item the head's v-heads one after the other: kgen/families/gated_delta_rule/local_grads.py's
// algebra (its docstring has the notation) from the chunk's inputs, its start state S (S^T, from
// gated_delta_rule_chunk_states), the gradient dS' of its end state (dS'^T, from gated_delta_rule_chunk_reverse)
// and Tbeta (from gated_delta_rule_kkt), with T = I - Tbeta StrictLower(K K^T * D) (since T (I + A) = I).
// Writes dq and dk per q/k head (fp32, a GVA group's v-heads added in order: deterministic, and no per-v-head
// copies for the host to sum), dv, dg and dbeta of the chunk's tokens.
//
// Two warpgroups, each with its own chain of products (wgmma, all 64 rows and every column of a product in one
// warpgroup), handing results over through shared memory and named barriers:
// - the chain (warps 0-3): dVn = Kd dS' + scale P^T dO, dw = -dVn S^T, dt, X = T^T dt, dA = -StrictLower(X T^T)
//   and dkk + dkk^T; and dq = scale diag(e^G) dO S^T + dqk K;
// - the side (warps 4-7): K K^T and Q K^T (L and P), T = I - Tbeta L, Z = V - diag(e^G) K S, Vn = Tbeta Z,
//   dqk = scale (dO Vn^T) * D; dk from Vn dS'^T, dqk^T Q, T^T dw and (dkk + dkk^T) K; dv = diag(beta) T^T dVn.
// Until the thirty-third session both warpgroups took a column half of every product in turn, a block barrier
// between products: about twenty dependent phases a unit, each one's epilogue and barrier leaving the tensor core
// idle (bench/NOTES.md, twenty-ninth and thirty-first sessions). Now one warpgroup's products run while the other
// is in an epilogue or waiting, and a product whose A operand is the one before's result takes it from registers.
//
// Operands are 16-bit shared-memory tiles in wgmma's 64-byte swizzled layout (common/swizzle.cuh: spans of 32
// columns; any operand may be read transposed). Sums over a row are made in a fixed order (no atomics): each
// row's by the one thread that holds it in every product, each warpgroup into its own vectors, added in a fixed
// order at the unit's end; so the gradients are deterministic. Rows past the sequence are zero in q, k, v and
// dO, their gates and betas zero, and nothing is written for them.
//
// Blocks are persistent (one an SM: the tiles take most of its shared memory), each taking the items blockIdx.x,
// + gridDim.x, ... and each item's v-heads as units of work. The side warpgroup loads the next unit's inputs
// during this one (ncu: the loads at each block's start were about 14% of its time, bench/NOTES.md,
// thirty-first session): dO, S^T, dS'^T and V (and Q for a new item) once both warpgroups have read their own for
// the last time; Tbeta (and K for a new item) after the last products. A group's later v-heads keep the item's Q
// and K.
//
// Config as for recurrence.cuh (T, kHeadDim, kHasIncompleteTile). Needs common/ numeric, smem, swizzle, cp_async,
// tma (the proxy fence, the L2 prefetch), warp_roles (named barriers), fp8 and wgmma (widths 64 and head_dim);
// gated_delta_rule/tiles.cuh (kChunk, accumulators_as_a, kResidualScale).
namespace kgen {
namespace gdn {

template <class Config>
struct LocalGrads {
    using T = typename Config::T;
    static constexpr int kHeadDim = Config::kHeadDim;
    static constexpr bool kHasIncompleteTile = Config::kHasIncompleteTile;
    static constexpr int kThreads = 256, kWarps = kThreads / 32, kGroupThreads = kWarpgroupThreads;
    static constexpr int kStateRows = kHeadDim;
    static constexpr int kSquareF = kChunk + 4;  // fp32 scratch stride
    static constexpr int kSpanBytes = 64, kSpanCols = kSpanBytes / 2;  // the tiles' swizzle
    static constexpr int kChain = 0, kSide = 1;  // the warpgroups

    // Named barriers (0 is __syncthreads'): each warpgroup's own, then the hand-overs, each passed once a unit,
    // by one warpgroup arriving and the other waiting.
    enum Barrier : int {
        kChainGroup = 1, kSideGroup = 2,
        kPReady,     // side -> chain: P (16-bit)
        kTReady,     // side -> chain: T, and L (fp32)
        kDqkReady,   // side -> chain: dqk
        kDvnReady,   // chain -> side: dVn
        kDwReady,    // chain -> side: dw
        kSymReady,   // chain -> side: dkk + dkk^T
        kEarlyFree,  // chain -> side: the chain reads dO, S^T, dS'^T, V and Q no more
        kLateFree,   // chain -> side: the chain reads K and dqk no more
    };

    // Row vectors of one warpgroup: row i's entries written only by the thread holding row i in every product
    // (columns: the thread i of the warpgroup), added across warpgroups at the unit's end.
    struct GroupSums {
        float d_gamma[kChunk], d_beta[kChunk];
        float columns[kChunk];            // column sums of the exponent matrices (dP * P, dA * A), subtracted
        float via_kd[kChunk], via_kb[kChunk];  // Kd . dKd and k . dKb (e^G k . dKb once finish scales it), row by row
        float column_part[4][kChunk];     // a column's sum from each warp
    };

    // Tiles first, each a whole number of swizzle repeats from a 1024-byte aligned base.
    struct Shared {
        T q[kChunk * kHeadDim], k[kChunk * kHeadDim], v[kChunk * kHeadDim], d_out[kChunk * kHeadDim];
        T state[kStateRows * kHeadDim], d_state[kStateRows * kHeadDim];  // S^T and dS'^T, [value][key]
        T tbeta[kChunk * kChunk];    // Tbeta; then dqk
        T t[kChunk * kChunk];        // L (16-bit), then T
        T p[kChunk * kChunk];        // P (16-bit), then dt, then dkk + dkk^T
        T z_vn[kChunk * kHeadDim];   // Z, then Vn
        T d_vn[kChunk * kHeadDim], dw[kChunk * kHeadDim];
        float square[kChunk * kSquareF];  // L = StrictLower(K K^T * D), then dkk
        float gamma[kChunk], beta[kChunk];
        GroupSums sums[2];
        float block_part[kWarps];
    };
    static constexpr int kDynamicSmemBytes = sizeof(Shared) + kSwizzleAlignment;
    static_assert(kDynamicSmemBytes <= 227 * 1024, "gated_delta_rule_chunk_grads: shared memory over 227 KB");

    // Where element (row, col) of a tile of kRows rows lies, in elements.
    template <int kRows>
    __device__ static __forceinline__ int at(int row, int col) { return kgen::swizzled<kSpanBytes, kRows, 2, 2>(row, col); }
    __device__ static __forceinline__ float& at_f(float* m, int i, int j) { return m[i * kSquareF + j]; }

    // wgmma's descriptors of the tiles: 8 rows of a span are 512 bytes apart; along the contiguous dimension of
    // an MN-major operand, spans are `span_stride` bytes apart.
    __device__ static __forceinline__ unsigned long long k_major(unsigned address) {
        return smem_descriptor(address, 16, 8 * kSpanBytes, Swizzle::k64B);
    }
    __device__ static __forceinline__ unsigned long long mn_major(unsigned address, unsigned span_stride) {
        return smem_descriptor(address, span_stride, 8 * kSpanBytes, Swizzle::k64B);
    }
    // B's descriptor at reduction step k0: a [kK][kN] tile (kBKN) or one stored [kN][kK].
    template <int kN, int kK, bool kBKN>
    __device__ static __forceinline__ unsigned long long b_descriptor(unsigned b_base, int k0) {
        return kBKN ? mn_major(b_base + k0 * kSpanBytes, kK * kSpanBytes)
                    : k_major(b_base + (k0 / kSpanCols) * (kN * kSpanBytes) + (k0 % kSpanCols) * 2);
    }

    // Generic-proxy writes to shared memory (stores, cp.async) made visible to the tensor core's reads, then the
    // block's barrier.
    __device__ static __forceinline__ void barrier() {
        fence_proxy_async_shared();
        __syncthreads();
    }
    // The warpgroup's own barrier, after its writes are made visible to its products; group_wait without that
    // (before overwriting a tile that every warp's product has read: the products are complete).
    __device__ static __forceinline__ void group_wait(int group) { named_barrier_sync(kChainGroup + group, kGroupThreads); }
    __device__ static __forceinline__ void group_sync(int group) {
        fence_proxy_async_shared();
        group_wait(group);
    }
    // A hand-over: the writing warpgroup makes its writes visible (to the tensor core too) and arrives; the
    // reading one waits. bar.arrive orders this thread's earlier memory accesses before the waiters' later ones.
    __device__ static __forceinline__ void hand_over(Barrier b) {
        fence_proxy_async_shared();
        named_barrier_arrive(b, kThreads);
    }
    __device__ static __forceinline__ void await(Barrier b) { named_barrier_sync(b, kThreads); }

    // op(A) op(B) into the warpgroup's accumulators (all 64 rows, kN columns), issued (wgmma_fence'd by the
    // caller, not committed): A a [64][kK] tile (or stored [kK][64] when kATransposed), B a [kK][kN] tile (kBKN) or
    // stored [kN][kK]. Accumulators as wgmma's (the mma.sync fragment layout, warp w of the warpgroup on rows
    // 16 w ..); `accumulate` adds the product to them.
    template <int kN, int kK, bool kATransposed, bool kBKN>
    __device__ static __forceinline__ void issue(float (&acc)[kN / 8][4], const T* a, const T* b, bool accumulate) {
        static_assert(kN % kSpanCols == 0 && kK % 16 == 0, "product: whole spans");
        const unsigned a_base = smem_addr(a), b_base = smem_addr(b);
#pragma unroll
        for (int k0 = 0; k0 < kK; k0 += 16) {
            const unsigned long long a_desc =
                kATransposed ? mn_major(a_base + k0 * kSpanBytes, kK * kSpanBytes)
                             : k_major(a_base + (k0 / kSpanCols) * (kChunk * kSpanBytes) + (k0 % kSpanCols) * 2);
            wgmma_ss<kN, kBKN ? 1 : 0, kATransposed ? 1 : 0>(acc, a_desc, b_descriptor<kN, kK, kBKN>(b_base, k0),
                                                           accumulate || k0 > 0);
        }
    }

    // The same with A from registers (wgmma's RS form): a product's accumulators packed by accumulators_as_a
    // (16-bit, as a tile of them would hold).
    template <int kN, int kK, bool kBKN>
    __device__ static __forceinline__ void issue_rs(float (&acc)[kN / 8][4], unsigned (&a)[kK / 16][4], const T* b) {
        const unsigned b_base = smem_addr(b);
#pragma unroll
        for (int kk = 0; kk < kK / 16; ++kk) wgmma_rs<kN, kBKN ? 1 : 0>(acc, a[kk], b_descriptor<kN, kK, kBKN>(b_base, 16 * kk), kk > 0);
    }

    // Commits the products issued and waits for them: their accumulators are then the thread's again.
    template <class... Accumulators>
    __device__ static __forceinline__ void complete(Accumulators&... accumulators) {
        wgmma_commit();
        wgmma_wait<0>();
        (fence_operands(accumulators), ...);
    }

    // One product, issued and completed.
    template <int kN, int kK, bool kATransposed, bool kBKN, bool kAccumulate = false>
    __device__ static __forceinline__ void product(float (&acc)[kN / 8][4], const T* a, const T* b) {
        wgmma_fence();
        issue<kN, kK, kATransposed, kBKN>(acc, a, b, kAccumulate);
        complete(acc);
    }
    template <int kN, int kK, bool kBKN>
    __device__ static __forceinline__ void product_rs(float (&acc)[kN / 8][4], unsigned (&a)[kK / 16][4], const T* b) {
        fence_operands(a);
        wgmma_fence();
        issue_rs<kN, kK, kBKN>(acc, a, b);
        complete(acc);
    }

    // Row and column of accumulator element (n, e).
    __device__ static __forceinline__ int row_of(int e) { return 16 * ((threadIdx.x / 32) % 4) + (threadIdx.x % 32) / 4 + (e / 2) * 8; }
    __device__ static __forceinline__ int column_of(int n, int e) { return 8 * n + 2 * (threadIdx.x % 4) + e % 2; }

    // Each thread's accumulator elements through f(row, column, value) -> the value to keep.
    template <int kN, class F>
    __device__ static __forceinline__ void each(float (&acc)[kN / 8][4], F f) {
#pragma unroll
        for (int n = 0; n < kN / 8; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[n][e] = f(row_of(e), column_of(n, e), acc[n][e]);
        }
    }

    // A product's results into a 16-bit tile of 64 rows.
    template <int kN>
    __device__ static __forceinline__ void store(T* tile, const float (&acc)[kN / 8][4]) {
#pragma unroll
        for (int n = 0; n < kN / 8; ++n) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                *reinterpret_cast<unsigned*>(tile + at<kChunk>(row_of(2 * half), column_of(n, 0))) =
                    pack2<T>(acc[n][2 * half], acc[n][2 * half + 1]);
            }
        }
    }

    // A product's rows into global memory, fp32, rows `row_stride` elements apart, only the rows inside the
    // sequence (row_inside: the thread's upper and lower row); `add` adds them to what the thread wrote there before,
    // by fire-and-forget reductions in L2 (red): a load first waited for its own round trip (ncu: 13% of the
    // kernel's stall samples, bench/NOTES.md, thirty-first session). The same thread wrote every element it adds to,
    // in program order, so each sum is the one an add in registers would make (red's fp32 add rounds to nearest
    // even, flushing subnormals to zero) and the result stays deterministic.
    template <int kN>
    __device__ static __forceinline__ void write_rows(float* out, long long row_stride, const float (&acc)[kN / 8][4],
                                                      const bool (&row_inside)[2], bool add) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            if (!row_inside[half]) continue;
            float* const row = out + row_of(2 * half) * row_stride + column_of(0, 0);
#pragma unroll
            for (int n = 0; n < kN / 8; ++n) {  // columns 8 n on
                if (add) {
                    asm volatile("red.global.add.v2.f32 [%0], { %1, %2 };\n"
                                 :: "l"(row + 8 * n), "f"(acc[n][2 * half]), "f"(acc[n][2 * half + 1]) : "memory");
                } else {
                    *reinterpret_cast<float2*>(row + 8 * n) = make_float2(acc[n][2 * half], acc[n][2 * half + 1]);
                }
            }
        }
    }

    // Adds, per row, the sum over the row's elements of value(row, column, element) into sums[row]: each thread's,
    // then the four lanes of its rows (which hold all of a row's columns). No barrier: row i's entry is always
    // written by the same thread.
    template <int kN, class F>
    __device__ static __forceinline__ void add_row_sums(float* sums, const float (&acc)[kN / 8][4], F value) {
        float part[2] = {0.f, 0.f};
#pragma unroll
        for (int n = 0; n < kN / 8; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) part[e / 2] += value(row_of(e), column_of(n, e), acc[n][e]);
        }
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            part[half] += __shfl_xor_sync(0xffffffffu, part[half], 1);
            part[half] += __shfl_xor_sync(0xffffffffu, part[half], 2);
            if (threadIdx.x % 4 == 0) sums[row_of(2 * half)] += part[half];
        }
    }

    // Elements (row, col) and (row, col + 1) of a 16-bit tile of 64 rows (col even: one 32-bit word), as floats.
    __device__ static __forceinline__ float2 pair_at(const T* tile, int row, int col) {
        return unpack2<T>(*reinterpret_cast<const unsigned*>(tile + at<kChunk>(row, col)));
    }

    // Adds, per row, the dot product of the row's accumulators with the same row of a 16-bit tile (read a word, two
    // columns, at a time) into sums[row], as add_row_sums does.
    template <int kN>
    __device__ static __forceinline__ void add_row_dots(float* sums, const float (&acc)[kN / 8][4], const T* tile) {
        float part[2] = {0.f, 0.f};
#pragma unroll
        for (int n = 0; n < kN / 8; ++n) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const float2 pair = pair_at(tile, row_of(2 * half), column_of(n, 0));
                part[half] = fmaf(pair.x, acc[n][2 * half], fmaf(pair.y, acc[n][2 * half + 1], part[half]));
            }
        }
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            part[half] += __shfl_xor_sync(0xffffffffu, part[half], 1);
            part[half] += __shfl_xor_sync(0xffffffffu, part[half], 2);
            if (threadIdx.x % 4 == 0) sums[row_of(2 * half)] += part[half];
        }
    }

    // The gradient of exponents G_i - G_j from a 64x64 matrix M in accumulators: its row sums into d_gamma, its
    // column sums (the warp's rows by shuffles, then the four warps in order) into `columns`. Its warpgroup
    // barrier (before the columns' last add) also orders the warpgroup's shared-memory writes before the call
    // (fenced for the tensor core by their writers) before what follows.
    __device__ static __forceinline__ void add_exponent_sums(GroupSums& sums, int group, const float (&m)[kChunk / 8][4]) {
        add_row_sums<kChunk>(sums.d_gamma, m, [](int, int, float x) { return x; });
        float column[kChunk / 8][2];
#pragma unroll
        for (int n = 0; n < kChunk / 8; ++n) {
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                column[n][c] = m[n][c] + m[n][2 + c];
#pragma unroll
                for (int offset = 4; offset < 32; offset *= 2) column[n][c] += __shfl_xor_sync(0xffffffffu, column[n][c], offset);
            }
        }
        const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4;
        if (lane < 4) {
#pragma unroll
            for (int n = 0; n < kChunk / 8; ++n) {
#pragma unroll
                for (int c = 0; c < 2; ++c) sums.column_part[warp][8 * n + 2 * lane + c] = column[n][c];
            }
        }
        group_wait(group);
        const int local = threadIdx.x % kGroupThreads;
        if (local < kChunk) {
            sums.columns[local] += sums.column_part[0][local] + sums.column_part[1][local] +
                                   sums.column_part[2][local] + sums.column_part[3][local];
        }
    }

    // Word w of a 16-byte vector (int4 or uint4; w known where the loops unroll).
    template <class Vector>
    __device__ static __forceinline__ unsigned word_of(const Vector& vector, int w) {
        return static_cast<unsigned>(w == 0 ? vector.x : w == 1 ? vector.y : w == 2 ? vector.z : vector.w);
    }

    // Rows [0, valid) of a [kRows][kCols] global matrix (row stride in elements) into a tile by cp.async from
    // `loaders` threads (this one `loader`), the rest zero-filled and never read.
    template <int kCols, int kRows = kChunk>
    __device__ static __forceinline__ void load(T* tile, const T* src, long long stride, int valid, int loader, int loaders) {
        constexpr int kPieces = kRows * kCols / 8;
        for (int i = loader; i < kPieces; i += loaders) {
            const int row = i / (kCols / 8), col = (i % (kCols / 8)) * 8;
            const bool inside = row < valid;
            cp_async_16_zfill(smem_addr(tile + at<kRows>(row, col)), src + (inside ? row * stride + col : 0), inside);
        }
    }

    // A unit of work: a chunk, its q/k head, and one v-head of the head's group. Items are chunk-fastest.
    struct Unit {
        int chunk, head, head_v;
    };
    template <class Args>
    __device__ static __forceinline__ Unit unit_of(const Args& a, int item, int group_index) {
        const int chunks = static_cast<int>(a.num_chunks), chunk = item % chunks, head = item / chunks;
        return {chunk, head, head * static_cast<int>(a.num_heads_v / a.num_heads) + group_index};
    }
    template <class Args>
    __device__ static __forceinline__ int valid_rows(const Args& a, int chunk) {
        return kHasIncompleteTile ? a.chunks[2 * chunk + 1] : kChunk;
    }

    // The unit's dO, S^T, dS'^T and V, and with_q its Q, by cp.async (not committed).
    template <class Args>
    __device__ static __forceinline__ void load_early(Shared& smem, const Args& a, const Unit& u, bool with_q, int loader, int loaders) {
        const int token = a.chunks[2 * u.chunk], valid = valid_rows(a, u.chunk);
        const long long qk_stride = a.num_heads * kHeadDim, v_stride = a.num_heads_v * kHeadDim;
        const long long state_offset = (static_cast<long long>(u.chunk) * a.num_heads_v + u.head_v) * kHeadDim * kHeadDim;
        if (with_q) load<kHeadDim>(smem.q, a.q + token * qk_stride + u.head * kHeadDim, qk_stride, valid, loader, loaders);
        load<kHeadDim>(smem.v, a.v + token * v_stride + u.head_v * kHeadDim, v_stride, valid, loader, loaders);
        load<kHeadDim>(smem.d_out, a.d_out + token * v_stride + u.head_v * kHeadDim, v_stride, valid, loader, loaders);
        load<kHeadDim, kStateRows>(smem.state, a.states + state_offset, kHeadDim, kStateRows, loader, loaders);
        load<kHeadDim, kStateRows>(smem.d_state, a.d_states + state_offset, kHeadDim, kStateRows, loader, loaders);
    }

    // The unit's Tbeta, and with_k its K, by cp.async (not committed).
    template <class Args>
    __device__ static __forceinline__ void load_late(Shared& smem, const Args& a, const Unit& u, bool with_k, int loader, int loaders) {
        const long long qk_stride = a.num_heads * kHeadDim;
        if (with_k) {
            load<kHeadDim>(smem.k, a.k + a.chunks[2 * u.chunk] * qk_stride + u.head * kHeadDim, qk_stride,
                           valid_rows(a, u.chunk), loader, loaders);
        }
        load<kChunk>(smem.tbeta, a.tbeta + (static_cast<long long>(u.chunk) * a.num_heads_v + u.head_v) * kChunk * kChunk,
                     kChunk, kChunk, loader, loaders);
    }

    // The unit's two rounding-loss slices (add_state_products reads them, each warpgroup half of each, on its
    // chain of products) into L2, by one thread, a unit ahead.
    template <class Args>
    __device__ static __forceinline__ void prefetch_residuals(const Args& a, const Unit& u) {
        const long long offset = (static_cast<long long>(u.chunk) * a.num_heads_v + u.head_v) * kHeadDim * kHeadDim;
        prefetch_l2(a.state_residuals + offset, kStateRows * kHeadDim);
        prefetch_l2(a.d_state_residuals + offset, kStateRows * kHeadDim);
    }

    // Thread i < kChunk's gate g and beta of the unit's token i (zeros past the sequence, and for other threads).
    template <class Args>
    __device__ static __forceinline__ float2 gates_of(const Args& a, const Unit& u) {
        const int i = threadIdx.x;
        if (i >= kChunk || (kHasIncompleteTile && i >= valid_rows(a, u.chunk))) return make_float2(0.f, 0.f);
        const long long at = static_cast<long long>(a.chunks[2 * u.chunk] + i) * a.num_heads_v + u.head_v;
        return make_float2(a.g[at], a.beta_is_fp32 ? static_cast<const float*>(a.beta)[at]
                                                   : to_f32<T>(static_cast<const T*>(a.beta)[at]));
    }

    // D_ij = e^{G_i - G_j} for i >= j, else 0: the exponent is never positive.
    __device__ static __forceinline__ float decay(const Shared& smem, int i, int j) {
        return i >= j ? __expf(smem.gamma[i] - smem.gamma[j]) : 0.f;
    }

    // What both warpgroups know of the unit.
    struct Context {
        Unit unit;
        float scale, gamma_last;
        bool row_inside[2];  // the thread's two accumulator rows
        bool add_to_dq_dk;   // a group's later v-head: dq and dk are added to the item's
    };

    // Where the chunk's gradients go (dq and dk [token, head, K], dv [token, v-head, K]), from its first token
    // read again at each write (volatile): addresses made at the start and kept live to the end crowd out the
    // products' registers (ptxas spilled them).
    template <class Args>
    __device__ static __forceinline__ long long out_offset(const Args& a, int chunk, long long heads, int of_head) {
        const int first = *static_cast<const volatile int*>(a.chunks + 2 * chunk);
        return (static_cast<long long>(first) * heads + of_head) * kHeadDim;
    }

    // The kernel: its arguments as chunk.cu.j2 declares them from the launch contract.
    template <class Args>
    __device__ static __forceinline__ void run(const Args& a) {
        extern __shared__ unsigned char smem_bytes[];
        Shared& smem = *reinterpret_cast<Shared*>(align_up<kSwizzleAlignment>(smem_bytes));
        const int group = static_cast<int>(a.num_heads_v / a.num_heads);
        // Below 2^31: q would otherwise hold 2^37 rows.
        const int items = static_cast<int>(a.num_chunks * a.num_heads);
        int item = blockIdx.x;
        if (item >= items) return;
        const Unit first = unit_of(a, item, 0);
        load_early(smem, a, first, true, threadIdx.x, kThreads);
        load_late(smem, a, first, true, threadIdx.x, kThreads);
        cp_async_commit();
        if (threadIdx.x == 0) prefetch_residuals(a, first);
        float2 gates = gates_of(a, first);
        for (int group_index = 0;;) {
            // The unit after this one: the group's next v-head, else the block's next item's first.
            const bool same_item = group_index + 1 < group;
            const int next_item = same_item ? item : item + static_cast<int>(gridDim.x);
            const int next_index = same_item ? group_index + 1 : 0;
            gates = run_unit(smem, a, unit_of(a, item, group_index), gates, group_index > 0, next_item < items,
                             unit_of(a, next_item, next_index), !same_item);
            if (next_item >= items) break;
            item = next_item, group_index = next_index;
            barrier();  // the unit's last reads of its vectors are done before the next unit writes them
        }
    }

    // One unit, its inputs loaded (not yet waited for) and its gates given; add_to_dq_dk: a group's later v-head,
    // adding to the item's dq and dk. The side warpgroup loads the next unit's inputs (if has_next; Q and K too
    // for a new_item) into the tiles as the unit is done with them; returns the next unit's gates.
    template <class Args>
    __device__ static __forceinline__ float2 run_unit(Shared& smem, const Args& a, const Unit u, float2 gates,
                                                      bool add_to_dq_dk, bool has_next, const Unit next, bool new_item) {
        const int group = warp_index() / 4, local = threadIdx.x % kGroupThreads;
        if (threadIdx.x < kChunk) {
            smem.gamma[threadIdx.x] = gates.x;  // cumsum below
            smem.beta[threadIdx.x] = gates.y;
        }
        if (local < kChunk) {
            GroupSums& sums = smem.sums[group];
            sums.d_gamma[local] = sums.d_beta[local] = sums.columns[local] = sums.via_kd[local] = sums.via_kb[local] = 0.f;
        }
        cp_async_wait<0>();
        barrier();
        if (threadIdx.x < 32) {  // G = the in-chunk cumsum of g, lane l's tokens 2 l and 2 l + 1
            const int lane = threadIdx.x;
            const float2 gamma = chunk_cumsum(smem.gamma[2 * lane], smem.gamma[2 * lane + 1], lane);
            smem.gamma[2 * lane] = gamma.x;
            smem.gamma[2 * lane + 1] = gamma.y;
        }
        barrier();
        const int valid = valid_rows(a, u.chunk);
        const Context c{u, a.scale, smem.gamma[kChunk - 1],
                        {!kHasIncompleteTile || row_of(0) < valid, !kHasIncompleteTile || row_of(2) < valid}, add_to_dq_dk};
        if (has_next && threadIdx.x == kGroupThreads) prefetch_residuals(a, next);
        float2 next_gates = make_float2(0.f, 0.f);
        if (group == kChain) {
            if (has_next) next_gates = gates_of(a, next);  // threads 0-63: in this warpgroup
            chain(smem, a, c);
        } else {
            side(smem, a, c, has_next, next, new_item);
        }
        barrier();
        if (threadIdx.x < 32) finish(smem, a, c, valid);
        return next_gates;
    }

    // Warps 0-3: dVn, dw, dt, X, dA, dkk + dkk^T; dq.
    template <class Args>
    __device__ static __forceinline__ void chain(Shared& smem, const Args& a, const Context& c) {
        GroupSums& sums = smem.sums[kChain];
        // dVn = diag(e^{G_L - G}) K dS' + scale P^T dO, as scale (diag(e^{G_L - G}) / scale K dS' + P^T dO): the
        // tensor core adds the second product.
        float d_vn[kHeadDim / 8][4];
        product<kHeadDim, kHeadDim, false, false>(d_vn, smem.k, smem.d_state);
        each<kHeadDim>(d_vn, [&](int i, int, float x) { return __expf(c.gamma_last - smem.gamma[i]) / c.scale * x; });
        await(kPReady);
        product<kHeadDim, kChunk, true, true, true>(d_vn, smem.p, smem.d_out);
        each<kHeadDim>(d_vn, [&](int, int, float x) { return c.scale * x; });
        store<kHeadDim>(smem.d_vn, d_vn);
        hand_over(kDvnReady);
        unsigned d_vn_a[kHeadDim / 16][4];
        accumulators_as_a<T, kHeadDim / 8>(d_vn_a, d_vn);
        // dw = -dVn S^T.
        unsigned dw_a[kHeadDim / 16][4];
        {
            float dw[kHeadDim / 8][4];
            product_rs<kHeadDim, kHeadDim, true>(dw, d_vn_a, smem.state);
            each<kHeadDim>(dw, [](int, int, float x) { return -x; });
            store<kHeadDim>(smem.dw, dw);
            hand_over(kDwReady);
            accumulators_as_a<T, kHeadDim / 8>(dw_a, dw);
        }
        // dt = (dw Kb^T + dVn Vb^T): column j of both times beta_j (and e^{G_j}: Kb = diag(beta e^G) K).
        {
            float via_k[kChunk / 8][4], via_v[kChunk / 8][4];
            fence_operands(dw_a);
            fence_operands(d_vn_a);
            wgmma_fence();
            issue_rs<kChunk, kHeadDim, false>(via_k, dw_a, smem.k);
            issue_rs<kChunk, kHeadDim, false>(via_v, d_vn_a, smem.v);
            complete(via_k, via_v);
#pragma unroll
            for (int n = 0; n < kChunk / 8; ++n) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int j = column_of(n, e);
                    via_k[n][e] = smem.beta[j] * (__expf(smem.gamma[j]) * via_k[n][e] + via_v[n][e]);
                }
            }
            group_wait(kChain);  // every warp's P^T dO has read P's tile
            store<kChunk>(smem.p, via_k);
        }
        // dq = scale diag(e^G) dO S^T + dqk K; q . (its first term) is G's.
        float dq[kHeadDim / 8][4];
        product<kHeadDim, kHeadDim, false, true>(dq, smem.d_out, smem.state);
        each<kHeadDim>(dq, [&](int i, int, float x) { return c.scale * __expf(smem.gamma[i]) * x; });
        add_row_dots<kHeadDim>(sums.d_gamma, dq, smem.q);
        add_state_products(smem, a, c, kChain);
        named_barrier_arrive(kEarlyFree, kThreads);
        // X = T^T dt; dA = -StrictLower(X T^T), X from registers.
        await(kTReady);
        group_sync(kChain);  // dt's tile complete
        float da[kChunk / 8][4];
        {
            float x[kChunk / 8][4];
            product<kChunk, kChunk, true, true>(x, smem.t, smem.p);
            unsigned x_a[kChunk / 16][4];
            accumulators_as_a<T, kChunk / 8>(x_a, x);
            product_rs<kChunk, kChunk, false>(da, x_a, smem.t);
        }
        // beta's share sum_j dA_ij L_ij; the exponents' dA * A (A = diag(beta) L); dkk = dA * beta_i * D, into L's
        // place (each element by the thread that read it).
        each<kChunk>(da, [](int i, int j, float x) { return i > j ? -x : 0.f; });
        add_row_sums<kChunk>(sums.d_beta, da, [&](int i, int j, float x) { return x * at_f(smem.square, i, j); });
        each<kChunk>(da, [&](int i, int j, float x) {
            const float l = at_f(smem.square, i, j);
            at_f(smem.square, i, j) = x * smem.beta[i] * decay(smem, i, j);
            return x * smem.beta[i] * l;
        });
        add_exponent_sums(sums, kChain, da);  // its barrier: dkk complete, and X's product has read dt
        // dkk + dkk^T (16-bit, in dt's tile), for the side's dk.
        for (int x = threadIdx.x; x < kChunk * kChunk; x += kGroupThreads) {
            const int i = x / kChunk, j = x % kChunk;
            smem.p[at<kChunk>(i, j)] = from_f32<T>(at_f(smem.square, i, j) + at_f(smem.square, j, i));
        }
        hand_over(kSymReady);
        await(kDqkReady);
        product<kHeadDim, kChunk, false, true, true>(dq, smem.tbeta, smem.k);
        const long long num_heads = a.num_heads;
        write_rows<kHeadDim>(a.dq + out_offset(a, c.unit.chunk, num_heads, c.unit.head), num_heads * kHeadDim, dq,
                             c.row_inside, c.add_to_dq_dk);
        named_barrier_arrive(kLateFree, kThreads);
    }

    // Warps 4-7: L, P, T, Z, Vn, dqk; dk, dv; the next unit's loads.
    template <class Args>
    __device__ static __forceinline__ void side(Shared& smem, const Args& a, const Context& c, bool has_next,
                                                const Unit& next, bool new_item) {
        GroupSums& sums = smem.sums[kSide];
        const int loader = threadIdx.x - kGroupThreads;
        // P = Q K^T * D first (16-bit for the chain's P^T dO, its second product; fp32 kept here for dP * P), then
        // L = StrictLower(K K^T * D) (fp32 for the chain's dA terms, handed over with T; 16-bit for T).
        float p[kChunk / 8][4];
        product<kChunk, kHeadDim, false, false>(p, smem.q, smem.k);
        each<kChunk>(p, [&](int i, int j, float x) { return x * decay(smem, i, j); });
        store<kChunk>(smem.p, p);
        hand_over(kPReady);
        {
            float kk[kChunk / 8][4];
            product<kChunk, kHeadDim, false, false>(kk, smem.k, smem.k);
            each<kChunk>(kk, [&](int i, int j, float x) {
                const float l = i > j ? x * decay(smem, i, j) : 0.f;
                at_f(smem.square, i, j) = l;
                return l;
            });
            store<kChunk>(smem.t, kk);
        }
        group_sync(kSide);  // L's 16-bit copy complete
        // T = I - Tbeta L, into L's tile.
        {
            float t[kChunk / 8][4];
            product<kChunk, kChunk, false, true>(t, smem.tbeta, smem.t);
            each<kChunk>(t, [](int i, int j, float x) { return (i == j ? 1.f : 0.f) - x; });
            group_wait(kSide);  // every warp's product has read L
            store<kChunk>(smem.t, t);
        }
        hand_over(kTReady);
        // Z = V - diag(e^G) K S, then Vn = Tbeta Z into Z's tile.
        {
            float z[kHeadDim / 8][4];
            product<kHeadDim, kHeadDim, false, false>(z, smem.k, smem.state);
#pragma unroll
            for (int n = 0; n < kHeadDim / 8; ++n) {
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                    const int i = row_of(2 * half);
                    const float2 v = pair_at(smem.v, i, column_of(n, 0));
                    const float decay_in = __expf(smem.gamma[i]);
                    z[n][2 * half] = v.x - decay_in * z[n][2 * half];
                    z[n][2 * half + 1] = v.y - decay_in * z[n][2 * half + 1];
                }
            }
            store<kHeadDim>(smem.z_vn, z);
            group_sync(kSide);  // Z complete, and T for this warpgroup's products
            product<kHeadDim, kChunk, false, true>(z, smem.tbeta, smem.z_vn);
            group_wait(kSide);  // every warp's product has read Z, and Tbeta for the last time
            store<kHeadDim>(smem.z_vn, z);
            group_sync(kSide);  // Vn complete
        }
        // dqk = scale (dO Vn^T) * D (16-bit, in Tbeta's tile); dP * P = scale (dO Vn^T) * P, the exponents' share.
        {
            float dp[kChunk / 8][4];
            product<kChunk, kHeadDim, false, false>(dp, smem.d_out, smem.z_vn);
#pragma unroll
            for (int n = 0; n < kChunk / 8; ++n) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int i = row_of(e), j = column_of(n, e);
                    const float d_p = c.scale * dp[n][e];
                    p[n][e] *= d_p;
                    dp[n][e] = d_p * decay(smem, i, j);
                }
            }
            store<kChunk>(smem.tbeta, dp);
            hand_over(kDqkReady);
            add_exponent_sums(sums, kSide, p);  // its barrier: dqk complete for this warpgroup too
        }
        // dk = diag(e^{G_L - G}) Vn dS'^T + dqk^T Q + diag(beta e^G) T^T dw + (dkk + dkk^T) K, in registers.
        float dk[kHeadDim / 8][4];
        product<kHeadDim, kHeadDim, false, true>(dk, smem.z_vn, smem.d_state);
        each<kHeadDim>(dk, [&](int i, int, float x) { return __expf(c.gamma_last - smem.gamma[i]) * x; });
        // Kd . dKd, row by row: the exponents of Kd = diag(e^{G_L - G}) K.
        add_row_dots<kHeadDim>(sums.via_kd, dk, smem.k);
        product<kHeadDim, kChunk, true, true, true>(dk, smem.tbeta, smem.q);
        add_state_products(smem, a, c, kSide);
        // dVb = T^T dVn: dv = diag(beta) dVb; v . dVb is beta's share.
        await(kDvnReady);
        {
            float d_vb[kHeadDim / 8][4];
            product<kHeadDim, kChunk, true, true>(d_vb, smem.t, smem.d_vn);
            add_row_dots<kHeadDim>(sums.d_beta, d_vb, smem.v);
            const long long v_stride = a.num_heads_v * kHeadDim;
            T* const out = a.dv + out_offset(a, c.unit.chunk, a.num_heads_v, c.unit.head_v);
#pragma unroll
            for (int n = 0; n < kHeadDim / 8; ++n) {
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                    const int i = row_of(2 * half);
                    if (!c.row_inside[half]) continue;
                    *reinterpret_cast<unsigned*>(out + i * v_stride + column_of(n, 0)) =
                        pack2<T>(smem.beta[i] * d_vb[n][2 * half], smem.beta[i] * d_vb[n][2 * half + 1]);
                }
            }
        }
        // Neither warpgroup reads this unit's dO, S^T, dS'^T, V and Q any more: the next unit's go into their tiles.
        await(kEarlyFree);
        if (has_next) {
            load_early(smem, a, next, new_item, loader, kGroupThreads);
            cp_async_commit();
        }
        // dKb = T^T dw: dk += diag(beta e^G) dKb; e^G k . dKb is beta's share and, times beta, G's.
        await(kDwReady);
        {
            float d_kb[kHeadDim / 8][4];
            product<kHeadDim, kChunk, true, true>(d_kb, smem.t, smem.dw);
            add_row_dots<kHeadDim>(sums.via_kb, d_kb, smem.k);  // times e^G in finish
#pragma unroll
            for (int n = 0; n < kHeadDim / 8; ++n) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int i = row_of(e);
                    dk[n][e] += smem.beta[i] * __expf(smem.gamma[i]) * d_kb[n][e];
                }
            }
        }
        await(kSymReady);
        product<kHeadDim, kChunk, false, true, true>(dk, smem.p, smem.k);
        const long long num_heads = a.num_heads;
        write_rows<kHeadDim>(a.dk + out_offset(a, c.unit.chunk, num_heads, c.unit.head), num_heads * kHeadDim, dk,
                             c.row_inside, c.add_to_dq_dk);
        // Neither warpgroup reads this unit's K and dqk any more.
        await(kLateFree);
        if (has_next) {
            load_late(smem, a, next, new_item, loader, kGroupThreads);
            cp_async_commit();
        }
    }

    // This warpgroup's half of sum(dS' * S) over the state's elements, into block_part: S and dS' with what their
    // 16-bit copies lost (the recompute's and the reverse recurrence's rounding losses, tiles.cuh's
    // store_residual_rows), since the sum's terms cancel far below their size: from the copies alone dg missed
    // the 1e-2 bar on a head without decay (bench/NOTES.md, thirty-second session). 16 keys of a value row a
    // thread at a time.
    template <class Args>
    __device__ static __forceinline__ void add_state_products(Shared& smem, const Args& a, const Context& c, int group) {
        const long long state_offset = (static_cast<long long>(c.unit.chunk) * a.num_heads_v + c.unit.head_v) * kHeadDim * kHeadDim;
        constexpr int kHalf = kStateRows * kHeadDim / 2, kRounds = kHalf / (16 * kGroupThreads);
        static_assert(kRounds * 16 * kGroupThreads == kHalf, "state products: whole rounds of 16 elements a thread");
        const int first = group * kHalf + 16 * (threadIdx.x % kGroupThreads);
        float own = 0.f;
        // Both loads of a round before either is used (with all rounds' at once, ptxas spilled).
        int4 s_lost = *reinterpret_cast<const int4*>(a.state_residuals + state_offset + first);
        int4 d_lost = *reinterpret_cast<const int4*>(a.d_state_residuals + state_offset + first);
#pragma unroll 1
        for (int round = 0; round < kRounds; ++round) {
            const int x = first + round * 16 * kGroupThreads, value = x / kHeadDim, key = x % kHeadDim;
            const int4 s_now = s_lost, d_now = d_lost;
            if (round + 1 < kRounds) {  // the next round's, a round ahead
                s_lost = *reinterpret_cast<const int4*>(a.state_residuals + state_offset + x + 16 * kGroupThreads);
                d_lost = *reinterpret_cast<const int4*>(a.d_state_residuals + state_offset + x + 16 * kGroupThreads);
            }
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const uint4 s_kept = *reinterpret_cast<const uint4*>(smem.state + at<kStateRows>(value, key + 8 * half));
                const uint4 d_kept = *reinterpret_cast<const uint4*>(smem.d_state + at<kStateRows>(value, key + 8 * half));
#pragma unroll
                for (int i = 0; i < 8; i += 2) {
                    const float2 s_pair = unpack2<T>(word_of(s_kept, i / 2)), d_pair = unpack2<T>(word_of(d_kept, i / 2));
                    // Bytes 8 half + i and + 1 of the round's 16: word (8 half + i) / 4, its lower or upper 16 bits.
                    const int word = (8 * half + i) / 4, shift = 16 * ((i / 2) % 2);
                    const float2 s_loss = from_e5m2x2(static_cast<unsigned short>(word_of(s_now, word) >> shift));
                    const float2 d_loss = from_e5m2x2(static_cast<unsigned short>(word_of(d_now, word) >> shift));
                    constexpr float kUnscale = 1.f / kResidualScale;
                    own = fmaf(fmaf(s_loss.x, kUnscale, s_pair.x), fmaf(d_loss.x, kUnscale, d_pair.x), own);
                    own = fmaf(fmaf(s_loss.y, kUnscale, s_pair.y), fmaf(d_loss.y, kUnscale, d_pair.y), own);
                }
            }
        }
#pragma unroll
        for (int offset = 16; offset > 0; offset /= 2) own += __shfl_xor_sync(0xffffffffu, own, offset);
        if (threadIdx.x % 32 == 0) smem.block_part[threadIdx.x / 32] = own;
    }

    // Warp 0, after the block's barrier: both warpgroups' row vectors added in order, G_L's own share
    // (sum_i (Kd . dKd)_i + e^{G_L} sum(dS' * S)) to the last row, dg as the in-chunk reverse cumsum of dG, and
    // dbeta; lane l's tokens 2 l and 2 l + 1.
    template <class Args>
    __device__ static __forceinline__ void finish(Shared& smem, const Args& a, const Context& c, int valid) {
        const int lane = threadIdx.x;
        float d_gamma[2], d_beta[2], via = 0.f;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int i = 2 * lane + h;
            d_gamma[h] = d_beta[h] = 0.f;
            const float decay_in = __expf(smem.gamma[i]);
#pragma unroll
            for (int group = 0; group < 2; ++group) {
                const GroupSums& sums = smem.sums[group];
                const float via_kb = decay_in * sums.via_kb[i];
                d_gamma[h] += sums.d_gamma[i] - sums.columns[i] - sums.via_kd[i] + smem.beta[i] * via_kb;
                d_beta[h] += sums.d_beta[i] + via_kb;
                via += sums.via_kd[i];
            }
        }
#pragma unroll
        for (int offset = 16; offset > 0; offset /= 2) via += __shfl_xor_sync(0xffffffffu, via, offset);
        if (lane == 31) {
            float states = 0.f;
            for (int w = 0; w < kWarps; ++w) states += smem.block_part[w];
            d_gamma[1] += via + __expf(c.gamma_last) * states;
        }
        // dG summed from the chunk's end: chunk_cumsum over the tokens in reverse order (lane 31 - l's pair,
        // swapped), the sums then handed back.
        const float2 from_end = chunk_cumsum(__shfl_xor_sync(0xffffffffu, d_gamma[1], 31),
                                             __shfl_xor_sync(0xffffffffu, d_gamma[0], 31), lane);
        const float dg[2] = {__shfl_xor_sync(0xffffffffu, from_end.y, 31), __shfl_xor_sync(0xffffffffu, from_end.x, 31)};
        const long long heads_v = a.num_heads_v, token = a.chunks[2 * c.unit.chunk];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int i = 2 * lane + h;
            if (kHasIncompleteTile && i >= valid) continue;
            const long long at = (token + i) * heads_v + c.unit.head_v;
            a.dg[at] = dg[h];
            a.dbeta[at] = d_beta[h];
        }
    }
};

}  // namespace gdn
}  // namespace kgen
