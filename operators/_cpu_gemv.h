/* The GEMV kernels' one body, included by _cpu.c once per instruction set.
 *
 * The includer defines SUFFIX (the functions' name suffix) and W (float32 lanes a vector
 * holds: 4, 8 or 16) and opens a target region (``#pragma GCC target``), so this one body
 * is compiled for SSE2 (every x86-64; any other CPU's own vectors), AVX2+FMA and AVX-512,
 * and each instance is chosen at run time (cpuid: _cpu.c's PyInit). Written in GCC's vector
 * extensions rather than one set of intrinsics: the same source, so a path tested on one
 * CPU is the same arithmetic as the path another CPU runs, only wider.
 *
 * Each row's sum runs in W lanes (two sets: a 32-column chunk's first and second halves)
 * over the row in order, then the lanes are added in order, then the columns past whole
 * chunks: a row's result depends on W alone, never on which thread or which rows beside
 * it. The reduced weights' layouts (row groups) are operators/formats.py's.
 */

#define GEMV_CAT_(a, b) a##b
#define GEMV_CAT(a, b) GEMV_CAT_(a, b)
#define GEMV_FN(name) GEMV_CAT(name, SUFFIX)

/* fv, uv and xload: _cpu_vec.h's. */
#define FV GEMV_FN(fv)

/* A part's weight stream is asked for gemv_ahead[form] bytes ahead of its loads (_cpu.c's
 * reasons), one prefetch a cache line (bfloat16's into gemv_level's cache, the others' into
 * L1); past the stream's end harmless (never a fault). */
#define GEMV_AHEAD(p, form)                                                                  \
    do {                                                                                     \
        if (gemv_ahead[form]) {                                                              \
            if ((form) == AHEAD_BF16)                                                        \
                gemv_prefetch((const char *)(p) + gemv_ahead[form]);                         \
            else                                                                             \
                __builtin_prefetch((const char *)(p) + gemv_ahead[form], 0, 3);              \
        }                                                                                    \
    } while (0)

/* c + a * b, fused where the instruction set has it: written out, so that the float32 and
 * bfloat16 kernels' sums round alike wherever the compiler would contract one but not the
 * other (their results are equal bit for bit). */
static inline __attribute__((always_inline)) FV GEMV_FN(madd)(FV a, FV b, FV c) {
#if W == 16
    return (FV)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif W == 8
    return (FV)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
    return c + a * b;
#endif
}

static inline __attribute__((always_inline)) float GEMV_FN(hsum)(FV v) {
    float s = v[0];
    for (int i = 1; i < W; i++)
        s += v[i];
    return s;
}

/* _cpu_held.h's (included after this body): a held weight's rows, and its rows widened. */
static void GEMV_FN(held_rows)(const gemv_args *a, Py_ssize_t r0, Py_ssize_t r1);
static void GEMV_FN(held_widen_rows)(int form, const uint8_t *wh, Py_ssize_t rb, Py_ssize_t r0,
                                     Py_ssize_t r1, Py_ssize_t k, float *out);

/* float32 rows [r0, r1), row-major, in groups of up to GEMV_GROUP rows: the same sums in
 * the same order as a bfloat16 group's (bf16_group), so bfloat16 weights that hold a
 * float32 weight exactly give its results bit for bit. */
