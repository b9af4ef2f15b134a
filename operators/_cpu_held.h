/* Kernels on weights held as the checkpoint stores them (_cpu.c's HELD_* forms), one body
 * included by _cpu.c once per instruction set after _cpu_gemv.h (SUFFIX, W and the target
 * region as there).
 *
 * What each computes: the float32 values llama.cpp's dequantize_row_* (ggml-quants.c) gives
 * for the stored bytes, by the same float32 operations (so the same bits: a scale times an
 * integer is exact in float32 for every block form but Q6_K's, whose one rounding is
 * llama.cpp's too; a Q4_1 / Q5_1 / K-form minimum is added with one rounding, as there), then
 * float32 products with x, summed in float32 in W lanes, x as it is (the prompt chunk's
 * GEMM, and a decode GEMV on bfloat16 and float16, widened in the registers as loaded).
 * A decode GEMV on a block form is _cpu_held_x8.h's: x rounded to 8-bit blocks, integer dot
 * products, as llama.cpp's.
 */

#define HELD_CAT_(a, b) a##b
#define HELD_CAT(a, b) HELD_CAT_(a, b)
#define HELD_FN(name) HELD_CAT(name, SUFFIX)
#define HFV HELD_FN(fv)
#define HUV HELD_FN(uv)
#define HSV HELD_FN(sv)

/* ggml-quants.c's get_scale_min_k4: sub-block j's 6-bit scale and minimum of a K super-block's
 * 12 packed bytes. */
static inline __attribute__((always_inline)) void HELD_FN(scale_min_k4)(int j, const uint8_t *q,
                                                                       uint8_t *d, uint8_t *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* A little-endian float16 (finite) as float32: F16C where the instruction set has it. */
static inline __attribute__((always_inline)) float HELD_FN(half)(const uint8_t *p) {
#if W >= 8
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
#else
    return half_to_float(p);
#endif
}

/* A K super-block's 8 sub-block scales (sc[0..8)) and minimums (sc[8..16)), 6 bits each,
 * from its 12 packed bytes at once (ggml's get_scale_min_k4 for every j, as its AVX2 dot
 * product unpacks them). */
static inline __attribute__((always_inline)) void HELD_FN(k_scales)(const uint8_t *q, uint8_t sc[16]) {
    uint32_t u[4];
    memcpy(u, q, 12);
    const uint32_t m1 = 0x3f3f3f3fu, m2 = 0x0f0f0f0fu, m3 = 0x03030303u;
    u[3] = ((u[2] >> 4) & m2) | (((u[1] >> 6) & m3) << 4);
    const uint32_t mins_lo = u[1] & m1;
    u[1] = (u[2] & m2) | (((u[0] >> 6) & m3) << 4);
    u[2] = mins_lo;
    u[0] &= m1;
    memcpy(sc, u, 16);  /* sc: u[0], u[1]; mins: u[2], u[3] */
}

/* W bytes from p as int32 lanes, zero- or sign-extended. */
static inline __attribute__((always_inline)) HSV HELD_FN(u8_lanes)(const uint8_t *p) {
#if W == 16
    return (HSV)_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
#elif W == 8
    return (HSV)_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
#else
    HSV v;
    for (int l = 0; l < W; l++)
        v[l] = p[l];
    return v;
#endif
}

static inline __attribute__((always_inline)) HSV HELD_FN(s8_lanes)(const uint8_t *p) {
#if W == 16
    return (HSV)_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p));
#elif W == 8
    return (HSV)_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
#else
    HSV v;
    for (int l = 0; l < W; l++)
        v[l] = (int8_t)p[l];
    return v;
#endif
}

static inline __attribute__((always_inline)) HFV HELD_FN(fsplat)(float f) {
    HFV v = {0};
    return v + f;
}

static inline __attribute__((always_inline)) HSV HELD_FN(isplat)(int32_t i) {
    HSV v = {0};
    return v + i;
}

