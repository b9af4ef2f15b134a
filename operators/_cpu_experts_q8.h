/* A prompt chunk's experts on Q8_0 stacks (experts_chunk's path where the stacks are held as
 * Q8_0 and the CPU has AVX-512 VNNI), included by _cpu_experts.h.
 *
 * Why: a chunk's rows spread over the experts (128 rows, 8 of 64 experts each: 16 rows an
 * expert hit), so each expert's GEMM is short. The dense Q8_0 GEMM (_cpu_held_gemm.h's
 * hq8_run) pads x to panels of 32 rows and sums each of w's blocks (for the +128 it stores x
 * with) once per call: on a 16-row expert half its products are padding and the block sums
 * a third of its time. Here:
 *
 * - the chunk's rows are quantized once (not once per expert they chose), as hq8_block rounds
 *   them, and each expert's rows are gathered into panels of 16 (one 64-byte vector per 4
 *   values of a block), the last panel run on 8-row vectors where it holds 8 rows or fewer;
 * - w meets x the other way about: VPDPBUSD multiplies w's bytes plus 128 (unsigned: w XOR
 *   0x80, -128 .. 127 as 0 .. 255) by x's int8, and each lane's sum starts at -128 times its
 *   block's sum of x (taken once, when x is quantized), so no pass sums w's blocks;
 * - w is read where it lies, 8 rows (a tile) at a time: the tile's blocks XORed into a small
 *   buffer (kept in L1) that every panel of the expert's rows reads.
 *
 * Each output is the same float32 operations as hq8_run's, in the same order: a block's
 * products summed exactly in int32, converted, times dx * dw (float32) added into the lane's
 * float32 sum, the blocks in order, then the bias: the same bits, and each row's bits its own
 * (no other row of the chunk enters its sums). The hidden values meet the second product as
 * 8-bit blocks so too (operators/experts.py's _hidden_rounding). */

#define EQ_LANES 16 /* rows of x a panel holds */
#define EQ_MR 8     /* rows of w a tile holds: 8 int32 and 8 float32 sums per vector of x */

typedef struct {
    const uint8_t *w;  /* the expert's rows: n rows of B * 34 bytes */
    const float *b;    /* (n,) or NULL */
    const int8_t *xq;  /* panels (P, B, 8, EQ_LANES, 4): each lane's 4 values of a group */
    const int32_t *xc; /* (P, B, EQ_LANES): -128 times each lane's block sum */
    const float *dx;   /* (P, B, EQ_LANES) */
    float *out;        /* (rows, n) */
    Py_ssize_t rows, n, B;
} eq8_gemm;

/* One row's block of x (32 values at v) into lane ``lane`` of a panel's block (xq, xc, dx at
 * the block): hq8_block's rounding. */
static inline void eq8_put(const float *v, int8_t *xq, int32_t *xc, float *dx, int lane) {
    int8_t q[32];
    dx[lane] = hq8_block(v, q);
    int32_t s = 0;
    for (int j = 0; j < 32; j++)
        s += q[j];
    xc[lane] = -128 * s;
    for (int g = 0; g < 8; g++)
        memcpy(xq + (g * EQ_LANES + lane) * 4, q + 4 * g, 4);
}

/* n rows of x (rows xs floats apart, K values each) into panels (as eq8_gemm's), the last
 * panel's lanes past n zero. */
static void eq8_panels(const float *x, Py_ssize_t xs, Py_ssize_t n, Py_ssize_t K, int8_t *xq,
                       int32_t *xc, float *dx) {
    const Py_ssize_t B = K / 32, P = (n + EQ_LANES - 1) / EQ_LANES;
    for (Py_ssize_t i = 0; i < P * EQ_LANES; i++) {
        const Py_ssize_t p = i / EQ_LANES;
        const int lane = (int)(i % EQ_LANES);
        for (Py_ssize_t b = 0; b < B; b++) {
            const Py_ssize_t at = p * B + b;
            if (i < n) {
                eq8_put(x + i * xs + 32 * b, xq + at * 8 * EQ_LANES * 4, xc + at * EQ_LANES,
                        dx + at * EQ_LANES, lane);
            } else {
                for (int g = 0; g < 8; g++)
                    memset(xq + (at * 8 * EQ_LANES + g * EQ_LANES + lane) * 4, 0, 4);
                xc[at * EQ_LANES + lane] = 0;
                dx[at * EQ_LANES + lane] = 0.0f;
            }
        }
    }
}

