/* A decode step's GEMV on the held block forms (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K,
 * Q6_K) with x as 8-bit blocks, as llama.cpp's integer dot products meet it. Included by
 * _cpu.c once per instruction set after _cpu_held.h (SUFFIX, W and the target region as
 * there), and once more as SUFFIX _vnni (W 16, X8_VNNI defined) inside an AVX-512 VNNI target
 * region, chosen at run time where the CPU has it (_cpu.c's held_vnni).
 *
 * What each computes: x per 32 values as formats.quantize_x8 rounds it (an int8 each, a
 * float32 scale dx = max|x| / 127, by the same float32 operations); each block's (or K
 * sub-block's) stored integers, as unsigned bytes (Q4_0's nibbles 0..15, Q5's 0..31, Q6_K's
 * 0..63; Q8_0's magnitudes, x taking their signs), against x's 32 int8, summed exactly in
 * int32 lanes of four values each: VPDPBUSD on VNNI, VPMADDUBSW then VPMADDWD on AVX2 and
 * AVX-512 without it (pairs at most 2 * 128 * 127 < 2^15: never saturated), a loop in
 * portable C. Each lane is converted to float32 exactly and multiplied by the block's scale
 * times dx into the row's float32 lanes; an offset (Q4_0's 8, Q5_0's 16, Q6_K's 32) or a
 * minimum (Q4_1, Q5_1, the K forms' dmin * m) meets the exact integer sum of x's values it
 * spans, times dx. So a row's sum is of the stored values times x8's values (held.reference_x),
 * rounded only by float32 sums, in an order that depends on the form alone.
 */

#define X8_CAT_(a, b) a##b
#define X8_CAT(a, b) X8_CAT_(a, b)
#define X8_FN(name) X8_CAT(name, SUFFIX)
#ifdef X8_VNNI
#define X8_BASE(name) name##_avx512 /* the AVX-512 instance's helpers (a subset of this target) */
#else
#define X8_BASE(name) X8_CAT(name, SUFFIX)
#endif

#if W < 8  /* 32-byte vectors on SSE2: two registers each; every function taking one inlined */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
#endif
typedef uint8_t X8_FN(u8x32) __attribute__((vector_size(32)));
typedef int8_t X8_FN(s8x32) __attribute__((vector_size(32)));
typedef int32_t X8_FN(i32x8) __attribute__((vector_size(32)));
typedef float X8_FN(f32x8) __attribute__((vector_size(32)));
#define U8V X8_FN(u8x32)
#define S8V X8_FN(s8x32)
#define I32V X8_FN(i32x8)
#define F32V X8_FN(f32x8)

static inline __attribute__((always_inline)) U8V X8_FN(load32)(const uint8_t *p) {
    U8V v;
    memcpy(&v, p, 32);
    return v;
}

static inline __attribute__((always_inline)) S8V X8_FN(xload8)(const int8_t *p) {
    S8V v;
    memcpy(&v, p, 32);
    return v;
}

/* u's 32 unsigned bytes against x's 32 int8: lane l the sum of values 4l .. 4l + 3's
 * products, exactly. */
static inline __attribute__((always_inline)) I32V X8_FN(dot_usv)(U8V u, S8V x) {
#if defined(X8_VNNI)
    return (I32V)_mm256_dpbusd_epi32(_mm256_setzero_si256(), (__m256i)u, (__m256i)x);
#elif W >= 8
    return (I32V)_mm256_madd_epi16(_mm256_maddubs_epi16((__m256i)u, (__m256i)x),
                                   _mm256_set1_epi16(1));
#else
    I32V r;
    for (int l = 0; l < 8; l++) {
        int32_t t = 0;
        for (int j = 4 * l; j < 4 * l + 4; j++)
            t += (int32_t)u[j] * x[j];
        r[l] = t;
    }
    return r;
#endif
}

static inline __attribute__((always_inline)) I32V X8_FN(dot_us)(U8V u, const int8_t *x) {
    return X8_FN(dot_usv)(u, X8_FN(xload8)(x));
}

/* w's 32 int8 against x's: dot_us of |w| (as unsigned: -128's 128) and x given w's signs. */
static inline __attribute__((always_inline)) I32V X8_FN(dot_ss)(const uint8_t *w, const int8_t *x) {
#if W >= 8
    const __m256i wv = _mm256_loadu_si256((const __m256i *)w);
    const __m256i xv = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)x), wv);
    return X8_FN(dot_usv)((U8V)_mm256_abs_epi8(wv), (S8V)xv);
#else
    I32V r;
    for (int l = 0; l < 8; l++) {
        int32_t t = 0;
        for (int j = 4 * l; j < 4 * l + 4; j++)
            t += (int32_t)(int8_t)w[j] * x[j];
        r[l] = t;
    }
    return r;
