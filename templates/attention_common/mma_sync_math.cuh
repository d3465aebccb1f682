// One warp's tensor-core math on mma.sync, shared by the attention kernels built on it (prefill's
// mma_sync kernel, decode's): ldmatrix lanes over the swizzled tiles, S = Q K^T for 16-row blocks
// of queries and a kTileN-key tile, and O += P V. Included after attention/tiles.cuh and
// attention/softmax.cuh and the variant's constants (kTileM: the Q tile's rows in shared memory).

// Up to 128 columns per thread row block, Q's mma fragments are held for the
// whole key loop; beyond, they would push the kernel into spills, so they are
// re-read from shared memory at every key tile.
constexpr bool kQInRegisters = kHeadDim * kRowBlocks <= 128;

// Where one lane's ldmatrix reads. Every 16x16 block a warp reads has the lane's
// row at the same residue mod 8, so the lane's swizzle is fixed, and the
// position of chunk 2*step + chunk_low is (2*step) ^ (chunk_low ^ swizzle): one
// XOR with a constant per read, rather than an address held per step.
constexpr int kXorSpan = kSpanChunks / 2;  // steps per column block

struct LdsmLane {
    unsigned row_bytes;
    unsigned xor_bytes;

    __device__ LdsmLane(int row, int chunk_low) : row_bytes(row * kSpanBytes), xor_bytes((chunk_low ^ swizzle(row)) * 16) {}
    // The lane's address for k-step `step` (16 columns) of the 16-row block at `block_row` of a kRows tile.
    template <int kRows>
    __device__ unsigned at(unsigned tile, int block_row, int step) const {
        return tile + (step / kXorSpan) * (kRows * kSpanBytes) + block_row * kSpanBytes + row_bytes +
               ((32 * (step % kXorSpan)) ^ xor_bytes);
    }
};

// ---- One warp's rows: scores and P V ----

using QFragments = unsigned[kQInRegisters ? kRowBlocks : 1][kQInRegisters ? kHeadDim / 16 : 1][4];

// S = Q K^T for this warp's rows and kTileN keys; each K fragment serves every row block.
__device__ __forceinline__ void compute_scores(Scores& s, const QFragments& q_frag, unsigned s_q, unsigned k_tile,
                                               const LdsmLane& q_lane, const LdsmLane& k_lane) {
#pragma unroll
    for (int rb = 0; rb < kRowBlocks; ++rb)
#pragma unroll
        for (int nb = 0; nb < kTileN / 8; ++nb)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[rb][nb][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        unsigned q_reread_raw[kQInRegisters ? 1 : kRowBlocks][4];
        const auto& q_reread = q_reread_raw;  // const like q_frag, so either can be the A operand
        if constexpr (!kQInRegisters) {
#pragma unroll
            for (int rb = 0; rb < kRowBlocks; ++rb) kgen::ldmatrix_x4(q_reread_raw[rb], q_lane.at<kTileM>(s_q, rb * 16, kk));
        }
#pragma unroll
        for (int nb = 0; nb < kTileN / 16; ++nb) {
            unsigned b[4];
            kgen::ldmatrix_x4(b, k_lane.at<kTileN>(k_tile, nb * 16, kk));
#pragma unroll
            for (int rb = 0; rb < kRowBlocks; ++rb) {
                const unsigned (&a)[4] = kQInRegisters ? q_frag[kQInRegisters ? rb : 0][kk] : q_reread[kQInRegisters ? 0 : rb];
                kgen::mma_16816<T>(s[rb][2 * nb], a, b[0], b[1]);
                kgen::mma_16816<T>(s[rb][2 * nb + 1], a, b[2], b[3]);
            }
        }
    }
}

// O += P V; each V fragment serves every row block.
__device__ __forceinline__ void accumulate_pv(RowState& state, const Scores& s, unsigned v_tile, const LdsmLane& v_lane) {
    Probabilities p;
    pack_probabilities(s, p);
#pragma unroll
    for (int kb = 0; kb < kTileN / 16; ++kb) {
#pragma unroll
        for (int db = 0; db < kHeadDim / 16; ++db) {
            unsigned b[4];
            kgen::ldmatrix_x4_trans(b, v_lane.at<kTileN>(v_tile, kb * 16, db));
#pragma unroll
            for (int rb = 0; rb < kRowBlocks; ++rb) {
                kgen::mma_16816<T>(state.o[rb][2 * db], p[rb][kb], b[0], b[1]);
                kgen::mma_16816<T>(state.o[rb][2 * db + 1], p[rb][kb], b[2], b[3]);
            }
        }
    }
}

