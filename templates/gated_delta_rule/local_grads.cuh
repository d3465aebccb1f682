// The backward's per-chunk gradients, per (chunk, q/k head) item the head's v-heads one after the other: kgen/families/gated_delta_rule/local_grads.py's
// algebra (its docstring has the notation) from the chunk's inputs, its start state S (S^T, from
// gated_delta_rule_chunk_states), the gradient dS' of its end state (dS'^T, from gated_delta_rule_chunk_reverse)
// and Tbeta (from gated_delta_rule_kkt), with T = I - Tbeta StrictLower(K K^T * D) (since T (I + A) = I).
// Writes dq and dk per q/k head (fp32, a GVA group's v-heads added in order: deterministic, and no per-v-head
// copies for the host to sum), dv, dg and dbeta of the chunk's tokens.
//
// Every operand is a 16-bit shared-memory tile in wgmma's 64-byte swizzled layout (common/swizzle.cuh: spans of
// 32 columns, so that a warpgroup's half of a 64-column product is whole spans); every product is `product`, a
// wgmma over one such pair (either side read transposed), its result in registers: the two warpgroups take the
// 64 rows each, and a column half each. (It ran on mma.sync until the twenty-ninth session: ncu found it
// latency-bound at 16% of the tensor pipe, each B fragment loaded by the four warps of a column half.) fp32
// matrices the whole block reads (the masks' sums) go through fp32 scratch tiles. Sums over a row are made in a
// fixed order (no atomics), so the gradients are deterministic. Rows past the sequence are zero in q, k, v and
// dO, their gates and betas zero, and nothing is written for them.
//
// Blocks are persistent (one an SM: the tiles take most of its shared memory), each taking the items blockIdx.x,
// + gridDim.x, ... and each item's v-heads as units of work. A unit's inputs are loaded during the unit before it
// (ncu: the loads at each block's start were about 14% of its time, bench/NOTES.md, thirty-first session): dO,
// S^T, dS'^T and V (and Q for a new item) as soon as the unit before has read its own for the last time, midway
// through its tail of products; Tbeta (and K for a new item) after its last products. A group's later v-heads
// keep the item's Q and K.
//
// Config as for recurrence.cuh (T, kHeadDim, kHasIncompleteTile). Needs common/ numeric, smem, swizzle, cp_async,
// tma (the proxy fence) and wgmma (widths 32 and 64 at head dim 64 or 128); gated_delta_rule/tiles.cuh (kChunk).
namespace kgen {
namespace gdn {

template <class Config>
struct LocalGrads {
    using T = typename Config::T;
    static constexpr int kHeadDim = Config::kHeadDim;
    static constexpr bool kHasIncompleteTile = Config::kHasIncompleteTile;
    static constexpr int kThreads = 256, kWarps = kThreads / 32;
    static constexpr int kStateRows = kHeadDim;
    static constexpr int kSquareF = kChunk + 4;  // fp32 scratch stride
    static constexpr int kSpanBytes = 64, kSpanCols = kSpanBytes / 2;  // the tiles' swizzle

    // Tiles first, each a whole number of swizzle repeats from a 1024-byte aligned base.
    struct Shared {
        T q[kChunk * kHeadDim], k[kChunk * kHeadDim], v[kChunk * kHeadDim], d_out[kChunk * kHeadDim];
        T state[kStateRows * kHeadDim], d_state[kStateRows * kHeadDim];  // S^T and dS'^T, [value][key]
        T tbeta[kChunk * kChunk];    // Tbeta; later dqk, then dt, then dkk + dkk^T
        T t[kChunk * kChunk];        // L (16-bit) for T, then T
        T x[kChunk * kChunk];        // X = T^T dt (Q stays for the group's next v-head)
        T wide0[kChunk * kHeadDim];  // Z, then P (first 64 columns), then dVn
        T wide1[kChunk * kHeadDim];  // Vn, then dw
        float square0[kChunk * kSquareF];  // L = StrictLower(K K^T * D), then dkk
        float square1[kChunk * kSquareF];  // K K^T and Q K^T, then P = Q K^T * D, then dP * P, then dA * A
        float gamma[kChunk], beta[kChunk];
        float row_part[2][kChunk];    // a row's sum from each column half of the warps
        float d_gamma[kChunk], d_beta[kChunk];
        float via_kd[kChunk], via_kb[kChunk];  // Kd . dKd and e^G k . dKb, row by row
        float block_part[kWarps];
    };
    static constexpr int kDynamicSmemBytes = sizeof(Shared) + kSwizzleAlignment;
    static_assert(kDynamicSmemBytes <= 227 * 1024, "gated_delta_rule_chunk_grads: shared memory over 227 KB");