/* Lanes 0 .. W - 1 plus j: which bit of a Q5 block's qh each lane's value takes. */
static inline __attribute__((always_inline)) HSV HELD_FN(iota)(int j) {
    HSV v;
    for (int l = 0; l < W; l++)
        v[l] = l + j;
    return v;
}

#define HF(v) __builtin_convertvector((v), HFV)

/* A block form's W integer values (int32 lanes) from vector v of one 32-value block (v <
 * 32 / W), its values v * W .. v * W + W - 1, as the block stores them (Q4_0's and Q5_0's
 * offsets taken off: the integer each value is d times). The K forms take theirs per
 * sub-block below. */
static inline __attribute__((always_inline)) HSV HELD_FN(q32_lanes)(int form, const uint8_t *blk,
                                                                   int v) {
    const int j = v * W % 16, high = v * W >= 16;
    switch (form) {
    case HELD_Q8_0:
        return HELD_FN(s8_lanes)(blk + 2 + v * W);
    case HELD_Q4_0: {
        const HSV u = HELD_FN(u8_lanes)(blk + 2 + j);
        return (high ? u >> 4 : u & 0xF) - 8;
    }
    case HELD_Q4_1: {
        const HSV u = HELD_FN(u8_lanes)(blk + 4 + j);
        return high ? u >> 4 : u & 0xF;
    }
    case HELD_Q5_0: case HELD_Q5_1: {
        const int at = form == HELD_Q5_0 ? 2 : 4;
        uint32_t qh;
        memcpy(&qh, blk + at, 4);
        const HSV u = HELD_FN(u8_lanes)(blk + at + 4 + j);
        const HUV h = (HUV)HELD_FN(isplat)((int32_t)qh);
        const HSV bit = (HSV)((h >> (HUV)HELD_FN(iota)(v * W)) & 1u) << 4;
        const HSV q = (high ? u >> 4 : u & 0xF) | bit;
        return form == HELD_Q5_0 ? q - 16 : q;
    }
    }
    return HELD_FN(isplat)(0);
}

/* A 32-value block's scale d and (Q4_1, Q5_1) minimum m: value = d * q (+ m). */
static inline __attribute__((always_inline)) float HELD_FN(q32_scale)(int form, const uint8_t *blk,
                                                                     float *m) {
    *m = (form == HELD_Q4_1 || form == HELD_Q5_1) ? half_to_float(blk + 2) : 0.0f;
    return half_to_float(blk);
}

/* A K super-block's sub-block s (of 8, 32 values): vector v (< 32 / W) of its integers. */
static inline __attribute__((always_inline)) HSV HELD_FN(k_lanes)(int form, const uint8_t *blk,
                                                                 int s, int v) {
    const int i = s / 2, shift = 4 * (s & 1);
    if (form == HELD_Q4_K)
        return (HELD_FN(u8_lanes)(blk + 16 + 32 * i + v * W) >> shift) & 0xF;
    /* Q5_K: the 5th bit, bit s of the 32 qh bytes */
    const HSV lo = (HELD_FN(u8_lanes)(blk + 48 + 32 * i + v * W) >> shift) & 0xF;
    const HSV hb = (HELD_FN(u8_lanes)(blk + 16 + v * W) >> s) & 1;
    return lo | hb << 4;
}

/* Q6_K's value run r (of 4, 32 values) of half h: vector v of its integers (minus 32). */
static inline __attribute__((always_inline)) HSV HELD_FN(q6_lanes)(const uint8_t *blk, int h,
                                                                  int r, int v) {
    const uint8_t *ql = blk + 64 * h + 32 * (r & 1) + v * W, *qh = blk + 128 + 32 * h + v * W;
    const HSV lo = (HELD_FN(u8_lanes)(ql) >> (4 * (r >> 1))) & 0xF;
    const HSV hi = (HELD_FN(u8_lanes)(qh) >> (2 * r)) & 3;
    return (lo | hi << 4) - 32;
}

/* nb blocks of ``form`` from p widened into out (nb * block floats), as dequantize_row_*
 * (the same float32 operations: the same values, bit for bit). */
