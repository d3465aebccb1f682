// Shared-memory addressing: 32-bit shared-window addresses, as ldmatrix, cp.async,
// TMA and mbarriers take them (half the registers of generic pointers), and alignment.
namespace kgen {

__device__ __forceinline__ unsigned smem_addr(const void* ptr) {
    return static_cast<unsigned>(__cvta_generic_to_shared(ptr));
}

// The first shared-window address at or after `address` that is a multiple of kAlignment (a power of two).
template <unsigned kAlignment>
__device__ __forceinline__ unsigned align_up(unsigned address) {
    static_assert((kAlignment & (kAlignment - 1)) == 0, "alignments are powers of two");
    return (address + (kAlignment - 1)) & ~(kAlignment - 1);
}

// The same for a pointer into shared memory, moved by pointer arithmetic rather than through an
// integer: the compiler then still knows the result is shared memory (LDS/STS, not generic accesses).
template <unsigned kAlignment, class E>
__device__ __forceinline__ E* align_up(E* ptr) {
    static_assert((kAlignment & (kAlignment - 1)) == 0, "alignments are powers of two");
    return ptr + ((kAlignment - (smem_addr(ptr) & (kAlignment - 1))) & (kAlignment - 1));
}

}  // namespace kgen
