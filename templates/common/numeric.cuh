// Element types, conversions to and from fp32, and 16-byte vector access.
// Included into rendered sources with Jinja, so `kgen render` shows it inline.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace kgen {

template <class T> __device__ __forceinline__ float to_f32(T x);
template <> __device__ __forceinline__ float to_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ float to_f32<__half>(__half x) { return __half2float(x); }
template <> __device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }

template <class T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// 16 bytes of T: the widest access one thread can make in one instruction.
template <class T>
struct alignas(16) Vec16 {
    static constexpr int kSize = 16 / sizeof(T);
    T elem[kSize];
};

// Streaming 16-byte load/store (evict-first): for data each kernel touches once,
// so it does not push reusable lines out of L2.
template <class T>
__device__ __forceinline__ Vec16<T> load_streaming(const T* ptr) {
    uint4 raw = __ldcs(reinterpret_cast<const uint4*>(ptr));
    Vec16<T> out;
    memcpy(&out, &raw, sizeof(raw));
    return out;
}

template <class T>
__device__ __forceinline__ void store_streaming(T* ptr, const Vec16<T>& value) {
    uint4 raw;
    memcpy(&raw, &value, sizeof(raw));
    __stcs(reinterpret_cast<uint4*>(ptr), raw);
}

// The 32 bits of a 4-byte value (a pair of 16-bit elements).
template <class Pair>
__device__ __forceinline__ unsigned bits_of(const Pair& pair) {
    static_assert(sizeof(Pair) == sizeof(unsigned), "a 32-bit pair");
    unsigned out;
    memcpy(&out, &pair, sizeof(out));
    return out;
}

// Two floats as one 32-bit pair of T (the low half is `lo`): for 16-bit T one paired conversion
// (cvt.rn.bf16x2 / f16x2), where two conversions and a permute would be three instructions.
template <class T>
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
    const T pair[2] = {from_f32<T>(lo), from_f32<T>(hi)};
    return bits_of(pair);
}
template <>
__device__ __forceinline__ unsigned pack2<__nv_bfloat16>(float lo, float hi) { return bits_of(__floats2bfloat162_rn(lo, hi)); }
template <>
__device__ __forceinline__ unsigned pack2<__half>(float lo, float hi) { return bits_of(__floats2half2_rn(lo, hi)); }

// The two Ts of a 32-bit pair as floats (x: the low half).
template <class T>
__device__ __forceinline__ float2 unpack2(unsigned pair) {
    T halves[2];
    memcpy(halves, &pair, sizeof(halves));
    return make_float2(to_f32<T>(halves[0]), to_f32<T>(halves[1]));
}

// Softmax runs in the log2 domain (one MUFU.EX2 per exponential): a natural-log input is scaled
// by log2(e) on the way in, a log2 LSE by ln 2 on the way out.
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// 2^x with one MUFU.EX2, flushing denormal results to zero: exp2f() adds a range
// check and two rescaling multiplies per call to keep denormals, which a softmax
// never needs.
__device__ __forceinline__ float exp2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ float inf() { return __int_as_float(0x7f800000); }
// What a kernel writes where it refuses to compute: a result that cannot pass for a number.
__device__ __forceinline__ float quiet_nan() { return __int_as_float(0x7fc00000); }

}  // namespace kgen