static inline __attribute__((always_inline)) void GEMV_FN(f32_group)(const gemv_args *a,
                                                                    Py_ssize_t r, const int R) {
    const Py_ssize_t K = a->k, C = K / 32, T = K % 32;
    const float *X = a->x;
    FV lo[GEMV_GROUP], hi[GEMV_GROUP];
    for (int i = 0; i < R; i++)
        lo[i] = hi[i] = (FV){0};
    for (Py_ssize_t c = 0; c < C; c++) {
        const float *x = X + c * 32;
        for (int i = 0; i < R; i++) {  /* a chunk's row is 128 bytes: two lines */
            const float *w = a->w + (r + i) * K + c * 32;
            GEMV_AHEAD(w, AHEAD_F32);
            GEMV_AHEAD(w + 16, AHEAD_F32);
        }
        for (int j = 0; j < 16; j += W) {
            FV x0 = GEMV_FN(xload)(x + j), x1 = GEMV_FN(xload)(x + 16 + j);
            for (int i = 0; i < R; i++) {
                const float *w = a->w + (r + i) * K + c * 32;
                lo[i] = GEMV_FN(madd)(GEMV_FN(xload)(w + j), x0, lo[i]);
                hi[i] = GEMV_FN(madd)(GEMV_FN(xload)(w + 16 + j), x1, hi[i]);
            }
        }
    }
    for (int i = 0; i < R; i++) {
        const float *w = a->w + (r + i) * K + C * 32;
        float t = GEMV_FN(hsum)(lo[i] + hi[i]);
        for (Py_ssize_t c = 0; c < T; c++)
            t = fmaf(w[c], X[C * 32 + c], t);
        a->y[r + i] = a->b ? t + a->b[r + i] : t;
    }
}

/* The decode forms (operators/formats.py) keep a group of GEMV_GROUP rows' weights one
 * after another, so a part reads one sequential stream, and a group's rows' sums run side by
 * side (independent chains, each x vector loaded once for them). R: the group's rows,
 * GEMV_GROUP but in a last group of the rest. */

/* A bfloat16 group: per whole 32-column chunk, R rows of 16 pairs, pair j of a row its
 * columns j (low half) and 16 + j (high half); then each row's K % 32 last columns in
 * order. A pair is one 32-bit lane: the low half shifted up is column j as float32, the
 * high half masked is column 16 + j (widening is exact), so W pairs are W values of each
 * half with no shuffle. */
static inline __attribute__((always_inline)) void GEMV_FN(bf16_group)(const gemv_args *a,
                                                                     Py_ssize_t r, const int R) {
    const Py_ssize_t K = a->k, C = K / 32, T = K % 32;
    const uint16_t *g = a->w16 + r * K;
    const float *X = a->x;
    FV lo[GEMV_GROUP], hi[GEMV_GROUP];
    for (int i = 0; i < R; i++)
        lo[i] = hi[i] = (FV){0};
    for (Py_ssize_t c = 0; c < C; c++) {
        const uint16_t *p = g + c * R * 32;
        const float *x = X + c * 32;
        for (int i = 0; i < R; i++)  /* a chunk's row is 64 bytes: one line */
            GEMV_AHEAD(p + i * 32, AHEAD_BF16);
        for (int j = 0; j < 16; j += W) {
            FV x0 = GEMV_FN(xload)(x + j), x1 = GEMV_FN(xload)(x + 16 + j);
            for (int i = 0; i < R; i++) {
                GEMV_FN(uv) v;
                memcpy(&v, p + i * 32 + 2 * j, sizeof v);
                lo[i] = GEMV_FN(madd)((FV)(v << 16), x0, lo[i]);
                hi[i] = GEMV_FN(madd)((FV)(v & 0xffff0000u), x1, hi[i]);
            }
        }
    }
    const uint16_t *tail = g + C * R * 32;
    for (int i = 0; i < R; i++) {
        float t = GEMV_FN(hsum)(lo[i] + hi[i]);
        for (Py_ssize_t c = 0; c < T; c++)  /* fused in both kernels: the same roundings */
            t = fmaf(bf16_to_float(tail[i * T + c]), X[C * 32 + c], t);
        a->y[r + i] = a->b ? t + a->b[r + i] : t;
    }
}

static inline __attribute__((always_inline)) FV GEMV_FN(splat)(float f) {
    FV v = {0};
    return v + f;
}

/* Lane by lane max (neither NaN: formats.quantize_x16 makes a block with a NaN NaN by its
 * dx alone). */
static inline __attribute__((always_inline)) FV GEMV_FN(vmax)(FV a, FV b) {
#if W == 16
    return (FV)_mm512_max_ps((__m512)a, (__m512)b);
#elif W == 8
    return (FV)_mm256_max_ps((__m256)a, (__m256)b);
#elif defined(HAVE_X86)
    return (FV)_mm_max_ps((__m128)a, (__m128)b);
#else
    FV m;
    for (int l = 0; l < W; l++)
        m[l] = a[l] > b[l] ? a[l] : b[l];
    return m;
#endif
}

