// Warp specialisation (sm_90a): warpgroups with different roles and register budgets,
// and named barriers that synchronise a subset of the block's warps.
// Included into rendered sources with Jinja; the raw block keeps Jinja away from the asm.
{% raw %}
namespace kgen {

constexpr int kWarpgroupThreads = 128;

// Moves this warpgroup's register budget to kRegisters per thread (a multiple of 8 in
// 24..256); executed by all its warps. ptxas may ignore it under launch bounds of more than
// one block per SM (it says "setmaxnreg ignored", which `kgen build` refuses); the prefill's
// 64-row wgmma tile at two blocks an SM (a user's spec; the built-in one runs three) keeps it.
template <int kRegisters>
__device__ __forceinline__ void release_registers() {
    static_assert(kRegisters % 8 == 0 && kRegisters >= 24 && kRegisters <= 256, "setmaxnreg takes 24..256 in steps of 8");
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(kRegisters));
}

template <int kRegisters>
__device__ __forceinline__ void claim_registers() {
    static_assert(kRegisters % 8 == 0 && kRegisters >= 24 && kRegisters <= 256, "setmaxnreg takes 24..256 in steps of 8");
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(kRegisters));
}

// Named barrier `id` (1..15; 0 is __syncthreads') over `threads` threads, a multiple of 32:
// sync waits for all of them; arrive counts this warp in without waiting.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" :: "r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" :: "r"(id), "r"(threads) : "memory");
}

// The block's warp index as a value the compiler knows is warp-uniform, so branches on
// roles do not diverge within a warp.
__device__ __forceinline__ int warp_index() { return __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 32, 0); }

}  // namespace kgen
{% endraw %}