#endif
}

/* A 32-value block's 16 bytes of nibbles as its 32 values in order (values 0..15 the low
 * nibbles, 16..31 the high: ggml-common.h's layout). */
static inline __attribute__((always_inline)) U8V X8_FN(nibbles)(const uint8_t *p) {
#if W >= 8
    const __m128i t = _mm_loadu_si128((const __m128i *)p);
    return (U8V)_mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(0xF));
#else
    U8V u;
    for (int j = 0; j < 16; j++) {
        u[j] = p[j] & 0xF;
        u[j + 16] = p[j] >> 4;
    }
    return u;
#endif
}

/* Bit j of qh as 16 in byte j (a Q5 block's fifth bits). */
static inline __attribute__((always_inline)) U8V X8_FN(fifth)(uint32_t qh) {
#if W == 16
    return (U8V)_mm256_maskz_mov_epi8((__mmask32)qh, _mm256_set1_epi8(16));
#elif W == 8
    const __m256i sel = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                         2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i b = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), sel), bit);
    return (U8V)_mm256_and_si256(_mm256_cmpeq_epi8(b, bit), _mm256_set1_epi8(16));
#else
    U8V u;
    for (int j = 0; j < 32; j++)
        u[j] = ((qh >> j) & 1) << 4;
    return u;
#endif
}

static inline __attribute__((always_inline)) F32V X8_FN(fl)(I32V v) {
    return __builtin_convertvector(v, F32V);
}

/* acc + v * s, fused where the instruction set has it. */
static inline __attribute__((always_inline)) F32V X8_FN(fma)(I32V v, float s, F32V acc) {
#if W >= 8
    return (F32V)_mm256_fmadd_ps(_mm256_cvtepi32_ps((__m256i)v), _mm256_set1_ps(s), (__m256)acc);
#else
    return acc + X8_FN(fl)(v) * s;
#endif
}

/* Block b of a 32-value form's row into acc (and its offset's or minimum's term into m). */
static inline __attribute__((always_inline)) void X8_FN(block32)(int form, const uint8_t *row,
                                                                Py_ssize_t b, const int8_t *xq,
                                                                const float *dx, const float *xs,
                                                                F32V *acc, float *m) {
    const int five = form == HELD_Q5_0 || form == HELD_Q5_1;
    const int mins = form == HELD_Q4_1 || form == HELD_Q5_1;
    const int bytes = form == HELD_Q8_0 ? 34 : form == HELD_Q4_0 ? 18 : form == HELD_Q4_1 ? 20
                      : form == HELD_Q5_0 ? 22 : 24;
    const uint8_t *blk = row + bytes * b;
    const float s = X8_BASE(half)(blk) * dx[b];
    if (form == HELD_Q8_0) {
        *acc = X8_FN(fma)(X8_FN(dot_ss)(blk + 2, xq + 32 * b), s, *acc);
        return;
    }
    const int at = 2 + 2 * mins + 4 * five;  /* the nibbles */
    U8V u = X8_FN(nibbles)(blk + at);
    if (five) {
        uint32_t qh;
        memcpy(&qh, blk + at - 4, 4);
        u |= X8_FN(fifth)(qh);
    }
    *acc = X8_FN(fma)(X8_FN(dot_us)(u, xq + 32 * b), s, *acc);
    *m += mins ? X8_BASE(half)(blk + 2) * dx[b] * xs[b] : s * xs[b];
}

/* x as formats.quantize_x8 rounds it (the same float32 operations): per 32 values dx (NaN
 * where a value is not finite) and 32 int8; xs the exact sum of each 32's int8, xh of each
 * 16's (as float32: |sum| <= 32 * 127). */
static void X8_FN(quantize_x8)(const float *x, Py_ssize_t K, int8_t *q, float *dx, float *xs,
                               float *xh) {
    for (Py_ssize_t b = 0; b < K / 32; b++) {
        const float *v = x + 32 * b;
        float amax = 0.0f, zs = 0.0f;
        for (int j = 0; j < 32; j++) {
            const float a = fabsf(v[j]);
            amax = a > amax ? a : amax;
            zs += v[j] * 0.0f;
        }
        const float d = amax >= 0x1p-100f ? amax / 127.0f : 0.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        dx[b] = d + zs;
        int s0 = 0, s1 = 0;
#if W >= 8
        const __m256 idv = _mm256_set1_ps(id);
        __m256i i32[4];
        for (int j = 0; j < 4; j++)  /* rounded to nearest, ties to even (numpy's rint) */
            i32[j] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + 8 * j), idv));
        const __m256i h = _mm256_packs_epi32(i32[0], i32[1]), l = _mm256_packs_epi32(i32[2], i32[3]);
        const __m256i b8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(h, l),
                                                       _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)(q + 32 * b), b8);