/* W float32 (integers within int16's range) rounded to nearest, ties to even (numpy's
 * rint; the default rounding mode), stored as int16. */
static inline __attribute__((always_inline)) void GEMV_FN(round16)(FV v, int16_t *q) {
#if W == 16
    _mm256_storeu_si256((__m256i *)q, _mm512_cvtepi32_epi16(_mm512_cvtps_epi32((__m512)v)));
#elif W == 8
    __m256i i = _mm256_cvtps_epi32((__m256)v);
    _mm_storeu_si128((__m128i *)q, _mm_packs_epi32(_mm256_castsi256_si128(i),
                                                   _mm256_extracti128_si256(i, 1)));
#elif defined(HAVE_X86)
    __m128i i = _mm_cvtps_epi32((__m128)v);
    _mm_storel_epi64((__m128i *)q, _mm_packs_epi32(i, i));
#else
    for (int l = 0; l < W; l++)
        q[l] = (int16_t)nearbyintf(v[l]);
#endif
}

/* x as the Q8_0 GEMV meets it (formats.quantize_x16, by the same float32 operations): per
 * 32-value block its scale dx (NaN where a value is not finite) and 32 int16 values. */
static void GEMV_FN(quantize_x)(const float *x, Py_ssize_t K, int16_t *q, float *dx) {
    const GEMV_FN(uv) magnitude = {0};
    for (Py_ssize_t b = 0; b < K / Q8_BLOCK; b++) {
        const float *v = x + b * Q8_BLOCK;
        FV m = {0}, z = {0};
        for (int j = 0; j < Q8_BLOCK; j += W) {
            FV u = GEMV_FN(xload)(v + j);
            m = GEMV_FN(vmax)(m, (FV)((GEMV_FN(uv))u & (magnitude + 0x7fffffffu)));
            z += u * 0.0f;
        }
        float amax = m[0], zs = z[0];
        for (int l = 1; l < W; l++) {
            amax = m[l] > amax ? m[l] : amax;
            zs += z[l];
        }
        const float d = amax >= 0x1p-100f ? amax / 32767.0f : 0.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        dx[b] = d + zs;
        for (int j = 0; j < Q8_BLOCK; j += W)
            GEMV_FN(round16)(GEMV_FN(xload)(v + j) * id, q + b * Q8_BLOCK + j);
    }
}

/* One Q8_0 block's 32 int8 values against x's 32 int16 (quantize_x), in int32 lanes whose
 * sum is the block's dot product, exactly (at most 32 * 127 * 32767 < 2^31). */
#if W == 16
typedef __m512i GEMV_FN(iv);
#elif W == 8
typedef __m256i GEMV_FN(iv);
#else
typedef int32_t GEMV_FN(iv);
#endif
static inline __attribute__((always_inline)) GEMV_FN(iv) GEMV_FN(q8dot)(const uint8_t *q,
                                                                       const int16_t *x) {
#if W == 16
    return _mm512_madd_epi16(_mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)q)),
                             _mm512_loadu_si512((const void *)x));
#elif W == 8
    __m256i lo = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)q)),
                                   _mm256_loadu_si256((const __m256i *)x));
    __m256i hi = _mm256_madd_epi16(
        _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(q + 16))),
        _mm256_loadu_si256((const __m256i *)(x + 16)));
    return _mm256_add_epi32(lo, hi);
#else
    int32_t s = 0;
    for (int j = 0; j < Q8_BLOCK; j++)
        s += (int32_t)(int8_t)q[j] * x[j];
    return s;
#endif
}

