// Shared-memory addressing: 32-bit shared-window addresses, as ldmatrix, cp.async,
// TMA and mbarriers take them (half the registers of generic pointers).
// Included into rendered sources with Jinja; the raw block keeps Jinja away from
// the asm operand lists, whose braces and percent signs look like its tags.
{% raw %}
namespace kgen {

__device__ __forceinline__ unsigned smem_addr(const void* ptr) {
    return static_cast<unsigned>(__cvta_generic_to_shared(ptr));
}

// Sixteen zero bytes at a 16-byte aligned shared address.
__device__ __forceinline__ void st_shared_zero16(unsigned smem) {
    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" :: "r"(smem), "r"(0u) : "memory");
}

}  // namespace kgen
{% endraw %}
