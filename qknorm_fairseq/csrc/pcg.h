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

/* numpy's PCG64DXSM(SEED) state: SEED through numpy's SeedSequence (its 32-bit words hashed into a pool of
 * four, then four 64-bit words out), which seed the LCG as PCG's setseq srandom does, with the 128-bit
 * default multiplier (the draws step with the cheap one). Into OUT: the state's high and low words, then the
 * increment's. The hash's constants and steps are SeedSequence's (numpy/random/bit_generator.pyx). */
static inline uint32_t seed_hashmix(uint32_t v, uint32_t *h) {
    v ^= *h;
    *h *= 0x931e8875u;
    v *= *h;
    return v ^ (v >> 16);
}

static inline uint32_t seed_mix(uint32_t x, uint32_t y) {
    uint32_t r = 0xca01f9ddu * x - 0x4973f715u * y;
    return r ^ (r >> 16);
}

static inline void pcg_seed_state(uint64_t seed, uint64_t out[4]) {
    uint32_t entropy[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)}, pool[4], h = 0x43b0d7e5u, words[8];
    int n = seed >> 32 ? 2 : 1; /* seed's 32-bit words, low first; 0 is one word */
    for (int i = 0; i < 4; i++)
        pool[i] = seed_hashmix(i < n ? entropy[i] : 0, &h);
    for (int src = 0; src < 4; src++)
        for (int dst = 0; dst < 4; dst++)
            if (src != dst)
                pool[dst] = seed_mix(pool[dst], seed_hashmix(pool[src], &h));
    uint32_t g = 0x8b51f9ddu;
    for (int i = 0; i < 8; i++) {
        uint32_t v = pool[i % 4] ^ g;
        g *= 0x58f38dedu;
        v *= g;
        words[i] = v ^ (v >> 16);
    }
    uint64_t w[4];
    for (int i = 0; i < 4; i++)
        w[i] = (uint64_t)words[2 * i] | (uint64_t)words[2 * i + 1] << 32;
    const u128 multiplier = ((u128)2549297995355413924ULL << 64) | 4865540595714422341ULL;
    u128 inc = (((u128)w[2] << 64 | w[3]) << 1) | 1, state = inc;  /* 0 stepped once is the increment */
    state = (state + ((u128)w[0] << 64 | w[1])) * multiplier + inc;
    out[0] = (uint64_t)(state >> 64);
    out[1] = (uint64_t)state;
    out[2] = (uint64_t)(inc >> 64);
    out[3] = (uint64_t)inc;
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