/* Four rows' block sums (q8dot's lanes) added up, one row a lane: exact integers. */
static inline __attribute__((always_inline)) i4v GEMV_FN(sum4)(GEMV_FN(iv) m0, GEMV_FN(iv) m1,
                                                              GEMV_FN(iv) m2, GEMV_FN(iv) m3) {
#if W == 16 || W == 8
#if W == 16
    __m256i n0 = _mm256_add_epi32(_mm512_castsi512_si256(m0), _mm512_extracti64x4_epi64(m0, 1));
    __m256i n1 = _mm256_add_epi32(_mm512_castsi512_si256(m1), _mm512_extracti64x4_epi64(m1, 1));
    __m256i n2 = _mm256_add_epi32(_mm512_castsi512_si256(m2), _mm512_extracti64x4_epi64(m2, 1));
    __m256i n3 = _mm256_add_epi32(_mm512_castsi512_si256(m3), _mm512_extracti64x4_epi64(m3, 1));
#else
    __m256i n0 = m0, n1 = m1, n2 = m2, n3 = m3;
#endif
    /* [row i's lanes 0-3, 4-7] per 128-bit half after two horizontal adds */
    __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(n0, n1), _mm256_hadd_epi32(n2, n3));
    return (i4v)_mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
#else
    i4v v = {m0, m1, m2, m3};
    return v;
#endif
}

/* s + m * d (four lanes), fused where the instruction set has it. */
static inline __attribute__((always_inline)) f4v GEMV_FN(madd4)(f4v m, f4v d, f4v s) {
#if W == 16 || W == 8
    return (f4v)_mm_fmadd_ps((__m128)m, (__m128)d, (__m128)s);
#else
    return s + m * d;
#endif
}

/* A block's R float16 scales as float32: one F16C conversion of the four where the group is
 * whole (the same values as halves4 for every finite scale, which quantizing gives), else
 * halves4 (lanes past R zero). */
static inline __attribute__((always_inline)) f4v GEMV_FN(scales4)(const uint8_t *p, const int R) {
#if W == 16 || W == 8
    if (R == 4)
        return (f4v)_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)p));
#endif
    return halves4(p, R);
}

/* A Q8_0 group: per 32-weight block, the R rows' float16 scales d, then their R x 32 int8
 * values q. Each row's block is one exact integer, sum q * xq, then times d * dx into its
 * row's lane: one rounding of the integer, one of d * dx, one fused multiply-add. */
static inline __attribute__((always_inline)) void GEMV_FN(q8_group)(const gemv_args *a,
                                                                   Py_ssize_t r, const int R,
                                                                   const int16_t *XQ,
                                                                   const float *DX) {
    const Py_ssize_t B = a->k / Q8_BLOCK;
    const uint8_t *g = a->wq + r * B * Q8_BYTES;
    f4v s = {0, 0, 0, 0};
    for (Py_ssize_t b = 0; b < B; b++) {
        const uint8_t *p = g + b * R * Q8_BYTES, *q = p + 2 * R;
        /* a block of R rows is R * 34 bytes: one line each, first to last */
        for (int l = 0; l < R * Q8_BYTES; l += 64)
            GEMV_AHEAD(p + l, AHEAD_Q8);
        GEMV_AHEAD(p + R * Q8_BYTES - 1, AHEAD_Q8);
        const int16_t *xq = XQ + b * Q8_BLOCK;
        GEMV_FN(iv) m[GEMV_GROUP];
        for (int i = 0; i < GEMV_GROUP; i++)  /* rows past R: row 0 again, scaled by 0 */
            m[i] = GEMV_FN(q8dot)(q + (i < R ? i : 0) * Q8_BLOCK, xq);
        f4v d = GEMV_FN(scales4)(p, R) * DX[b];
        s = GEMV_FN(madd4)(__builtin_convertvector(GEMV_FN(sum4)(m[0], m[1], m[2], m[3]), f4v), d,
                           s);
    }
    for (int i = 0; i < R; i++)
        a->y[r + i] = a->b ? s[i] + a->b[r + i] : s[i];
}

/* Q8_0 rows [r0, r1) (see gemv_rows): x quantized once per part (each part the whole of
 * it: no part waits for another), then the groups. */
