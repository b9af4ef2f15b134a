/* A batched decode step's GEMV on held weights: a skinny GEMM, y (m, n) = x (m, k) w (n, k)^T
 * for m = 2 .. 16 rows of x (runtime/batch.py's rows, each a session's token), each weight
 * block read and decoded once for all the rows, whose sums are held side by side in
 * registers (up to SK_MB rows of x a pass over a weight row, the row then in L1 for the next
 * pass). Included by _cpu.c once per instruction set after _cpu_held_x8.h (SUFFIX, W and the
 * target region as there), and once more as SUFFIX _vnni (X8_VNNI defined: the block forms
 * only), chosen at run time as the one-row kernels are (BY_SIMD, held_vnni).
 *
 * Exactness: every (weight row, x row) pair's sum is the one-row kernel's for that x row, the
 * same operations in the same order on the same values, only interleaved with the other
 * rows' (bf16_rows_seq's four chains and hsum4; x8_dot's integer block dot products, scales,
 * two alternating accumulators and its final sums; x quantized per row by the same
 * quantize_x8): so each row's y is the one-row GEMV's bit for bit, on every instruction set
 * (tests/operators/test_skinny.py holds it against the one-row entry).
 *
 * Not here: float32 and the decode forms (row-grouped bfloat16, Q8_0 with int16 x), whose
 * batched rows are _cpu_gemv.h's gemv_rows_multi; Q6_K and float16 (skinny_x8's why), which
 * gemv_batch_part runs a block of rows at a time for every row.
 */

#define SK_CAT_(a, b) a##b
#define SK_CAT(a, b) SK_CAT_(a, b)
#define SK_FN(name) SK_CAT(name, SUFFIX)
#ifdef X8_VNNI
#define SK_BASE(name) name##_avx512 /* the AVX-512 instance's helpers */
#else
#define SK_BASE(name) SK_CAT(name, SUFFIX)
#endif
#define SK_U8V SK_FN(u8x32)
#define SK_S8V SK_FN(s8x32)
#define SK_I32V SK_FN(i32x8)
#define SK_F32V SK_FN(f32x8)

/* Rows of x a pass over a weight row holds: the block forms keep two 8-lane sums and two
 * scalars a row (16 rows: 32 of AVX-512's 32 registers at most, the rest spilled to L1 as
 * the compiler likes; 8 on 16-register sets). */
#if W == 16
#define SK_MB 8
#else
#define SK_MB 4
#endif

#if W < 8
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

/* x's rows as quantize_x8 makes them, one after another: row j's xq at q + j * K, its dx and
 * xs at j * B, its xh at j * 2B (B = K / 32). */
typedef struct {
    const int8_t *q;
    const float *dx, *xs, *xh;
    Py_ssize_t K, B;
    const float *dxT, *xsT;  /* dx and xs block-major: block b's rows from b * m */
    Py_ssize_t m;
} SK_FN(sk_x8rows);

#if W == 16
/* quantize_x8's values, bit for bit, faster where a block's 32 values are all finite: its
 * zs (the sum of each value times 0, four cycles a value in one dependent chain) is then
 * +0 and dx = d + 0 = d, and its largest |x|, its products x * id, their rounding and the
 * exact integer sums are the same operations on the same values, 16 lanes at a time. A
 * block with an infinity or a NaN goes to quantize_x8 itself. */