#ifdef HAVE_X86
/* The tile's MR rows against a panel's 16 lanes (``wide``) or its first 8: o[r * 16 + lane].
 * wp: the tile's blocks (B, EQ_MR, 32) XORed 0x80; dw: (B, EQ_MR). */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma"))) static inline
    __attribute__((always_inline)) void eq8_tile(const uint8_t *wp, const float *dw,
                                                 const int8_t *xq, const int32_t *xc,
                                                 const float *dx, Py_ssize_t B, const int MR,
                                                 const int wide, const uint8_t *next,
                                                 Py_ssize_t rb, float *o) {
    if (wide) {
        __m512 c[EQ_MR];
        for (int r = 0; r < MR; r++)
            c[r] = _mm512_setzero_ps();
        for (Py_ssize_t b = 0; b < B; b++) {
            const uint8_t *wb = wp + b * EQ_MR * 32;
            const int8_t *xb = xq + b * 8 * EQ_LANES * 4;
            if (next)  /* the next tile's rows, from memory while this one computes */
                for (int r = 0; r < EQ_MR; r++)
                    _mm_prefetch((const char *)(next + r * rb + 34 * b), _MM_HINT_T1);
            const __m512i start = _mm512_loadu_si512(xc + b * EQ_LANES);
            __m512i s[EQ_MR];
            for (int r = 0; r < MR; r++)
                s[r] = start;
            for (int g = 0; g < 8; g++) {
                const __m512i xv = _mm512_loadu_si512(xb + g * EQ_LANES * 4);
                for (int r = 0; r < MR; r++) {
                    int32_t four;
                    memcpy(&four, wb + r * 32 + 4 * g, 4);
                    s[r] = _mm512_dpbusd_epi32(s[r], _mm512_set1_epi32(four), xv);
                }
            }
            const __m512 d = _mm512_loadu_ps(dx + b * EQ_LANES);
            for (int r = 0; r < MR; r++)
                c[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[r]),
                                       _mm512_mul_ps(d, _mm512_set1_ps(dw[r * B + b])), c[r]);
        }
        for (int r = 0; r < MR; r++)
            _mm512_storeu_ps(o + r * EQ_LANES, c[r]);
        return;
    }
    __m256 c[EQ_MR];
    for (int r = 0; r < MR; r++)
        c[r] = _mm256_setzero_ps();
    for (Py_ssize_t b = 0; b < B; b++) {
        const uint8_t *wb = wp + b * EQ_MR * 32;
        const int8_t *xb = xq + b * 8 * EQ_LANES * 4;
        if (next)  /* the next tile's rows, from memory while this one computes */
            for (int r = 0; r < EQ_MR; r++)
                _mm_prefetch((const char *)(next + r * rb + 34 * b), _MM_HINT_T1);
        const __m256i start = _mm256_loadu_si256((const __m256i *)(xc + b * EQ_LANES));
        __m256i s[EQ_MR];
        for (int r = 0; r < MR; r++)
            s[r] = start;
        for (int g = 0; g < 8; g++) {
            const __m256i xv = _mm256_loadu_si256((const __m256i *)(xb + g * EQ_LANES * 4));
            for (int r = 0; r < MR; r++) {
                int32_t four;
                memcpy(&four, wb + r * 32 + 4 * g, 4);
                s[r] = _mm256_dpbusd_epi32(s[r], _mm256_set1_epi32(four), xv);
            }
        }
        const __m256 d = _mm256_loadu_ps(dx + b * EQ_LANES);
        for (int r = 0; r < MR; r++)
            c[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[r]),
                                   _mm256_mul_ps(d, _mm256_set1_ps(dw[r * B + b])), c[r]);
    }
    for (int r = 0; r < MR; r++)
        _mm256_storeu_ps(o + r * EQ_LANES, c[r]);
}