#else
        for (int j = 0; j < 32; j++)
        {
            const float r = nearbyintf(v[j] * id);
            q[32 * b + j] = r == r ? (int8_t)r : 0;  /* NaN: the block's dx is NaN */
        }
#endif
        for (int j = 0; j < 16; j++) {
            s0 += q[32 * b + j];
            s1 += q[32 * b + 16 + j];
        }
        xh[2 * b] = (float)s0;
        xh[2 * b + 1] = (float)s1;
        xs[b] = (float)(s0 + s1);
    }
}

#define X8_AHEAD(p)                                                                          \
    do {                                                                                     \
        if (gemv_ahead[AHEAD_Q8])                                                            \
            __builtin_prefetch((const char *)(p) + gemv_ahead[AHEAD_Q8], 0, 3);              \
    } while (0)

/* One row of a block form against x8 (xq, dx, xs, xh as quantize_x8 makes them). */
static inline __attribute__((always_inline)) float X8_FN(x8_dot)(int form, const uint8_t *row,
                                                                  Py_ssize_t K, const int8_t *xq,
                                                                  const float *dx, const float *xs,
                                                                  const float *xh) {
    F32V acc0 = {0}, acc1 = {0};
    float m0 = 0.0f, m1 = 0.0f, off = 0.0f;
    switch (form) {
    case HELD_Q8_0: case HELD_Q4_0: case HELD_Q4_1: case HELD_Q5_0: case HELD_Q5_1: {
        /* sum d dx (q . x) (- offset * sum d dx xs, or + sum m dx xs); two blocks a turn */
        const int bytes = form == HELD_Q8_0 ? 34 : form == HELD_Q4_0 ? 18 : form == HELD_Q4_1 ? 20
                          : form == HELD_Q5_0 ? 22 : 24;
        Py_ssize_t b = 0;
        for (; b + 1 < K / 32; b += 2) {
            X8_AHEAD(row + bytes * b);
            X8_FN(block32)(form, row, b, xq, dx, xs, &acc0, &m0);
            X8_FN(block32)(form, row, b + 1, xq, dx, xs, &acc1, &m1);
        }
        if (b < K / 32)
            X8_FN(block32)(form, row, b, xq, dx, xs, &acc0, &m0);
        off = form == HELD_Q4_0 ? -8.0f : form == HELD_Q5_0 ? -16.0f
              : form == HELD_Q8_0 ? 0.0f : 1.0f;
        break;
    }
    case HELD_Q4_K: case HELD_Q5_K: {
        const int five = form == HELD_Q5_K, bytes = five ? 176 : 144;
        for (Py_ssize_t b = 0; b < K / QK_K; b++) {
            const uint8_t *blk = row + bytes * b;
            for (int l = 0; l < bytes; l += 64)
                X8_AHEAD(blk + l);
            const float d = X8_BASE(half)(blk), dmin = X8_BASE(half)(blk + 2);
            uint8_t sm[16];
            X8_BASE(k_scales)(blk + 4, sm);
            const float *dxb = dx + 8 * b, *xsb = xs + 8 * b;
            float D[8];
            for (int j = 0; j < 8; j++) {
                D[j] = d * sm[j] * dxb[j];
                m0 += (dmin * sm[8 + j]) * dxb[j] * xsb[j];
            }
            U8V qh = {0};
            if (five)
                qh = X8_FN(load32)(blk + 16);
            for (int i = 0; i < 4; i++) {
                const U8V v = X8_FN(load32)(blk + (five ? 48 : 16) + 32 * i);
                U8V lo = v & 0xF, hi = (v >> 4) & 0xF;
                if (five) {
                    lo |= ((qh >> (2 * i)) & 1) << 4;
                    hi |= ((qh >> (2 * i + 1)) & 1) << 4;
                }
                const int8_t *xb = xq + QK_K * b + 64 * i;
                acc0 += X8_FN(fl)(X8_FN(dot_us)(lo, xb)) * D[2 * i];
                acc1 += X8_FN(fl)(X8_FN(dot_us)(hi, xb + 32)) * D[2 * i + 1];
            }
        }
        off = -1.0f;
        break;
    }
    case HELD_Q6_K:  /* values (q + 32) - 32, a scale per 16 */
        for (Py_ssize_t b = 0; b < K / QK_K; b++) {
            const uint8_t *blk = row + 210 * b;
            for (int l = 0; l < 210; l += 64)
                X8_AHEAD(blk + l);
            const float d = X8_BASE(half)(blk + 208);
            const int8_t *sc = (const int8_t *)(blk + 192);
            for (int h = 0; h < 2; h++) {
                const U8V qh = X8_FN(load32)(blk + 128 + 32 * h);
                for (int r = 0; r < 4; r++) {
                    const Py_ssize_t s = 8 * b + 4 * h + r;  /* x's 32-value block */
                    const int at = 8 * h + 2 * r;            /* the run's two scales */
                    const U8V ql = X8_FN(load32)(blk + 64 * h + 32 * (r & 1));
                    const U8V u = ((ql >> (4 * (r >> 1))) & 0xF) | ((qh >> (2 * r)) & 3) << 4;
                    const float D0 = d * sc[at] * dx[s], D1 = d * sc[at + 1] * dx[s];
                    const F32V Dv = {D0, D0, D0, D0, D1, D1, D1, D1};
                    const F32V t = X8_FN(fl)(X8_FN(dot_us)(u, xq + 32 * s)) * Dv;
                    const float m = D0 * xh[2 * s] + D1 * xh[2 * s + 1];
                    if (r & 1) {
                        acc1 += t;
                        m1 += m;
                    } else {
                        acc0 += t;
                        m0 += m;
                    }
                }
            }
        }
        off = -32.0f;
        break;
    }
    const F32V a = acc0 + acc1;
    const float t = ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
    return t + off * (m0 + m1);
}