static void SK_FN(sk_quantize_x8)(const float *x, Py_ssize_t K, int8_t *q, float *dx, float *xs,
                                  float *xh) {
    const __m512 inf = _mm512_set1_ps(INFINITY);
    for (Py_ssize_t b = 0; b < K / 32; b++) {
        const __m512 v0 = _mm512_loadu_ps(x + 32 * b), v1 = _mm512_loadu_ps(x + 32 * b + 16);
        const __m512 a0 = _mm512_abs_ps(v0), a1 = _mm512_abs_ps(v1);
        if ((__mmask16)(_mm512_cmp_ps_mask(a0, inf, _CMP_LT_OQ) &
                        _mm512_cmp_ps_mask(a1, inf, _CMP_LT_OQ)) != 0xFFFF) {
            SK_FN(quantize_x8)(x + 32 * b, 32, q + 32 * b, dx + b, xs + b, xh + 2 * b);
            continue;
        }
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1));
        const float d = amax >= 0x1p-100f ? amax / 127.0f : 0.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        dx[b] = d + 0.0f;
        const __m512 idv = _mm512_set1_ps(id);
        const __m512i i0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, idv));
        const __m512i i1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, idv));
        _mm_storeu_si128((__m128i *)(q + 32 * b), _mm512_cvtsepi32_epi8(i0));
        _mm_storeu_si128((__m128i *)(q + 32 * b + 16), _mm512_cvtsepi32_epi8(i1));
        const int s0 = _mm512_reduce_add_epi32(i0), s1 = _mm512_reduce_add_epi32(i1);
        xh[2 * b] = (float)s0;
        xh[2 * b + 1] = (float)s1;
        xs[b] = (float)(s0 + s1);
    }
}
#define SK_QUANTIZE SK_FN(sk_quantize_x8)
#else
#define SK_QUANTIZE SK_FN(quantize_x8)
#endif

/* Block b of a 32-value form's row against M rows of x (x8_dot's block32 for each), the
 * block's bytes decoded once. */
static inline __attribute__((always_inline)) void SK_FN(sk_block32)(
        int form, const uint8_t *row, Py_ssize_t b, const SK_FN(sk_x8rows) *X, SK_F32V *acc,
        float *mm, const int M) {
    const int five = form == HELD_Q5_0 || form == HELD_Q5_1;
    const int mins = form == HELD_Q4_1 || form == HELD_Q5_1;
    const int bytes = form == HELD_Q8_0 ? 34 : form == HELD_Q4_0 ? 18 : form == HELD_Q4_1 ? 20
                      : form == HELD_Q5_0 ? 22 : 24;
    const uint8_t *blk = row + bytes * b;
    const float d = SK_BASE(half)(blk);
    if (form == HELD_Q8_0) {
#if W >= 8
        const __m256i wv = _mm256_loadu_si256((const __m256i *)(blk + 2));
        const SK_U8V aw = (SK_U8V)_mm256_abs_epi8(wv);
        for (int j = 0; j < M; j++) {
            const __m256i xv = _mm256_loadu_si256((const __m256i *)(X->q + j * X->K + 32 * b));
            const SK_I32V v = SK_FN(dot_usv)(aw, (SK_S8V)_mm256_sign_epi8(xv, wv));
            acc[j] = SK_FN(fma)(v, d * X->dx[j * X->B + b], acc[j]);
        }
#else
        for (int j = 0; j < M; j++)
            acc[j] = SK_FN(fma)(SK_FN(dot_ss)(blk + 2, X->q + j * X->K + 32 * b),
                                d * X->dx[j * X->B + b], acc[j]);
#endif
        return;
    }
    const int at = 2 + 2 * mins + 4 * five;  /* the nibbles */
    SK_U8V u = SK_FN(nibbles)(blk + at);
    if (five) {
        uint32_t qh;
        memcpy(&qh, blk + at - 4, 4);
        u |= SK_FN(fifth)(qh);
    }
    const float hm = mins ? SK_BASE(half)(blk + 2) : 0.0f;
    const float *dx = X->dxT + b * X->m, *xs = X->xsT + b * X->m;
    float S[SK_MB];
    for (int j = 0; j < M; j++)  /* the rows' scales side by side */
        S[j] = d * dx[j];
    for (int j = 0; j < M; j++)
        acc[j] = SK_FN(fma)(SK_FN(dot_us)(u, X->q + j * X->K + 32 * b), S[j], acc[j]);
    for (int j = 0; j < M; j++)
        mm[j] += mins ? hm * dx[j] * xs[j] : S[j] * xs[j];
}