static void HELD_FN(widen_blocks)(int form, const uint8_t *restrict p, Py_ssize_t nb,
                                  float *restrict out) {
    switch (form) {
    case HELD_F32:
        memcpy(out, p, sizeof(float) * nb);
        return;
    case HELD_BF16: {
        const uint16_t *h = (const uint16_t *)p;
        for (Py_ssize_t i = 0; i < nb; i++) {
            const uint32_t bits = (uint32_t)h[i] << 16;
            memcpy(out + i, &bits, 4);
        }
        return;
    }
    case HELD_F16:
#if W >= 8
        for (Py_ssize_t i = 0; i + 8 <= nb; i += 8)
            _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 2 * i))));
        for (Py_ssize_t i = nb / 8 * 8; i < nb; i++)
            out[i] = _cvtsh_ss((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
#else
        for (Py_ssize_t i = 0; i < nb; i++)
            out[i] = half_to_float(p + 2 * i);
#endif
        return;
    case HELD_Q8_0: case HELD_Q4_0: case HELD_Q4_1: case HELD_Q5_0: case HELD_Q5_1: {
        int bytes;
        held_block(form, &bytes);
        for (Py_ssize_t b = 0; b < nb; b++, p += bytes, out += 32) {
            float m;
            const HFV d = HELD_FN(fsplat)(HELD_FN(q32_scale)(form, p, &m)), mv = HELD_FN(fsplat)(m);
            for (int v = 0; v < 32 / W; v++)  /* d * q exact; + m one rounding, as ggml's */
                HELD_FN(xstore)(out + v * W, HF(HELD_FN(q32_lanes)(form, p, v)) * d + mv);
        }
        return;
    }
    case HELD_Q4_K: case HELD_Q5_K:
        for (Py_ssize_t b = 0; b < nb; b++, p += form == HELD_Q4_K ? 144 : 176, out += QK_K) {
            const float d = half_to_float(p), dmin = half_to_float(p + 2);
            for (int s = 0; s < 8; s++) {
                uint8_t sc, mn;
                HELD_FN(scale_min_k4)(s, p + 4, &sc, &mn);
                const HFV D = HELD_FN(fsplat)(d * sc), M = HELD_FN(fsplat)(dmin * mn);
                for (int v = 0; v < 32 / W; v++)  /* D * q exact; - M one rounding */
                    HELD_FN(xstore)(out + 32 * s + v * W, D * HF(HELD_FN(k_lanes)(form, p, s, v)) - M);
            }
        }
        return;
    case HELD_Q6_K:
        for (Py_ssize_t b = 0; b < nb; b++, p += 210, out += QK_K) {
            const float d = half_to_float(p + 208);
            const int8_t *sc = (const int8_t *)(p + 192);
            for (int h = 0; h < 2; h++)
                for (int r = 0; r < 4; r++)
                    for (int v = 0; v < 32 / W; v++) {
                        const int at = 128 * h + 32 * r + v * W;  /* a scale per 16 values */
                        const HFV D = HELD_FN(fsplat)(d * sc[at / 16]);
                        HELD_FN(xstore)(out + at, D * HF(HELD_FN(q6_lanes)(p, h, r, v)));
                    }
        }
        return;
    }
}

/* Rows [r0, r1) of a held weight (rows of rb bytes from wh, k values each) widened into out
 * (k floats a row, one after another). */
static void HELD_FN(held_widen_rows)(int form, const uint8_t *wh, Py_ssize_t rb, Py_ssize_t r0,
                                     Py_ssize_t r1, Py_ssize_t k, float *out) {
    int bytes, block = held_block(form, &bytes);
    for (Py_ssize_t r = r0; r < r1; r++)
        HELD_FN(widen_blocks)(form, wh + r * rb, k / block, out + (r - r0) * k);
}

/* The lanes of v[0 .. R) summed across, one row's sum a lane of out (R <= 4): on 16 and 8
 * lanes, halves added and then two rounds of horizontal adds for the four rows at once (13
 * instructions where four sums of 16 lanes in turn were 60 dependent adds: at k = 576 a
 * row's sum cost as much as its products). */