/* Rows [j, j + mr) of w: their blocks XORed into wp (B, EQ_MR, 32), their scales into dw
 * (EQ_MR, B) as half_to_float widens them (16 at a time: the float16's bits moved into a
 * float32's place and rescaled by 2^112, exactly). */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void eq8_pack(const eq8_gemm *a,
                                                                          Py_ssize_t j, int mr,
                                                                          uint8_t *wp,
                                                                          float *dw) {
    const Py_ssize_t B = a->B, rb = B * 34;
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    const __m512i at = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,
                                                            12, 13, 14, 15),
                                          _mm512_set1_epi32(34));
    for (int r = 0; r < mr; r++) {
        const uint8_t *row = a->w + (j + r) * rb;
        for (Py_ssize_t b = 0; b < B; b++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(row + 34 * b + 2));
            _mm256_storeu_si256((__m256i *)(wp + (b * EQ_MR + r) * 32), _mm256_xor_si256(v, flip));
        }
        Py_ssize_t b = 0;
        for (; b + 16 <= B; b += 16) { /* a scale's 2 bytes and the next 2 (the block's) */
            const __m512i h = _mm512_i32gather_epi32(at, (const void *)(row + 34 * b), 1);
            const __m512i mag = _mm512_slli_epi32(_mm512_and_si512(h, _mm512_set1_epi32(0x7fff)), 13);
            const __m512 f = _mm512_mul_ps(_mm512_castsi512_ps(mag), _mm512_set1_ps(0x1p112f));
            const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(h, _mm512_set1_epi32(0x8000)), 16);
            _mm512_storeu_ps(dw + r * B + b, _mm512_castsi512_ps(
                                                  _mm512_or_si512(_mm512_castps_si512(f), sign)));
        }
        for (; b < B; b++)
            dw[r * B + b] = half_to_float(row + 34 * b);
    }
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma"))) static void eq8_run_tile(
    const eq8_gemm *a, const uint8_t *wp, const float *dw, Py_ssize_t p, int mr, int wide,
    const uint8_t *next, float *o) {
    const Py_ssize_t rb = a->B * 34;
    const Py_ssize_t at = p * a->B;
    const int8_t *xq = a->xq + at * 8 * EQ_LANES * 4;
    const int32_t *xc = a->xc + at * EQ_LANES;
    const float *dx = a->dx + at * EQ_LANES;
#define EQ8_CASE(M)                                                                          \
    case M:                                                                                  \
        if (wide)                                                                            \
            eq8_tile(wp, dw, xq, xc, dx, a->B, M, 1, next, rb, o);                                     \
        else                                                                                 \
            eq8_tile(wp, dw, xq, xc, dx, a->B, M, 0, next, rb, o);                                     \
        break;
    switch (mr) {
        EQ8_CASE(1) EQ8_CASE(2) EQ8_CASE(3) EQ8_CASE(4) EQ8_CASE(5) EQ8_CASE(6) EQ8_CASE(7)
        default:
            if (wide)
                eq8_tile(wp, dw, xq, xc, dx, a->B, EQ_MR, 1, next, rb, o);
            else
                eq8_tile(wp, dw, xq, xc, dx, a->B, EQ_MR, 0, next, rb, o);
    }
#undef EQ8_CASE
}

