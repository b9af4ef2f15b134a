/* A prompt chunk's GEMM on a weight held as bfloat16 rows (the checkpoint's own, memory-
 * mapped): out (m, n) = bf16(x) (m, k) @ w (n, k).T (+ b), float32 sums of bfloat16
 * products, as llama.cpp's bfloat16 GEMM (x rounded to bfloat16, AVX-512 BF16's VDPBF16PS).
 *
 * x is rounded to bfloat16 (to nearest, ties to even; a NaN stays a quiet NaN: the tiles'
 * rounding, formats.round_bfloat16's) into panels of 32 rows, each pair of values (2p, 2p + 1)
 * of the 32 rows one 64-byte vector, rows past m zeros. w is read where it lies, row-major:
 * a row's pair p is one 32-bit broadcast, so VDPBF16PS of it against a panel's pair adds
 * both products into that row of w's sums for 16 rows of x at once. A tile is 12 rows of w
 * by the 32 rows of a panel (24 sums in registers over the whole of k, in order, a pair at a
 * time); a block of w's rows (kept in L2) meets every panel in turn. Nothing is widened and
 * w is never copied: no conversion pass at load, none per call.
 *
 * Where the CPU lacks AVX-512 BF16 (or the float32 kernels were told to run on less), the
 * same rounded x meets the widening GEMM (gemm_held_run): the same products, float32 sums
 * in another order. held.reference_x gives the float64 reference the same rounded x, so
 * check judges the kernel by the float32 GEMM's tolerance. */

#define HG_PANEL 32 /* rows of x a panel holds: two vectors of 16 */
#define HG_MR 12    /* rows of w a tile holds: 24 sums, two x vectors, a broadcast */

typedef struct {
    const uint8_t *wh; /* rows of rb bytes, k bfloat16 each */
    const float *x, *b;
    float *out;
    uint32_t *xp; /* panels: (mp / 32, kp, 32) pairs */
    Py_ssize_t m, n, k, kp, mp, rb, jb;
} hgemm_args;

