/* A prompt chunk's attention, and the row bodies every rms_norm, activation and rope step
 * runs (a chunk's rows split over the pool, a decode step's one row on the calling thread):
 * one body included by _cpu.c once per instruction set (as _cpu_gemv.h: SUFFIX and W, float32
 * lanes a vector holds, defined by the includer, inside its target region; the vectors
 * _cpu_vec.h's).
 *
 * Semantics are operators.attention.Attention's (causal GQA over a KV cache, an optional
 * sliding window, softcap, ALiBi slopes and ring), judged by its float64 reference. The work is split
 * into units, one head's block of 2W query rows each, and a unit is computed the same way
 * whichever thread runs it: every result is independent of the thread count.
 *
 * A unit: its queries (times the scale) packed transposed, (head_dim, 2W); the scores of
 * every key it may see, kept transposed, (keys, 2W), each key's 2W scores two vectors, so
 * the softmax runs across the queries' lanes; then the values' sums the same way, (2W) per
 * value column, divided by the softmax's sum and written to the unit's rows of out.
 */

#ifndef CPU_CHUNK_ONCE
#define CPU_CHUNK_ONCE
/* Activations by their operators/activation.py names: silu (and swish), the tanh form of
 * gelu (gelu_new, gelu_pytorch_tanh, ...), the erf form (gelu, gelu_python), relu,
 * quick_gelu, relu2 (relu squared), sigmoid (a gated attention output's). The first two run
 * in vectors (gate below), the rest one value at a time (act_one). */
enum { ACT_SILU, ACT_GELU_TANH, ACT_GELU_ERF, ACT_RELU, ACT_QUICK_GELU, ACT_RELU2, ACT_SIGMOID,
       ACT_COUNT };

/* gelu's erf form as operators/activation.py's _gelu32: 0.5 x erfc(-x / sqrt(2)), no
 * cancellation for negative x. */
static inline float gelu_erf(float x) { return erfcf(x * -0.70710678118654752f) * x * 0.5f; }

static inline float act_one(float x, int act) {
    switch (act) {
    case ACT_GELU_ERF: return gelu_erf(x);
    case ACT_RELU: return x < 0.0f ? 0.0f : x;  /* NaN stays NaN, as numpy's maximum */
    case ACT_RELU2: return x < 0.0f ? 0.0f : x * x;
    case ACT_SIGMOID: return 1.0f / (1.0f + expf(-x));  /* as activation.py's _sigmoid32 */
    default: return x / (1.0f + expf(-1.702f * x));  /* quick_gelu */
    }
}
#endif

#define CH_CAT_(a, b) a##b
#define CH_CAT(a, b) CH_CAT_(a, b)
#define CH_FN(name) CH_CAT(name, SUFFIX)

/* fv, sv, xload and xstore: _cpu_vec.h's. */
#define FV CH_FN(fv)
#define IV CH_FN(sv)

/* a where mask (all ones) else b. */
static inline __attribute__((always_inline)) FV CH_FN(pick)(IV mask, FV a, FV b) {
    return (FV)(((IV)a & mask) | ((IV)b & ~mask));
}

/* exp(x) for x <= 0, as _cpu.c's exp256 (Cephes' expf: x = n ln2 + r, a degree-6
 * polynomial in r, times 2^n; below -87.3, 0), in W lanes of any width. n is rounded to
 * nearest by adding and taking away 1.5 * 2^23 (|x log2 e| < 2^22 here). */
static inline __attribute__((always_inline)) FV CH_FN(vexp)(FV x) {
    const FV lo = (FV){0} + -87.33654f;
    IV under = x < lo;
    x = CH_FN(pick)(under, lo, x);
    FV n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    FV r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    FV p = (FV){0} + 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + (r + 1.0f);
    IV e = (__builtin_convertvector(n, IV) + 127) << 23;
    return (FV)((IV)(p * (FV)e) & ~under);
}

/* MR keys' scores (rows kr[0..MR), float32 or bf16's bfloat16 bits) against the packed
 * queries qp (D, 2W), into st. */
static inline __attribute__((always_inline)) void CH_FN(scores)(const float *qp, int D,
                                                               const void *const *kr,
                                                               float *st, const int MR,
                                                               const int bf16) {
    FV c[6][2];
    for (int r = 0; r < MR; r++)
        c[r][0] = c[r][1] = (FV){0};
    for (int p = 0; p < D; p++) {
        FV x0 = CH_FN(xload)(qp + p * 2 * W), x1 = CH_FN(xload)(qp + p * 2 * W + W);
        for (int r = 0; r < MR; r++) {
            float k = kv_at(kr[r], p, bf16);
            c[r][0] += x0 * k;
            c[r][1] += x1 * k;
        }
    }
    for (int r = 0; r < MR; r++) {
        CH_FN(xstore)(st + r * 2 * W, c[r][0]);
        CH_FN(xstore)(st + r * 2 * W + W, c[r][1]);
    }
}

