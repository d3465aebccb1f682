// The mma.sync kernel (Ampere style, any arch from sm_80): mma.sync m16n8k16 from padded shared-memory tiles
// filled by cp.async, kStages tiles of K in flight, 8 warps over a 128 x 128 tile. Rows past the group and
// (has_incomplete_tile) columns past N or K load as zeros.
// Needs kernel.cu.j2's variant constants and schedule.
{% include "common/mma.cuh" %}
{% include "common/cp_async.cuh" %}

namespace {

constexpr int kThreads = {{ num_warps }} * 32, kWarps = kThreads / 32;
// Warps tile the block's output 2 x (kWarps / 2); a warp's share is whole 16 x 16 pieces.
constexpr int kWarpsM = 2, kWarpsN = kWarps / kWarpsM;
static_assert(kCluster == 1, "grouped_gemm: with mma=mma_sync, cluster must be 1 (its blocks share nothing)");
static_assert(kWarps % kWarpsM == 0, "grouped_gemm: num_warps must be even");
constexpr int kWarpM = kTileM / kWarpsM, kWarpN = kTileN / kWarpsN;
static_assert(kWarpM % 16 == 0 && kWarpN % 16 == 0,
              "grouped_gemm: tile_m / 2 and tile_n / (num_warps / 2) must be multiples of 16");
constexpr int kFragsM = kWarpM / 16, kFragsN = kWarpN / 8;
static_assert(kTileK % 16 == 0, "grouped_gemm: tile_k must be a multiple of 16 (mma's k)");
// Shared rows padded by 16 bytes, so the 8 rows an ldmatrix reads start on distinct banks.
constexpr int kStride = kTileK + 8;
constexpr int kChunksPerRow = kTileK / 8;  // 16-byte cp.async pieces
struct Stage {
    T a[kTileM * kStride];
    T b[kBRows * kStride];
};
constexpr int kDynamicSmemBytes = kStages * static_cast<int>(sizeof(Stage)) + 16;

static_assert(kThreads == {{ contract.threads }}, "threads per block differ from the host's contract");
static_assert(kDynamicSmemBytes == {{ contract.dynamic_smem_bytes }}, "shared memory differs from the host's contract");

// kRows rows of a [*, num_k] row-major source from `rows_valid` rows on, K columns [k0, k0 + kTileK), into a
// padded tile; pieces past the rows or past num_k are zero-filled and never read from global memory.
template <int kRows>
__device__ __forceinline__ void load_tile(T* tile, const T* source, long long rows_valid, long long num_k, long long k0) {
    for (int i = threadIdx.x; i < kRows * kChunksPerRow; i += kThreads) {
        const int row = i / kChunksPerRow, column = (i % kChunksPerRow) * 8;
        const bool inside = row < rows_valid && (!kHasIncompleteTile || k0 + column < num_k);
        kgen::cp_async_16_zfill(kgen::smem_addr(tile + row * kStride + column),
                                inside ? source + row * num_k + k0 + column : source, inside);
    }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads, {{ min_blocks_per_sm }})
grouped_gemm({{ contract.signature("grouped_gemm") }}) {
    __shared__ BlockTile shared_tile;  // the block agrees on its tile: warp 0 finds it
    if (threadIdx.x < 32) {
        const BlockTile found = block_tile(blockIdx.x, offs, num_experts, num_rows, masked_rows, row_tiles, column_tiles);
        if (threadIdx.x == 0) shared_tile = found;
    }
    __syncthreads();
    const BlockTile tile = shared_tile;
    if (tile.owner.expert < 0) return;  // the whole block
    const int expert = tile.owner.expert;
    const long long first_row = tile.owner.first_row, group_end = tile.owner.group_end;
    extern __shared__ unsigned char smem_bytes[];
    Stage* const stages = reinterpret_cast<Stage*>(kgen::align_up<16>(smem_bytes));
    const long long n0 = tile.column_tile * kTileN;
    const long long a_rows = min(static_cast<long long>(kTileM), group_end - first_row);
    const long long b_rows = kHasIncompleteTile ? min(static_cast<long long>(kTileN), num_n - n0) : kTileN;
    const T* const a_tile = a + first_row * num_k;
    // This expert's rows of b: num_n, or (SwiGLU) num_n gate rows then num_n up rows.
    const T* const b_tile = b + (static_cast<long long>(expert) * (kBRows / kTileN) * num_n + n0) * num_k;
    const int k_tiles = static_cast<int>((num_k + kTileK - 1) / kTileK);

    auto load_stage = [&](int kt) {
        Stage& stage = stages[kt % kStages];
        load_tile<kTileM>(stage.a, a_tile, a_rows, num_k, static_cast<long long>(kt) * kTileK);
        load_tile<kTileN>(stage.b, b_tile, b_rows, num_k, static_cast<long long>(kt) * kTileK);
        if constexpr (kSwiglu) {  // the up tile, past the gate tile (no such room without SwiGLU)
            load_tile<kTileN>(stage.b + kTileN * kStride, b_tile + num_n * num_k, b_rows, num_k, static_cast<long long>(kt) * kTileK);
        }
    };
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
        if (s < k_tiles) load_stage(s);
        kgen::cp_async_commit();  // a group per stage, empty or not, so the waits below count stages
    }

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int warp_m = (warp % kWarpsM) * kWarpM, warp_n = (warp / kWarpsM) * kWarpN;
    float acc[kFragsM][kFragsN][4] = {};
    float acc_up[kSwiglu ? kFragsM : 1][kSwiglu ? kFragsN : 1][4] = {};  // SwiGLU's up product
    for (int kt = 0; kt < k_tiles; ++kt) {
        kgen::cp_async_wait<kStages - 2>();
        __syncthreads();  // stage kt is here for every thread, and stage kt - 1 is read by none any more
        if (kt + kStages - 1 < k_tiles) load_stage(kt + kStages - 1);
        kgen::cp_async_commit();
        const Stage& stage = stages[kt % kStages];
#pragma unroll
        for (int kk = 0; kk < kTileK; kk += 16) {
            unsigned a_frag[kFragsM][4];
#pragma unroll
            for (int i = 0; i < kFragsM; ++i) {
                kgen::ldmatrix_x4(a_frag[i], kgen::smem_addr(stage.a + (warp_m + 16 * i + lane % 16) * kStride + kk + (lane / 16) * 8));
            }
#pragma unroll
            for (int j = 0; j < kFragsN; j += 2) {
                unsigned b_frag[4];  // B stored [n][k]: columns n of 16 x 8 fragments j and j + 1
                kgen::ldmatrix_x4(b_frag, kgen::smem_addr(stage.b + (warp_n + 8 * j + lane % 8 + (lane / 16) * 8) * kStride + kk + ((lane / 8) % 2) * 8));
#pragma unroll
                for (int i = 0; i < kFragsM; ++i) {
                    kgen::mma_16816<T>(acc[i][j], a_frag[i], b_frag[0], b_frag[1]);
                    kgen::mma_16816<T>(acc[i][j + 1], a_frag[i], b_frag[2], b_frag[3]);
                }
                if constexpr (kSwiglu) {
                    kgen::ldmatrix_x4(b_frag, kgen::smem_addr(stage.b + (kTileN + warp_n + 8 * j + lane % 8 + (lane / 16) * 8) * kStride + kk + ((lane / 8) % 2) * 8));
#pragma unroll
                    for (int i = 0; i < kFragsM; ++i) {
                        kgen::mma_16816<T>(acc_up[i][j], a_frag[i], b_frag[0], b_frag[1]);
                        kgen::mma_16816<T>(acc_up[i][j + 1], a_frag[i], b_frag[2], b_frag[3]);
                    }
                }
            }
        }
    }
    kgen::cp_async_wait<0>();  // no copy may outlive the block (the last groups are empty, but keep it exact)