static inline uint32_t hg_round(uint32_t u) {
    const uint32_t near = (u + 0x7fffu + ((u >> 16) & 1)) >> 16;
    return (u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40 : near;
}

/* Panels' rows [i0, i1) (multiples of 32) rounded and packed into xp. */
static void hgemm_pack_part(const void *args, int part, int parts) {
    const hgemm_args *a = args;
    Py_ssize_t i0, i1;
    share(a->mp, HG_PANEL, part, parts, &i0, &i1);
    const Py_ssize_t P = a->k / 2;
    for (Py_ssize_t i = i0; i < i1; i++) {
        uint32_t *dst = a->xp + (i / HG_PANEL) * a->kp * HG_PANEL + i % HG_PANEL;
        if (i >= a->m) {
            for (Py_ssize_t p = 0; p < a->kp; p++)
                dst[p * HG_PANEL] = 0;
            continue;
        }
        const uint32_t *src = (const uint32_t *)(a->x + i * a->k);
        for (Py_ssize_t p = 0; p < P; p++)
            dst[p * HG_PANEL] = hg_round(src[2 * p]) | hg_round(src[2 * p + 1]) << 16;
        if (P < a->kp) /* odd k: the last value, paired with zero */
            dst[P * HG_PANEL] = hg_round(src[a->k - 1]);
    }
}

/* x (m, k) rounded to bfloat16 values, as float32 (the portable path's x); NULL where no
 * memory. The caller frees it. */
static float *hgemm_rounded(const float *x, Py_ssize_t m, Py_ssize_t k) {
    float *r = malloc(sizeof(float) * m * k);
    if (!r)
        return NULL;
    const uint32_t *src = (const uint32_t *)x;
    uint32_t *dst = (uint32_t *)r;
    for (Py_ssize_t i = 0; i < m * k; i++)
        dst[i] = hg_round(src[i]) << 16;
    return r;
}

/* Panel q's block of columns [jb, je) from blk (32 rows of stride floats) into out (m, n),
 * the bias added: each out row's run written once, whole (gemm_cols' reason: rows n floats
 * apart fall in one L1 set where n is a multiple of 1024). */
static void hg_block_out(float *out, const float *b, Py_ssize_t m, Py_ssize_t n,
                         Py_ssize_t stride, Py_ssize_t q, Py_ssize_t jb, Py_ssize_t je,
                         const float *blk) {
    const Py_ssize_t i0 = q * HG_PANEL, rows = m - i0 < HG_PANEL ? m - i0 : HG_PANEL;
    for (Py_ssize_t i = 0; i < rows; i++) {
        float *o = out + (i0 + i) * n + jb;
        const float *from = blk + i * stride;
        if (b)
            for (Py_ssize_t c = 0; c < je - jb; c++)
                o[c] = from[c] + b[jb + c];
        else
            memcpy(o, from, sizeof(float) * (je - jb));
    }
}

#ifdef HAVE_X86
/* MR rows of w from row j against panel q: the tile's sums into blk (32 rows of jb floats,
 * the block's columns from its first row), for hgemm_block_out to copy out. */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) static inline
    __attribute__((always_inline)) void hgemm_tile(const hgemm_args *a, Py_ssize_t j,
                                                   Py_ssize_t q, const int MR, float *blk) {
    __m512 c[HG_MR][2];
    for (int r = 0; r < MR; r++)
        c[r][0] = c[r][1] = _mm512_setzero_ps();
    const uint32_t *x = a->xp + q * a->kp * HG_PANEL;
    const uint8_t *w = a->wh + j * a->rb;
    const Py_ssize_t P = a->k / 2, rb = a->rb;
    for (Py_ssize_t p = 0; p < P; p++) {
        const __m512bh x0 = (__m512bh)_mm512_loadu_si512(x + p * HG_PANEL);
        const __m512bh x1 = (__m512bh)_mm512_loadu_si512(x + p * HG_PANEL + 16);
        for (int r = 0; r < MR; r++) {
            uint32_t pair;
            memcpy(&pair, w + r * rb + 4 * p, 4);
            const __m512bh v = (__m512bh)_mm512_set1_epi32((int)pair);
            c[r][0] = _mm512_dpbf16_ps(c[r][0], x0, v);
            c[r][1] = _mm512_dpbf16_ps(c[r][1], x1, v);
        }
    }
    if (P < a->kp) { /* odd k: w's last value, paired with zero (never read past the row) */
        const __m512bh x0 = (__m512bh)_mm512_loadu_si512(x + P * HG_PANEL);
        const __m512bh x1 = (__m512bh)_mm512_loadu_si512(x + P * HG_PANEL + 16);
        for (int r = 0; r < MR; r++) {
            uint16_t last;
            memcpy(&last, w + r * rb + 4 * P, 2);
            const __m512bh v = (__m512bh)_mm512_set1_epi32((int)last);
            c[r][0] = _mm512_dpbf16_ps(c[r][0], x0, v);
            c[r][1] = _mm512_dpbf16_ps(c[r][1], x1, v);
        }
    }
    for (int r = 0; r < MR; r++) {
        float t[HG_PANEL];
        _mm512_storeu_ps(t, c[r][0]);
        _mm512_storeu_ps(t + 16, c[r][1]);
        for (int i = 0; i < HG_PANEL; i++)
            blk[i * a->jb + r] = t[i];
    }
}

/* Output columns [j0, j1) over every row: jb rows of w at a time against every panel. */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) static void hgemm_cols(
    const hgemm_args *a, Py_ssize_t j0, Py_ssize_t j1, float *blk) {
    for (Py_ssize_t jb = j0; jb < j1; jb += a->jb) {
        const Py_ssize_t je = jb + a->jb < j1 ? jb + a->jb : j1;
        for (Py_ssize_t q = 0; q * HG_PANEL < a->m; q++) {
            Py_ssize_t j = jb;
            for (; j + HG_MR <= je; j += HG_MR)
                hgemm_tile(a, j, q, HG_MR, blk + (j - jb));
            float *at = blk + (j - jb);
            switch (je - j) { /* the last (je - jb) % 12 rows of w as one tile */
            case 0: break;
            case 1: hgemm_tile(a, j, q, 1, at); break;
            case 2: hgemm_tile(a, j, q, 2, at); break;
            case 3: hgemm_tile(a, j, q, 3, at); break;
            case 4: hgemm_tile(a, j, q, 4, at); break;
            case 5: hgemm_tile(a, j, q, 5, at); break;
            case 6: hgemm_tile(a, j, q, 6, at); break;
            case 7: hgemm_tile(a, j, q, 7, at); break;
            case 8: hgemm_tile(a, j, q, 8, at); break;
            case 9: hgemm_tile(a, j, q, 9, at); break;
            case 10: hgemm_tile(a, j, q, 10, at); break;
            default: hgemm_tile(a, j, q, 11, at); break;
            }
            hg_block_out(a->out, a->b, a->m, a->n, a->jb, q, jb, je, blk);
        }
    }
}