static void GEMV_FN(q8_rows)(const gemv_args *a, Py_ssize_t r0, Py_ssize_t r1) {
    const Py_ssize_t K = a->k;
    int16_t qs[X16_STACK];
    float ds[X16_STACK / Q8_BLOCK];
    int16_t *xq = K <= X16_STACK ? qs : malloc(sizeof(int16_t) * K);
    float *dx = K <= X16_STACK ? ds : malloc(sizeof(float) * (K / Q8_BLOCK));
    if (!xq || !dx) {  /* no memory for a long row's x: NaN, never a wrong number */
        for (Py_ssize_t r = r0; r < r1; r++)
            a->y[r] = NAN;
    } else {
        GEMV_FN(quantize_x)(a->x, K, xq, dx);
        Py_ssize_t r = r0;
        for (; r + GEMV_GROUP <= r1; r += GEMV_GROUP)
            GEMV_FN(q8_group)(a, r, GEMV_GROUP, xq, dx);
        if (r < r1)
            GEMV_FN(q8_group)(a, r, (int)(r1 - r), xq, dx);
    }
    if (xq != qs)
        free(xq);
    if (dx != ds)
        free(dx);
}

/* ---- GEMM: out (m, n) = x (m, k) w (n, k)^T (+ b), a prompt chunk's projection ----------
 * On xt, x in panels of 2W rows (padded with zeros), each panel transposed, (k, 2W), and
 * the panels one after another: a panel's 2W values at one p are two vector loads, and a
 * tile reads its panel in order. Each output element is one sum over p in order. */

/* Rows of w a GEMM tile holds: MR x 2 accumulators, two x vectors and a broadcast in
 * registers. AVX-512 has 32 vector registers: 12 rows (24 accumulators) read each x
 * vector for twice the FMAs of 6 (2 threads, SmolLM2's chunk shapes: 165-233 -> 238-310
 * GF/s); AVX2's and SSE2's 16 registers hold 6. A sum's order is the same at any MR. */
#if W == 16
#define GEMM_MR 12
#else
#define GEMM_MR 6
#endif

/* Output columns a block of w's rows spans (measured best at each MR: kept in L2). */
#define GEMM_JB (W == 16 ? 48 : 96)

/* MR rows of w (float32, k apart, from w) against the panel of xt at row i0: an MR x 2W
 * tile of out, its sums held in registers over the whole of k, stored into blk (2W rows of
 * GEMM_JB floats, the block's columns from jb) for gemm_cols to copy out. */
static inline __attribute__((always_inline)) void GEMV_FN(tile)(const gemm_args *a, const float *w,
                                                               Py_ssize_t i0, const int MR,
                                                               float *blk) {
    const Py_ssize_t K = a->k;
    const float *xt = a->xt + i0 * K;  /* this panel's (k, 2W) */
    FV c[GEMM_MR][2];
    for (int r = 0; r < MR; r++)
        c[r][0] = c[r][1] = (FV){0};
    for (Py_ssize_t p = 0; p < K; p++) {
        FV x0 = GEMV_FN(xload)(xt + p * 2 * W), x1 = GEMV_FN(xload)(xt + p * 2 * W + W);
        for (int r = 0; r < MR; r++) {
            float wr = w[r * K + p];
            c[r][0] += x0 * wr;
            c[r][1] += x1 * wr;
        }
    }
    for (int r = 0; r < MR; r++)
        for (int i = 0; i < 2 * W; i++)
            blk[i * GEMM_JB + r] = i < W ? c[r][0][i] : c[r][1][i - W];
}

/* The block's tiles from blk into out's rows i0 .. (columns jb .. je), bias added: each
 * out row's run written once, whole. Why not from the tiles straight into out: a tile's
 * 2W rows lie N floats apart, and where N is a multiple of 1024 (4 KB pages' worth of
 * floats: SmolLM2's 3072-wide gate+up, Gemma 3's 4096) they all fall in one set of L1,
 * whose ways cannot hold them, so every tile of the block fetched the rows again: n 3072
 * ran at 77 GF/s against 160 at n 3088 (one thread, k 576, 512 rows). */
static inline void GEMV_FN(block_out)(const gemm_args *a, Py_ssize_t jb, Py_ssize_t je,
                                      Py_ssize_t i0, const float *blk) {
    const Py_ssize_t rows = a->m - i0 < 2 * W ? a->m - i0 : 2 * W, N = a->n, nc = je - jb;
    for (Py_ssize_t i = 0; i < rows; i++) {
        float *out = a->out + (i0 + i) * N + jb;
        const float *from = blk + i * GEMM_JB;
        if (a->b)
            for (Py_ssize_t c = 0; c < nc; c++)
                out[c] = from[c] + a->b[jb + c];
        else
            memcpy(out, from, sizeof(float) * nc);
    }
}

