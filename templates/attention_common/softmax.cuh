// The online softmax over mma C-fragments, shared by the attention kernels (prefill's two, decode's).
// A thread holds 2 * kRowBlocks rows of C-fragments (mma.sync's layout, which wgmma's repeats over
// 8-column blocks): for each, kTileN scores of the current key tile and kHeadDim columns of O. The
// scores are scaled into the log2 domain, so each exponential is one ex2.
// Needs common/numeric.cuh and common/lse_merge.cuh.
namespace kgen {
namespace attention {

// The per-thread accumulators: O in mma C-fragments, and for each of the thread's
// 2 * kRowBlocks rows the running max (scaled, log2 domain) and its share of the sum.
template <int kRowBlocks, int kHeadDim>
struct RowState {
    float o[kRowBlocks][kHeadDim / 8][4];
    float max[2 * kRowBlocks];
    float sum[2 * kRowBlocks];
};

template <int kRowBlocks, int kTileN>
using Scores = float[kRowBlocks][kTileN / 8][4];

// P as 16-bit A-fragments of the P V product, packed straight from the S accumulators
// (the C- and A-fragment layouts agree): half the registers of S while O is live.
template <int kRowBlocks, int kTileN>
using Probabilities = unsigned[kRowBlocks][kTileN / 16][4];

// A factor per thread row.
template <int kRowBlocks>
using RowFactors = float[2 * kRowBlocks];

// One key tile's online softmax: new row maxima (over the quad that shares a row), the
// sums rescaled and the scores exponentiated in place; `correction` is the factor O must
// be rescaled by (rescale_output) before this tile's P V is added.
template <int kRowBlocks, int kBlocksN, int kHeadDim>
__device__ __forceinline__ void softmax_update(float (&s)[kRowBlocks][kBlocksN][4], RowState<kRowBlocks, kHeadDim>& state,
                                               float scale_log2, float (&correction)[2 * kRowBlocks]) {
    float base[2 * kRowBlocks];
#pragma unroll
    for (int i = 0; i < 2 * kRowBlocks; ++i) {
        // The scale is positive (the host checks), so the max of raw scores, scaled once, is the scaled max.
        float raw_max = -inf();
#pragma unroll
        for (int nb = 0; nb < kBlocksN; ++nb) {
            raw_max = fmaxf(raw_max, fmaxf(s[i / 2][nb][2 * (i % 2)], s[i / 2][nb][2 * (i % 2) + 1]));
        }
        raw_max = fmaxf(raw_max, __shfl_xor_sync(0xffffffffu, raw_max, 1));
        raw_max = fmaxf(raw_max, __shfl_xor_sync(0xffffffffu, raw_max, 2));
        const float tile_max = fmaxf(state.max[i], raw_max * scale_log2);
        // A row with no allowed key so far keeps max -inf.
        base[i] = lse_base(tile_max);
        correction[i] = exp2_ftz(state.max[i] - base[i]);
        state.max[i] = tile_max;
        state.sum[i] *= correction[i];
    }
#pragma unroll
    for (int rb = 0; rb < kRowBlocks; ++rb) {
#pragma unroll
        for (int nb = 0; nb < kBlocksN; ++nb) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int i = 2 * rb + (e >> 1);
                s[rb][nb][e] = exp2_ftz(fmaf(s[rb][nb][e], scale_log2, -base[i]));
                state.sum[i] += s[rb][nb][e];
            }
        }
    }
}

template <int kRowBlocks, int kHeadDim>
__device__ __forceinline__ void rescale_output(RowState<kRowBlocks, kHeadDim>& state, const float (&correction)[2 * kRowBlocks]) {
#pragma unroll
    for (int rb = 0; rb < kRowBlocks; ++rb) {
#pragma unroll
        for (int db = 0; db < kHeadDim / 8; ++db) {
            state.o[rb][db][0] *= correction[2 * rb];
            state.o[rb][db][1] *= correction[2 * rb];
            state.o[rb][db][2] *= correction[2 * rb + 1];
            state.o[rb][db][3] *= correction[2 * rb + 1];
        }
    }
}

template <class T, int kRowBlocks, int kBlocksN>
__device__ __forceinline__ void pack_probabilities(const float (&s)[kRowBlocks][kBlocksN][4], unsigned (&p)[kRowBlocks][kBlocksN / 2][4]) {
#pragma unroll
    for (int rb = 0; rb < kRowBlocks; ++rb) {
#pragma unroll
        for (int kb = 0; kb < kBlocksN / 2; ++kb) {
            p[rb][kb][0] = pack2<T>(s[rb][2 * kb][0], s[rb][2 * kb][1]);
            p[rb][kb][1] = pack2<T>(s[rb][2 * kb][2], s[rb][2 * kb][3]);
            p[rb][kb][2] = pack2<T>(s[rb][2 * kb + 1][0], s[rb][2 * kb + 1][1]);
            p[rb][kb][3] = pack2<T>(s[rb][2 * kb + 1][2], s[rb][2 * kb + 1][3]);
        }
    }
}

}  // namespace attention
}  // namespace kgen