static inline __attribute__((always_inline)) void HELD_FN(hsum4)(const HFV *v, const int R,
                                                                float out[4]) {
#if W == 16 || W == 8
    __m256 n[4];
    for (int i = 0; i < 4; i++) {
        const HFV u = v[i < R ? i : 0];
#if W == 16
        n[i] = _mm256_add_ps(_mm512_castps512_ps256((__m512)u),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd((__m512d)u, 1)));
#else
        n[i] = (__m256)u;
#endif
    }
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(n[0], n[1]), _mm256_hadd_ps(n[2], n[3]));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
#else
    for (int i = 0; i < R; i++)
        out[i] = HELD_FN(hsum)(v[i]);
#endif
}

/* bfloat16 rows: a row's 2W values from c * 2W are W 32-bit lanes, lane l its values 2l (low
 * half: shifted up, a float32 exactly) and 2l + 1 (high half: masked), so x is met in the
 * order held_bf16_order puts it (per 2W values: the even ones, then the odd ones). Rows one
 * after another, each read whole before the next, so a part reads one stream (four rows side
 * by side, as the float32 kernel's groups, read four streams the prefetcher follows worse:
 * one stream ran 1.09x on Llama-3.2-1B-shaped rows of 2048 and 8192, 1.16x on SmolLM2's,
 * interleaved on the same tensors of the GGUF files, 2 threads, 2026-12-05); four chains a
 * row. */
static inline __attribute__((always_inline)) void HELD_FN(bf16_rows_seq)(const gemv_args *a,
                                                                        Py_ssize_t r,
                                                                        const int R) {
    const Py_ssize_t K = a->k, C = K / (2 * W), pitch = a->rb / 2;
    HFV both[GEMV_GROUP];
    for (int i = 0; i < R; i++) {
        const uint16_t *row = (const uint16_t *)(a->wh + (r + i) * a->rb);
        HFV lo0 = {0}, hi0 = {0}, lo1 = {0}, hi1 = {0};
        Py_ssize_t c = 0;
        for (; c + 1 < C; c += 2) {
            const float *x = a->xp + c * 2 * W;
            const uint16_t *p = row + c * 2 * W;
            for (int l = 0; l < 8 * W; l += 64)  /* the pair's 8W bytes, a line each */
                GEMV_AHEAD((const char *)p + l, AHEAD_BF16);
            HUV v0, v1;
            memcpy(&v0, p, sizeof v0);
            memcpy(&v1, p + 2 * W, sizeof v1);
            lo0 = HELD_FN(madd)((HFV)(v0 << 16), HELD_FN(xload)(x), lo0);
            hi0 = HELD_FN(madd)((HFV)(v0 & 0xffff0000u), HELD_FN(xload)(x + W), hi0);
            lo1 = HELD_FN(madd)((HFV)(v1 << 16), HELD_FN(xload)(x + 2 * W), lo1);
            hi1 = HELD_FN(madd)((HFV)(v1 & 0xffff0000u), HELD_FN(xload)(x + 3 * W), hi1);
        }
        if (c < C) {
            HUV v;
            memcpy(&v, row + c * 2 * W, sizeof v);
            lo0 = HELD_FN(madd)((HFV)(v << 16), HELD_FN(xload)(a->xp + c * 2 * W), lo0);
            hi0 = HELD_FN(madd)((HFV)(v & 0xffff0000u), HELD_FN(xload)(a->xp + c * 2 * W + W), hi0);
        }
        both[i] = (lo0 + hi0) + (lo1 + hi1);
    }
    float sums[4];
    HELD_FN(hsum4)(both, R, sums);
    for (int i = 0; i < R; i++) {
        const uint16_t *w = (const uint16_t *)(a->wh + (r + i) * a->rb);
        float t = sums[i];
        for (Py_ssize_t c = C * 2 * W; c < K; c++)
            t = fmaf(bf16_to_float(w[c]), a->x[c], t);
        a->y[r + i] = a->b ? t + a->b[r + i] : t;
    }
    (void)pitch;
}