/* One weight row of a block form against M rows of x into out[j] (x8_dot's value for each). */
static inline __attribute__((always_inline)) void SK_FN(sk_x8_multi)(int form, const uint8_t *row,
                                                                 const SK_FN(sk_x8rows) *X,
                                                                 float *out, const int M) {
    const Py_ssize_t K = X->K;
    SK_F32V acc0[SK_MB], acc1[SK_MB];
    float m0[SK_MB], m1[SK_MB], off = 0.0f;
    for (int j = 0; j < M; j++) {
        acc0[j] = acc1[j] = (SK_F32V){0};
        m0[j] = m1[j] = 0.0f;
    }
    switch (form) {
    case HELD_Q8_0: case HELD_Q4_0: case HELD_Q4_1: case HELD_Q5_0: case HELD_Q5_1: {
        const int bytes = form == HELD_Q8_0 ? 34 : form == HELD_Q4_0 ? 18 : form == HELD_Q4_1 ? 20
                          : form == HELD_Q5_0 ? 22 : 24;
        Py_ssize_t b = 0;
        for (; b + 1 < K / 32; b += 2) {
            if (gemv_ahead[AHEAD_Q8])
                __builtin_prefetch((const char *)(row + bytes * b) + gemv_ahead[AHEAD_Q8], 0, 3);
            SK_FN(sk_block32)(form, row, b, X, acc0, m0, M);
            SK_FN(sk_block32)(form, row, b + 1, X, acc1, m1, M);
        }
        if (b < K / 32)
            SK_FN(sk_block32)(form, row, b, X, acc0, m0, M);
        off = form == HELD_Q4_0 ? -8.0f : form == HELD_Q5_0 ? -16.0f
              : form == HELD_Q8_0 ? 0.0f : 1.0f;
        break;
    }
    case HELD_Q4_K: case HELD_Q5_K: {
        const int five = form == HELD_Q5_K, bytes = five ? 176 : 144;
        for (Py_ssize_t b = 0; b < K / QK_K; b++) {
            const uint8_t *blk = row + bytes * b;
            if (gemv_ahead[AHEAD_Q8])
                for (int l = 0; l < bytes; l += 64)
                    __builtin_prefetch((const char *)(blk + l) + gemv_ahead[AHEAD_Q8], 0, 3);
            const float d = SK_BASE(half)(blk), dmin = SK_BASE(half)(blk + 2);
            uint8_t sm[16];
            SK_BASE(k_scales)(blk + 4, sm);
            float D[SK_MB][8];
            for (int j = 0; j < M; j++) {
                const float *dxb = X->dx + j * X->B + 8 * b, *xsb = X->xs + j * X->B + 8 * b;
                for (int s = 0; s < 8; s++) {
                    D[j][s] = d * sm[s] * dxb[s];
                    m0[j] += (dmin * sm[8 + s]) * dxb[s] * xsb[s];
                }
            }
            SK_U8V qh = {0};
            if (five)
                qh = SK_FN(load32)(blk + 16);
            for (int i = 0; i < 4; i++) {
                const SK_U8V v = SK_FN(load32)(blk + (five ? 48 : 16) + 32 * i);
                SK_U8V lo = v & 0xF, hi = (v >> 4) & 0xF;
                if (five) {
                    lo |= ((qh >> (2 * i)) & 1) << 4;
                    hi |= ((qh >> (2 * i + 1)) & 1) << 4;
                }
                for (int j = 0; j < M; j++) {
                    const int8_t *xb = X->q + j * K + QK_K * b + 64 * i;
                    acc0[j] += SK_FN(fl)(SK_FN(dot_us)(lo, xb)) * D[j][2 * i];
                    acc1[j] += SK_FN(fl)(SK_FN(dot_us)(hi, xb + 32)) * D[j][2 * i + 1];
                }
            }
        }
        off = -1.0f;
        break;
    }
    }
    for (int j = 0; j < M; j++) {
        const SK_F32V a = acc0[j] + acc1[j];
        const float t = ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
        out[j] = t + off * (m0[j] + m1[j]);
    }
}