    // Where element (row, col) of a tile of kRows rows lies, in elements.
    template <int kRows>
    __device__ static __forceinline__ int at(int row, int col) { return kgen::swizzled<kSpanBytes, kRows, 2, 2>(row, col); }

    // wgmma's descriptors of the tiles: 8 rows of a span are 512 bytes apart; along the contiguous dimension of
    // an MN-major operand, spans are `span_stride` bytes apart.
    __device__ static __forceinline__ unsigned long long k_major(unsigned address) {
        return smem_descriptor(address, 16, 8 * kSpanBytes, Swizzle::k64B);
    }
    __device__ static __forceinline__ unsigned long long mn_major(unsigned address, unsigned span_stride) {
        return smem_descriptor(address, span_stride, 8 * kSpanBytes, Swizzle::k64B);
    }

    // Generic-proxy writes to shared memory (stores, cp.async) made visible to the tensor core's reads, then the
    // block's barrier: every barrier here precedes a product that may read what was written before it.
    __device__ static __forceinline__ void barrier() {
        fence_proxy_async_shared();
        __syncthreads();
    }

    // The warpgroup's columns [half * kN / 2, +kN / 2) of all 64 rows of op(A) op(B): A a [64][kK] tile (or stored
    // [kK][64] when kATransposed), B a [kK][kN] tile (kBKN) or stored [kN][kK]. Accumulators as wgmma's (the
    // mma.sync fragment layout, warp w of a warpgroup on rows 16 w ..); kAccumulate adds the product to them.
    template <int kN, int kK, bool kATransposed, bool kBKN, bool kAccumulate = false>
    __device__ static __forceinline__ void product(float (&acc)[kN / 16][4], const T* a, const T* b) {
        constexpr int kHalf = kN / 2;
        static_assert(kHalf % kSpanCols == 0 && kK % 16 == 0, "product: a warpgroup's columns are whole spans");
        const int n_base = (threadIdx.x / 128) * kHalf;
        const unsigned a_base = smem_addr(a), b_base = smem_addr(b);
        wgmma_fence();
#pragma unroll
        for (int k0 = 0; k0 < kK; k0 += 16) {
            const unsigned long long a_desc =
                kATransposed ? mn_major(a_base + k0 * kSpanBytes, kK * kSpanBytes)
                             : k_major(a_base + (k0 / kSpanCols) * (kChunk * kSpanBytes) + (k0 % kSpanCols) * 2);
            const unsigned long long b_desc =
                kBKN ? mn_major(b_base + (n_base / kSpanCols) * (kK * kSpanBytes) + k0 * kSpanBytes, kK * kSpanBytes)
                     : k_major(b_base + (k0 / kSpanCols) * (kN * kSpanBytes) + n_base * kSpanBytes + (k0 % kSpanCols) * 2);
            wgmma_ss<kHalf, kBKN ? 1 : 0, kATransposed ? 1 : 0>(acc, a_desc, b_desc, kAccumulate || k0 > 0);
        }
        wgmma_commit();
        wgmma_wait<0>();
        fence_operands(acc);
    }

