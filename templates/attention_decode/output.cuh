// The decode kernel's output of one packed row: O as T and the natural-log LSE.
// Needs common/numeric.cuh and common/lse_merge.cuh.
namespace kgen {
namespace attention_decode {

// The output of a row once every key has been merged in: fold the sink into the denominator,
// write O (16-bit) and the natural-log LSE. `o` holds Cols columns normalised by the row's own
// sum, `lse2` the row's log2 LSE (-inf: no key; NaN: the request was refused).
template <class T, int Cols>
__device__ __forceinline__ void write_row(const float (&o)[Cols], float lse2, float sink_log2, T* out_row, float* lse_row) {
    // The row's sum is 1 (O is normalised). fold_sink's fmaxf drops a NaN lse2, so test it itself.
    const SinkFold fold = fold_sink(lse2, 1.f, sink_log2);
    const bool refused = lse2 != lse2;
    const float o_scale = refused ? lse2 : (fold.denominator > 0.f ? fold.row_weight / fold.denominator : 0.f);
    constexpr int kStore = Cols < 8 ? Cols : 8;  // elements of one store: 8 (16 bytes), or all Cols if fewer
    struct alignas(kStore * sizeof(T)) Packed {
        T elem[kStore];
    };
#pragma unroll
    for (int c = 0; c < Cols; c += kStore) {
        Packed packed;
#pragma unroll
        for (int e = 0; e < kStore; ++e) packed.elem[e] = from_f32<T>(o[c + e] * o_scale);
        *reinterpret_cast<Packed*>(out_row + c) = packed;
    }
    if (lse_row != nullptr) *lse_row = refused ? lse2 : fold.natural_lse();
}

}  // namespace attention_decode
}  // namespace kgen
