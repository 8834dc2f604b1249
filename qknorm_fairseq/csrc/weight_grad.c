/* --fused-kernels on a CPU with AMX: a bf16 linear layer's weight and bias gradients in one pass,
 *   dw = dy^T x (OUT x IN),  db = the column sums of dy (OUT),
 * for dy (N x OUT) and x (N x IN), bf16 rows, OUT and IN multiples of 16.
 *
 * oneDNN's product for dy^T x copies both operands into its tiles' layouts at every call (dy transposed),
 * and torch sums db in a pass of its own. Here the tokens run in chunks of CHUNK: each thread copies its
 * share of both operands' chunk into AMX's layouts (the transpose done 16 x 16 32-bit units at a time in
 * registers, db summed on the way) and multiplies them into fp32 sums it keeps for the whole product.
 * Each output's sum runs over the tokens in order in one thread (the threads split the wider of OUT and
 * IN), so the bits do not depend on the thread count; they differ from oneDNN's, which sums in another
 * order, both rounded once from fp32 (tests/unit/test_weight_grad.py holds each output within an fp32 sum's
 * error and one rounding of the fp64 result).
 *
 * AMX's tile product _tile_dpbf16ps(C, A, B) adds to C[m][j] the sum over k < 16 of A[m][2k] B[k][2j]
 * + A[m][2k+1] B[k][2j+1]. Here m is an output row o, j an input column i, and 2k, 2k+1 two tokens:
 * B's row k is two tokens' rows of x interleaved (16 pairs: one 32-bit unit a column), A's row m is dy's
 * column o over 32 tokens, the same pairs: the 16 x 16 units of 16 such interleaved rows of dy, transposed.
 *
 * Built without AMX (or with -DQK_PORTABLE), qk_weight_grad_ready() is 0 and the caller keeps torch's ops.
 */
#include <stdint.h>

#include "common.h"
#include "simd.h"

#if QK_AVX512 && defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#define CHUNK 128                /* tokens a chunk: both operands' tiles for it stay in L2 */
#define STEPS (CHUNK / 32)       /* tile products a chunk, 32 tokens each */
#define TILE 256                 /* 32-bit units a tile: 16 rows of 64 bytes */
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* Whether this process may use AMX's tiles (Linux grants the state on request; oneDNN asks for it too) */
int qk_weight_grad_ready(void) { return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0; }

static void tiles_config(void) {
    struct { uint8_t palette, start; uint8_t reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; } c = {0};
    c.palette = 1;
    for (int t = 0; t < 8; t++) {
        c.colsb[t] = 64;
        c.rows[t] = 16;
    }
    _tile_loadconfig(&c);
}

/* 16 bf16 of row T of A (N rows of W), columns C.., or zeros past the last row */
static inline __m256i row16(const uint16_t *a, int64_t n, int64_t w, int64_t t, int64_t c) {
    return t < n ? _mm256_loadu_si256((const __m256i *)(a + t * w + c)) : _mm256_setzero_si256();
}

/* rows LO and HI interleaved: 16 32-bit units (lo[j], hi[j]) */
static inline __m512i interleave(__m256i lo, __m256i hi) {
    return _mm512_or_si512(_mm512_cvtepu16_epi32(lo), _mm512_slli_epi32(_mm512_cvtepu16_epi32(hi), 16));
}

/* R (16 x 16 32-bit units, a vector a row) transposed in place */
static inline void transpose16(__m512i *r) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int g = 0; g < 16; g += 8)
        for (int i = 0; i < 4; i++) {
            t[g + i] = _mm512_shuffle_i32x4(r[g + i], r[g + i + 4], 0x88);
            t[g + i + 4] = _mm512_shuffle_i32x4(r[g + i], r[g + i + 4], 0xdd);
        }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
    }
}

/* dy's columns 16 O.. over the chunk's STEPS x 32 tokens from T0 as A tiles into DST; their sums into SUM */
static void pack_dy(const uint16_t *dy, int64_t n, int64_t out, int64_t t0, int64_t o, uint32_t *dst, __m512 *sum) {
    for (int s = 0; s < STEPS; s++) {
        __m512i r[16];
        for (int k = 0; k < 16; k++) {
            int64_t t = t0 + 32 * s + 2 * k;
            __m256i lo = row16(dy, n, out, t, 16 * o), hi = row16(dy, n, out, t + 1, 16 * o);
            *sum = _mm512_add_ps(_mm512_add_ps(*sum, vwiden(lo)), vwiden(hi));
            r[k] = interleave(lo, hi);
        }
        transpose16(r);
        for (int k = 0; k < 16; k++)
            _mm512_store_si512(dst + s * TILE + 16 * k, r[k]);
    }
}

/* x's columns 16 I.. over the chunk's tokens from T0 as B tiles into DST */
static void pack_x(const uint16_t *x, int64_t n, int64_t in, int64_t t0, int64_t i, uint32_t *dst) {
    for (int s = 0; s < STEPS; s++)
        for (int k = 0; k < 16; k++) {
            int64_t t = t0 + 32 * s + 2 * k;
            _mm512_store_si512(dst + s * TILE + 16 * k, interleave(row16(x, n, in, t, 16 * i), row16(x, n, in, t + 1, 16 * i)));
        }
}

/* OP (_tile_loadd or _tile_stored: a tile's number must be a constant) on the sums' tiles in use: C0's, the one
 * right of it (I2), the two below them (O2) */