    // Row and column of accumulator element (n, e) of a product kN wide.
    template <int kN>
    __device__ static __forceinline__ int row_of(int e) { return 16 * ((threadIdx.x / 32) % 4) + (threadIdx.x % 32) / 4 + (e / 2) * 8; }
    template <int kN>
    __device__ static __forceinline__ int column_of(int n, int e) {
        return (threadIdx.x / 128) * (kN / 2) + 8 * n + 2 * (threadIdx.x % 4) + e % 2;
    }

    // Each thread's accumulator elements through f(row, column, value) -> the value to keep.
    template <int kN, class F>
    __device__ static __forceinline__ void each(float (&acc)[kN / 16][4], F f) {
#pragma unroll
        for (int n = 0; n < kN / 16; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[n][e] = f(row_of<kN>(e), column_of<kN>(n, e), acc[n][e]);
        }
    }

    // A product's results into a 16-bit tile of 64 rows.
    template <int kN>
    __device__ static __forceinline__ void store(T* tile, const float (&acc)[kN / 16][4]) {
#pragma unroll
        for (int n = 0; n < kN / 16; ++n) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                *reinterpret_cast<unsigned*>(tile + at<kChunk>(row_of<kN>(2 * half), column_of<kN>(n, 0))) =
                    pack2<T>(acc[n][2 * half], acc[n][2 * half + 1]);
            }
        }
    }

    // acc += factor * more, element by element.
    template <int kN>
    __device__ static __forceinline__ void add_into(float (&acc)[kN / 16][4], const float (&more)[kN / 16][4], float factor) {
#pragma unroll
        for (int n = 0; n < kN / 16; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[n][e] += factor * more[n][e];
        }
    }

