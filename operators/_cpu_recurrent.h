/* The recurrent token mixers' kernels: the causal convolution carrying its last rows, Mamba's
 * selective scan, Mamba2's SSD step, the gated delta rule's step and the gated RMSNorm.
 * Included by _cpu.c once per instruction set after _cpu_chunk.h (whose vexp and gate they
 * use), with SUFFIX and W defined, as _cpu_chunk.h is.
 *
 * Semantics are the operators' (operators/causal_conv.py, selective_scan.py, ssd.py,
 * delta_rule.py, gated_norm.py), judged by their float64 references, which run each
 * recurrence a row at a time. A state the kernel updates is its operator's ``updates``
 * input; ``fresh`` (the call's start at 0) reads it as zeros. Work is split over channels
 * (the convolution, the scan) or heads (SSD, the delta rule), each computed the same way
 * whichever thread runs it: results are independent of the thread count.
 */

#ifndef CPU_RECURRENT_ONCE
#define CPU_RECURRENT_ONCE

/* torch's softplus (threshold 20), one value. */
static inline float softplus1(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* OP_CAUSAL_CONV: out (n, C) = act(b + sum_j w[j] . [state; x][t + j]), the state (K - 1, C)
 * then the last K - 1 rows of [state; x]. w packed (K, C); x rows xs apart. */
typedef struct {
    const float *x, *w, *b;
    float *out, *state;
    Py_ssize_t n, C, K, xs;
    int act, fresh;
} conv_args;

/* OP_SCAN: Mamba's selective scan over n rows, each channel d of D: its N state entries
 * decayed by exp(softplus(dt) A[d]) and written dt x B, read by C, plus Dk x, times
 * silu(z). Rows of x, dt, B, C, z apart by their strides. */
typedef struct {
    const float *x, *dt, *A, *B, *C, *Dk, *z;
    float *out, *state;
    Py_ssize_t n, D, N, xs, dts, Bs, Cs, zs;
    int fresh;
} scan_args;

/* OP_SSD: one row of Mamba2's SSD, H heads of P in G groups of N; dt clamped to
 * [dt_min, dt_max] after softplus(dt + dt_bias). */
typedef struct {
    const float *x, *dt, *A, *B, *C, *Dk, *dt_bias;
    float *out, *state;
    Py_ssize_t H, P, N, G;
    float dt_min, dt_max;
    int fresh;
} ssd_args;

/* OP_DELTA: one row of the gated delta rule, Hv value heads of Dv over Hk key heads of Dk;
 * q, k L2-normed (eps 1e-6) where l2norm, q times scale. */
typedef struct {
    const float *q, *k, *v, *a, *b, *A, *dt_bias;
    float *out, *state;
    Py_ssize_t Hk, Dk, Hv, Dv;
    float scale;
    int fresh, l2norm;
} delta_args;

/* OP_GATED_NORM: rows of ``width`` in groups of ``group``: w norm(x silu(z)) (gate_first) or
 * w norm(x) silu(z); the weight ``width`` or ``group`` long. */
typedef struct {
    const float *x, *z, *w;
    float *out;
    Py_ssize_t rows, width, group, wsize, xs, zs;
    float eps;
    int gate_first;
} gnorm_args;

#endif

#define RC_CAT_(a, b) a##b
#define RC_CAT(a, b) RC_CAT_(a, b)
#define RC_FN(name) RC_CAT(name, SUFFIX)
#define FV RC_FN(fv)

static inline __attribute__((always_inline)) float RC_FN(rc_hsum)(FV v) {
    float s = v[0];
    for (int l = 1; l < W; l++)
        s += v[l];
    return s;
}

static inline __attribute__((always_inline)) float RC_FN(silu1)(float y) {
    return y / (1.0f + expf(-y));
}

static void RC_FN(conv_cols)(const conv_args *a, Py_ssize_t c0, Py_ssize_t c1) {
    const Py_ssize_t K1 = a->K - 1, n = a->n, C = a->C;
    for (Py_ssize_t t = 0; t < n; t++) {
        float *o = a->out + t * C;
        Py_ssize_t c = c0;
        for (; c + W <= c1; c += W) {
            FV acc = a->b ? RC_FN(xload)(a->b + c) : (FV){0};
            for (Py_ssize_t j = 0; j <= K1; j++) {
                const Py_ssize_t r = t + j;  /* row of [state; x] */
                if (r < K1 && a->fresh)
                    continue;
                const float *src = r < K1 ? a->state + r * C : a->x + (r - K1) * a->xs;
                acc += RC_FN(xload)(a->w + j * C + c) * RC_FN(xload)(src + c);
            }
            RC_FN(xstore)(o + c, a->act ? RC_FN(gate)(acc, ACT_SILU) : acc);
        }
        for (; c < c1; c++) {
            float acc = a->b ? a->b[c] : 0.0f;
            for (Py_ssize_t j = 0; j <= K1; j++) {
                const Py_ssize_t r = t + j;
                if (r < K1 && a->fresh)
                    continue;
                acc += a->w[j * C + c] * (r < K1 ? a->state[r * C + c] : a->x[(r - K1) * a->xs + c]);
            }
            o[c] = a->act ? RC_FN(silu1)(acc) : acc;
        }
    }
    /* The state: row r becomes row r + n of [state; x], rows in increasing order (a row is
     * read before it is written over). */
    for (Py_ssize_t r = 0; r < K1; r++) {
        float *dst = a->state + r * C + c0;
        const Py_ssize_t from = r + n;
        if (from < K1) {
            if (a->fresh)
                memset(dst, 0, sizeof(float) * (c1 - c0));
            else
                memmove(dst, a->state + from * C + c0, sizeof(float) * (c1 - c0));
        } else {
            memcpy(dst, a->x + (from - K1) * a->xs + c0, sizeof(float) * (c1 - c0));
        }
    }
}

static void RC_FN(scan_chans)(const scan_args *a, Py_ssize_t d0, Py_ssize_t d1) {
    const Py_ssize_t N = a->N, NW = N - N % W;
    for (Py_ssize_t d = d0; d < d1; d++) {
        float *h = a->state + d * N;
        const float *A = a->A + d * N;
        if (a->fresh)
            memset(h, 0, sizeof(float) * N);
        for (Py_ssize_t t = 0; t < a->n; t++) {
            const float delta = softplus1(a->dt[t * a->dts + d]), xv = a->x[t * a->xs + d];
            const float dx = delta * xv;
            const float *B = a->B + t * a->Bs, *C = a->C + t * a->Cs;
            FV acc = {0};
            Py_ssize_t s = 0;
            for (; s < NW; s += W) {
                FV hv = RC_FN(vexp)(RC_FN(xload)(A + s) * delta) * RC_FN(xload)(h + s) +
                        RC_FN(xload)(B + s) * dx;
                RC_FN(xstore)(h + s, hv);
                acc += hv * RC_FN(xload)(C + s);
            }
            float y = RC_FN(rc_hsum)(acc);
            for (; s < N; s++) {
                h[s] = expf(delta * A[s]) * h[s] + dx * B[s];
                y += h[s] * C[s];
            }
            y += a->Dk[d] * xv;
            if (a->z)
                y *= RC_FN(silu1)(a->z[t * a->zs + d]);
            a->out[t * a->D + d] = y;
        }
    }
}

static void RC_FN(ssd_heads)(const ssd_args *a, Py_ssize_t h0, Py_ssize_t h1) {
    const Py_ssize_t P = a->P, N = a->N, NW = N - N % W, R = a->H / a->G;
    for (Py_ssize_t h = h0; h < h1; h++) {
        float delta = softplus1(a->dt[h] + a->dt_bias[h]);
        delta = delta < a->dt_min ? a->dt_min : delta > a->dt_max ? a->dt_max : delta;
        const float decay = a->fresh ? 0.0f : expf(delta * a->A[h]);
        const float *B = a->B + (h / R) * N, *C = a->C + (h / R) * N;
        for (Py_ssize_t p = 0; p < P; p++) {
            float *S = a->state + (h * P + p) * N;
            const float xv = a->x[h * P + p], dx = delta * xv;
            FV acc = {0};
            Py_ssize_t n = 0;
            for (; n < NW; n += W) {
                /* a fresh state reads as zeros (times decay 0 would keep a NaN) */
                FV s = a->fresh ? RC_FN(xload)(B + n) * dx
                                : RC_FN(xload)(S + n) * decay + RC_FN(xload)(B + n) * dx;
                RC_FN(xstore)(S + n, s);
                acc += s * RC_FN(xload)(C + n);
            }
            float y = RC_FN(rc_hsum)(acc);
            for (; n < N; n++) {
                S[n] = (a->fresh ? 0.0f : S[n] * decay) + B[n] * dx;
                y += S[n] * C[n];
            }
            a->out[h * P + p] = y + a->Dk[h] * xv;
        }
    }
}

/* ``x`` (D) L2-normed (where l2norm) times ``scale`` into ``out``. */
static inline void RC_FN(normed)(float *out, const float *x, Py_ssize_t D, int l2norm,
                                 float scale) {
    float inv = scale;
    if (l2norm) {
        float ss = 0.0f;
        for (Py_ssize_t i = 0; i < D; i++)
            ss += x[i] * x[i];
        inv = 1.0f / sqrtf(ss + 1e-6f);
        for (Py_ssize_t i = 0; i < D; i++)
            out[i] = x[i] * inv * scale;
        return;
    }
    for (Py_ssize_t i = 0; i < D; i++)
        out[i] = x[i] * inv;
}

static void RC_FN(delta_heads)(const delta_args *a, Py_ssize_t h0, Py_ssize_t h1) {
    const Py_ssize_t Dk = a->Dk, Dv = a->Dv, VW = Dv - Dv % W, R = a->Hv / a->Hk;
    float q[Dk], k[Dk], kv[Dv];
    for (Py_ssize_t h = h0; h < h1; h++) {
        const Py_ssize_t g = h / R;
        RC_FN(normed)(q, a->q + g * Dk, Dk, a->l2norm, a->scale);
        RC_FN(normed)(k, a->k + g * Dk, Dk, a->l2norm, 1.0f);
        const float decay = a->fresh ? 0.0f : expf(a->A[h] * softplus1(a->a[h] + a->dt_bias[h]));
        const float beta = 1.0f / (1.0f + expf(-a->b[h]));
        float *S = a->state + h * Dk * Dv;
        const float *v = a->v + h * Dv;
        float *o = a->out + h * Dv;
        /* kv = (decay S)^T k, then the correction delta = (v - kv) beta */
        memset(kv, 0, sizeof(float) * Dv);
        if (!a->fresh) {
            for (Py_ssize_t i = 0; i < Dk; i++) {
                const float ki = k[i] * decay;
                const float *Si = S + i * Dv;
                Py_ssize_t j = 0;
                for (; j < VW; j += W)
                    RC_FN(xstore)(kv + j, RC_FN(xload)(kv + j) + RC_FN(xload)(Si + j) * ki);
                for (; j < Dv; j++)
                    kv[j] += Si[j] * ki;
            }
        }
        for (Py_ssize_t j = 0; j < Dv; j++)
            kv[j] = (v[j] - kv[j]) * beta;
        /* S = decay S + k delta^T; o = S^T q */
        memset(o, 0, sizeof(float) * Dv);
        for (Py_ssize_t i = 0; i < Dk; i++) {
            float *Si = S + i * Dv;
            const float ki = k[i], qi = q[i];
            Py_ssize_t j = 0;
            for (; j < VW; j += W) {
                FV s = RC_FN(xload)(kv + j) * ki;
                if (!a->fresh)
                    s += RC_FN(xload)(Si + j) * decay;
                RC_FN(xstore)(Si + j, s);
                RC_FN(xstore)(o + j, RC_FN(xload)(o + j) + s * qi);
            }
            for (; j < Dv; j++) {
                Si[j] = (a->fresh ? 0.0f : Si[j] * decay) + kv[j] * ki;
                o[j] += Si[j] * qi;
            }
        }
    }
}

static void RC_FN(gnorm_rows)(const gnorm_args *a, Py_ssize_t r0, Py_ssize_t r1) {
    const Py_ssize_t G = a->group, GW = G - G % W;
    for (Py_ssize_t r = r0; r < r1; r++) {
        const float *x = a->x + r * a->xs, *z = a->z + r * a->zs;
        float *out = a->out + r * a->width;
        for (Py_ssize_t g0 = 0; g0 < a->width; g0 += G) {
            const float *w = a->w + (a->wsize == G ? 0 : g0);
            FV acc = {0};
            Py_ssize_t c = 0;
            for (; c < GW; c += W) {  /* y = x (times silu(z) first), kept in out */
                FV y = RC_FN(xload)(x + g0 + c);
                if (a->gate_first)
                    y = y * RC_FN(gate)(RC_FN(xload)(z + g0 + c), ACT_SILU);
                RC_FN(xstore)(out + g0 + c, y);
                acc += y * y;
            }
            float ss = RC_FN(rc_hsum)(acc);
            for (; c < G; c++) {
                float y = x[g0 + c];
                if (a->gate_first)
                    y *= RC_FN(silu1)(z[g0 + c]);
                out[g0 + c] = y;
                ss += y * y;
            }
            const float inv = 1.0f / sqrtf(ss / (float)G + a->eps);
            for (c = 0; c < GW; c += W) {
                FV y = RC_FN(xload)(out + g0 + c) * inv * RC_FN(xload)(w + c);
                if (!a->gate_first)
                    y = y * RC_FN(gate)(RC_FN(xload)(z + g0 + c), ACT_SILU);
                RC_FN(xstore)(out + g0 + c, y);
            }
            for (; c < G; c++) {
                float y = out[g0 + c] * inv * w[c];
                out[g0 + c] = a->gate_first ? y : y * RC_FN(silu1)(z[g0 + c]);
            }
        }
    }
}

#undef FV
#undef RC_FN
#undef RC_CAT
#undef RC_CAT_