static void hgemm_part(const void *args, int part, int parts) {
    const hgemm_args *a = args;
    Py_ssize_t j0, j1; /* whole tiles of w's rows */
    share(a->n, HG_MR, part, parts, &j0, &j1);
    float blk[HG_PANEL * 96];
    if (j0 < j1)
        hgemm_cols(a, j0, j1, blk);
}
#endif

/* out (m, n) = bf16(x) @ w.T (+ b) on bfloat16 rows w (rb = 2k bytes apart), on the pool,
 * with the GIL released: 0 done, -1 where x's panels find no memory, 1 where this CPU has
 * no AVX-512 BF16 kernel (the caller runs the portable path on hgemm_rounded's x). */
static int hgemm_bf16_run(float *out, const float *x, const void *w, const float *b,
                          Py_ssize_t m, Py_ssize_t n, Py_ssize_t k) {
#ifdef HAVE_X86
    if (tiles_running() == TILES_PORTABLE)
        return 1;
    hgemm_args a = {.wh = w, .x = x, .b = b, .out = out, .m = m, .n = n, .k = k,
                    .kp = (k + 1) / 2, .mp = (m + HG_PANEL - 1) / HG_PANEL * HG_PANEL,
                    .rb = 2 * k};
    /* rows of w a block: whole tiles, about 384 KB of them (in L2 beside a panel), 96 at
     * most (blk's) */
    a.jb = 393216 / a.rb / HG_MR * HG_MR;
    a.jb = a.jb < HG_MR ? HG_MR : a.jb > 96 ? 96 : a.jb;
    int failed = 0;
    pthread_mutex_lock(&gemm_lock);
    a.xp = gemm_buffer(sizeof(uint32_t) * a.mp * a.kp);
    if (!a.xp) {
        failed = 1;
    } else {
        pool_run(hgemm_pack_part, &a);
        pool_run(hgemm_part, &a);
    }
    pthread_mutex_unlock(&gemm_lock);
    return failed ? -1 : 0;
#else
    (void)out, (void)x, (void)w, (void)b, (void)m, (void)n, (void)k;
    return 1;
#endif
}

/* ---- Q8_0 rows: x quantized to 8 bits per 32-value block, integer dot products ----------
 * As llama.cpp's Q8_0 GEMM: each block of 32 values of a row of x becomes 32 int8 q and a
 * scale dx (dx = max |x| / 127, q = x / dx rounded to nearest, ties to even; the scale kept
 * float32, where llama.cpp rounds it to float16), so a block's products with w's int8 sum
 * exactly in int32, scaled once by dx * dw, and the blocks' sums add in float32.
 * (formats.quantize_x8 gives the same q and dx; a block with a value not finite has dx NaN,
 * one whose max |x| is below 2^-100 zeros, as quantize_x16.)
 *
 * AVX-512 VNNI's VPDPBUSD multiplies unsigned bytes by signed ones: x is stored as q + 128
 * (1 .. 255) and each w block's sum times 128 taken off (the sums start at -128 sum(w)). x's
 * panels of 32 rows: per block, 8 groups of 4 values, each group the 32 rows' 4 bytes (two
 * vectors of 16 rows); dx per block the 32 rows' scales. A tile is 6 rows of w by the 32
 * rows: 12 int32 sums of the block, 12 float32 sums over the blocks. */

#define HQ_MR 6

typedef struct {
    const uint8_t *wh; /* rows of rb = k / 32 * 34 bytes */
    const float *x, *b;
    float *out;
    uint8_t *xq; /* (mp / 32, B, 8, 32, 4) */
    float *dx;   /* (mp / 32, B, 32) */
    Py_ssize_t m, n, k, B, mp, rb, jb;
} hq8_args;

/* One row's block b of x: its scale and 32 values rounded (q in -127 .. 127). */
static inline float hq8_block(const float *v, int8_t *q) {
    float amax = 0.0f, zs = 0.0f;
    for (int j = 0; j < 32; j++) {
        const float a = fabsf(v[j]);
        amax = a > amax ? a : amax;
        zs += v[j] * 0.0f; /* NaN where a value is not finite */
    }
    const float d = amax >= 0x1p-100f ? amax / 127.0f : 0.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < 32; j++) {
        const float r = rintf(v[j] * id);
        q[j] = (int8_t)(r > 127.0f ? 127 : r < -127.0f ? -127 : r == r ? r : 0);
    }
    return d + zs;
}

