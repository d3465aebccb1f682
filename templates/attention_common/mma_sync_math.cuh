// One warp's tensor-core math on mma.sync, shared by the attention kernels built on it (prefill's
// mma_sync kernel, decode's): ldmatrix lanes over the swizzled tiles, S = Q K^T for kRowBlocks
// 16-row blocks of queries and a tile of keys, and O += P V.
// Needs common/numeric.cuh, smem.cuh, swizzle.cuh, mma.cuh, attention_common/tiles.cuh and
// attention_common/softmax.cuh.
namespace kgen {
namespace attention {

// Where one lane's ldmatrix reads in a tile. Every 16x16 block a warp reads has the lane's
// row at the same residue mod 8, so the lane's swizzle is fixed, and the position of chunk
// 2*step + chunk_low is (2*step) ^ (chunk_low ^ swizzle): one XOR with a constant per read,
// rather than an address held per step.
template <class Tile>
struct LdsmLane {
    static constexpr int kXorSpan = Tile::kSpanChunks / 2;  // steps per span
    unsigned row_bytes;
    unsigned xor_bytes;

    __device__ LdsmLane(int row, int chunk_low)
        : row_bytes(row * Tile::kSpanBytes), xor_bytes((chunk_low ^ swizzle_pattern<Tile::kSpanBytes>(row)) * 16) {}
    // The lane's address for k-step `step` (16 columns) of the 16-row block at `block_row`.
    __device__ unsigned at(unsigned tile, int block_row, int step) const {
        return tile + (step / kXorSpan) * (Tile::kRows * Tile::kSpanBytes) + block_row * Tile::kSpanBytes + row_bytes +
               ((32 * (step % kXorSpan)) ^ xor_bytes);
    }
};

// A warp's rows: kRowBlocks blocks of 16 query rows of a Q tile of kTileM rows, against key tiles of kTileN.
template <class T, int kHeadDim, int kTileM, int kTileN, int kRowBlocks>
struct MmaSyncWarp {
    using QTile = Tile<T, kHeadDim, kTileM>;
    using KVTile = Tile<T, kHeadDim, kTileN>;

    // Up to 128 columns per thread row block, Q's mma fragments are held for the
    // whole key loop; beyond, they would push the kernel into spills, so they are
    // re-read from shared memory at every key tile.
    static constexpr bool kQInRegisters = kHeadDim * kRowBlocks <= 128;
    using QFragments = unsigned[kQInRegisters ? kRowBlocks : 1][kQInRegisters ? kHeadDim / 16 : 1][4];

    // Q's fragments, for kQInRegisters.
    __device__ static __forceinline__ void load_q(QFragments& q_frag, unsigned s_q, const LdsmLane<QTile>& q_lane) {
#pragma unroll
        for (int rb = 0; rb < kRowBlocks; ++rb)
#pragma unroll
            for (int kk = 0; kk < kHeadDim / 16; ++kk) ldmatrix_x4(q_frag[rb][kk], q_lane.at(s_q, rb * 16, kk));
    }

    // S = Q K^T for this warp's rows and kTileN keys; each K fragment serves every row block.
    __device__ static __forceinline__ void compute_scores(Scores<kRowBlocks, kTileN>& s, const QFragments& q_frag, unsigned s_q,
                                                          unsigned k_tile, const LdsmLane<QTile>& q_lane,
                                                          const LdsmLane<KVTile>& k_lane) {
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
                for (int rb = 0; rb < kRowBlocks; ++rb) ldmatrix_x4(q_reread_raw[rb], q_lane.at(s_q, rb * 16, kk));
            }
#pragma unroll
            for (int nb = 0; nb < kTileN / 16; ++nb) {
                unsigned b[4];
                ldmatrix_x4(b, k_lane.at(k_tile, nb * 16, kk));
#pragma unroll
                for (int rb = 0; rb < kRowBlocks; ++rb) {
                    const unsigned (&a)[4] = kQInRegisters ? q_frag[kQInRegisters ? rb : 0][kk] : q_reread[kQInRegisters ? 0 : rb];
                    mma_16816<T>(s[rb][2 * nb], a, b[0], b[1]);
                    mma_16816<T>(s[rb][2 * nb + 1], a, b[2], b[3]);
                }
            }
        }
    }

    // O += P V; each V fragment serves every row block.
    __device__ static __forceinline__ void accumulate_pv(RowState<kRowBlocks, kHeadDim>& state, const Scores<kRowBlocks, kTileN>& s,
                                                         unsigned v_tile, const LdsmLane<KVTile>& v_lane) {
        Probabilities<kRowBlocks, kTileN> p;
        pack_probabilities<T>(s, p);
#pragma unroll
        for (int kb = 0; kb < kTileN / 16; ++kb) {
#pragma unroll
            for (int db = 0; db < kHeadDim / 16; ++db) {
                unsigned b[4];
                ldmatrix_x4_trans(b, v_lane.at(v_tile, kb * 16, db));
#pragma unroll
                for (int rb = 0; rb < kRowBlocks; ++rb) {
                    mma_16816<T>(state.o[rb][2 * db], p[rb][kb], b[0], b[1]);
                    mma_16816<T>(state.o[rb][2 * db + 1], p[rb][kb], b[2], b[3]);
                }
            }
        }
    }
};

}  // namespace attention
}  // namespace kgen