    // The result, rounded to T, in place of the accumulators: the product, or silu(gate) up.
#pragma unroll
    for (int i = 0; i < kFragsM; ++i) {
#pragma unroll
        for (int j = 0; j < kFragsN; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float value = acc[i][j][e];
                acc[i][j][e] = kSwiglu ? rounded_swiglu(value, acc_up[i][j][e]) : rounded(value);
            }
        }
    }
    // FP8: each row's amax over the block's 128 columns: the thread's, its row's four lanes', then the column
    // warps' through shared memory (rows past the group are zeros here, and every thread reaches the barrier).
    [[maybe_unused]] __shared__ float row_amax[kQuantize ? kWarpsN : 1][kQuantize ? kTileM : 1];
    if constexpr (kQuantize) {
#pragma unroll
        for (int i = 0; i < kFragsM; ++i) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                float amax = 0.f;
#pragma unroll
                for (int j = 0; j < kFragsN; ++j) {
                    amax = kgen::max_keeping_nan(amax, fabsf(acc[i][j][2 * half]));
                    amax = kgen::max_keeping_nan(amax, fabsf(acc[i][j][2 * half + 1]));
                }
                amax = kgen::max_keeping_nan(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
                amax = kgen::max_keeping_nan(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
                if (lane % 4 == 0) row_amax[warp / kWarpsM][warp_m + 16 * i + lane / 4 + 8 * half] = amax;
            }
        }
        __syncthreads();
    }
    // Rows inside the group only; columns inside N (whole 2-element pairs: N is even).
#pragma unroll
    for (int i = 0; i < kFragsM; ++i) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int tile_row = warp_m + 16 * i + lane / 4 + 8 * half;
            const long long row = first_row + tile_row;
            if (row >= group_end) continue;
            float inverse = 0.f;
            if constexpr (kQuantize) {
                float amax = row_amax[0][tile_row];
#pragma unroll
                for (int w = 1; w < kWarpsN; ++w) amax = kgen::max_keeping_nan(amax, row_amax[w][tile_row]);
                const float scale = kgen::e4m3_scale(amax);
                inverse = 1.f / scale;
{% if epilogue == "swiglu_quantize" %}{# the signature has scales and out_fp8 with this epilogue alone #}
                if (warp / kWarpsM == 0 && lane % 4 == 0) scales[(n0 / kTileN) * scales_stride + row] = scale;
{% endif %}
            }
#pragma unroll
            for (int j = 0; j < kFragsN; ++j) {
                const long long column = n0 + warp_n + 8 * j + 2 * (lane % 4);
                if (kHasIncompleteTile && column >= num_n) continue;
                store_pair(out, {{ "out_fp8" if epilogue == "swiglu_quantize" else "nullptr" }}, row * num_n + column,
                           acc[i][j][2 * half], acc[i][j][2 * half + 1], inverse);
            }
        }
    }
}
