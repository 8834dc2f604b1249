/* --fused-adam on a CPU. Under --bf16: the update of the flat fp32 master (trainer.FlatBF16Optimizer)
 * read from the model's bf16 gradients and written back into its bf16 weights in the same pass.
 * fairseq's step makes three: the gradients widened into the master's gradient, Adam, and the
 * weights narrowed back, each over every parameter. In fp32: every parameter tensor stepped in place
 * in one call, the clipping factor applied on the way, where the per-tensor loops make one call (and
 * the clipping one more pass) per tensor.
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

/* The sum of squares of N tensors of DTYPE (NULL: skipped), each split into blocks among the threads;
 * the threads' sums added in thread order, so a call's bits depend on the thread count only. */
double qk_sumsq(int n, const void *const *tensors, const int64_t *sizes, int dtype, int threads) {
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
                BY_DTYPE(sum += LANE_SUM(len, square(load(tensors[t], DT, start + j)));)
            }
        }
        partial[omp_get_thread_num()] = sum;
    }
    double total = 0.0;
    for (int k = 0; k < threads; k++)
        total += partial[k];
    return total;
}

static inline float adam(float g, float *p, float *m, float *v, float step_size, float beta1, float beta2,
                         float eps, float decay) {
    float mi = *m * beta1 + g * (1.0f - beta1);
    float vi = *v * beta2 + g * g * (1.0f - beta2);
    float pi = *p;
    if (decay != 0.0f)
        pi = pi + pi * -decay;
    pi = pi - mi / (sqrtf(vi) + eps) * step_size;
    *m = mi;
    *v = vi;
    *p = pi;
    return pi;
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
                    w[i] = f32_to_bf16(
                        adam(bf16_to_f32(g[i]) * factor, pt + i, mt + i, vt + i, step_size, beta1, beta2, eps, decay));
            } else {
#pragma omp for schedule(static) nowait
                for (int64_t i = 0; i < sizes[t]; i++)
                    w[i] = f32_to_bf16(adam(0.0f, pt + i, mt + i, vt + i, step_size, beta1, beta2, eps, decay));
            }
            offset += sizes[t];
        }
    }
}

/* One Adam step of N fp32 tensors P[t] in place, with moments M[t] and V[t]: gradient GRADS[t] (fp32, NULL:
 * no step, as multi_tensor_adam leaves a parameter without a gradient) times FACTOR. */
void qk_adam_f32(int n, float *const *p, const float *const *grads, float *const *m, float *const *v,
                 const int64_t *sizes, float factor, float step_size, float beta1, float beta2, float eps, float decay,
                 int threads) {
#pragma omp parallel num_threads(threads)
    {
        for (int t = 0; t < n; t++) {
            const float *g = grads[t];
            if (g == NULL)
                continue;
            float *pt = p[t], *mt = m[t], *vt = v[t];
#pragma omp for schedule(static) nowait
            for (int64_t i = 0; i < sizes[t]; i++)
                adam(g[i] * factor, pt + i, mt + i, vt + i, step_size, beta1, beta2, eps, decay);
        }
    }
}