#define ACCUMULATORS(OP)                      \
    do {                                      \
        OP(0, c0, ldc * 4);                   \
        if (i2)                               \
            OP(1, c0 + 16, ldc * 4);          \
        if (o2)                               \
            OP(2, c1, ldc * 4);               \
        if (o2 && i2)                         \
            OP(3, c1 + 16, ldc * 4);          \
    } while (0)

/* The fp32 sums C (row stride LDC floats) of A's tile rows 16 O.. times B's columns 16 I.., two by two, plus the
 * chunk's products: A and B the chunk's tiles, STEPS a tile row or column */
static void multiply(const uint32_t *a, int64_t ot, const uint32_t *b, int64_t it, float *c, int64_t ldc, int first) {
    for (int64_t o = 0; o < ot; o += 2)
        for (int64_t i = 0; i < it; i += 2) {
            int o2 = o + 1 < ot, i2 = i + 1 < it;
            float *c0 = c + 16 * o * ldc + 16 * i, *c1 = c0 + 16 * ldc;
            if (first) {
                _tile_zero(0);
                _tile_zero(1);
                _tile_zero(2);
                _tile_zero(3);
            } else {
                ACCUMULATORS(_tile_loadd);
            }
            const uint32_t *a0 = a + o * STEPS * TILE, *a1 = a0 + STEPS * TILE, *b0 = b + i * STEPS * TILE, *b1 = b0 + STEPS * TILE;
            for (int s = 0; s < STEPS; s++) {
                _tile_loadd(4, a0 + s * TILE, 64);
                _tile_loadd(6, b0 + s * TILE, 64);
                _tile_dpbf16ps(0, 4, 6);
                if (i2) {
                    _tile_loadd(7, b1 + s * TILE, 64);
                    _tile_dpbf16ps(1, 4, 7);
                }
                if (o2) {
                    _tile_loadd(5, a1 + s * TILE, 64);
                    _tile_dpbf16ps(2, 5, 6);
                    if (i2)
                        _tile_dpbf16ps(3, 5, 7);
                }
            }
            ACCUMULATORS(_tile_stored);
        }
}

/* The bytes of work of one of PARTS parts of qk_weight_grad (a multiple of 64) */
static int64_t part_bytes(int64_t out, int64_t in, int parts) {
    int64_t ot = out / 16, it = in / 16, most = (out >= in ? ot : it) / parts + 1;
    int64_t a = out >= in ? most : ot, b = out >= in ? it : most, c = 16 * (out >= in ? most * in : out * most);
    return (a + b) * STEPS * TILE * 4 + c * 4;
}

/* The bytes of work qk_weight_grad needs in THREADS parts */
int64_t qk_weight_grad_work(int64_t out, int64_t in, int threads) { return threads * part_bytes(out, in, threads); }

/* DW (OUT x IN) = DY^T X and DB (OUT; none where NULL) = DY's column sums, rounded once from fp32 to bf16, for
 * N >= 1 tokens; WORK: qk_weight_grad_work's bytes, 64-byte aligned. THREADS parts, each a share of dy's columns
 * (dw's rows) or of x's (dw's columns), whichever are more, and a slice of WORK, the parts OpenMP's threads in turn */
void qk_weight_grad(const uint16_t *dy, const uint16_t *x, int64_t n, int64_t out, int64_t in, uint16_t *dw,
                    uint16_t *db, char *work, int threads) {
    int64_t ot = out / 16, it = in / 16, bytes = part_bytes(out, in, threads);
    int by_out = out >= in;
    #pragma omp parallel for num_threads(threads) schedule(static, 1)
    for (int part = 0; part < threads; part++) {
        int64_t split = by_out ? ot : it, lo = split * part / threads, hi = split * (part + 1) / threads;
        int64_t o0 = by_out ? lo : 0, on = by_out ? hi - lo : ot, i0 = by_out ? 0 : lo, in_ = by_out ? it : hi - lo;
        uint32_t *a = (uint32_t *)(work + part * bytes), *b = a + on * STEPS * TILE;
        float *c = (float *)(b + in_ * STEPS * TILE);
        int64_t ldc = 16 * in_;
        __m512 sums[on > 0 ? on : 1];
        for (int64_t o = 0; o < on; o++)
            sums[o] = _mm512_setzero_ps();
        tiles_config();
        for (int64_t t0 = 0; t0 < n; t0 += CHUNK) {
            for (int64_t o = 0; o < on; o++)
                pack_dy(dy, n, out, t0, o0 + o, a + o * STEPS * TILE, &sums[o]);
            for (int64_t i = 0; i < in_; i++)
                pack_x(x, n, in, t0, i0 + i, b + i * STEPS * TILE);
            multiply(a, on, b, in_, c, ldc, t0 == 0);
        }
        _tile_release();
        for (int64_t r = 0; r < 16 * on; r++)
            for (int64_t j = 0; j < ldc; j += 16)
                vstore(BF16, dw, (16 * o0 + r) * in + 16 * i0 + j, ALL_LANES, _mm512_load_ps(c + r * ldc + j));
        if (db && (by_out || part == 0)) /* split by x's columns, every part sums all of dy: the first writes them */
            for (int64_t o = 0; o < on; o++)
                vstore(BF16, db, 16 * (o0 + o), ALL_LANES, sums[o]);
    }
}
#else
int qk_weight_grad_ready(void) { return 0; }
int64_t qk_weight_grad_work(int64_t out, int64_t in, int threads) { return 0; }
void qk_weight_grad(const uint16_t *dy, const uint16_t *x, int64_t n, int64_t out, int64_t in, uint16_t *dw,
                    uint16_t *db, char *work, int threads) {}
#endif