/* Output columns [j0, j1) over every row: JB rows of w at a time (kept in L2) against
 * every panel of x (each read from L2 by the block's tiles in turn). A held weight's block
 * of rows is widened into wbuf (GEMM_JB rows of k floats) first, once for every panel: a
 * prompt chunk's 2W-row panels share it, so widening costs 1 / (m / 2W) of the products. */
static void GEMV_FN(gemm_cols)(const gemm_args *a, Py_ssize_t j0, Py_ssize_t j1, float *wbuf) {
    float blk[2 * W * GEMM_JB];  /* 12 KB on AVX-512: L1 */
    const Py_ssize_t K = a->k;
    for (Py_ssize_t jb = j0; jb < j1; jb += GEMM_JB) {
        const Py_ssize_t je = jb + GEMM_JB < j1 ? jb + GEMM_JB : j1;
        const float *wb = a->w + jb * K;
        if (a->held) {
            GEMV_FN(held_widen_rows)(a->form, a->wh, a->rb, jb, je, K, wbuf);
            wb = wbuf;
        }
        for (Py_ssize_t i0 = 0; i0 < a->m; i0 += 2 * W) {
            Py_ssize_t j = jb;
            for (; j + GEMM_MR <= je; j += GEMM_MR)
                GEMV_FN(tile)(a, wb + (j - jb) * K, i0, GEMM_MR, blk + (j - jb));
            float *at = blk + (j - jb);
            const float *w = wb + (j - jb) * K;
            switch (je - j) {  /* the last (je - jb) % MR columns as one tile */
            case 0: break;
            case 1: GEMV_FN(tile)(a, w, i0, 1, at); break;
            case 2: GEMV_FN(tile)(a, w, i0, 2, at); break;
            case 3: GEMV_FN(tile)(a, w, i0, 3, at); break;
            case 4: GEMV_FN(tile)(a, w, i0, 4, at); break;
            case 5: GEMV_FN(tile)(a, w, i0, 5, at); break;
#if GEMM_MR > 6
            case 6: GEMV_FN(tile)(a, w, i0, 6, at); break;
            case 7: GEMV_FN(tile)(a, w, i0, 7, at); break;
            case 8: GEMV_FN(tile)(a, w, i0, 8, at); break;
            case 9: GEMV_FN(tile)(a, w, i0, 9, at); break;
            case 10: GEMV_FN(tile)(a, w, i0, 10, at); break;
            default: GEMV_FN(tile)(a, w, i0, 11, at); break;
#else
            default: break;
#endif
            }
            GEMV_FN(block_out)(a, jb, je, i0, blk);
        }
    }
}

/* ---- several x rows against each weight row (a batched decode step's) -------------------
 * Each (weight row, x row) pair's sum runs in the lanes, order and roundings of the one-row
 * kernels above (f32_group's, bf16_group's), so every result is the one-row GEMV's bit for
 * bit; the weight row is loaded once for up to GEMV_MB rows of x, whose 2 x M sums run as
 * independent chains. x rows lie xs floats apart, y rows ys. */
#define GEMV_MB (W == 16 ? 8 : 4)

/* hsum(lo[m] + hi[m]) of each of M sums into s[m], the same adds in the same order, but
 * lane by lane across the M sums (M independent chains: the M one after another waited on
 * each chain's 15 dependent adds, ~350 cycles a weight row at M = 8, more than its FMAs). */
static inline __attribute__((always_inline)) void GEMV_FN(hsums)(const FV *lo, const FV *hi,
                                                                const int M, float *s) {
    float lanes[8][W];
    for (int m = 0; m < M; m++) {
        FV v = lo[m] + hi[m];
        memcpy(lanes[m], &v, sizeof v);
    }
    for (int m = 0; m < M; m++)
        s[m] = lanes[m][0];
    for (int i = 1; i < W; i++)
        for (int m = 0; m < M; m++)
            s[m] += lanes[m][i];
}