#ifdef X8_VNNI
/* Q8_0 on VNNI: x_j's int8 stored plus 128 (xu, unsigned) meets the block's int8 w in one
 * VPDPBUSD a row, begun from -128 * (each four of w's sum) (made once a block for all the
 * rows): sum (x + 128) w - 128 sum w = sum x w, the same exact int32 lanes as dot_ss's
 * |w| against x given w's signs. Then x8_dot's float32 steps for each row: the lanes
 * converted, times d * dx (the same float32 product), added by one FMA into the even or
 * odd blocks' sums. A weight row's factors d_b * dx_jb for all its blocks and the pass's
 * rows are made first, sixteen a vector product, so each row's FMA takes its factor as a
 * broadcast load: where a scalar product and a broadcast a row and block were (2.05 cycles
 * a block and row of x on Zen 4, in L2, to 1.52; blocks paired in 64-byte vectors measured
 * no faster: Zen 4 splits them in two), and the rows' last sums eight at once (sk_sum8). */
/* Block b of a Q8_0 row against M rows of xu into acc (x8_dot's lanes for each), the rows'
 * factors d_b * dx_jb at S[j]. */
static inline __attribute__((always_inline)) void sk_q8_vnni_bs(const uint8_t *blk, const uint8_t *xb,
                                                                const float *S, Py_ssize_t K,
                                                                __m256 *acc, const int M) {
    const __m256i wv = _mm256_loadu_si256((const __m256i *)(blk + 2));
    const __m256i corr = _mm256_sub_epi32(
        _mm256_setzero_si256(),
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8((char)0x80), wv));
    for (int j = 0; j < M; j++) {
        const __m256i v = _mm256_dpbusd_epi32(
            corr, _mm256_loadu_si256((const __m256i *)(xb + j * K)), wv);
        acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), _mm256_broadcast_ss(S + j), acc[j]);
    }
}

/* Eight rows' x8_dot sums, each in its own order ((a0 + a4) + (a1 + a5)) + ((a2 + a6) +
 * (a3 + a7)) of its a = acc0 + acc1, eight at once: lane j row j's. */
static inline __attribute__((always_inline)) __m256 sk_sum8(const __m256 *a) {
    __m256 u[4];
    for (int j = 0; j < 4; j++)  /* rows j and j + 4: [a0+a4, a1+a5, a2+a6, a3+a7] each */
        u[j] = _mm256_add_ps(_mm256_permute2f128_ps(a[j], a[j + 4], 0x20),
                             _mm256_permute2f128_ps(a[j], a[j + 4], 0x31));
    return _mm256_hadd_ps(_mm256_hadd_ps(u[0], u[1]), _mm256_hadd_ps(u[2], u[3]));
}

/* A Q8_0 row against M rows of xu (x8_dot's value for each into out). dxQ: the pass's rows'
 * dx by blocks (block b's eight at 8b, rows past M zero); S: room for 8 K / 32 floats. */
static inline __attribute__((always_inline)) void sk_q8_vnni(const uint8_t *row, const uint8_t *xu,
                                                             const float *dxQ, float *S,
                                                             Py_ssize_t K, float *out,
                                                             const int M) {
    const Py_ssize_t B = K / 32;
    Py_ssize_t b = 0;
    for (; b + 1 < B; b += 2) {  /* the factors, sixteen a product: d * dx as x8_dot's */
        const __m512 dv = _mm512_insertf32x8(_mm512_set1_ps(half_avx512(row + 34 * b)),
                                             _mm256_set1_ps(half_avx512(row + 34 * b + 34)), 1);
        _mm512_storeu_ps(S + 8 * b, _mm512_mul_ps(dv, _mm512_loadu_ps(dxQ + 8 * b)));
    }
    if (b < B)
        _mm256_storeu_ps(S + 8 * b, _mm256_mul_ps(_mm256_set1_ps(half_avx512(row + 34 * b)),
                                                  _mm256_loadu_ps(dxQ + 8 * b)));
    __m256 acc0[8], acc1[8];
    for (int j = 0; j < 8; j++)
        acc0[j] = acc1[j] = _mm256_setzero_ps();
    for (b = 0; b + 1 < B; b += 2) {  /* x8_dot's order: even blocks into acc0, odd acc1 */
        if (gemv_ahead[AHEAD_Q8])
            __builtin_prefetch((const char *)(row + 34 * b) + gemv_ahead[AHEAD_Q8], 0, 3);
        sk_q8_vnni_bs(row + 34 * b, xu + 32 * b, S + 8 * b, K, acc0, M);
        sk_q8_vnni_bs(row + 34 * b + 34, xu + 32 * b + 32, S + 8 * b + 8, K, acc1, M);
    }
    if (b < B)
        sk_q8_vnni_bs(row + 34 * b, xu + 32 * b, S + 8 * b, K, acc0, M);
    __m256 a[8];
    for (int j = 0; j < 8; j++)
        a[j] = _mm256_add_ps(acc0[j], acc1[j]);
    /* x8_dot's t + off * (m0 + m1), off and m 0 */
    _mm256_storeu_ps(out, _mm256_add_ps(sk_sum8(a), _mm256_setzero_ps()));
}
#endif

