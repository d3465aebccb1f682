// Merging softmax results by their log-sum-exps (LSEs): partial results of one row over disjoint
// key sets (split-KV decode, context parallelism, a decode block's warps), or a row and its sink
// logit. Partial s, with LSE l_s and output v_s normalised over its own keys, weighs
// w_s = e^(l_s - m), m the largest l_s; the merged row is v = sum_s w_s v_s / sum_s w_s, with LSE
// m + log(sum_s w_s). The largest weight is exactly 1, so the sum is >= 1 whenever a partial saw
// keys. The same holds in the log2 domain with 2^ and log2, which the attention kernels use.
// Needs common/numeric.cuh.
namespace kgen {

// The base weights are taken against: the largest LSE, or 0 when that is -inf (no partial saw a
// key), so that every weight is 0 rather than NaN (-inf - -inf). Either log domain.
__device__ __forceinline__ float lse_base(float top) { return top == -inf() ? 0.f : top; }

// ---- Natural-log LSEs (merge_attention_states) ----

// The weight e^(lse - base) of a partial, as one exp2.
__device__ __forceinline__ float lse_weight(float lse, float top) { return exp2f((lse - lse_base(top)) * kLog2e); }

// One thread's share of a merged row: Vec16<T>::kSize columns, accumulated in fp32.
template <class T>
struct WeightedSum {
    static constexpr int kCols = Vec16<T>::kSize;
    float acc[kCols] = {};
    float weight_sum = 0.f;

    // A partial with weight 0 (lse = -inf, it saw no keys) is skipped, not multiplied by 0: its
    // values may hold anything, NaN included.
    __device__ __forceinline__ void add(float weight, const Vec16<T>& x) {
        weight_sum += weight;
        const bool has_keys = weight > 0.f;
#pragma unroll
        for (int i = 0; i < kCols; ++i) acc[i] = fmaf(weight, has_keys ? to_f32(x.elem[i]) : 0.f, acc[i]);
    }

    // The merged values into `y`: 0 when no partial saw keys.
    __device__ __forceinline__ void merged(Vec16<T>& y) const {
        const float inv = weight_sum > 0.f ? __frcp_rn(weight_sum) : 0.f;
#pragma unroll
        for (int i = 0; i < kCols; ++i) y.elem[i] = from_f32<T>(acc[i] * inv);
    }

    // The merged LSE for weights taken against `top`: -inf when no partial saw keys.
    __device__ __forceinline__ float lse(float top) const { return weight_sum > 0.f ? top + __logf(weight_sum) : -inf(); }
};

// ---- log2 LSEs (the attention kernels) ----

// A row's online softmax (running max `row_max`, sum `row_sum`, log2 units) with a sink logit
// folded in: the sink joins the denominator but has no value row. O, normalised by nothing yet,
// is scaled by row_weight / denominator.
struct SinkFold {
    float base;         // lse_base of the larger of the row's max and the sink
    float row_weight;   // 2^(row_max - base), the factor of the row's sum and of its O
    float denominator;  // row_sum * row_weight + 2^(sink - base): 0 only with no key and no sink

    // The merged LSE as a natural log (what the ops return); -inf for a zero denominator, NaN for a NaN one.
    __device__ __forceinline__ float natural_lse() const {
        return denominator <= 0.f ? -inf() : (base + log2f(denominator)) * kLn2;
    }
};

__device__ __forceinline__ SinkFold fold_sink(float row_max, float row_sum, float sink_log2) {
    SinkFold fold;
    fold.base = lse_base(fmaxf(row_max, sink_log2));
    fold.row_weight = exp2f(row_max - fold.base);
    fold.denominator = row_sum * fold.row_weight + exp2f(sink_log2 - fold.base);
    return fold;
}

// Merges `count` partial results of one row: partial z has log2 LSE lse_at(z) and O, normalised by
// its own sum, whose columns [c, c + 4) of the thread's are o_at(z, c) (a float4). Returns the
// merged log2 LSE and leaves the merged, normalised O in `o`. A NaN LSE (a refused request) poisons
// the result. Partials are read kBatch at a time, all loads of a batch in flight together: partials
// read from L2 would otherwise cost one round trip each, more than the merge's work.
template <int kCols, int kBatch, class LseAt, class OAt>
__device__ __forceinline__ float merge_partials(int count, LseAt lse_at, OAt o_at, float (&o)[kCols]) {
    float top = -inf(), total = 0.f;
    bool refused = false;
#pragma unroll
    for (int c = 0; c < kCols; ++c) o[c] = 0.f;
    for (int z0 = 0; z0 < count; z0 += kBatch) {
        float lse2[kBatch];
        float4 part[kBatch][kCols / 4];
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
            const bool present = z0 + j < count;
            lse2[j] = present ? lse_at(z0 + j) : -inf();
#pragma unroll
            for (int c = 0; c < kCols / 4; ++c) part[j][c] = present ? o_at(z0 + j, 4 * c) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
        float batch_top = top;
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
            refused |= lse2[j] != lse2[j];
            batch_top = fmaxf(batch_top, lse2[j]);
        }
        if (batch_top == -inf()) continue;  // nothing but empty partials so far
        const float rescale = exp2f(top - batch_top);  // 0 while top is -inf
        total *= rescale;
#pragma unroll
        for (int c = 0; c < kCols; ++c) o[c] *= rescale;
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
            const float weight = exp2f(lse2[j] - batch_top);  // an empty partial's is 0 (and its O is 0)
            total += weight;
#pragma unroll
            for (int c = 0; c < kCols / 4; ++c) {
                o[4 * c] += weight * part[j][c].x, o[4 * c + 1] += weight * part[j][c].y;
                o[4 * c + 2] += weight * part[j][c].z, o[4 * c + 3] += weight * part[j][c].w;
            }
        }
        top = batch_top;
    }
    if (refused) return quiet_nan();
    if (top == -inf()) return top;
    const float inv = 1.f / total;  // total >= 1: the top partial's weight is 1
#pragma unroll
    for (int c = 0; c < kCols; ++c) o[c] *= inv;
    return top + log2f(total);
}

}  // namespace kgen