/* Value columns [d0, d0 + MR) of the unit's 2W rows: sum over keys j of st[j] v_j[d]. */
static inline __attribute__((always_inline)) void CH_FN(sums)(const chunk_args *a,
                                                             const char *V, Py_ssize_t lo,
                                                             Py_ssize_t hi, const float *st,
                                                             int d0, FV *o, const int MR,
                                                             const int bf16) {
    const Py_ssize_t pitch = (Py_ssize_t)a->D * (bf16 ? 2 : 4);  /* bytes a row */
    FV c[6][2];
    for (int r = 0; r < MR; r++)
        c[r][0] = c[r][1] = (FV){0};
    const char *row = V + (lo % a->rows) * pitch;
    for (Py_ssize_t j = lo; j < hi; j++) {
        FV p0 = CH_FN(xload)(st + (j - lo) * 2 * W), p1 = CH_FN(xload)(st + (j - lo) * 2 * W + W);
        for (int r = 0; r < MR; r++) {
            float v = kv_at(row, d0 + r, bf16);
            c[r][0] += p0 * v;
            c[r][1] += p1 * v;
        }
        row += pitch;
        if (row == V + a->rows * pitch)
            row = V;
    }
    for (int r = 0; r < MR; r++)
        o[2 * r] = c[r][0], o[2 * r + 1] = c[r][1];
}

/* One unit: head h, query rows [i0, i0 + 2W) of the chunk (fewer at its end); the caches
 * float32, or (bf16) bfloat16 bits. */
static inline __attribute__((always_inline)) void CH_FN(chunk_unit_of)(const chunk_args *a,
                                                                      int h, Py_ssize_t i0,
                                                                      float *qp, float *st,
                                                                      const int bf16) {
    const int D = a->D, G = a->G, R = a->H / G, HD = a->H * D;
    const int P = 2 * W;
    const Py_ssize_t pitch = (Py_ssize_t)D * (bf16 ? 2 : 4);  /* bytes a cache row */
    const Py_ssize_t i1 = i0 + P < a->n ? i0 + P : a->n, nb = i1 - i0;
    const Py_ssize_t hi = a->start + i1;
    const Py_ssize_t lo = a->window > 0 && a->start + i0 - a->window + 1 > 0
                              ? a->start + i0 - a->window + 1 : 0;
    const char *K = (const char *)a->keys + (Py_ssize_t)(h / R) * a->L * pitch;
    const char *V = (const char *)a->values + (Py_ssize_t)(h / R) * a->L * pitch;
    for (int p = 0; p < D; p++)
        for (int i = 0; i < P; i++)
            qp[p * P + i] = i < nb ? a->q[(i0 + i) * a->qstride + h * D + p] * a->scale : 0.0f;
    /* Scores, six keys at a time; keys are rows p % rows (a ring's wrap) */
    Py_ssize_t j = lo;
    for (; j + 6 <= hi; j += 6) {
        const void *kr[6];
        for (int r = 0; r < 6; r++)
            kr[r] = K + ((j + r) % a->rows) * pitch;
        CH_FN(scores)(qp, D, kr, st + (j - lo) * P, 6, bf16);
    }
    for (; j < hi; j++) {
        const void *kr[1] = {K + (j % a->rows) * pitch};
        CH_FN(scores)(qp, D, kr, st + (j - lo) * P, 1, bf16);
    }
    /* Each lane's query position (padding lanes: the last row's, so never all masked). */
    IV qpos[2];
    for (int v = 0; v < 2; v++)
        for (int i = 0; i < W; i++) {
            Py_ssize_t row = i0 + v * W + i < i1 ? i0 + v * W + i : i1 - 1;
            qpos[v][i] = (int32_t)(a->start + row);
        }
    const FV neg = (FV){0} + -INFINITY;
    const float slope = a->alibi ? a->alibi[h] : 0.0f;
    FV m[2] = {neg, neg};
    for (j = lo; j < hi; j++) {
        float *s = st + (j - lo) * P;
        if (a->softcap > 0.0f)
            for (int i = 0; i < P; i++)
                s[i] = tanhf(s[i] / a->softcap) * a->softcap;
        IV kp = (IV){0} + (int32_t)j;
        for (int v = 0; v < 2; v++) {
            IV seen = kp <= qpos[v];
            if (a->window > 0)
                seen &= kp > qpos[v] - (int32_t)a->window;
            FV x = CH_FN(xload)(s + v * W);
            if (a->alibi)  /* after the softcap, by each lane's own query position */
                x += __builtin_convertvector(kp - qpos[v], FV) * slope;
            x = CH_FN(pick)(seen, x, neg);
            CH_FN(xstore)(s + v * W, x);
            m[v] = CH_FN(pick)(x > m[v], x, m[v]);
        }
    }
    FV l[2] = {{0}, {0}};
    for (j = lo; j < hi; j++) {
        float *s = st + (j - lo) * P;
        for (int v = 0; v < 2; v++) {
            FV e = CH_FN(vexp)(CH_FN(xload)(s + v * W) - m[v]);
            CH_FN(xstore)(s + v * W, e);
            l[v] += e;
        }
    }
    float *out = a->out + i0 * HD + h * D;
    FV o[12];
    int d = 0;
    for (; d + 6 <= D; d += 6) {
        CH_FN(sums)(a, V, lo, hi, st, d, o, 6, bf16);
        for (int r = 0; r < 6; r++)
            for (int v = 0; v < 2; v++) {
                FV y = o[2 * r + v] / l[v];
                for (int i = 0; i < W && v * W + i < nb; i++)
                    out[(v * W + i) * HD + d + r] = y[i];
            }
    }
    if (d < D) {  /* the last D % 6 columns in one sweep of the keys, not one sweep each */
        const int rest = D - d;
        switch (rest) {
        case 1: CH_FN(sums)(a, V, lo, hi, st, d, o, 1, bf16); break;
        case 2: CH_FN(sums)(a, V, lo, hi, st, d, o, 2, bf16); break;
        case 3: CH_FN(sums)(a, V, lo, hi, st, d, o, 3, bf16); break;
        case 4: CH_FN(sums)(a, V, lo, hi, st, d, o, 4, bf16); break;
        default: CH_FN(sums)(a, V, lo, hi, st, d, o, 5, bf16); break;
        }
        for (int r = 0; r < rest; r++)
            for (int v = 0; v < 2; v++) {
                FV y = o[2 * r + v] / l[v];
                for (int i = 0; i < W && v * W + i < nb; i++)
                    out[(v * W + i) * HD + d + r] = y[i];
            }
    }
}

