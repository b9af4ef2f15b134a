/* The GEMV kernels' one body, included by _cpu.c once per instruction set.
 *
 * The includer defines SUFFIX (the functions' name suffix) and W (float32 lanes a vector
 * holds: 4, 8 or 16) and opens a target region (``#pragma GCC target``), so this one body
 * is compiled for SSE2 (every x86-64; any other CPU's own vectors), AVX2+FMA and AVX-512,
 * and each instance is chosen at run time (cpuid: _cpu.c's PyInit). Written in GCC's vector
 * extensions rather than one set of intrinsics: the same source, so a path tested on one
 * CPU is the same arithmetic as the path another CPU runs, only wider.
 *
 * Each row's sum runs in W lanes over the row in order, then the lanes are added in order:
 * a row's result depends on W alone, never on which thread or which rows beside it.
 */

#define GEMV_CAT_(a, b) a##b
#define GEMV_CAT(a, b) GEMV_CAT_(a, b)
#define GEMV_FN(name) GEMV_CAT(name, SUFFIX)

typedef float GEMV_FN(fv) __attribute__((vector_size(4 * W)));
typedef uint32_t GEMV_FN(uv) __attribute__((vector_size(4 * W)));

#define FV GEMV_FN(fv)

static inline __attribute__((always_inline)) FV GEMV_FN(xload)(const float *p) {
    FV v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* W weights from element i on as float32: float32 as they are; bfloat16 widened (its bits
 * are a float32's upper half, exactly). The widenings are intrinsics where there are some:
 * GCC 12 turns __builtin_convertvector of bytes into one insert per lane. */
static inline __attribute__((always_inline)) FV GEMV_FN(wload)(const gemv_args *a,
                                                              Py_ssize_t i, const int kind) {
    if (kind == WEIGHTS_BF16) {
        const uint16_t *p = a->w16 + i;
#if W == 16
        return (FV)_mm512_slli_epi32(_mm512_cvtepu16_epi32(
            _mm256_loadu_si256((const __m256i *)p)), 16);
#elif W == 8
        return (FV)_mm256_slli_epi32(_mm256_cvtepu16_epi32(
            _mm_loadu_si128((const __m128i *)p)), 16);
#else
        GEMV_FN(uv) u = {(uint32_t)p[0] << 16, (uint32_t)p[1] << 16, (uint32_t)p[2] << 16,
                         (uint32_t)p[3] << 16};
        return (FV)u;
#endif
    }
    return GEMV_FN(xload)(a->w + i);
}

/* W int8 values as float32 (exact). */
static inline __attribute__((always_inline)) FV GEMV_FN(qload)(const uint8_t *p) {
#if W == 16
    return (FV)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
#elif W == 8
    return (FV)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
#else
    const int8_t *q = (const int8_t *)p;
    FV v = {(float)q[0], (float)q[1], (float)q[2], (float)q[3]};
    return v;
#endif
}

static inline __attribute__((always_inline)) float GEMV_FN(hsum)(FV v) {
    float s = v[0];
    for (int i = 1; i < W; i++)
        s += v[i];
    return s;
}

/* float32 or bfloat16 rows [r0, r1): four at a time, each x vector loaded once for them. */
static inline __attribute__((always_inline)) void GEMV_FN(dense)(const gemv_args *a,
                                                                Py_ssize_t r0, Py_ssize_t r1,
                                                                const int kind) {
    const float *X = a->x;
    const Py_ssize_t K = a->k, KW = K - K % W;
    Py_ssize_t r = r0;
    for (; r + 4 <= r1; r += 4) {
        const Py_ssize_t w0 = r * K, w1 = w0 + K, w2 = w1 + K, w3 = w2 + K;
        FV s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
        for (Py_ssize_t c = 0; c < KW; c += W) {
            FV x = GEMV_FN(xload)(X + c);
            s0 += GEMV_FN(wload)(a, w0 + c, kind) * x;
            s1 += GEMV_FN(wload)(a, w1 + c, kind) * x;
            s2 += GEMV_FN(wload)(a, w2 + c, kind) * x;
            s3 += GEMV_FN(wload)(a, w3 + c, kind) * x;
        }
        float t[4] = {GEMV_FN(hsum)(s0), GEMV_FN(hsum)(s1), GEMV_FN(hsum)(s2), GEMV_FN(hsum)(s3)};
        for (int i = 0; i < 4; i++) {
            const Py_ssize_t w = (r + i) * K;
            for (Py_ssize_t c = KW; c < K; c++)
                t[i] += weight(a, w + c) * X[c];
            a->y[r + i] = a->b ? t[i] + a->b[r + i] : t[i];
        }
    }
    for (; r < r1; r++) {
        const Py_ssize_t w = r * K;
        FV s = {0};
        for (Py_ssize_t c = 0; c < KW; c += W)
            s += GEMV_FN(wload)(a, w + c, kind) * GEMV_FN(xload)(X + c);
        float t = GEMV_FN(hsum)(s);
        for (Py_ssize_t c = KW; c < K; c++)
            t += weight(a, w + c) * X[c];
        a->y[r] = a->b ? t + a->b[r] : t;
    }
}

/* One Q8_0 block's products (32 int8 weights against x[0:32]), in W lanes. */
static inline __attribute__((always_inline)) FV GEMV_FN(block)(const uint8_t *q, const float *x) {
    FV p = {0};
    for (int j = 0; j < Q8_BLOCK; j += W)
        p += GEMV_FN(qload)(q + j) * GEMV_FN(xload)(x + j);
    return p;
}

/* Q8_0 rows [r0, r1): each block's products scaled by its d, four rows at a time. */
static inline __attribute__((always_inline)) void GEMV_FN(q8)(const gemv_args *a, Py_ssize_t r0,
                                                             Py_ssize_t r1) {
    const float *X = a->x;
    const Py_ssize_t B = a->k / Q8_BLOCK, S = B * Q8_BYTES;
    const uint8_t *Q = a->wq;
    Py_ssize_t r = r0;
    for (; r + 4 <= r1; r += 4) {
        const uint8_t *q0 = Q + r * S, *q1 = q0 + S, *q2 = q1 + S, *q3 = q2 + S;
        FV s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
        for (Py_ssize_t b = 0; b < B; b++) {
            const float *x = X + b * Q8_BLOCK;
            const Py_ssize_t o = b * Q8_BYTES;
            s0 += GEMV_FN(block)(q0 + o + 2, x) * half_to_float(q0 + o);
            s1 += GEMV_FN(block)(q1 + o + 2, x) * half_to_float(q1 + o);
            s2 += GEMV_FN(block)(q2 + o + 2, x) * half_to_float(q2 + o);
            s3 += GEMV_FN(block)(q3 + o + 2, x) * half_to_float(q3 + o);
        }
        float t[4] = {GEMV_FN(hsum)(s0), GEMV_FN(hsum)(s1), GEMV_FN(hsum)(s2), GEMV_FN(hsum)(s3)};
        for (int i = 0; i < 4; i++)
            a->y[r + i] = a->b ? t[i] + a->b[r + i] : t[i];
    }
    for (; r < r1; r++) {
        const uint8_t *q = Q + r * S;
        FV s = {0};
        for (Py_ssize_t b = 0; b < B; b++)
            s += GEMV_FN(block)(q + b * Q8_BYTES + 2, X + b * Q8_BLOCK) *
                 half_to_float(q + b * Q8_BYTES);
        float t = GEMV_FN(hsum)(s);
        a->y[r] = a->b ? t + a->b[r] : t;
    }
}

/* ---- GEMM: out (m, n) = x (m, k) w (n, k)^T (+ b), a prompt chunk's projection ----------
 * On xt, x in panels of 2W rows (padded with zeros), each panel transposed, (k, 2W), and
 * the panels one after another: a panel's 2W values at one p are two vector loads, and a
 * tile reads its panel in order. Each output element is one sum over p in order. */

/* MR rows of w (from row j) against the panel of xt at row i0: an MR x 2W tile of out,
 * its sums held in registers over the whole of k. */
static inline __attribute__((always_inline)) void GEMV_FN(tile)(const gemm_args *a, Py_ssize_t j,
                                                               Py_ssize_t i0, const int MR) {
    const Py_ssize_t K = a->k, N = a->n;
    const float *w = a->w + j * K, *xt = a->xt + i0 * K;  /* this panel's (k, 2W) */
    FV c[6][2];
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
    const Py_ssize_t rows = a->m - i0 < 2 * W ? a->m - i0 : 2 * W;
    float *out = a->out + i0 * N + j;
    for (int r = 0; r < MR; r++) {
        const float bias = a->b ? a->b[j + r] : 0.0f;
        for (Py_ssize_t i = 0; i < rows; i++)
            out[i * N + r] = (i < W ? c[r][0][i] : c[r][1][i - W]) + bias;
    }
}

/* Output columns [j0, j1) over every row: JB rows of w at a time (kept in L2) against
 * every panel of x (each read from L2 by the block's tiles in turn). */
static void GEMV_FN(gemm_cols)(const gemm_args *a, Py_ssize_t j0, Py_ssize_t j1) {
    const Py_ssize_t JB = 96;
    for (Py_ssize_t jb = j0; jb < j1; jb += JB) {
        const Py_ssize_t je = jb + JB < j1 ? jb + JB : j1;
        for (Py_ssize_t i0 = 0; i0 < a->m; i0 += 2 * W) {
            Py_ssize_t j = jb;
            for (; j + 6 <= je; j += 6)
                GEMV_FN(tile)(a, j, i0, 6);
            for (; j < je; j++)
                GEMV_FN(tile)(a, j, i0, 1);
        }
    }
}

static void GEMV_FN(gemv_rows)(const gemv_args *a, Py_ssize_t r0, Py_ssize_t r1) {
    if (a->wq)
        GEMV_FN(q8)(a, r0, r1);
    else if (a->w16)
        GEMV_FN(dense)(a, r0, r1, WEIGHTS_BF16);
    else
        GEMV_FN(dense)(a, r0, r1, WEIGHTS_F32);
}

#undef FV
#undef GEMV_FN
#undef GEMV_CAT
#undef GEMV_CAT_