#define SK_MULTI(fn, M, ...)                                                                \
    switch (M) {                                                                            \
    case 1: fn(__VA_ARGS__, 1); break;                                                      \
    case 2: fn(__VA_ARGS__, 2); break;                                                      \
    case 3: fn(__VA_ARGS__, 3); break;                                                      \
    case 4: fn(__VA_ARGS__, 4); break;                                                      \
    case 5: fn(__VA_ARGS__, SK_MB >= 5 ? 5 : 1); break;                                     \
    case 6: fn(__VA_ARGS__, SK_MB >= 6 ? 6 : 1); break;                                     \
    case 7: fn(__VA_ARGS__, SK_MB >= 7 ? 7 : 1); break;                                     \
    default: fn(__VA_ARGS__, SK_MB >= 8 ? 8 : 1); break;                                    \
    }

/* One form's weight rows [r0, r1) against the m rows of X (passes of up to SK_MB rows), y
 * rows ys floats apart; the form a constant in each inlined copy. */
static inline __attribute__((always_inline)) void SK_FN(sk_x8_form)(
        const gemv_args *a, const int form, Py_ssize_t r0, Py_ssize_t r1, const SK_FN(sk_x8rows) *X,
        Py_ssize_t m, Py_ssize_t ys) {
    float out[SK_MB];
    for (Py_ssize_t r = r0; r < r1; r++) {
        const uint8_t *row = a->wh + r * a->rb;
        for (Py_ssize_t j0 = 0; j0 < m; j0 += SK_MB) {
            const int M = (int)(m - j0 < SK_MB ? m - j0 : SK_MB);
            SK_FN(sk_x8rows) P = {X->q + j0 * X->K, X->dx + j0 * X->B, X->xs + j0 * X->B,
                               X->xh + 2 * j0 * X->B, X->K, X->B, X->dxT + j0, X->xsT + j0,
                               X->m};
            SK_MULTI(SK_FN(sk_x8_multi), M, form, row, &P, out)
            for (int j = 0; j < M; j++)
                a->y[(j0 + j) * ys + r] = a->b ? out[j] + a->b[r] : out[j];
        }
    }
}

/* A held block form's rows [r0, r1) against m rows of x (xs floats apart): each row of x
 * quantized once (quantize_x8, as the one-row kernel does), then the rows. 1 where done; 0
 * where the form is none of these; -1 where x's blocks find no memory (y NaN). */
#ifdef X8_VNNI
static int skinny_x8_vnni(const gemv_args *a, Py_ssize_t r0, Py_ssize_t r1, Py_ssize_t m,
                          Py_ssize_t xs, Py_ssize_t ys)
#else
static int SK_FN(skinny_x8)(const gemv_args *a, Py_ssize_t r0, Py_ssize_t r1, Py_ssize_t m,
                            Py_ssize_t xs, Py_ssize_t ys)
