/* A decode step's GEMV on the K forms llama.cpp's Q4_K_M files hold (Q4_K, Q6_K), a row of
 * 256-value super-blocks against x as 8-bit blocks, in 64-byte vectors: what
 * _cpu_held_x8.h's x8_dot computes (the same integer dot products, the same float32 factors
 * by the same operations), with the per-sub-block float work done eight or sixteen
 * sub-blocks at a time. Included by _cpu.c once, inside the AVX-512 VNNI target region,
 * before the _vnni instance of _cpu_held_x8.h, whose x8_rows calls these for those forms.
 *
 * Why: x8_dot's K cases took each sub-block's scale, minimum and x's scale as scalars (a
 * dozen scalar float operations per 32 values, on the same pipes as the vectors) and its
 * products in 32-byte halves; on Zen 4 that bound the Llama-3.1-8B-shaped Q4_K_M file's
 * GEMV by its arithmetic, not by its reads (docs/design-native.md). Here a super-block's
 * eight factors d * sc_j * dx_j (Q6_K: sixteen, a scale per 16 values) are one vector (Q4_K's
 * scales and minimums unpacked in the registers); its four 64-byte dot products are folded to
 * one vector by exact int32 adds (kz_fold), so the floats take one conversion, one permute of
 * the factors to the folded lanes and one FMA a super-block; the minimums' term (Q4_K:
 * dmin * m_j * dx_j times x's block sums; Q6_K's offset 32: the factors times x's 16-value
 * sums) is one FMA a super-block into a vector summed at the row's end.
 *
 * Sums: each sub-block's integer dot product is exact (VPDPBUSD: the stored integers, 0..15
 * or 0..63, as unsigned bytes against x's int8); each lane's is converted to float32 exactly
 * and multiplied by its factor into float32 lanes, so a row's sum is of the stored values
 * times x8's values (held.reference_x) rounded only by float32 sums, in an order fixed by
 * the form and k alone (never by the thread or the rows beside it).
 */

/* v's 16 float32 lanes summed (halves added down to one). */
static inline __attribute__((always_inline)) float kz_hsum8(__m256 h);
static inline __attribute__((always_inline)) float kz_hsum(__m512 v) {
    return kz_hsum8(_mm256_add_ps(_mm512_castps512_ps256(v),
                                  _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
}

static inline __attribute__((always_inline)) float kz_hsum8(__m256 h) {
    const __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    const __m128 p = _mm_add_ps(q, _mm_movehl_ps(q, q));
    return _mm_cvtss_f32(_mm_add_ss(p, _mm_movehdup_ps(p)));
}

/* Lanes 0..15 of a permute's index: lanes 0..7 take a, 8..15 take b. */
static inline __attribute__((always_inline)) __m512i kz_two(int a, int b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32(a)), _mm256_set1_epi32(b), 1);
}

/* Four vectors of int32 dot products summed down to one, exactly: per 128-bit chunk c,
 * lane 4c + t the sum of a[t]'s chunk c (t = 0..3, a = {p, q, r, s}). Four lanes of one
 * 16-byte-aligned run of x (Q4_K: half a sub-block; Q6_K: a 16-value run) land in one lane,
 * so the floats take one conversion, one permute and one FMA a super-block, not four. */
static inline __attribute__((always_inline)) __m512i kz_fold(__m512i p, __m512i q, __m512i r,
                                                             __m512i s) {
    const __m512i pq = _mm512_add_epi32(_mm512_unpacklo_epi32(p, q), _mm512_unpackhi_epi32(p, q));
    const __m512i rs = _mm512_add_epi32(_mm512_unpacklo_epi32(r, s), _mm512_unpackhi_epi32(r, s));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(pq, rs), _mm512_unpackhi_epi64(pq, rs));
}

/* A Q4_K super-block's 12 bytes of packed 6-bit scales and minimums (at q; 16 bytes read,
 * the 4 past them its nibbles) as 16 bytes: sc_0..7, then m_0..7 (ggml's get_scale_min_k4 for
 * every j, in the registers: j < 4 from q[j] and q[j + 4] & 63; j >= 4 from q[j + 4]'s
 * nibbles and the top two bits of q[j - 4] and q[j]). */
static inline __attribute__((always_inline)) __m128i kz_scales_mins(const uint8_t *q) {
    const __m128i v = _mm_loadu_si128((const __m128i *)q);
    const __m128i a = _mm_shuffle_epi8(v, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
    const __m128i top = _mm_shuffle_epi8(v, _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7));
    const __m128i keep = _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0);
    const __m128i high = _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15);
    const __m128i lo = _mm_or_si128(_mm_and_si128(a, keep), _mm_and_si128(_mm_srli_epi16(a, 4), high));
    return _mm_or_si128(lo, _mm_and_si128(_mm_srli_epi16(top, 2), _mm_set1_epi8(0x30)));
}

/* One Q4_K row (K / 256 super-blocks of 144 bytes: d, dmin, 12 bytes of 6-bit scales and
 * minimums, 128 bytes of nibbles) against x8 (xq, dx and xs as quantize_x8 makes them): sum
 * over sub-blocks j of (d * sc_j * dx_j) (q_j . x_j) - (dmin * m_j * dx_j) xs_j. */
