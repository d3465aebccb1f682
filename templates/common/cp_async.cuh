// Asynchronous global->shared copies that bypass registers (cp.async, sm_80+), for
// loads TMA cannot make: rows of a tile that must not be read past a bound.
// Included into rendered sources with Jinja; the raw block keeps Jinja away from
// the asm operand lists, whose braces and percent signs look like its tags.
{% raw %}
namespace kgen {

// A 16-byte copy, predicated: when !valid the source size is 0, so nothing is
// read (gmem may point past the data) and the 16 shared bytes are zero-filled.
__device__ __forceinline__ void cp_async_16_zfill(unsigned smem, const void* gmem, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(smem), "l"(gmem), "r"(valid ? 16 : 0));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int kPending>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(kPending)); }

}  // namespace kgen
{% endraw %}