static inline __attribute__((always_inline)) void GEMV_FN(f32_multi)(
        const gemv_args *a, Py_ssize_t r, const float *X, Py_ssize_t xs, float *Y,
        Py_ssize_t ys, const int M) {
    const Py_ssize_t K = a->k, C = K / 32, T = K % 32;
    const float *w = a->w + r * K;
    FV lo[GEMV_MB], hi[GEMV_MB];
    for (int m = 0; m < M; m++)
        lo[m] = hi[m] = (FV){0};
    for (Py_ssize_t c = 0; c < C; c++) {
        const float *wc = w + c * 32;
        GEMV_AHEAD(wc, AHEAD_F32);
        GEMV_AHEAD(wc + 16, AHEAD_F32);
        for (int j = 0; j < 16; j += W) {
            FV w0 = GEMV_FN(xload)(wc + j), w1 = GEMV_FN(xload)(wc + 16 + j);
            for (int m = 0; m < M; m++) {
                const float *x = X + m * xs + c * 32;
                lo[m] = GEMV_FN(madd)(w0, GEMV_FN(xload)(x + j), lo[m]);
                hi[m] = GEMV_FN(madd)(w1, GEMV_FN(xload)(x + 16 + j), hi[m]);
            }
        }
    }
    float sums[8];
    GEMV_FN(hsums)(lo, hi, M, sums);
    for (int m = 0; m < M; m++) {
        const float *x = X + m * xs;
        float t = sums[m];
        for (Py_ssize_t c = 0; c < T; c++)
            t = fmaf(w[C * 32 + c], x[C * 32 + c], t);
        Y[m * ys + r] = a->b ? t + a->b[r] : t;
    }
}

/* Row i of the bfloat16 group at row g (R rows: its chunks R * 32 values apart, its tail
 * after the group's chunks), as bf16_group computes it. */
static inline __attribute__((always_inline)) void GEMV_FN(bf16_multi)(
        const gemv_args *a, Py_ssize_t g, const int R, int i, const float *X, Py_ssize_t xs,
        float *Y, Py_ssize_t ys, const int M) {
    const Py_ssize_t K = a->k, C = K / 32, T = K % 32;
    const uint16_t *base = a->w16 + g * K;
    FV lo[GEMV_MB], hi[GEMV_MB];
    for (int m = 0; m < M; m++)
        lo[m] = hi[m] = (FV){0};
    for (Py_ssize_t c = 0; c < C; c++) {
        const uint16_t *p = base + c * R * 32 + i * 32;
        GEMV_AHEAD(p, AHEAD_BF16);
        for (int j = 0; j < 16; j += W) {
            GEMV_FN(uv) v;
            memcpy(&v, p + 2 * j, sizeof v);
            FV w0 = (FV)(v << 16), w1 = (FV)(v & 0xffff0000u);
            for (int m = 0; m < M; m++) {
                const float *x = X + m * xs + c * 32;
                lo[m] = GEMV_FN(madd)(w0, GEMV_FN(xload)(x + j), lo[m]);
                hi[m] = GEMV_FN(madd)(w1, GEMV_FN(xload)(x + 16 + j), hi[m]);
            }
        }
    }
    const uint16_t *tail = base + C * R * 32 + i * T;
    float sums[8];
    GEMV_FN(hsums)(lo, hi, M, sums);
    for (int m = 0; m < M; m++) {
        const float *x = X + m * xs;
        float t = sums[m];
        for (Py_ssize_t c = 0; c < T; c++)
            t = fmaf(bf16_to_float(tail[c]), x[C * 32 + c], t);
        Y[m * ys + g + i] = a->b ? t + a->b[g + i] : t;
    }
}