static float kz_q4_k(const uint8_t *row, Py_ssize_t K, const int8_t *xq, const float *dx,
                     const float *xs) {
    const __m512i low = _mm512_set1_epi8(0xF);
    /* kz_fold's lane 4c + i: sub-block 2i (c < 2) or 2i + 1 */
    const __m512i at = _mm512_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6, 1, 3, 5, 7, 1, 3, 5, 7);
    const __m512i dmins = kz_two(0, 1);
    __m512 acc = _mm512_setzero_ps(), mins = _mm512_setzero_ps();
    const Py_ssize_t ahead = gemv_ahead[AHEAD_Q8];
    for (Py_ssize_t b = 0; b < K / QK_K; b++) {
        const uint8_t *blk = row + 144 * b;
        if (ahead) {
            __builtin_prefetch((const char *)blk + ahead, 0, 3);
            __builtin_prefetch((const char *)blk + ahead + 64, 0, 3);
            __builtin_prefetch((const char *)blk + ahead + 143, 0, 3);
        }
        /* lanes 0..7 the factors d * sc_j * dx_j (x8_dot's D[j]), 8..15 dmin * m_j * dx_j */
        uint32_t dd;
        memcpy(&dd, blk, 4);
        const __m512 d2 = _mm512_permutexvar_ps(dmins, _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi32_si128((int)dd))));
        const __m512 sm = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(kz_scales_mins(blk + 4)));
        const __m512 F = _mm512_mul_ps(_mm512_mul_ps(d2, sm), _mm512_broadcast_f32x8(_mm256_loadu_ps(dx + 8 * b)));
        mins = _mm512_fmadd_ps(F, _mm512_broadcast_f32x8(_mm256_loadu_ps(xs + 8 * b)), mins);
        const int8_t *xb = xq + QK_K * b;
        __m512i d[4];
        for (int i = 0; i < 4; i++) {  /* sub-blocks 2i (low nibbles: lanes 0..7) and 2i + 1 */
            const __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * i)));
            const __m512i u = _mm512_and_si512(_mm512_mask_srli_epi16(v, 0xFFFF0000u, v, 4), low);
            d[i] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, _mm512_loadu_si512(xb + 64 * i));
        }
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(kz_fold(d[0], d[1], d[2], d[3])),
                              _mm512_permutexvar_ps(at, F), acc);
    }
    /* mins' lanes 8..15 hold the minimums' terms (0..7: the factors times xs, unused) */
    return kz_hsum(acc) - kz_hsum8(_mm512_extractf32x8_ps(mins, 1));
}

/* One Q6_K row (K / 256 super-blocks of 210 bytes: 128 of low nibbles, 64 of high bit pairs,
 * 16 int8 scales, d) against x8 (xh: x's sums per 16 values): sum over 16-value runs j of
 * (d * sc_j * dx_j) ((q_j + 32) . x_j - 32 xh_j), the stored 0..63 as unsigned bytes. */
static float kz_q6_k(const uint8_t *row, Py_ssize_t K, const int8_t *xq, const float *dx,
                     const float *xh) {
    const __m512i low = _mm512_set1_epi8(0xF), two = _mm512_set1_epi8(3);
    const __m512i pairs = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    /* kz_fold's lane 4c + t: run 4t + c's sum, t the vector (h = t / 2; runs r = 0, 1 or 2, 3) */
    const __m512i at = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    __m512 acc = _mm512_setzero_ps(), offs = _mm512_setzero_ps();
    const Py_ssize_t ahead = gemv_ahead[AHEAD_Q8];
    for (Py_ssize_t b = 0; b < K / QK_K; b++) {
        const uint8_t *blk = row + 210 * b;
        if (ahead) {
            __builtin_prefetch((const char *)blk + ahead, 0, 3);
            __builtin_prefetch((const char *)blk + ahead + 64, 0, 3);
            __builtin_prefetch((const char *)blk + ahead + 128, 0, 3);
            __builtin_prefetch((const char *)blk + ahead + 209, 0, 3);
        }
        const __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 192))));
        const __m512 dx2 = _mm512_permutexvar_ps(pairs, _mm512_castps256_ps512(_mm256_loadu_ps(dx + 8 * b)));
        /* x8_dot's D = d * sc[at] * dx[s], a lane each of the 16 runs */
        const __m512 F = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(half_avx512(blk + 208)), sc), dx2);
        offs = _mm512_fmadd_ps(F, _mm512_loadu_ps(xh + 16 * b), offs);
        const int8_t *xb = xq + QK_K * b;
        __m512i d[4];
        for (int h = 0; h < 2; h++) {
            const __m512i ql = _mm512_loadu_si512(blk + 64 * h);
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
            /* runs r = 0, 1 (low nibbles; qh's bits 0-1, 2-3) and r = 2, 3 (high; 4-5, 6-7) */
            const __m512i h01 = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1);
            const __m512i u01 = _mm512_or_si512(_mm512_and_si512(ql, low),
                                                _mm512_slli_epi16(_mm512_and_si512(h01, two), 4));
            const __m512i u23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low),
                                                _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(h01, 4), two), 4));
            d[2 * h] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u01, _mm512_loadu_si512(xb + 128 * h));
            d[2 * h + 1] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u23, _mm512_loadu_si512(xb + 128 * h + 64));
        }
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(kz_fold(d[0], d[1], d[2], d[3])),
                              _mm512_permutexvar_ps(at, F), acc);
    }
    return kz_hsum(acc) - 32.0f * kz_hsum(offs);
}
