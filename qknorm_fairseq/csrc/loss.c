/* --fused-loss under --fused-kernels on a CPU: the label-smoothed loss's two passes over the logits
 * (criterion.FusedLabelSmoothedNLL), each one C loop over rows of fp32 or bf16 logits, fp32 arithmetic.
 *
 * Statistics, per row x of TYPES logits (FORBIDDEN: 1 for a type the row may not predict, whose logit
 * is -inf, or NULL):
 *   lse = m + log(sum e^(x - m)), m the row's largest logit (+inf where m is, -inf where every logit is);
 *   tgt = x[target];  total = the sum of the allowed logits.
 * Gradient, per row: g = e^(x - lse) c_softmax - (c_nll at the target) - c_smooth w, w the type's weight
 * (WEIGHTS, or 1 for each), rounded once to the logits' dtype.
 * e^v is common.h's exp_nonpositive (within 2 ulp of e^v; below e^-87 it is 0), the sums run in LANES
 * partial sums added in lane order (common.h): the same bits on any thread count, other rounding than
 * Inductor's loops of the same formula, which a GPU runs.
 */
#include <math.h>   /* INFINITY, isfinite, logf */
#include <stdlib.h> /* malloc */

#include "common.h"

/* LOGITS (ROWS, TYPES) contiguous, TARGET (ROWS) int64, into LSE, TGT and TOTAL (fp32, ROWS each). Returns the
 * number of targets outside [0, TYPES), whose TGT is NaN. */
int64_t qk_loss_statistics(int dtype, const void *logits, const int64_t *target, const uint8_t *forbidden, int64_t rows,
                           int64_t types, float *lse, float *tgt, float *total, int threads) {
    int64_t bad = 0;
    BY_DTYPE(_Pragma("omp parallel num_threads(threads) reduction(+ : bad)") {
        float *row = DT == F32 ? NULL : malloc((size_t)types * sizeof(float)); /* a bf16 row widened */
        _Pragma("omp for schedule(static)")
        for (int64_t r = 0; r < rows; r++) {
            const float *x = (const float *)logits + r * types;
            if (DT == BF16) {
                for (int64_t j = 0; j < types; j++)
                    row[j] = load(logits, DT, r * types + j);
                x = row;
            }
            float m = row_max(x, types), shift = isfinite(m) ? m : 0.0f;
            float sum = LANE_SUM(types, exp_nonpositive(x[j] - shift));
            lse[r] = m == INFINITY ? m : shift + logf(sum); /* all -inf: -inf; a NaN: NaN */
            total[r] = forbidden ? LANE_SUM(types, forbidden[j] ? 0.0f : x[j]) : LANE_SUM(types, x[j]);
            int64_t t = target[r];
            int inside = t >= 0 && t < types;
            bad += !inside;
            tgt[r] = inside ? x[t] : NAN;
        }
        free(row);
    })
    return bad;
}

/* LOGITS (ROWS, TYPES) contiguous; LSE, C_SOFTMAX, C_NLL, C_SMOOTH (fp32, ROWS each); TARGET (ROWS) int64 within
 * [0, TYPES) (one outside is left out); WEIGHTS (fp32, TYPES) or NULL; into GRAD (the logits' dtype). */
void qk_loss_gradient(int dtype, const void *logits, const float *lse, const float *c_softmax, const int64_t *target,
                      const float *c_nll, const float *c_smooth, const float *weights, int64_t rows, int64_t types,
                      void *grad, int threads) {
    BY_DTYPE(_Pragma("omp parallel for num_threads(threads) schedule(static)")
             for (int64_t r = 0; r < rows; r++) {
                 int64_t o = r * types;
                 float l = lse[r], cs = c_softmax[r], cm = c_smooth[r];
                 if (weights)
                     for (int64_t j = 0; j < types; j++)
                         store(grad, DT, o + j, exp_nonpositive(load(logits, DT, o + j) - l) * cs - cm * weights[j]);
                 else
                     for (int64_t j = 0; j < types; j++)
                         store(grad, DT, o + j, exp_nonpositive(load(logits, DT, o + j) - l) * cs - cm);
                 int64_t t = target[r];
                 if (t >= 0 && t < types)
                     store(grad, DT, o + t, exp_nonpositive(load(logits, DT, o + t) - l) * cs - c_nll[r]
                                                - cm * (weights ? weights[t] : 1.0f));
             })
}