/* Part ``part``'s share of w's rows (whole tiles) against every panel. */
static void eq8_part(const void *args, int part, int parts) {
    const eq8_gemm *a = args;
    Py_ssize_t j0, j1;
    share(a->n, EQ_MR, part, parts, &j0, &j1);
    if (j0 >= j1)
        return;
    uint8_t *wp = malloc((size_t)a->B * EQ_MR * (32 + sizeof(float)));
    if (!wp) { /* no memory for a tile's blocks: NaN, never a wrong number */
        for (Py_ssize_t i = 0; i < a->rows; i++)
            for (Py_ssize_t j = j0; j < j1; j++)
                a->out[i * a->n + j] = NAN;
        return;
    }
    float *dw = (float *)(wp + a->B * EQ_MR * 32); /* (EQ_MR, B) */
    float o[EQ_MR * EQ_LANES];
    const Py_ssize_t P = (a->rows + EQ_LANES - 1) / EQ_LANES;
    for (Py_ssize_t j = j0; j < j1; j += EQ_MR) {
        const int mr = (int)(j1 - j < EQ_MR ? j1 - j : EQ_MR);
        eq8_pack(a, j, mr, wp, dw);
        for (Py_ssize_t p = 0; p < P; p++) {
            const Py_ssize_t lanes = a->rows - p * EQ_LANES < EQ_LANES ? a->rows - p * EQ_LANES
                                                                        : EQ_LANES;
            /* the first panel's tile fetches the next tile's rows (whole tiles only) */
            const uint8_t *next = p == 0 && j + 2 * EQ_MR <= j1 ? a->w + (j + EQ_MR) * a->B * 34
                                                                : NULL;
            eq8_run_tile(a, wp, dw, p, mr, lanes > 8, next, o);
            for (Py_ssize_t i = 0; i < lanes; i++) {
                float *out = a->out + (p * EQ_LANES + i) * a->n + j;
                for (int r = 0; r < mr; r++)
                    out[r] = a->b ? o[r * EQ_LANES + i] + a->b[j + r] : o[r * EQ_LANES + i];
            }
        }
    }
    free(wp);
}

static int eq8_offered = -1; /* AVX-512 VNNI (and BW), first asked */

/* Whether this path runs here: hq8_run's conditions. */
static int eq8_ready(void) {
    if (eq8_offered < 0)
        eq8_offered = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw");
    return eq8_offered && simd == SIMD_AVX512 && tiles_running() != TILES_PORTABLE;
}
#else
static int eq8_ready(void) {
    return 0;
}
static void eq8_part(const void *args, int part, int parts) {
    (void)args, (void)part, (void)parts;
}
#endif

/* experts_chunk's rows on Q8_0 stacks (``start``, ``pairs``: each expert's (row, slot) pairs,
 * ``most`` the most any expert has), as experts_chunk runs them: the experts ascending, each
 * row's outputs added in its slots' order. NULL, or why not. */