/* Rows [r0, r1) of a held block form (held_rows'): x as x8 once per part (no part waits for
 * another), then row by row, a part's rows one stream. */
static void X8_FN(x8_rows)(const gemv_args *a, Py_ssize_t r0, Py_ssize_t r1) {
    const Py_ssize_t K = a->k, B = K / 32;
    int8_t qs[X16_STACK] __attribute__((aligned(64)));
    float ds[X16_STACK / 32], ss[X16_STACK / 32], hs[X16_STACK / 16];
    const int big = K > X16_STACK;
    int8_t *xq = big ? malloc(K) : qs;
    float *dx = big ? malloc(sizeof(float) * B) : ds;
    float *xs = big ? malloc(sizeof(float) * B) : ss;
    float *xh = big ? malloc(sizeof(float) * 2 * B) : hs;
    if (!xq || !dx || !xs || !xh) {  /* no memory for a long row's x: NaN, never a wrong number */
        for (Py_ssize_t r = r0; r < r1; r++)
            a->y[r] = NAN;
    } else {
        X8_FN(quantize_x8)(a->x, K, xq, dx, xs, xh);
        const int form = a->form;
        for (Py_ssize_t r = r0; r < r1; r++) {
            float t;
            switch (form) {  /* the form a constant in each inlined copy */
            case HELD_Q8_0: t = X8_FN(x8_dot)(HELD_Q8_0, a->wh + r * a->rb, K, xq, dx, xs, xh); break;
            case HELD_Q4_0: t = X8_FN(x8_dot)(HELD_Q4_0, a->wh + r * a->rb, K, xq, dx, xs, xh); break;
            case HELD_Q4_1: t = X8_FN(x8_dot)(HELD_Q4_1, a->wh + r * a->rb, K, xq, dx, xs, xh); break;
            case HELD_Q5_0: t = X8_FN(x8_dot)(HELD_Q5_0, a->wh + r * a->rb, K, xq, dx, xs, xh); break;
            case HELD_Q5_1: t = X8_FN(x8_dot)(HELD_Q5_1, a->wh + r * a->rb, K, xq, dx, xs, xh); break;
#ifdef X8_VNNI  /* the K forms of Q4_K_M files a super-block in 64-byte vectors: _cpu_held_k.h */
            case HELD_Q4_K: t = kz_q4_k(a->wh + r * a->rb, K, xq, dx, xs); break;
            case HELD_Q6_K: t = kz_q6_k(a->wh + r * a->rb, K, xq, dx, xh); break;
#else
            case HELD_Q4_K: t = X8_FN(x8_dot)(HELD_Q4_K, a->wh + r * a->rb, K, xq, dx, xs, xh); break;
#endif
            case HELD_Q5_K: t = X8_FN(x8_dot)(HELD_Q5_K, a->wh + r * a->rb, K, xq, dx, xs, xh); break;
            default: t = X8_FN(x8_dot)(HELD_Q6_K, a->wh + r * a->rb, K, xq, dx, xs, xh); break;
            }
            a->y[r] = a->b ? t + a->b[r] : t;
        }
    }
    if (big) {
        free(xq);
        free(dx);
        free(xs);
        free(xh);
    }
}

#if W < 8
#pragma GCC diagnostic pop
#endif
#undef X8_AHEAD
#undef U8V
#undef S8V
#undef I32V
#undef F32V
#undef X8_BASE
#undef X8_FN
#undef X8_CAT
#undef X8_CAT_
