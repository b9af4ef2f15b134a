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
 * eight factors d * sc_j * dx_j (Q6_K: sixteen, a scale per 16 values) are one vector,
 * spread to the dot products' lanes by a permute; the minimums' term (Q4_K: dmin * m_j * dx_j
 * times x's block sums; Q6_K's offset 32: the factors times x's 16-value sums) is one
 * fused multiply-add a super-block into a vector summed at the row's end.
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

/* Lanes 4q .. 4q + 3 take a + q (q < 4). */
static inline __attribute__((always_inline)) __m512i kz_four(int a) {
    return _mm512_setr_epi32(a, a, a, a, a + 1, a + 1, a + 1, a + 1, a + 2, a + 2, a + 2, a + 2,
                             a + 3, a + 3, a + 3, a + 3);
}

/* One Q4_K row (K / 256 super-blocks of 144 bytes: d, dmin, 12 bytes of 6-bit scales and
 * minimums, 128 bytes of nibbles) against x8 (xq, dx and xs as quantize_x8 makes them): sum
 * over sub-blocks j of (d * sc_j * dx_j) (q_j . x_j) - (dmin * m_j * dx_j) xs_j. */
static float kz_q4_k(const uint8_t *row, Py_ssize_t K, const int8_t *xq, const float *dx,
                     const float *xs) {
    const __m512i low = _mm512_set1_epi8(0xF);
    const __m512i ix[4] = {kz_two(0, 1), kz_two(2, 3), kz_two(4, 5), kz_two(6, 7)};
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    __m256 mins = _mm256_setzero_ps();
    for (Py_ssize_t b = 0; b < K / QK_K; b++) {
        const uint8_t *blk = row + 144 * b;
        if (gemv_ahead[AHEAD_Q8]) {
            __builtin_prefetch((const char *)blk + gemv_ahead[AHEAD_Q8], 0, 3);
            __builtin_prefetch((const char *)blk + gemv_ahead[AHEAD_Q8] + 64, 0, 3);
            __builtin_prefetch((const char *)blk + gemv_ahead[AHEAD_Q8] + 143, 0, 3);
        }
        uint8_t sm[16];
        k_scales_avx512(blk + 4, sm);
        const __m256 dxv = _mm256_loadu_ps(dx + 8 * b);
        const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)sm)));
        const __m256 mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(sm + 8))));
        /* x8_dot's D[j] = d * sm[j] * dxb[j], and (dmin * sm[8 + j]) * dxb[j] * xsb[j] */
        const __m512 F = _mm512_castps256_ps512(
            _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(half_avx512(blk)), sc), dxv));
        mins = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(half_avx512(blk + 2)), mn), dxv),
                               _mm256_loadu_ps(xs + 8 * b), mins);
        const int8_t *xb = xq + QK_K * b;
        for (int i = 0; i < 4; i++) {  /* sub-blocks 2i (low nibbles) and 2i + 1 (high) */
            const __m256i v = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * i));
            const __m512i u = _mm512_and_si512(
                _mm512_inserti64x4(_mm512_castsi256_si512(v), _mm256_srli_epi16(v, 4), 1), low);
            const __m512i d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u,
                                                  _mm512_loadu_si512(xb + 64 * i));
            const __m512 t = _mm512_permutexvar_ps(ix[i], F);
            if (i & 1)
                acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), t, acc1);
            else
                acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), t, acc0);
        }
    }
    return kz_hsum(_mm512_add_ps(acc0, acc1)) - kz_hsum8(mins);
}

/* One Q6_K row (K / 256 super-blocks of 210 bytes: 128 of low nibbles, 64 of high bit pairs,
 * 16 int8 scales, d) against x8 (xh: x's sums per 16 values): sum over 16-value runs j of
 * (d * sc_j * dx_j) ((q_j + 32) . x_j - 32 xh_j), the stored 0..63 as unsigned bytes. */
static float kz_q6_k(const uint8_t *row, Py_ssize_t K, const int8_t *xq, const float *dx,
                     const float *xh) {
    const __m512i low = _mm512_set1_epi8(0xF), two = _mm512_set1_epi8(3);
    const __m512i pairs = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    const __m512i ix[4] = {kz_four(0), kz_four(4), kz_four(8), kz_four(12)};
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps(), offs = _mm512_setzero_ps();
    for (Py_ssize_t b = 0; b < K / QK_K; b++) {
        const uint8_t *blk = row + 210 * b;
        if (gemv_ahead[AHEAD_Q8]) {
            __builtin_prefetch((const char *)blk + gemv_ahead[AHEAD_Q8], 0, 3);
            __builtin_prefetch((const char *)blk + gemv_ahead[AHEAD_Q8] + 64, 0, 3);
            __builtin_prefetch((const char *)blk + gemv_ahead[AHEAD_Q8] + 128, 0, 3);
            __builtin_prefetch((const char *)blk + gemv_ahead[AHEAD_Q8] + 209, 0, 3);
        }
        const __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 192))));
        const __m512 dx2 = _mm512_permutexvar_ps(pairs, _mm512_castps256_ps512(_mm256_loadu_ps(dx + 8 * b)));
        /* x8_dot's D = d * sc[at] * dx[s] */
        const __m512 F = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(half_avx512(blk + 208)), sc), dx2);
        offs = _mm512_fmadd_ps(F, _mm512_loadu_ps(xh + 16 * b), offs);
        const int8_t *xb = xq + QK_K * b;
        for (int h = 0; h < 2; h++) {
            const __m512i ql = _mm512_loadu_si512(blk + 64 * h);
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
            /* runs r = 0, 1 (low nibbles; qh's bits 0-1, 2-3) and r = 2, 3 (high; 4-5, 6-7) */
            const __m512i h01 = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1);
            const __m512i u01 = _mm512_or_si512(_mm512_and_si512(ql, low),
                                                _mm512_slli_epi16(_mm512_and_si512(h01, two), 4));
            const __m512i u23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low),
                                                _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(h01, 4), two), 4));
            const __m512i d01 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u01,
                                                    _mm512_loadu_si512(xb + 128 * h));
            const __m512i d23 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u23,
                                                    _mm512_loadu_si512(xb + 128 * h + 64));
            acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d01), _mm512_permutexvar_ps(ix[2 * h], F), acc0);
            acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d23), _mm512_permutexvar_ps(ix[2 * h + 1], F), acc1);
        }
    }
    return kz_hsum(_mm512_add_ps(acc0, acc1)) - 32.0f * kz_hsum(offs);
}
