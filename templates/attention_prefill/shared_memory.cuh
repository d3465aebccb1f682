// The prefill kernels' shared memory: [slack to a swizzle repeat][Q][K x kKVBuffers][V x kKVBuffers][mbarriers],
// for a Q tile of type QTile, K and V tiles of type KVTile (attention_common/tiles.cuh) and kBarrierBytes of
// mbarriers, which each kernel counts for itself.
// Needs common/swizzle.cuh.
namespace kgen {
namespace attention_prefill {

template <class QTile, class KVTile, int kBarrierBytes, int kKVBuffers = 2>
struct SharedMemory {
    static constexpr int kQBytes = QTile::kBytes;
    static constexpr int kKVTileBytes = KVTile::kBytes;
    static constexpr int kBarrierOffset = kQBytes + 2 * kKVBuffers * kKVTileBytes;
    // The host adds kSwizzleAlignment bytes of slack so the tiles can start on a swizzle boundary.
    static constexpr int kDynamicBytes = kSwizzleAlignment + kBarrierOffset + kBarrierBytes;

    unsigned q, k, v;  // the tiles' shared-window addresses: one Q, kKVBuffers buffers each of K and V
    unsigned barriers;

    __device__ explicit SharedMemory(unsigned char* smem_raw)
        : q(align_up<kSwizzleAlignment>(smem_addr(smem_raw))), k(q + kQBytes), v(k + kKVBuffers * kKVTileBytes), barriers(q + kBarrierOffset) {}
};

}  // namespace attention_prefill
}  // namespace kgen