#endif
{
    switch (a->form) {
    case HELD_Q8_0: case HELD_Q4_0: case HELD_Q4_1: case HELD_Q5_0: case HELD_Q5_1:
    case HELD_Q4_K: case HELD_Q5_K: break;
    default: return 0;  /* Q6_K too: written as x8_dot's, GCC contracted its scalar terms
                         * into FMAs as the rows' count led it, not as in the one-row kernel
                         * (the last bit off at 3, 8, 9 and 16 rows on AVX2): a block of
                         * rows at a time there (gemv_batch_part) */
    }
#ifdef X8_VNNI
    if (a->form == HELD_Q4_K)  /* the one-row kernel on VNNI is _cpu_held_k.h's kz_q4_k, which
                                * adds a super-block's sums in another order: each row that
                                * kernel's bits, a block of rows at a time (gemv_batch_part) */
        return 0;
#endif
#if W == 16 && !defined(X8_VNNI)
    if (held_vnni)
        return skinny_x8_vnni(a, r0, r1, m, xs, ys);
#endif
    const Py_ssize_t K = a->k, B = K / 32;
    /* x8 rows (m K bytes; 4 m B floats), room for Q8_0's on VNNI (m K bytes, m B floats),
     * then dx and xs block-major (2 m B floats) */
    int8_t *q = malloc((size_t)(2 * m * K) + (size_t)m * 7 * B * sizeof(float));
    if (!q) {
        for (Py_ssize_t j = 0; j < m; j++)
            for (Py_ssize_t r = r0; r < r1; r++)
                a->y[j * ys + r] = NAN;
        return -1;
    }
    float *dx = (float *)(q + m * K + (-(m * K) & 3)), *xsum = dx + m * B, *xh = xsum + m * B;
    for (Py_ssize_t j = 0; j < m; j++)
        SK_QUANTIZE(a->x + j * xs, K, q + j * K, dx + j * B, xsum + j * B, xh + 2 * j * B);
    float *dxT = (float *)(q + 2 * m * K) + 4 * m * B, *xsT = dxT + m * B;  /* K % 32 == 0 */
    for (Py_ssize_t j = 0; j < m; j++)
        for (Py_ssize_t b = 0; b < B; b++) {
            dxT[b * m + j] = dx[j * B + b];
            xsT[b * m + j] = xsum[j * B + b];
        }
    const SK_FN(sk_x8rows) X = {q, dx, xsum, xh, K, B, dxT, xsT, m};
#ifdef X8_VNNI
    if (a->form == HELD_Q8_0) {
        uint8_t *xu = (uint8_t *)(xh + 2 * m * B);
        for (Py_ssize_t i = 0; i < m * K; i++)
            xu[i] = (uint8_t)q[i] ^ 0x80u;
        /* x's scales by passes of SK_MB rows, block by block (sk_q8_vnni's dxQ), and room
         * for a weight row's factors */
        const Py_ssize_t passes = (m + SK_MB - 1) / SK_MB;
        float *dxQ = malloc((size_t)((passes + 1) * B * 8 + 8) * sizeof(float));
        if (!dxQ) {
            free(q);
            for (Py_ssize_t j = 0; j < m; j++)
                for (Py_ssize_t r = r0; r < r1; r++)
                    a->y[j * ys + r] = NAN;
            return -1;
        }
        float *S = dxQ + passes * B * 8;
        for (Py_ssize_t g = 0; g < passes; g++)
            for (Py_ssize_t bb = 0; bb < B; bb++)
                for (int i = 0; i < 8; i++) {
                    const Py_ssize_t j = g * SK_MB + i;
                    dxQ[(g * B + bb) * 8 + i] = i < SK_MB && j < m ? dx[j * B + bb] : 0.0f;
                }
        float out[8];
        for (Py_ssize_t r = r0; r < r1; r++) {
            const uint8_t *row = a->wh + r * a->rb;
            for (Py_ssize_t j0 = 0; j0 < m; j0 += SK_MB) {
                const int M = (int)(m - j0 < SK_MB ? m - j0 : SK_MB);
                SK_MULTI(sk_q8_vnni, M, row, xu + j0 * K, dxQ + j0 / SK_MB * B * 8, S, K, out)
                for (int j = 0; j < M; j++)
                    a->y[(j0 + j) * ys + r] = a->b ? out[j] + a->b[r] : out[j];
            }
        }
        free(dxQ);
        free(q);
        return 1;
    }
#endif
    switch (a->form) {
    case HELD_Q8_0: SK_FN(sk_x8_form)(a, HELD_Q8_0, r0, r1, &X, m, ys); break;
    case HELD_Q4_0: SK_FN(sk_x8_form)(a, HELD_Q4_0, r0, r1, &X, m, ys); break;
    case HELD_Q4_1: SK_FN(sk_x8_form)(a, HELD_Q4_1, r0, r1, &X, m, ys); break;
    case HELD_Q5_0: SK_FN(sk_x8_form)(a, HELD_Q5_0, r0, r1, &X, m, ys); break;
    case HELD_Q5_1: SK_FN(sk_x8_form)(a, HELD_Q5_1, r0, r1, &X, m, ys); break;
    case HELD_Q4_K: SK_FN(sk_x8_form)(a, HELD_Q4_K, r0, r1, &X, m, ys); break;
    default: SK_FN(sk_x8_form)(a, HELD_Q5_K, r0, r1, &X, m, ys); break;
    }
    free(q);
    return 1;
}

