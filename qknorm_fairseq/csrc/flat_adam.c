/* --fused-adam under --bf16 on a CPU: the update of the flat fp32 master (trainer.FlatBF16Optimizer)
 * read from the model's bf16 gradients and written back into its bf16 weights in the same pass.
 * fairseq's step makes three: the gradients widened into the master's gradient, Adam, and the
 * weights narrowed back, each over every parameter.
 *
 * The formula is optimizer.py's, in fp32 (-ffp-contract=off: every product and sum rounded on its
 * own): g = grad * factor (fairseq's clipping factor), the moments, the decoupled weight decay and
 * the step. A tensor without a gradient (a NULL pointer) steps with g = 0, as the master's zeroed
 * gradient does. The gradient norm for clipping is accumulated in fp64.
 *
 * Threads: OpenMP, each tensor's elements split statically; no element depends on another, so the
 * update's bits do not depend on the thread count.
 */
#include <math.h>

#include "common.h"

#define BLOCK 4096 /* elements per fp64 addition */
#define MAX_THREADS 1024

static inline float square(float v) { return v * v; }

/* The sum of squares of N bf16 tensors (NULL: skipped), each split into blocks among the threads;
 * the threads' sums added in thread order, so a call's bits depend on the thread count only. */
double qk_sumsq_bf16(int n, const uint16_t *const *tensors, const int64_t *sizes, int threads) {
    double partial[MAX_THREADS] = {0};
    if (threads > MAX_THREADS)
        threads = MAX_THREADS;
#pragma omp parallel num_threads(threads)
    {
        double sum = 0.0;
        for (int t = 0; t < n; t++) {
            if (tensors[t] == NULL)
                continue;
            int64_t blocks = (sizes[t] + BLOCK - 1) / BLOCK;
#pragma omp for schedule(static) nowait
            for (int64_t b = 0; b < blocks; b++) {
                int64_t start = b * BLOCK, len = sizes[t] - start < BLOCK ? sizes[t] - start : BLOCK;
                const uint16_t *x = tensors[t] + start;
                sum += LANE_SUM(len, square(bf16_to_f32(x[j])));
            }
        }
        partial[omp_get_thread_num()] = sum;
    }
    double total = 0.0;
    for (int k = 0; k < threads; k++)
        total += partial[k];
    return total;
}

static inline void adam(float g, float *p, float *m, float *v, uint16_t *w, float step_size, float beta1,
                        float beta2, float eps, float decay) {
    float mi = *m * beta1 + g * (1.0f - beta1);
    float vi = *v * beta2 + g * g * (1.0f - beta2);
    float pi = *p;
    if (decay != 0.0f)
        pi = pi + pi * -decay;
    pi = pi - mi / (sqrtf(vi) + eps) * step_size;
    *m = mi;
    *v = vi;
    *p = pi;
    *w = f32_to_bf16(pi);
}

/* One Adam step of N tensors laid end to end in the flat master P with moments M and V: tensor t's
 * gradient GRADS[t] (bf16, NULL: zeros) times FACTOR, its weights written to WEIGHTS[t] (bf16). */
void qk_adam_bf16(int n, uint16_t *const *weights, const uint16_t *const *grads, const int64_t *sizes, float *p,
                  float *m, float *v, float factor, float step_size, float beta1, float beta2, float eps, float decay,
                  int threads) {
#pragma omp parallel num_threads(threads)
    {
        int64_t offset = 0;
        for (int t = 0; t < n; t++) {
            uint16_t *w = weights[t];
            const uint16_t *g = grads[t];
            float *pt = p + offset, *mt = m + offset, *vt = v + offset;
            if (g != NULL) {
#pragma omp for schedule(static) nowait
                for (int64_t i = 0; i < sizes[t]; i++)
                    adam(bf16_to_f32(g[i]) * factor, pt + i, mt + i, vt + i, w + i, step_size, beta1, beta2, eps,
                         decay);
            } else {
#pragma omp for schedule(static) nowait
                for (int64_t i = 0; i < sizes[t]; i++)
                    adam(0.0f, pt + i, mt + i, vt + i, w + i, step_size, beta1, beta2, eps, decay);
            }
            offset += sizes[t];
        }
    }
}
