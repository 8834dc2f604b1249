/* numpy's PCG64DXSM stream, which --fast-dropout's masks are drawn from: a 128-bit LCG whose
 * state before each step gives one 64-bit word by the DXSM output function; a word is four 16-bit
 * draws, low bits first. Jumps ahead in log2(steps) steps (Brown, 1994), so each thread can start
 * at its own share of the stream.
 */
#ifndef QK_PCG_H
#define QK_PCG_H
#include <stdint.h>
#include <string.h>

typedef unsigned __int128 u128;

#define MULTIPLIER 0xda942042e4dd58b5ULL /* PCG64DXSM's "cheap" 64-bit LCG multiplier */

#define STATE_ARGS uint64_t state_hi, uint64_t state_lo, uint64_t inc_hi, uint64_t inc_lo
#define STATE_INIT                                                  \
    u128 state = ((u128)state_hi << 64) | state_lo;                 \
    u128 inc = ((u128)inc_hi << 64) | inc_lo;

static inline uint64_t pcg_next(u128 *state, u128 inc) {
    /* DXSM output of the state before the step */
    uint64_t hi = (uint64_t)(*state >> 64), lo = (uint64_t)*state | 1;
    hi ^= hi >> 32;
    hi *= MULTIPLIER;
    hi ^= hi >> 48;
    hi *= lo;
    *state = *state * (u128)MULTIPLIER + inc;
    return hi;
}

/* The affine map s -> a s + c that STEPS steps apply, into A and C. */
static inline void pcg_jump(u128 inc, uint64_t steps, u128 *a_out, u128 *c_out) {
    u128 a = MULTIPLIER, c = inc, acc_a = 1, acc_c = 0;
    for (; steps; steps >>= 1) {
        if (steps & 1) {
            acc_a *= a;
            acc_c = acc_c * a + c;
        }
        c *= a + 1;
        a *= a;
    }
    *a_out = acc_a;
    *c_out = acc_c;
}

static inline u128 pcg_advance(u128 state, u128 inc, uint64_t steps) {
    u128 a, c;
    pcg_jump(inc, steps, &a, &c);
    return a * state + c;
}

#define WAYS 4 /* words drawn as WAYS runs of the stream side by side: independent chains */

/* The next N words of the stream at STATE into WORDS; STATE advanced past them. */
static inline void pcg_words(u128 *state, u128 inc, uint64_t *words, int64_t n) {
    int64_t run = n / WAYS, i = 0;
    if (run > 1) {
        u128 a, c, s[WAYS];
        pcg_jump(inc, (uint64_t)run, &a, &c);
        s[0] = *state;
        for (int w = 1; w < WAYS; w++)
            s[w] = a * s[w - 1] + c;
        for (int64_t k = 0; k < run; k++)
            for (int w = 0; w < WAYS; w++)
                words[w * run + k] = pcg_next(&s[w], inc);
        *state = s[WAYS - 1]; /* the last run ended where the rest begins */
        i = WAYS * run;
    }
    for (; i < n; i++)
        words[i] = pcg_next(state, inc);
}

#define CHUNK 256 /* words drawn at a time */

/* The stream's draws from any one on (not only a word's first), in order. */
typedef struct {
    u128 state, inc;
    uint64_t words[CHUNK];
    int64_t next; /* the next draw's index in WORDS as int16 */
} draws_t;

static inline void draws_from(draws_t *d, u128 state, u128 inc, uint64_t first) {
    d->state = pcg_advance(state, inc, first / 4);
    d->inc = inc;
    pcg_words(&d->state, inc, d->words, CHUNK);
    d->next = (int64_t)(first % 4);
}

/* The next N draws into OUT. */
static inline void draws_next(draws_t *d, int16_t *out, int64_t n) {
    while (n > 0) {
        if (d->next == 4 * CHUNK) {
            pcg_words(&d->state, d->inc, d->words, CHUNK);
            d->next = 0;
        }
        int64_t take = 4 * CHUNK - d->next < n ? 4 * CHUNK - d->next : n;
        memcpy(out, (const int16_t *)d->words + d->next, (size_t)take * sizeof(int16_t)); /* low bits first */
        d->next += take;
        out += take;
        n -= take;
    }
}

#endif
