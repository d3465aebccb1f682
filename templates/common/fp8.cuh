// FP8 e4m3 block quantization (DeepGEMM's recipe): s = max(amax, 1e-4) / 448 per block, q = e4m3_rn_satfinite(x / s)
// by x * (1 / s). A NaN in a block propagates to its amax (max_keeping_nan), its scale and its codes. Also e5m2
// pairs both ways, for the gated delta rule's state rounding losses (gated_delta_rule/tiles.cuh).
// Included into rendered sources with Jinja; the raw block keeps Jinja away from the asm operand lists.
{% raw %}
#include <cuda_fp8.h>  // __nv_fp8_e4m3, the spec's e4m3 elements

namespace kgen {

constexpr float kE4m3Max = 448.f, kMinAmax = 1e-4f;

// max that keeps a NaN from either side (fmaxf drops it).
__device__ __forceinline__ float max_keeping_nan(float a, float b) { return a != a || a > b ? a : b; }

// A block's scale from its amax (NaN stays NaN).
__device__ __forceinline__ float e4m3_scale(float amax) { return amax != amax ? amax : fmaxf(amax, kMinAmax) / kE4m3Max; }

// Two floats as two e4m3 codes, `lo` in the lower byte (the lower address); the second source lands in the low byte.
__device__ __forceinline__ unsigned short to_e4m3x2(float lo, float hi) {
    unsigned short out;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(out) : "f"(hi), "f"(lo));
    return out;
}

// Two floats as two e5m2 codes (saturating to the largest finite), `lo` in the lower byte.
__device__ __forceinline__ unsigned short to_e5m2x2(float lo, float hi) {
    unsigned short out;
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(out) : "f"(hi), "f"(lo));
    return out;
}

// Two e5m2 codes (the lower byte first) as floats (exact: e5m2 is a subset of fp16).
__device__ __forceinline__ float2 from_e5m2x2(unsigned short codes) {
    unsigned halves;
    asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(halves) : "h"(codes));
    __half2 pair;
    memcpy(&pair, &halves, sizeof(pair));
    return __half22float2(pair);
}

}  // namespace kgen
{% endraw %}