#ifndef X8_VNNI
/* ---- bfloat16 held rows (bf16_rows_seq's sums for each row of x) -------------------------
 * Each x row's four chains over the weight row; the weight's 2W values loaded and widened
 * once for the SK_BF rows of x; the four rows' totals summed across by hsum4 at once (each
 * lane of hsum4's result its own vector's sum, whatever the others). x rows in the kernel's
 * order (held_bf16_order), xs floats apart. (Tiles of four weight rows by two x rows, each
 * x vector loaded once for four weight rows, ran 1.7x faster with the weights in L2 on Zen 4
 * but no faster on SmolLM2's 270 MB streamed from memory, one thread or two: not kept.) */
#if W == 16
#define SK_BF 4
#else
#define SK_BF 2
#endif

static inline __attribute__((always_inline)) void SK_FN(sk_bf16_multi)(
        const gemv_args *a, Py_ssize_t r, const float *xp, const float *x, Py_ssize_t xs,
        float *y, Py_ssize_t ys, const int M) {
    const Py_ssize_t K = a->k, C = K / (2 * W);
    const uint16_t *row = (const uint16_t *)(a->wh + r * a->rb);
    SK_FN(fv) lo0[SK_BF], hi0[SK_BF], lo1[SK_BF], hi1[SK_BF];
    for (int j = 0; j < M; j++)
        lo0[j] = hi0[j] = lo1[j] = hi1[j] = (SK_FN(fv)){0};
    Py_ssize_t c = 0;
    for (; c + 1 < C; c += 2) {
        const uint16_t *p = row + c * 2 * W;
        for (int l = 0; l < 8 * W; l += 64)
            GEMV_AHEAD((const char *)p + l, AHEAD_BF16);
        SK_FN(uv) v0, v1;
        memcpy(&v0, p, sizeof v0);
        memcpy(&v1, p + 2 * W, sizeof v1);
        const SK_FN(fv) a0 = (SK_FN(fv))(v0 << 16), b0 = (SK_FN(fv))(v0 & 0xffff0000u);
        const SK_FN(fv) a1 = (SK_FN(fv))(v1 << 16), b1 = (SK_FN(fv))(v1 & 0xffff0000u);
        for (int j = 0; j < M; j++) {
            const float *xj = xp + j * xs + c * 2 * W;
            lo0[j] = SK_FN(madd)(a0, SK_FN(xload)(xj), lo0[j]);
            hi0[j] = SK_FN(madd)(b0, SK_FN(xload)(xj + W), hi0[j]);
            lo1[j] = SK_FN(madd)(a1, SK_FN(xload)(xj + 2 * W), lo1[j]);
            hi1[j] = SK_FN(madd)(b1, SK_FN(xload)(xj + 3 * W), hi1[j]);
        }
    }
    if (c < C) {
        SK_FN(uv) v;
        memcpy(&v, row + c * 2 * W, sizeof v);
        const SK_FN(fv) a0 = (SK_FN(fv))(v << 16), b0 = (SK_FN(fv))(v & 0xffff0000u);
        for (int j = 0; j < M; j++) {
            const float *xj = xp + j * xs + c * 2 * W;
            lo0[j] = SK_FN(madd)(a0, SK_FN(xload)(xj), lo0[j]);
            hi0[j] = SK_FN(madd)(b0, SK_FN(xload)(xj + W), hi0[j]);
        }
    }
    SK_FN(fv) both[4];
    for (int j = 0; j < M; j++)
        both[j] = (lo0[j] + hi0[j]) + (lo1[j] + hi1[j]);
    float sums[4];
    SK_FN(hsum4)(both, M, sums);
    for (int j = 0; j < M; j++) {
        const float *xj = x + j * xs;
        float t = sums[j];
        for (Py_ssize_t i = C * 2 * W; i < K; i++)
            t = fmaf(bf16_to_float(row[i]), xj[i], t);
        y[j * ys + r] = a->b ? t + a->b[r] : t;
    }
}