static void CH_FN(chunk_unit)(const chunk_args *a, int h, Py_ssize_t i0, float *qp, float *st) {
    if (a->kv16)
        CH_FN(chunk_unit_of)(a, h, i0, qp, st, 1);
    else
        CH_FN(chunk_unit_of)(a, h, i0, qp, st, 0);
}

/* Units [u0, u1) of (head, block) pairs, head-major. */
static void CH_FN(chunk_units)(const chunk_args *a, Py_ssize_t u0, Py_ssize_t u1, float *scratch) {
    const Py_ssize_t blocks = (a->n + 2 * W - 1) / (2 * W);
    float *qp = scratch, *st = scratch + (Py_ssize_t)a->D * 2 * W;
    for (Py_ssize_t u = u0; u < u1; u++)
        CH_FN(chunk_unit)(a, (int)(u / blocks), u % blocks * 2 * W, qp, st);
}

/* ---- a prompt chunk's rows, elementwise ---------------------------------------------- */

/* W values from p, n <= W of them (the rest 0): a row's tail computed as its whole vectors. */
static inline __attribute__((always_inline)) FV CH_FN(cpart)(const float *p, Py_ssize_t n) {
    FV v = {0};
    memcpy(&v, p, sizeof(float) * n);
    return v;
}

/* act(x) for silu and gelu's tanh form, in W lanes: exp(-|x|) serves both signs; silu(x) =
 * x / (1 + e) for x >= 0, x e / (1 + e) below; gelu's inner sum operation for operation as
 * operators/activation.py's _gelu_tanh32, tanh(z) = sign(z) (1 - e) / (1 + e), e =
 * exp(-2|z|). */
static inline __attribute__((always_inline)) FV CH_FN(gate)(FV x, int act) {
    const IV sign = (IV){0} + (int32_t)0x80000000;
    if (act == ACT_SILU) {
        FV e = CH_FN(vexp)((FV)((IV)x | sign));
        return CH_FN(pick)(x < 0.0f, x * e, x) / (e + 1.0f);
    }
    FV t = x * x;
    t = t * x;
    t = t * 0.044715f;
    t = t + x;
    t = t * 0.7978845608028654f;
    FV e = CH_FN(vexp)((FV)((IV)t & ~sign) * -2.0f);
    FV th = (FV)((IV)((1.0f - e) / (1.0f + e)) | ((IV)t & sign));
    return x * (th + 1.0f) * 0.5f;
}

/* act(x) (* u, where a->u is given) per row of d: the gated activation of a gated MLP, and
 * the plain activation; silu and gelu's tanh form in vectors (a row's tail as a part
 * vector), the others one value at a time (act_one). */