/* x (m, k) as the Q8_0 GEMM meets it, as float32 (the portable path's x); NULL where no
 * memory. The caller frees it. */
static float *hq8_values(const float *x, Py_ssize_t m, Py_ssize_t k) {
    float *r = malloc(sizeof(float) * m * k);
    if (!r)
        return NULL;
    int8_t q[32];
    for (Py_ssize_t i = 0; i < m * (k / 32); i++) {
        const float d = hq8_block(x + 32 * i, q);
        for (int j = 0; j < 32; j++)
            r[32 * i + j] = d * q[j];
    }
    return r;
}

#ifdef HAVE_X86
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void hq8_pack_part(
    const void *args, int part, int parts) {
    const hq8_args *a = args;
    Py_ssize_t i0, i1;
    share(a->mp, HG_PANEL, part, parts, &i0, &i1);
    for (Py_ssize_t i = i0; i < i1; i++) {
        const Py_ssize_t P = i / HG_PANEL, l = i % HG_PANEL;
        for (Py_ssize_t b = 0; b < a->B; b++) {
            int8_t q[32] = {0};
            float d = 0.0f;
            if (i < a->m)
                d = hq8_block(a->x + i * a->k + 32 * b, q);
            a->dx[(P * a->B + b) * HG_PANEL + l] = d;
            uint8_t *g = a->xq + ((P * a->B + b) * 8 * HG_PANEL + l) * 4;
            for (int t = 0; t < 8; t++)
                for (int j = 0; j < 4; j++)
                    g[t * HG_PANEL * 4 + j] = (uint8_t)(q[4 * t + j] + 128);
        }
    }
}

/* MR rows of w from row j against panel q; sw, dw: the block's rows' sums times -128 and
 * scales ((row - jb) * B + b). */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))) static inline
    __attribute__((always_inline)) void hq8_tile(const hq8_args *a, Py_ssize_t j, Py_ssize_t q,
                                                 const int MR, float *blk, const int32_t *sw,
                                                 const float *dw) {
    __m512 c[HQ_MR][2];
    for (int r = 0; r < MR; r++)
        c[r][0] = c[r][1] = _mm512_setzero_ps();
    const uint8_t *w = a->wh + j * a->rb;
    const Py_ssize_t B = a->B, rb = a->rb;
    for (Py_ssize_t b = 0; b < B; b++) {
        const uint8_t *x = a->xq + (q * B + b) * 8 * HG_PANEL * 4;
        __m512i s[HQ_MR][2];
        for (int r = 0; r < MR; r++)
            s[r][0] = s[r][1] = _mm512_set1_epi32(sw[r * B + b]);
        for (int t = 0; t < 8; t++) {
            const __m512i x0 = _mm512_loadu_si512(x + t * 128);
            const __m512i x1 = _mm512_loadu_si512(x + t * 128 + 64);
            for (int r = 0; r < MR; r++) {
                int32_t four;
                memcpy(&four, w + r * rb + b * 34 + 2 + 4 * t, 4);
                const __m512i v = _mm512_set1_epi32(four);
                s[r][0] = _mm512_dpbusd_epi32(s[r][0], x0, v);
                s[r][1] = _mm512_dpbusd_epi32(s[r][1], x1, v);
            }
        }
        const float *d = a->dx + (q * B + b) * HG_PANEL;
        const __m512 d0 = _mm512_loadu_ps(d), d1 = _mm512_loadu_ps(d + 16);
        for (int r = 0; r < MR; r++) {
            const __m512 e = _mm512_set1_ps(dw[r * B + b]);
            c[r][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[r][0]), _mm512_mul_ps(d0, e), c[r][0]);
            c[r][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[r][1]), _mm512_mul_ps(d1, e), c[r][1]);
        }
    }
    for (int r = 0; r < MR; r++) {
        float t[HG_PANEL];
        _mm512_storeu_ps(t, c[r][0]);
        _mm512_storeu_ps(t + 16, c[r][1]);
        for (int i = 0; i < HG_PANEL; i++)
            blk[i * a->jb + r] = t[i];
    }
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))) static void hq8_cols(
    const hq8_args *a, Py_ssize_t j0, Py_ssize_t j1, float *blk, int32_t *sw, float *dw) {
    const Py_ssize_t B = a->B;
    for (Py_ssize_t jb = j0; jb < j1; jb += a->jb) {
        const Py_ssize_t je = jb + a->jb < j1 ? jb + a->jb : j1;
        for (Py_ssize_t r = jb; r < je; r++) /* the block's rows' scales and sums, once */
            for (Py_ssize_t b = 0; b < B; b++) {
                const uint8_t *blkw = a->wh + r * a->rb + b * 34;
                int32_t t = 0;
                for (int l = 0; l < 32; l++)
                    t += (int8_t)blkw[2 + l];
                sw[(r - jb) * B + b] = -128 * t;
                dw[(r - jb) * B + b] = half_to_float(blkw);
            }
        for (Py_ssize_t q = 0; q * HG_PANEL < a->m; q++) {
            Py_ssize_t j = jb;
            for (; j + HQ_MR <= je; j += HQ_MR)
                hq8_tile(a, j, q, HQ_MR, blk + (j - jb), sw + (j - jb) * B, dw + (j - jb) * B);
            float *at = blk + (j - jb);
            const int32_t *s = sw + (j - jb) * B;
            const float *d = dw + (j - jb) * B;
            switch (je - j) {
            case 0: break;
            case 1: hq8_tile(a, j, q, 1, at, s, d); break;
            case 2: hq8_tile(a, j, q, 2, at, s, d); break;
            case 3: hq8_tile(a, j, q, 3, at, s, d); break;
            case 4: hq8_tile(a, j, q, 4, at, s, d); break;
            default: hq8_tile(a, j, q, 5, at, s, d); break;
            }
            hg_block_out(a->out, a->b, a->m, a->n, a->jb, q, jb, je, blk);
        }
    }
}

