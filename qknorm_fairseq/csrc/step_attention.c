/* --fused-kernels in beam search on a CPU: a decoding step's attention, a few queries per (batch row, head)
 * over their keys and values (one query in self-attention, a sentence's beams in cross-attention), one pass
 * per query: fp32 or bf16, fp32 arithmetic, the output rounded once.
 *
 * Per query q of head h in batch row b, over S keys k_j and values v_j (D values each):
 *   s_j = scale (q . k_j) + a_j   (a: the additive mask, 0 or -inf; none without a mask),
 *   out = sum_j e^(s_j - max s) v_j / sum_j e^(s_j - max s),
 * the dot products in LANES lanes, ROWS keys side by side (ROWS_LANE_SUM), e^v as softmax_dropout.c's
 * (exp_nonpositive; below e^-87 a weight is 0), the weighted sum over the keys in their order, 1 / sum
 * applied last. A row of -inf scores gives NaN, as torch's softmax does.
 *
 * Every tensor is read through its strides, its last dimension contiguous: the decoder cache's keys and
 * values are a view into its buffer, which scaled_dot_product_attention reads slowly (in bf16 at a tenth of
 * this loop's speed: docs/performance.md) and torch.matmul copies. OUT is contiguous (batch, heads, queries, D);
 * WEIGHTS, where not NULL, receives the softmax, fp32 (batch, heads, queries, S) contiguous, e^(s_j - max s)
 * / sum as the output applies it.
 * Threads: OpenMP over (batch row, head) pairs; a query's arithmetic is the same on any thread count.
 */
#include "common.h"

void qk_step_attention(int dtype, const void *restrict query, int64_t qb, int64_t qh, int64_t qi,
                       const void *restrict key, int64_t kb, int64_t kh, int64_t kj,
                       const void *restrict value, int64_t vb, int64_t vh, int64_t vj,
                       const void *restrict mask, int64_t mb, int64_t mh, int64_t mi,
                       void *restrict out, float *restrict weights,
                       int64_t batch, int64_t heads, int64_t queries, int64_t keys, int64_t d,
                       float scale, int threads) {
    int64_t padded = (keys + LANES - 1) / LANES * LANES;
    BY_DTYPE(
        _Pragma("omp parallel for num_threads(threads) schedule(static)")
        for (int64_t bh = 0; bh < batch * heads; bh++) {
            int64_t b = bh / heads, h = bh % heads;
            int64_t ko = b * kb + h * kh, vo = b * vb + h * vh;
            float qf[d], e[padded], acc[d], sums[ROWS];
            for (int64_t i = 0; i < queries; i++) {
                int64_t qo = b * qb + h * qh + i * qi, mo = b * mb + h * mh + i * mi;
                for (int64_t x = 0; x < d; x++)
                    qf[x] = load(query, DT, qo + x);
                for (int64_t first = 0; first < keys; first += ROWS) {
                    int64_t nr = keys - first < ROWS ? keys - first : ROWS, base = ko + first * kj;
                    ROWS_LANE_SUM(nr, d, qf[j] * load(key, DT, base + q * kj + j), sums);
                    for (int64_t r = 0; r < nr; r++)
                        e[first + r] = mask ? scale * sums[r] + load(mask, DT, mo + first + r) : scale * sums[r];
                }
                for (int64_t j = keys; j < padded; j++)
                    e[j] = -INFINITY;
                float max = row_max(e, padded);
                for (int64_t j = 0; j < padded; j++)
                    e[j] = exp_nonpositive(e[j] - max);
                float sum = LANE_SUM(padded, e[j]);
                for (int64_t x = 0; x < d; x++)
                    acc[x] = 0.0f;
                for (int64_t j = 0; j < keys; j++) {
                    float w = e[j];
                    int64_t o = vo + j * vj;
                    for (int64_t x = 0; x < d; x++)
                        acc[x] += w * load(value, DT, o + x);
                }
                float inv = 1.0f / sum;
                int64_t oo = (bh * queries + i) * d;
                for (int64_t x = 0; x < d; x++)
                    store(out, DT, oo + x, acc[x] * inv);
                if (weights)
                    for (int64_t j = 0; j < keys; j++)
                        weights[(bh * queries + i) * keys + j] = e[j] * inv;
            }
        })
}