#define GEMV_MULTI(fn, M, ...)                                                              \
    switch (M) {                                                                            \
    case 1: fn(__VA_ARGS__, 1); break;                                                      \
    case 2: fn(__VA_ARGS__, 2); break;                                                      \
    case 3: fn(__VA_ARGS__, 3); break;                                                      \
    case 4: fn(__VA_ARGS__, 4); break;                                                      \
    case 5: fn(__VA_ARGS__, GEMV_MB >= 5 ? 5 : 1); break;                                   \
    case 6: fn(__VA_ARGS__, GEMV_MB >= 6 ? 6 : 1); break;                                   \
    case 7: fn(__VA_ARGS__, GEMV_MB >= 7 ? 7 : 1); break;                                   \
    default: fn(__VA_ARGS__, GEMV_MB >= 8 ? 8 : 1); break;                                  \
    }

/* Rows [r0, r1) (whole groups, as gemv_rows takes them) against m rows of x; 0 where the
 * weights' form has no such kernel (Q8_0: gemv_batch_part reads it a block at a time). */
static int GEMV_FN(gemv_rows_multi)(const gemv_args *a, Py_ssize_t r0, Py_ssize_t r1,
                                    Py_ssize_t m, Py_ssize_t xs, Py_ssize_t ys) {
    if (a->wq || a->held)  /* Q8_0 row groups, held forms: gemv_batch_part's blocks */
        return 0;
    for (Py_ssize_t j = 0; j < m; j += GEMV_MB) {
        const int M = (int)(m - j < GEMV_MB ? m - j : GEMV_MB);
        const float *X = a->x + j * xs;
        float *Y = a->y + j * ys;
        if (!a->w16) {
            for (Py_ssize_t r = r0; r < r1; r++)
                GEMV_MULTI(GEMV_FN(f32_multi), M, a, r, X, xs, Y, ys)
            continue;
        }
        for (Py_ssize_t g = r0; g < r1; g += GEMV_GROUP) {
            const int R = (int)(a->n - g < GEMV_GROUP ? a->n - g : GEMV_GROUP);
            for (int i = 0; i < R; i++) {
                if (R == GEMV_GROUP)
                    GEMV_MULTI(GEMV_FN(bf16_multi), M, a, g, GEMV_GROUP, i, X, xs, Y, ys)
                else
                    GEMV_MULTI(GEMV_FN(bf16_multi), M, a, g, R, i, X, xs, Y, ys)
            }
        }
    }
    return 1;
}
#undef GEMV_MULTI
#undef GEMV_MB

/* Rows [r0, r1): r0 a multiple of GEMV_GROUP, r1 too or the last row (gemv_part). */
static void GEMV_FN(gemv_rows)(const gemv_args *a, Py_ssize_t r0, Py_ssize_t r1) {
    if (a->held) {
        GEMV_FN(held_rows)(a, r0, r1);
        return;
    }
    if (a->wq) {
        GEMV_FN(q8_rows)(a, r0, r1);
        return;
    }

    if (!a->w16) {
        /* float32 rows are row-major: a group reads its rows side by side, one stream each.
         * Rows shorter than 1024 values (4 KB) end before the prefetcher has followed four
         * streams far; one row at a time reads the part as one stream instead. Measured
         * cold, paired (SmolLM2's 576-wide rows 1.11-1.19x; 1536-wide 0.89x, so those stay
         * grouped). A row's sums are the same either way. */
        Py_ssize_t r = r0;
        if (a->k < 1024)  /* R a constant in each call: the group's loops unrolled */
            for (; r < r1; r++)
                GEMV_FN(f32_group)(a, r, 1);
        for (; r + GEMV_GROUP <= r1; r += GEMV_GROUP)
            GEMV_FN(f32_group)(a, r, GEMV_GROUP);
        if (r < r1)  /* the last group, of fewer rows */
            GEMV_FN(f32_group)(a, r, (int)(r1 - r));
        return;
    }
    Py_ssize_t r = r0;
    for (; r + GEMV_GROUP <= r1; r += GEMV_GROUP)
        GEMV_FN(bf16_group)(a, r, GEMV_GROUP);
    if (r < r1)  /* the last group, of fewer rows */
        GEMV_FN(bf16_group)(a, r, (int)(r1 - r));
}

#undef FV
#undef GEMM_MR
#undef GEMM_JB
#undef GEMV_FN
#undef GEMV_CAT
#undef GEMV_CAT_
