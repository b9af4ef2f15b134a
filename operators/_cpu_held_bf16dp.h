/* A decode step's GEMV on held bfloat16 rows by AVX-512 BF16 dot products (VDPBF16PS), x
 * rounded to bfloat16 first, as llama.cpp's ggml_vec_dot_bf16 meets it. Compiled once, inside
 * an avx512bf16 target region of _cpu.c, used where the CPU has it and bf16dp() is on. */

static void bf16dp_rows(const gemv_args *a, Py_ssize_t r0, Py_ssize_t r1) {
    const Py_ssize_t K = a->k, C = K / 32;
    uint16_t stack[X16_STACK] __attribute__((aligned(64)));
    uint16_t *xb = K <= X16_STACK ? stack : malloc(sizeof(uint16_t) * K);
    if (!xb) {
        for (Py_ssize_t r = r0; r < r1; r++)
            a->y[r] = NAN;
        return;
    }
    for (Py_ssize_t c = 0; c < C; c++)  /* to nearest, ties to even: float_to_bf16's */
        _mm512_storeu_si512((void *)(xb + 32 * c),
                            (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(a->x + 32 * c + 16),
                                                         _mm512_loadu_ps(a->x + 32 * c)));
    for (Py_ssize_t j = 32 * C; j < K; j++)
        xb[j] = float_to_bf16(a->x[j]);
    for (Py_ssize_t r = r0; r < r1; r++) {
        const uint16_t *row = (const uint16_t *)(a->wh + r * a->rb);
        __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
        Py_ssize_t c = 0;
        for (; c + 4 <= C; c += 4) {
            const uint16_t *p = row + 32 * c;
            for (int l = 0; l < 4; l++)
                GEMV_AHEAD_BF16((const char *)p + 64 * l);
            acc0 = _mm512_dpbf16_ps(acc0, (__m512bh)_mm512_loadu_si512(p), (__m512bh)_mm512_loadu_si512(xb + 32 * c));
            acc1 = _mm512_dpbf16_ps(acc1, (__m512bh)_mm512_loadu_si512(p + 32), (__m512bh)_mm512_loadu_si512(xb + 32 * c + 32));
            acc2 = _mm512_dpbf16_ps(acc2, (__m512bh)_mm512_loadu_si512(p + 64), (__m512bh)_mm512_loadu_si512(xb + 32 * c + 64));
            acc3 = _mm512_dpbf16_ps(acc3, (__m512bh)_mm512_loadu_si512(p + 96), (__m512bh)_mm512_loadu_si512(xb + 32 * c + 96));
        }
        for (; c < C; c++)
            acc0 = _mm512_dpbf16_ps(acc0, (__m512bh)_mm512_loadu_si512(row + 32 * c),
                                    (__m512bh)_mm512_loadu_si512(xb + 32 * c));
        float t = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3)));
        for (Py_ssize_t j = 32 * C; j < K; j++)
            t = fmaf(bf16_to_float(row[j]), bf16_to_float(xb[j]), t);
        a->y[r] = a->b ? t + a->b[r] : t;
    }
    if (xb != stack)
        free(xb);
}