static void hq8_part(const void *args, int part, int parts) {
    const hq8_args *a = args;
    Py_ssize_t j0, j1;
    share(a->n, HQ_MR, part, parts, &j0, &j1);
    if (j0 >= j1)
        return;
    float blk[HG_PANEL * 96];
    int32_t *sw = malloc(sizeof(int32_t) * a->jb * a->B);
    float *dw = malloc(sizeof(float) * a->jb * a->B);
    if (sw && dw) {
        hq8_cols(a, j0, j1, blk, sw, dw);
    } else { /* no memory for a block's scales: NaN, never a wrong number */
        for (Py_ssize_t i = 0; i < a->m; i++)
            for (Py_ssize_t j = j0; j < j1; j++)
                a->out[i * a->n + j] = NAN;
    }
    free(sw);
    free(dw);
}

static int hq8_offered = -1; /* AVX-512 VNNI (and BW), first asked */
#endif

/* out (m, n) = x8(x) @ w.T (+ b) on Q8_0 rows w, on the pool, with the GIL released: 0 done,
 * -1 where x's panels find no memory, 1 where this CPU has no AVX-512 VNNI kernel (or the
 * float32 kernels were told to run on less, or the portable tile kernel was chosen: the
 * caller runs the portable path on hq8_values' x). */
static int hq8_run(float *out, const float *x, const void *w, const float *b, Py_ssize_t m,
                   Py_ssize_t n, Py_ssize_t k) {
#ifdef HAVE_X86
    if (hq8_offered < 0)
        hq8_offered = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw");
    if (!hq8_offered || simd != SIMD_AVX512 || tiles_running() == TILES_PORTABLE)
        return 1;
    hq8_args a = {.wh = w, .x = x, .b = b, .out = out, .m = m, .n = n, .k = k, .B = k / 32,
                  .mp = (m + HG_PANEL - 1) / HG_PANEL * HG_PANEL, .rb = k / 32 * 34};
    a.jb = 393216 / a.rb / HQ_MR * HQ_MR;
    a.jb = a.jb < HQ_MR ? HQ_MR : a.jb > 96 ? 96 : a.jb;
    int failed = 0;
    pthread_mutex_lock(&gemm_lock);
    /* one buffer: the panels' bytes, then their scales */
    const Py_ssize_t qbytes = a.mp * k, dbytes = sizeof(float) * a.mp * a.B;
    uint8_t *buf = gemm_buffer(qbytes + dbytes);
    if (!buf) {
        failed = 1;
    } else {
        a.xq = buf;
        a.dx = (float *)(buf + qbytes);
        pool_run(hq8_pack_part, &a);
        pool_run(hq8_part, &a);
    }
    pthread_mutex_unlock(&gemm_lock);
    return failed ? -1 : 0;
#else
    (void)out, (void)x, (void)w, (void)b, (void)m, (void)n, (void)k;
    return 1;
#endif
}
