// Hopper bulk tensor copies (TMA) completing on shared-memory mbarriers.
// Included into rendered sources with Jinja; the raw block keeps Jinja away from
// the asm operand lists, whose braces and percent signs look like its tags.
{% raw %}
namespace kgen {

// A CUtensorMap, made on the host by cuda.core and passed by value as a
// __grid_constant__ kernel parameter (NVRTC cannot include <cuda.h> for the real type).
struct alignas(64) TmaDescriptor {
    unsigned long long bits[16];
};

__device__ __forceinline__ void mbarrier_init(unsigned bar, unsigned arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(bar), "r"(arrivals) : "memory");
}

// Makes initialised mbarriers visible to the async proxy (the TMA unit).
__device__ __forceinline__ void mbarrier_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// One arrival that also announces `bytes` of transactions the phase must wait for.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" :: "r"(bar), "r"(bytes) : "memory");
}

// One plain arrival (a consumer releasing a buffer).
__device__ __forceinline__ void mbarrier_arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(bar) : "memory");
}

__device__ __forceinline__ void mbarrier_wait(unsigned bar, unsigned parity) {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT;\n"
        "}\n" :: "r"(bar), "r"(parity) : "memory");
}

// ---- Thread-block clusters (sm_90) ----

// This CTA's rank in its cluster.
__device__ __forceinline__ unsigned cluster_rank() {
    unsigned rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
    return rank;
}

// One arrival on the mbarrier at offset `bar` of CTA `rank`'s shared memory (a peer's, in a cluster). Like
// mbarrier_arrive it releases at CTA scope: what it releases is a buffer's reads by wgmma, which wgmma_wait has
// already seen done, so the cluster-scope form's fences (MEMBAR.GPU in SASS) would only slow the release.
__device__ __forceinline__ void mbarrier_arrive_remote(unsigned bar, unsigned rank) {
    asm volatile(
        "{\n"
        ".reg .b32 remote;\n"
        "mapa.shared::cluster.u32 remote, %0, %1;\n"
        "mbarrier.arrive.shared::cluster.b64 _, [remote];\n"
        "}\n" :: "r"(bar), "r"(rank) : "memory");
}

// Every thread of the cluster that has not exited arrives, then waits for the others (not .aligned: callers may
// come from divergent code).
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}

// tma_load_3d into the same shared-memory offset of every CTA in `cta_mask` (bit r: rank r), each copy completing
// on the mbarrier at offset `bar` of its own CTA.
__device__ __forceinline__ void tma_load_3d_multicast(unsigned smem, const TmaDescriptor* map, int c0, int c1, int c2,
                                                      unsigned bar, unsigned short cta_mask) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
        " [%0], [%1, {%2, %3, %4}], [%5], %6;\n"
        :: "r"(smem), "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar), "h"(cta_mask)
        : "memory");
}

// Orders this thread's earlier generic-proxy accesses to shared memory before
// later async-proxy (TMA) writes to it.
__device__ __forceinline__ void fence_proxy_async_shared() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// A box of a rank-3 tensor at coordinates (c0 innermost, c1, c2) into shared memory.
__device__ __forceinline__ void tma_load_3d(unsigned smem, const TmaDescriptor* map, int c0, int c1, int c2, unsigned bar) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
        :: "r"(smem), "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
        : "memory");
}

// L2 policies for TMA loads: data read again soon by other CTAs (K and V of a head) stays;
// data read once (a query tile) goes first.
__device__ __forceinline__ unsigned long long l2_evict_last() {
    unsigned long long policy;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(policy));
    return policy;
}

__device__ __forceinline__ unsigned long long l2_evict_first() {
    unsigned long long policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
    return policy;
}

// tma_load_3d with an L2 policy from l2_evict_last / l2_evict_first.
__device__ __forceinline__ void tma_load_3d(unsigned smem, const TmaDescriptor* map, int c0, int c1, int c2, unsigned bar,
                                            unsigned long long policy) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
        " [%0], [%1, {%2, %3, %4}], [%5], %6;\n"
        :: "r"(smem), "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar), "l"(policy)
        : "memory");
}

// A box of shared memory to a rank-3 tensor at (c0, c1, c2); rows past the tensor's end are
// not written. Its reads of shared memory finish by tma_store_wait_read; a writer of that
// shared memory must first fence_proxy_async_shared its own writes.
__device__ __forceinline__ void tma_store_3d(const TmaDescriptor* map, unsigned smem, int c0, int c1, int c2) {
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n"
                 :: "l"(reinterpret_cast<unsigned long long>(map)), "r"(smem), "r"(c0), "r"(c1), "r"(c2) : "memory");
}

__device__ __forceinline__ void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }

// Until the committed stores have read their shared memory (it may be reused after).
__device__ __forceinline__ void tma_store_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }

}  // namespace kgen
{% endraw %}