static const char *experts_q8_chunk(const experts_call *c, const Py_ssize_t *start,
                                    const Py_ssize_t *pairs, Py_ssize_t most) {
    const Py_ssize_t m = c->m, k = c->k, E = c->E, H = c->H, R = c->R, I = c->I, Ho = c->Hout;
    const Py_ssize_t B1 = H / 32, B2 = I / 32, K = H > I ? H : I;
    const Py_ssize_t P = (most + EQ_LANES - 1) / EQ_LANES, lanes = P * EQ_LANES;
    /* the chunk's rows quantized once (unless each slot's input is its own: weight_input) */
    const Py_ssize_t rows_q = c->weight_input ? 0 : m;
    const size_t bytes = (size_t)rows_q * H + sizeof(float) * 2 * rows_q * B1  /* rows' x8 */
                         + (size_t)lanes * K + sizeof(float) * 2 * lanes * (K / 32) /* panels */
                         + sizeof(float) * (most * (R + I + Ho) + H);
    char *buf = malloc(bytes ? bytes : 1);
    if (!buf)
        return "experts: no memory for the chunk's rows as 8-bit blocks";
    char *at = buf;
    float *rd = (float *)at;                    at += sizeof(float) * rows_q * B1;
    int32_t *rc = (int32_t *)at;                at += sizeof(int32_t) * rows_q * B1;
    float *dx = (float *)at;                    at += sizeof(float) * lanes * (K / 32);
    int32_t *xc = (int32_t *)at;                at += sizeof(int32_t) * lanes * (K / 32);
    float *h = (float *)at;                     at += sizeof(float) * most * R;
    float *hid = (float *)at;                   at += sizeof(float) * most * I;
    float *y = (float *)at;                     at += sizeof(float) * most * Ho;
    float *xs = (float *)at;                    at += sizeof(float) * H;
    int8_t *rq = (int8_t *)at;                  at += (size_t)rows_q * H;
    int8_t *xq = (int8_t *)at;
    for (Py_ssize_t r = 0; r < rows_q; r++)
        for (Py_ssize_t b = 0; b < B1; b++) {
            int8_t *q = rq + r * H + 32 * b;
            rd[r * B1 + b] = hq8_block(c->x + r * H + 32 * b, q);
            int32_t s = 0;
            for (int j = 0; j < 32; j++)
                s += q[j];
            rc[r * B1 + b] = -128 * s;
        }
    const int vector = c->kind == EXPERT_GATED && !c->interleaved && !c->has_limit &&
                       !c->has_alpha && c->up_offset == 0.0f &&
                       (c->act == ACT_SILU || c->act == ACT_GELU_TANH);
    memset(c->out, 0, sizeof(float) * m * Ho);
    for (Py_ssize_t e = 0; e < E; e++) {
        const Py_ssize_t n = start[e + 1] - start[e];
        if (n == 0)
            continue; /* an expert no row chose: never read */
        const Py_ssize_t *p = pairs + start[e];
        const Py_ssize_t np = (n + EQ_LANES - 1) / EQ_LANES;
        for (Py_ssize_t i = 0; i < np * EQ_LANES; i++) { /* the expert's rows into panels */
            const Py_ssize_t pn = i / EQ_LANES;
            const int lane = (int)(i % EQ_LANES);
            const Py_ssize_t r = i < n ? p[i] / k : -1;
            if (r >= 0 && c->weight_input) {
                const float wt = c->route[r * 2 * k + k + p[i] % k];
                for (Py_ssize_t q = 0; q < H; q++)
                    xs[q] = c->x[r * H + q] * wt;
            }
            for (Py_ssize_t b = 0; b < B1; b++) {
                const Py_ssize_t blk = pn * B1 + b;
                int8_t *pq = xq + blk * 8 * EQ_LANES * 4;
                if (r < 0) {
                    for (int g = 0; g < 8; g++)
                        memset(pq + (g * EQ_LANES + lane) * 4, 0, 4);
                    xc[blk * EQ_LANES + lane] = 0;
                    dx[blk * EQ_LANES + lane] = 0.0f;
                } else if (c->weight_input) {
                    eq8_put(xs + 32 * b, pq, xc + blk * EQ_LANES, dx + blk * EQ_LANES, lane);
                } else {
                    const int8_t *q = rq + r * H + 32 * b;
                    for (int g = 0; g < 8; g++)
                        memcpy(pq + (g * EQ_LANES + lane) * 4, q + 4 * g, 4);
                    xc[blk * EQ_LANES + lane] = rc[r * B1 + b];
                    dx[blk * EQ_LANES + lane] = rd[r * B1 + b];
                }
            }
        }
        eq8_gemm first = {held_slice(c->w_in, HELD_Q8_0, e, R, H), c->b_in ? c->b_in + e * R : NULL,
                          xq, xc, dx, h, n, R, B1};
        pool_run(eq8_part, &first);
        if (vector) { /* act(gate) * up of halves: the chunk's gated kernel (_cpu_chunk.h) */
            rows_args g = {h, h + I, hid, n, I, R, R, I, 1, 1, c->act, 0, 0.0f};
            rows_run(rows_part, &g, n, n * I);
        } else {
            experts_hidden(c, h, hid, n);
        }
        eq8_panels(hid, I, n, I, xq, xc, dx);
        eq8_gemm second = {held_slice(c->w_down, HELD_Q8_0, e, Ho, I),
                           c->b_down ? c->b_down + e * Ho : NULL, xq, xc, dx, y, n, Ho, B2};
        pool_run(eq8_part, &second);
        for (Py_ssize_t t = 0; t < n; t++) {
            float *yt = y + t * Ho, *o = c->out + (p[t] / k) * Ho;
            if (c->norm)
                experts_norm(c, e, yt);
            const float wt = c->weight_input ? 1.0f : c->route[(p[t] / k) * 2 * k + k + p[t] % k];
            for (Py_ssize_t q = 0; q < Ho; q++)
                o[q] += yt[q] * wt;
        }
    }
    free(buf);
    return NULL;
}
