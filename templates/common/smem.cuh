// Shared-memory addressing: 32-bit shared-window addresses, as ldmatrix, cp.async,
// TMA and mbarriers take them (half the registers of generic pointers).
namespace kgen {

__device__ __forceinline__ unsigned smem_addr(const void* ptr) {
    return static_cast<unsigned>(__cvta_generic_to_shared(ptr));
}

}  // namespace kgen
