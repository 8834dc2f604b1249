/* The packed rows' attention grids (decoder_rows.py) on a CPU: a length group's rows, (tokens, heads, d)
 * sentence by sentence, each sentence's tokens at positions 0..its length, to the group's grid
 * (sentences, heads, length, d) with zeros at the pads, and back, each one pass. Plain copies of
 * SIZE-byte elements: the bits are those of torch's zeros, index_copy and transposing copies.
 *
 * Threads: OpenMP over (sentence, head) pairs; no two write the same bytes.
 */
#include "common.h"

void qk_rows_to_grid(int64_t size, const char *rows, const int64_t *lengths, int64_t count, int64_t heads, int64_t d,
                     int64_t length, char *grid, int threads) {
    int64_t first[count + 1];
    first_rows(lengths, count, first);
    int64_t vec = d * size, row = heads * vec; /* bytes: one head's values, one token's row */
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t sh = 0; sh < count * heads; sh++) {
        int64_t s = sh / heads, h = sh % heads;
        char *out = grid + sh * length * vec;
        const char *in = rows + first[s] * row + h * vec;
        for (int64_t t = 0; t < lengths[s]; t++)
            memcpy(out + t * vec, in + t * row, (size_t)vec);
        memset(out + lengths[s] * vec, 0, (size_t)((length - lengths[s]) * vec));
    }
}

void qk_grid_to_rows(int64_t size, const char *grid, const int64_t *lengths, int64_t count, int64_t heads, int64_t d,
                     int64_t length, char *rows, int threads) {
    int64_t first[count + 1];
    first_rows(lengths, count, first);
    int64_t vec = d * size, row = heads * vec;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t sh = 0; sh < count * heads; sh++) {
        int64_t s = sh / heads, h = sh % heads;
        const char *in = grid + sh * length * vec;
        char *out = rows + first[s] * row + h * vec;
        for (int64_t t = 0; t < lengths[s]; t++)
            memcpy(out + t * row, in + t * vec, (size_t)vec);
    }
}