    // A product's rows into global memory, fp32, rows `row_stride` elements apart, only the rows inside the
    // sequence (row_inside: the thread's upper and lower row); `add` adds them to what the thread wrote there before,
    // by fire-and-forget reductions in L2 (red): a load first waited for its own round trip (ncu: 13% of the
    // kernel's stall samples, bench/NOTES.md, thirty-first session). The same thread wrote every element it adds to,
    // in program order, so each sum is the one an add in registers would make (red's fp32 add rounds to nearest
    // even, flushing subnormals to zero) and the result stays deterministic.
    template <int kN>
    __device__ static __forceinline__ void write_rows(float* out, long long row_stride, const float (&acc)[kN / 16][4],
                                                      const bool (&row_inside)[2], bool add) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            if (!row_inside[half]) continue;
            float* const row = out + row_of<kN>(2 * half) * row_stride + column_of<kN>(0, 0);
#pragma unroll
            for (int n = 0; n < kN / 16; ++n) {  // columns 8 n on
                if (add) {
                    asm volatile("red.global.add.v2.f32 [%0], { %1, %2 };\n"
                                 :: "l"(row + 8 * n), "f"(acc[n][2 * half]), "f"(acc[n][2 * half + 1]) : "memory");
                } else {
                    *reinterpret_cast<float2*>(row + 8 * n) = make_float2(acc[n][2 * half], acc[n][2 * half + 1]);
                }
            }
        }
    }

    // Adds, per row, the sum over the thread's elements of value(row, column, element) into sums[row]: the four
    // lanes of a row, then the two column halves in order. Ends with the block's barrier.
    template <int kN, class F>
    __device__ static __forceinline__ void add_row_sums(Shared& smem, float* sums, const float (&acc)[kN / 16][4], F value) {
        float part[2] = {0.f, 0.f};
#pragma unroll
        for (int n = 0; n < kN / 16; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) part[e / 2] += value(row_of<kN>(e), column_of<kN>(n, e), acc[n][e]);
        }
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            part[half] += __shfl_xor_sync(0xffffffffu, part[half], 1);
            part[half] += __shfl_xor_sync(0xffffffffu, part[half], 2);
            if (threadIdx.x % 4 == 0) smem.row_part[threadIdx.x / 128][row_of<kN>(2 * half)] = part[half];
        }
        barrier();
        if (threadIdx.x < kChunk) sums[threadIdx.x] += smem.row_part[0][threadIdx.x] + smem.row_part[1][threadIdx.x];
        barrier();
    }

    // d_gamma[i] += sum_j M_ij - sum_j M_ji of a 64x64 fp32 scratch matrix (the gradient of exponents G_i - G_j).
    __device__ static __forceinline__ void add_exponent_sums(Shared& smem, const float* m) {
        if (threadIdx.x < kChunk) {
            const int i = threadIdx.x;
            float sum = 0.f;
            for (int j = 0; j < kChunk; ++j) sum += m[i * kSquareF + j] - m[j * kSquareF + i];
            smem.d_gamma[i] += sum;
        }
        barrier();
    }

    // Word w of a 16-byte vector (int4 or uint4; w known where the loops unroll).
    template <class Vector>
    __device__ static __forceinline__ unsigned word_of(const Vector& vector, int w) {
        return static_cast<unsigned>(w == 0 ? vector.x : w == 1 ? vector.y : w == 2 ? vector.z : vector.w);
    }

    // Rows [0, valid) of a [kRows][kCols] global matrix (row stride in elements) into a tile by cp.async, the
    // rest zero-filled and never read.
    template <int kCols, int kRows = kChunk>
    __device__ static __forceinline__ void load(T* tile, const T* src, long long stride, int valid) {
        constexpr int kPieces = kRows * kCols / 8;
        for (int i = threadIdx.x; i < kPieces; i += kThreads) {
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
    __device__ static __forceinline__ void load_early(Shared& smem, const Args& a, const Unit& u, bool with_q) {
        const int token = a.chunks[2 * u.chunk], valid = valid_rows(a, u.chunk);
        const long long qk_stride = a.num_heads * kHeadDim, v_stride = a.num_heads_v * kHeadDim;
        const long long state_offset = (static_cast<long long>(u.chunk) * a.num_heads_v + u.head_v) * kHeadDim * kHeadDim;
        if (with_q) load<kHeadDim>(smem.q, a.q + token * qk_stride + u.head * kHeadDim, qk_stride, valid);
        load<kHeadDim>(smem.v, a.v + token * v_stride + u.head_v * kHeadDim, v_stride, valid);
        load<kHeadDim>(smem.d_out, a.d_out + token * v_stride + u.head_v * kHeadDim, v_stride, valid);
        load<kHeadDim, kStateRows>(smem.state, a.states + state_offset, kHeadDim, kStateRows);
        load<kHeadDim, kStateRows>(smem.d_state, a.d_states + state_offset, kHeadDim, kStateRows);
    }

    // The unit's Tbeta, and with_k its K, by cp.async (not committed).
    template <class Args>
    __device__ static __forceinline__ void load_late(Shared& smem, const Args& a, const Unit& u, bool with_k) {
        const long long qk_stride = a.num_heads * kHeadDim;
        if (with_k) {
            load<kHeadDim>(smem.k, a.k + a.chunks[2 * u.chunk] * qk_stride + u.head * kHeadDim, qk_stride,
                           valid_rows(a, u.chunk));
        }
        load<kChunk>(smem.tbeta, a.tbeta + (static_cast<long long>(u.chunk) * a.num_heads_v + u.head_v) * kChunk * kChunk,
                     kChunk, kChunk);
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
        load_early(smem, a, first, true);
        load_late(smem, a, first, true);
        cp_async_commit();
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
    // adding to the item's dq and dk. Loads the next unit's inputs (if has_next; Q and K too for a new_item) into
    // the tiles as this unit is done with them, and returns the next unit's gates.
    template <class Args>
    __device__ static __forceinline__ float2 run_unit(Shared& smem, const Args& a, const Unit u, float2 gates,
                                                      bool add_to_dq_dk, bool has_next, const Unit next, bool new_item) {
        const int chunk = u.chunk, head = u.head, head_v = u.head_v, heads_v = static_cast<int>(a.num_heads_v);
        const int token = a.chunks[2 * chunk], valid = valid_rows(a, chunk);
        const long long num_heads = a.num_heads, qk_stride = num_heads * kHeadDim;
        const long long v_stride = static_cast<long long>(heads_v) * kHeadDim;
        const float scale = a.scale;
        if (threadIdx.x < kChunk) {
            const int i = threadIdx.x;
            smem.gamma[i] = gates.x;  // cumsum below
            smem.beta[i] = gates.y;
            smem.d_gamma[i] = smem.d_beta[i] = smem.via_kd[i] = smem.via_kb[i] = 0.f;
        }
        cp_async_wait<0>();
        barrier();
        if (threadIdx.x == 0) {
            float running = 0.f;
            for (int i = 0; i < kChunk; ++i) running += smem.gamma[i], smem.gamma[i] = running;
        }
        barrier();
        const float gamma_last = smem.gamma[kChunk - 1];
        const bool row_inside[2] = {!kHasIncompleteTile || row_of<kChunk>(0) < valid, !kHasIncompleteTile || row_of<kChunk>(2) < valid};
        // D_ij = e^{G_i - G_j} for i >= j, else 0: the exponent is never positive.
        auto decay = [&](int i, int j) { return i >= j ? __expf(smem.gamma[i] - smem.gamma[j]) : 0.f; };
        auto at_f = [](float* m, int i, int j) -> float& { return m[i * kSquareF + j]; };
        // Where the chunk's gradients go (dq and dk [token, head, K], dv [token, v-head, K]), from its first token
        // read again at each write (volatile): addresses made at the start and kept live to the end crowd out the
        // products' registers (ptxas spilled them).
        auto out_offset = [&](long long heads, int of_head) {
            const int first = *static_cast<const volatile int*>(a.chunks + 2 * chunk);
            return (static_cast<long long>(first) * heads + of_head) * kHeadDim;
        };

        // K K^T and Q K^T; L = StrictLower(K K^T * D) (fp32, and 16-bit in T's tile), P = Q K^T * D (fp32).
        {
            float kk[kChunk / 16][4], qk[kChunk / 16][4];
            product<kChunk, kHeadDim, false, false>(kk, smem.k, smem.k);
            product<kChunk, kHeadDim, false, false>(qk, smem.q, smem.k);
            each<kChunk>(kk, [&](int i, int j, float x) {
                const float l = i > j ? x * decay(i, j) : 0.f;
                at_f(smem.square0, i, j) = l;
                return l;
            });
            each<kChunk>(qk, [&](int i, int j, float x) { return at_f(smem.square1, i, j) = x * decay(i, j); });
            store<kChunk>(smem.t, kk);
        }
        barrier();
        // T = I - Tbeta L, into L's tile.
        {
            float t[kChunk / 16][4];
            product<kChunk, kChunk, false, true>(t, smem.tbeta, smem.t);
            each<kChunk>(t, [&](int i, int j, float x) { return (i == j ? 1.f : 0.f) - x; });
            barrier();  // L's 16-bit copy is read no more
            store<kChunk>(smem.t, t);
        }
        // Z = V - diag(e^G) K S (in wide0), then Vn = Tbeta Z (in wide1).
        {
            float z[kHeadDim / 16][4];
            product<kHeadDim, kHeadDim, false, false>(z, smem.k, smem.state);
            each<kHeadDim>(z, [&](int i, int c, float x) { return to_f32<T>(smem.v[at<kChunk>(i, c)]) - __expf(smem.gamma[i]) * x; });
            store<kHeadDim>(smem.wide0, z);
        }
        barrier();
        {
            float vn[kHeadDim / 16][4];
            product<kHeadDim, kChunk, false, true>(vn, smem.tbeta, smem.wide0);
            store<kHeadDim>(smem.wide1, vn);
        }
        barrier();  // Z and Tbeta are read no more
        // P (16-bit, in wide0's first 64 columns) for P^T dO.
        for (int x = threadIdx.x; x < kChunk * kChunk; x += kThreads) {
            const int i = x / kChunk, j = x % kChunk;
            smem.wide0[at<kChunk>(i, j)] = from_f32<T>(at_f(smem.square1, i, j));
        }
        barrier();
        // dVn = diag(e^{G_L - G}) K dS' + scale P^T dO (in wide0).
        {
            // As scale (diag(e^{G_L - G}) / scale K dS' + P^T dO): the tensor core adds the second product.
            float kd[kHeadDim / 16][4];
            product<kHeadDim, kHeadDim, false, false>(kd, smem.k, smem.d_state);
            each<kHeadDim>(kd, [&](int i, int, float x) { return __expf(gamma_last - smem.gamma[i]) / scale * x; });
            product<kHeadDim, kChunk, true, true, true>(kd, smem.wide0, smem.d_out);
            each<kHeadDim>(kd, [&](int, int, float x) { return scale * x; });
            barrier();  // P's 16-bit copy is read no more
            store<kHeadDim>(smem.wide0, kd);
        }
        // dqk = scale (dO Vn^T) * D (16-bit, in Tbeta's tile); dP * P = scale (dO Vn^T) * P, the exponents' share.
        {
            float dqk[kChunk / 16][4];
            product<kChunk, kHeadDim, false, false>(dqk, smem.d_out, smem.wide1);
            each<kChunk>(dqk, [&](int i, int j, float x) {
                at_f(smem.square1, i, j) *= scale * x;
                return scale * x * decay(i, j);
            });
            store<kChunk>(smem.tbeta, dqk);
        }
        barrier();
        // dVb = T^T dVn: dv = diag(beta) dVb; v . dVb is beta's share (here, so that V is free sooner).
        {
            float d_vb[kHeadDim / 16][4];
            product<kHeadDim, kChunk, true, true>(d_vb, smem.t, smem.wide0);
            add_row_sums<kHeadDim>(smem, smem.d_beta, d_vb, [&](int i, int c, float x) { return to_f32<T>(smem.v[at<kChunk>(i, c)]) * x; });
            T* const out = a.dv + out_offset(heads_v, head_v);
#pragma unroll
            for (int n = 0; n < kHeadDim / 16; ++n) {
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                    const int i = row_of<kHeadDim>(2 * half);
                    if (!row_inside[half]) continue;
                    *reinterpret_cast<unsigned*>(out + i * v_stride + column_of<kHeadDim>(n, 0)) =
                        pack2<T>(smem.beta[i] * d_vb[n][2 * half], smem.beta[i] * d_vb[n][2 * half + 1]);
                }
            }
        }
        add_exponent_sums(smem, smem.square1);
        // dq = scale diag(e^G) dO S^T + dqk K; q . (its first term) is G's.
        {
            float acc[kHeadDim / 16][4];
            product<kHeadDim, kHeadDim, false, true>(acc, smem.d_out, smem.state);
            each<kHeadDim>(acc, [&](int i, int, float x) { return scale * __expf(smem.gamma[i]) * x; });
            add_row_sums<kHeadDim>(smem, smem.d_gamma, acc, [&](int i, int c, float x) { return to_f32<T>(smem.q[at<kChunk>(i, c)]) * x; });
            product<kHeadDim, kChunk, false, true, true>(acc, smem.tbeta, smem.k);
            write_rows<kHeadDim>(a.dq + out_offset(num_heads, head), qk_stride, acc, row_inside, add_to_dq_dk);
        }
        // dk = diag(e^{G_L - G}) Vn dS'^T + dqk^T Q + (dkk + dkk^T) K + diag(beta e^G) T^T dw, in registers.
        float dk_acc[kHeadDim / 16][4];
        {
            product<kHeadDim, kHeadDim, false, true>(dk_acc, smem.wide1, smem.d_state);
            each<kHeadDim>(dk_acc, [&](int i, int, float x) { return __expf(gamma_last - smem.gamma[i]) * x; });
            // Kd . dKd, row by row: the exponents of Kd = diag(e^{G_L - G}) K.
            add_row_sums<kHeadDim>(smem, smem.via_kd, dk_acc, [&](int i, int c, float x) { return to_f32<T>(smem.k[at<kChunk>(i, c)]) * x; });
            product<kHeadDim, kChunk, true, true, true>(dk_acc, smem.tbeta, smem.q);
        }
        // G_L's own share: sum_i (Kd . dKd)_i + e^{G_L} sum(dS' * S). The second sum's terms cancel far below
        // their size, so it takes S and dS' with what their 16-bit copies lost (the recompute's and the reverse
        // recurrence's rounding losses, tiles.cuh's store_residual_rows): from the copies alone dg missed the 1e-2 bar on a
        // head without decay (bench/NOTES.md, thirty-second session). 16 keys of a value row a thread at a time.
        {
            const long long state_offset = (static_cast<long long>(chunk) * heads_v + head_v) * kHeadDim * kHeadDim;
            constexpr int kRounds = kStateRows * kHeadDim / (16 * kThreads);
            static_assert(kRounds * 16 * kThreads == kStateRows * kHeadDim, "own: whole rounds of 16 elements a thread");
            float own = 0.f;
            // Both loads of a round before either is used (with all rounds' at once, ptxas spilled).
            int4 s_lost = *reinterpret_cast<const int4*>(a.state_residuals + state_offset + 16 * threadIdx.x);
            int4 d_lost = *reinterpret_cast<const int4*>(a.d_state_residuals + state_offset + 16 * threadIdx.x);
#pragma unroll 1
            for (int round = 0; round < kRounds; ++round) {
                const int x = 16 * (threadIdx.x + round * kThreads), value = x / kHeadDim, key = x % kHeadDim;
                const int4 s_now = s_lost, d_now = d_lost;
                if (round + 1 < kRounds) {  // the next round's, a round ahead
                    s_lost = *reinterpret_cast<const int4*>(a.state_residuals + state_offset + x + 16 * kThreads);
                    d_lost = *reinterpret_cast<const int4*>(a.d_state_residuals + state_offset + x + 16 * kThreads);
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
            barrier();  // also: dqk and Vn are read no more
            if (threadIdx.x == 0) {
                float states = 0.f, via = 0.f;
                for (int w = 0; w < kWarps; ++w) states += smem.block_part[w];
                for (int i = 0; i < kChunk; ++i) via += smem.via_kd[i];
                smem.d_gamma[kChunk - 1] += via + __expf(gamma_last) * states;
            }
            barrier();
            if (threadIdx.x < kChunk) smem.d_gamma[threadIdx.x] -= smem.via_kd[threadIdx.x];
        }
        // dw = -dVn S^T (16-bit, in wide1); dt = dw Kb^T + dVn Vb^T (16-bit, in Tbeta's tile).
        {
            float dw[kHeadDim / 16][4];
            product<kHeadDim, kHeadDim, false, true>(dw, smem.wide0, smem.state);
            each<kHeadDim>(dw, [&](int, int, float x) { return -x; });
            store<kHeadDim>(smem.wide1, dw);
        }
        barrier();
        {
            float via_k[kChunk / 16][4], via_v[kChunk / 16][4];
            product<kChunk, kHeadDim, false, false>(via_k, smem.wide1, smem.k);
            product<kChunk, kHeadDim, false, false>(via_v, smem.wide0, smem.v);
            each<kChunk>(via_k, [&](int, int j, float x) { return __expf(smem.gamma[j]) * x; });
            add_into<kChunk>(via_k, via_v, 1.f);
            each<kChunk>(via_k, [&](int, int j, float x) { return smem.beta[j] * x; });
            store<kChunk>(smem.tbeta, via_k);
        }
        barrier();
        // This unit's dO, S^T, dS'^T, V and Q are read no more: the next unit's go into their tiles.
        float2 next_gates = make_float2(0.f, 0.f);
        if (has_next) {
            load_early(smem, a, next, new_item);
            cp_async_commit();
            next_gates = gates_of(a, next);
        }
        // X = T^T dt (16-bit); dA = -StrictLower(X T^T).
        {
            float x_acc[kChunk / 16][4];
            product<kChunk, kChunk, true, true>(x_acc, smem.t, smem.tbeta);
            store<kChunk>(smem.x, x_acc);
        }
        barrier();
        {
            float da[kChunk / 16][4];
            product<kChunk, kChunk, false, false>(da, smem.x, smem.t);
            each<kChunk>(da, [&](int i, int j, float x) { return i > j ? -x : 0.f; });
            // beta's share sum_j dA_ij L_ij; the exponents' dA * A (A = diag(beta) L); dkk = dA * beta_i * D.
            add_row_sums<kChunk>(smem, smem.d_beta, da, [&](int i, int j, float x) { return x * at_f(smem.square0, i, j); });
            each<kChunk>(da, [&](int i, int j, float x) {
                at_f(smem.square1, i, j) = x * smem.beta[i] * at_f(smem.square0, i, j);
                at_f(smem.square0, i, j) = x * smem.beta[i] * decay(i, j);
                return x;
            });
        }
        barrier();
        add_exponent_sums(smem, smem.square1);
        // dkk + dkk^T (16-bit, in dt's tile), then dk += (dkk + dkk^T) K.
        for (int x = threadIdx.x; x < kChunk * kChunk; x += kThreads) {
            const int i = x / kChunk, j = x % kChunk;
            smem.tbeta[at<kChunk>(i, j)] = from_f32<T>(at_f(smem.square0, i, j) + at_f(smem.square0, j, i));
        }
        barrier();
        product<kHeadDim, kChunk, false, true, true>(dk_acc, smem.tbeta, smem.k);
        // dKb = T^T dw: dk += diag(beta e^G) dKb; e^G k . dKb is beta's share and, times beta, G's.
        {
            float d_kb[kHeadDim / 16][4];
            product<kHeadDim, kChunk, true, true>(d_kb, smem.t, smem.wide1);
            add_row_sums<kHeadDim>(smem, smem.via_kb, d_kb, [&](int i, int c, float x) {
                return __expf(smem.gamma[i]) * to_f32<T>(smem.k[at<kChunk>(i, c)]) * x;
            });
            // This unit's K and Tbeta's tile are read no more.
            if (has_next) {
                load_late(smem, a, next, new_item);
                cp_async_commit();
            }
            each<kHeadDim>(d_kb, [&](int i, int, float x) { return smem.beta[i] * __expf(smem.gamma[i]) * x; });
            add_into<kHeadDim>(dk_acc, d_kb, 1.f);
            write_rows<kHeadDim>(a.dk + out_offset(num_heads, head), qk_stride, dk_acc, row_inside, add_to_dq_dk);
        }
        // dg: the in-chunk reverse cumsum of dG; dbeta.
        if (threadIdx.x == 0) {
            float running = 0.f;
            for (int i = kChunk - 1; i >= 0; --i) {
                running += smem.d_gamma[i] + smem.beta[i] * smem.via_kb[i];
                smem.d_gamma[i] = running;
            }
        }
        barrier();
        if (threadIdx.x < kChunk && (!kHasIncompleteTile || static_cast<int>(threadIdx.x) < valid)) {
            const int i = threadIdx.x;
            const long long at = static_cast<long long>(token + i) * heads_v + head_v;
            a.dg[at] = smem.d_gamma[i];
            a.dbeta[at] = smem.d_beta[i] + smem.via_kb[i];
        }
        return next_gates;
    }
};

}  // namespace gdn
}  // namespace kgen