/* W float16 values from p widened (F16C where the instruction set has it). */
static inline __attribute__((always_inline)) HFV HELD_FN(half_load)(const uint8_t *p) {
#if W == 16
    return (HFV)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
#elif W == 8
    return (HFV)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
#else
    HFV v;
    for (int l = 0; l < W; l++)
        v[l] = half_to_float(p + 2 * l);
    return v;
#endif
}

/* float16 rows: 2W values at a time, widened in the registers, x in order. */
static inline __attribute__((always_inline)) void HELD_FN(f16_rows)(const gemv_args *a,
                                                                   Py_ssize_t r, const int R) {
    const Py_ssize_t K = a->k, C = K / (2 * W);
    HFV lo[GEMV_GROUP], hi[GEMV_GROUP];
    for (int i = 0; i < R; i++)
        lo[i] = hi[i] = (HFV){0};
    const uint8_t *row0 = a->wh + r * a->rb;
    for (Py_ssize_t c = 0; c < C; c++) {
        const HFV x0 = HELD_FN(xload)(a->x + c * 2 * W), x1 = HELD_FN(xload)(a->x + c * 2 * W + W);
        for (int i = 0; i < R; i++) {
            const uint8_t *p = row0 + i * a->rb + c * 4 * W;
            if ((c & (16 / W - 1)) == 0)
                GEMV_AHEAD(p, AHEAD_BF16);
            lo[i] = HELD_FN(madd)(HELD_FN(half_load)(p), x0, lo[i]);
            hi[i] = HELD_FN(madd)(HELD_FN(half_load)(p + 2 * W), x1, hi[i]);
        }
    }
    HFV both[GEMV_GROUP];
    float sums[4];
    for (int i = 0; i < R; i++)
        both[i] = lo[i] + hi[i];
    HELD_FN(hsum4)(both, R, sums);
    for (int i = 0; i < R; i++) {
        const uint8_t *w = row0 + i * a->rb;
        float t = sums[i];
        for (Py_ssize_t c = C * 2 * W; c < K; c++)
            t = fmaf(half_to_float(w + 2 * c), a->x[c], t);
        a->y[r + i] = a->b ? t + a->b[r + i] : t;
    }
}

/* ---- one row of x (a decode step's GEMV) on the block forms: _cpu_held_x8.h (x as 8-bit
 * blocks, integer dot products, as llama.cpp's). */
static void HELD_FN(x8_rows)(const gemv_args *a, Py_ssize_t r0, Py_ssize_t r1);

/* Rows [r0, r1) of a held weight (gemv_rows's, for a->held): groups of GEMV_GROUP rows, the
 * last of the rest. */
static void HELD_FN(held_rows)(const gemv_args *a, Py_ssize_t r0, Py_ssize_t r1) {
    Py_ssize_t r = r0;
    switch (a->form) {
    case HELD_BF16:  /* R a constant in each call: the loops unrolled */
        for (; r + GEMV_GROUP <= r1; r += GEMV_GROUP)
            HELD_FN(bf16_rows_seq)(a, r, GEMV_GROUP);
        for (; r < r1; r++)
            HELD_FN(bf16_rows_seq)(a, r, 1);
        return;
    case HELD_F16:
        for (; r + GEMV_GROUP <= r1; r += GEMV_GROUP)
            HELD_FN(f16_rows)(a, r, GEMV_GROUP);
        for (; r < r1; r++)
            HELD_FN(f16_rows)(a, r, 1);
        return;
    default:  /* the block forms: x as 8-bit blocks (_cpu_held_x8.h) */
#if W == 16
        if (held_vnni) {
            x8_rows_vnni(a, r, r1);
            return;
        }
#endif
        HELD_FN(x8_rows)(a, r, r1);
    }
}

#undef HFV
#undef HUV
#undef HSV
#undef HF
#undef HELD_FN
#undef HELD_CAT
#undef HELD_CAT_