/* bfloat16 held rows [r0, r1) against m rows of x (a->x, its kernel's order a->xp; xs floats
 * apart): 1 where done, 0 where the form is not bfloat16. */
static int SK_FN(skinny_bf16)(const gemv_args *a, Py_ssize_t r0, Py_ssize_t r1, Py_ssize_t m,
                              Py_ssize_t xs, Py_ssize_t ys) {
    if (a->form != HELD_BF16 || !a->xp)
        return 0;
    for (Py_ssize_t r = r0; r < r1; r++)
        for (Py_ssize_t j0 = 0; j0 < m; j0 += SK_BF) {
            const int M = (int)(m - j0 < SK_BF ? m - j0 : SK_BF);
            const float *xp = a->xp + j0 * xs, *x = a->x + j0 * xs;
            float *y = a->y + j0 * ys;
            switch (M) {
            case 1: SK_FN(sk_bf16_multi)(a, r, xp, x, xs, y, ys, 1); break;
#if SK_BF >= 4
            case 2: SK_FN(sk_bf16_multi)(a, r, xp, x, xs, y, ys, 2); break;
            case 3: SK_FN(sk_bf16_multi)(a, r, xp, x, xs, y, ys, 3); break;
            default: SK_FN(sk_bf16_multi)(a, r, xp, x, xs, y, ys, 4); break;
#else
            default: SK_FN(sk_bf16_multi)(a, r, xp, x, xs, y, ys, 2); break;
#endif
            }
        }
    return 1;
}
#undef SK_BF


/* A held weight's rows [r0, r1) against m rows of x: 1 where done (bfloat16, the block
 * forms but Q6_K), 0 where the form has no skinny kernel here. */
static int SK_FN(skinny_rows)(const gemv_args *a, Py_ssize_t r0, Py_ssize_t r1, Py_ssize_t m,
                              Py_ssize_t xs, Py_ssize_t ys) {
    if (!a->held)  /* float32: gemv_rows_multi's (tiles of weight rows by x rows measured no
                    * faster on SmolLM2's decode step, two weight rows' streams slower at B 2-4) */
        return 0;
    if (a->form == HELD_BF16)
        return SK_FN(skinny_bf16)(a, r0, r1, m, xs, ys);
    return SK_FN(skinny_x8)(a, r0, r1, m, xs, ys) != 0;
}
#endif

#if W < 8
#pragma GCC diagnostic pop
#endif
#undef SK_MULTI
#undef SK_QUANTIZE
#undef SK_MB
#undef SK_U8V
#undef SK_S8V
#undef SK_I32V
#undef SK_F32V
#undef SK_BASE
#undef SK_FN
#undef SK_CAT
#undef SK_CAT_