static void CH_FN(gated_rows)(const rows_args *a, Py_ssize_t r0, Py_ssize_t r1) {
    const Py_ssize_t m = a->d;
    const int vec = a->act == ACT_SILU || a->act == ACT_GELU_TANH;
    const Py_ssize_t MW = vec ? m - m % W : 0;
    for (Py_ssize_t r = r0; r < r1; r++) {
        const float *g = a->x + r * a->xs, *u = a->u ? a->u + r * a->us : NULL;
        float *out = a->out + r * a->os;
        for (Py_ssize_t c = 0; c < MW; c += W) {
            FV y = CH_FN(gate)(CH_FN(xload)(g + c), a->act);
            CH_FN(xstore)(out + c, u ? y * CH_FN(xload)(u + c) : y);
        }
        if (vec && MW < m) {
            FV y = CH_FN(gate)(CH_FN(cpart)(g + MW, m - MW), a->act);
            if (u)
                y = y * CH_FN(cpart)(u + MW, m - MW);
            memcpy(out + MW, &y, sizeof(float) * (m - MW));
        } else if (!vec) {
            for (Py_ssize_t c = 0; c < m; c++)
                out[c] = u ? act_one(g[c], a->act) * u[c] : act_one(g[c], a->act);
        }
    }
}

/* x / sqrt(mean(x^2) + eps) * w per row; row r of (rows / inner, inner, d) at r / inner *
 * xs + r % inner * d; its weight row r % inner (one per head) or the one weight row. */
static void CH_FN(rms_rows)(const rows_args *a, Py_ssize_t r0, Py_ssize_t r1) {
    const Py_ssize_t d = a->d, DW = d - d % W;
    for (Py_ssize_t r = r0; r < r1; r++) {
        const Py_ssize_t o = r / a->inner, i = r % a->inner;
        const float *x = a->x + o * a->xs + i * d, *w = a->u + (a->wrows > 1 ? i * d : 0);
        float *out = a->out + o * a->os + i * d;
        FV acc = {0};
        for (Py_ssize_t c = 0; c < DW; c += W) {
            FV v = CH_FN(xload)(x + c);
            acc += v * v;
        }
        float sum = acc[0];
        for (int l = 1; l < W; l++)
            sum += acc[l];
        for (Py_ssize_t c = DW; c < d; c++)
            sum += x[c] * x[c];
        const float inv = 1.0f / sqrtf(sum / (float)d + a->eps);
        for (Py_ssize_t c = 0; c < DW; c += W)
            CH_FN(xstore)(out + c, CH_FN(xload)(x + c) * inv * CH_FN(xload)(w + c));
        for (Py_ssize_t c = DW; c < d; c++)
            out[c] = x[c] * inv * w[c];
    }
}

/* Rotary embedding of rows [r0, r1) of (n, heads, D), as operators.rope.Rope's kernel:
 * x * cos + partner(x) * sin per column of the tables (packed per column), columns past
 * the rotary width copied. */
static void CH_FN(rope_rows)(const rope_args *a, Py_ssize_t r0, Py_ssize_t r1) {
    const Py_ssize_t D = a->D, R = a->R, half = R / 2, HW = half - half % W;
    for (Py_ssize_t r = r0; r < r1; r++) {
        const float *cs = a->cos + (a->start + r) * R, *sn = a->sin + (a->start + r) * R;
        for (Py_ssize_t h = 0; h < a->heads; h++) {
            const float *x = a->x + r * a->xs + h * D;
            float *out = a->out + (r * a->heads + h) * D;
            if (a->interleaved) {
                for (Py_ssize_t c = 0; c < R; c++)
                    out[c] = x[c] * cs[c] + x[c ^ 1] * sn[c];
            } else {
                for (Py_ssize_t c = 0; c < HW; c += W) {
                    FV lo = CH_FN(xload)(x + c), hi = CH_FN(xload)(x + half + c);
                    CH_FN(xstore)(out + c, lo * CH_FN(xload)(cs + c) + hi * CH_FN(xload)(sn + c));
                    CH_FN(xstore)(out + half + c, hi * CH_FN(xload)(cs + half + c) +
                                                      lo * CH_FN(xload)(sn + half + c));
                }
                for (Py_ssize_t c = HW; c < half; c++) {
                    out[c] = x[c] * cs[c] + x[c + half] * sn[c];
                    out[c + half] = x[c + half] * cs[c + half] + x[c] * sn[c + half];
                }
            }
            memcpy(out + R, x + R, sizeof(float) * (D - R));
        }
    }
}

#undef FV
#undef IV
#undef CH_FN
#undef CH_CAT
#undef CH_CAT_
