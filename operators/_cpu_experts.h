/* A decode step's mixture of experts: its router (operators/router.py) and its routed experts
 * (operators/experts.py) for one row, included by _cpu.c after its GEMV instances and before
 * _cpu_program.h (whose OP_ROUTER and OP_EXPERTS steps run these).
 *
 * Why: a decode step of a mixture reads only the k experts its router chose, as llama.cpp's
 * mul_mat_id: the experts' weights stay stacked (E, rows, cols) in any form the GEMV reads
 * (float32 rows, bfloat16 or Q8_0 row groups, each expert's matrix grouped on its own:
 * formats.py), and each chosen expert's matrix is a slice at e * its size. The k experts'
 * first products are one task on the pool (each thread a share of every expert's rows, in
 * whole row groups, so no group straddles two experts), their activations on the calling
 * thread (k * I values), their down products a second task, then the weighted sum in the
 * slots' order (ascending experts, transformers' order) on the calling thread: two pool
 * wake-ups a layer, as a dense MLP's gate/up and down GEMVs.
 *
 * A prompt chunk's rows (experts_chunk) go by expert, as llama.cpp's mul_mat_id: the rows that
 * chose expert e gathered into one panel, one GEMM on e's slice of w_in (gemm_held_run: the
 * dense prompt GEMM, on any held form) and one on its slice of w_down, each output row added
 * into its row's sum weighted; the experts in ascending order, so each row's slots are added
 * in the decode step's order. Experts no row chose are not read.
 *
 * The stacks are in a decode form (``form``: the GEMV's row groups, a decode step's alone) or
 * held (``held`` >= 0: _cpu.c's HELD_* code, each expert's rows the held form's rows one after
 * another: (E * rows) rows of held_row_bytes(held, cols) bytes), which both steps read.
 *
 * Every result is the operators' float64 references' to within their tolerance; a row's
 * values do not depend on the thread count (the GEMV's sums never do).
 */

/* _cpu.c's and _cpu_program.h's, defined after this file. */
static void held_bf16_order(const float *x, Py_ssize_t k, int lanes, float *xp);
static void rows_run(task_fn fn, const void *args, Py_ssize_t rows, Py_ssize_t work);

/* An expert's weight form: the GEMV's (WEIGHTS_F32, WEIGHTS_BF16, 2: Q8_0). */
static inline const void *expert_slice(const void *base, int form, Py_ssize_t e, Py_ssize_t n,
                                       Py_ssize_t k) {
    if (form == 2)
        return (const uint8_t *)base + e * n * (k / Q8_BLOCK) * Q8_BYTES;
    if (form == WEIGHTS_BF16)
        return (const uint16_t *)base + e * n * k;
    return (const float *)base + e * n * k;
}

/* Expert e's matrix (n, k) of a held stack (rows of held_row_bytes(held, k) bytes). */
static inline const uint8_t *held_slice(const void *base, int held, Py_ssize_t e, Py_ssize_t n,
                                        Py_ssize_t k) {
    return (const uint8_t *)base + e * n * held_row_bytes(held, k);
}

typedef struct {
    const void *w;        /* the stacked matrices (E, n, k) in form ``form`` */
    int form;
    const float *b;       /* (E, n) or NULL */
    const float *x;       /* slot j's input at x + j * xstride */
    Py_ssize_t xstride;
    float *y;             /* slot j's output at y + j * n */
    const int *experts;   /* the k experts */
    Py_ssize_t slots, n, k;
    int held;             /* >= 0: w held in that form (HELD_*), ``form`` unread */
    const float *xp;      /* held bfloat16: slot j's x in the kernel's order at xp + j * k */
} experts_gemv;

/* Every slot's rows [lo, hi) of its expert's product, lo and hi whole row groups. */
static void experts_part(const void *args, int part, int parts) {
    const experts_gemv *a = args;
    Py_ssize_t lo, hi;
    share(a->n, GEMV_GROUP, part, parts, &lo, &hi);
    if (lo >= hi)
        return;
    for (Py_ssize_t j = 0; j < a->slots; j++) {
        const Py_ssize_t e = a->experts[j];
        if (a->held >= 0) {
            gemv_args g = {NULL, a->x + j * a->xstride, a->b ? a->b + e * a->n : NULL, NULL, NULL,
                           a->y + j * a->n, a->n, a->k, 1, a->held,
                           held_slice(a->w, a->held, e, a->n, a->k),
                           held_row_bytes(a->held, a->k), a->xp ? a->xp + j * a->k : NULL};
            BY_SIMD(gemv_rows, &g, lo, hi);
            continue;
        }
        const void *w = expert_slice(a->w, a->form, e, a->n, a->k);
        gemv_args g = {a->form == WEIGHTS_F32 ? w : NULL, a->x + j * a->xstride,
                       a->b ? a->b + e * a->n : NULL, a->form == WEIGHTS_BF16 ? w : NULL,
                       a->form == 2 ? w : NULL, a->y + j * a->n, a->n, a->k};
        BY_SIMD(gemv_rows, &g, lo, hi);
    }
}

/* An expert's activation of one value, in float32 as operators/activation.py's kernels. */
static inline float expert_act(float x, int act) {
    if (act == ACT_SILU)
        return x / (1.0f + expf(-x));
    if (act == ACT_GELU_TANH)
        return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
    return act_one(x, act);
}

enum { EXPERT_GATED, EXPERT_PLAIN };

/* Rows through their k experts (operators/experts.py's Experts, slots summed). ints: E, k,
 * R (w_in's rows), H, I, Hout, kind, act, flags (1 interleaved, 2 weight_input, 4 has_limit,
 * 8 has_alpha), m (rows), held (-1: the decode forms by ``form``); floats: limit, alpha,
 * up_offset, norm_eps. scratch (one row): k * (H + R + I + Hout) floats. NULL, or why not (an
 * expert index outside 0 .. E - 1, as the router never writes; no memory). */
typedef struct {
    float *out;
    const float *x, *route, *b_in, *b_down, *norm;
    const void *w_in, *w_down;
    int form;
    float *scratch;
    Py_ssize_t E, k, R, H, I, Hout;
    int kind, act, interleaved, weight_input, has_limit, has_alpha;
    float limit, alpha, up_offset, norm_eps;
    Py_ssize_t m;
    int held;
} experts_call;

/* The hidden values (rows, I) of first products h (rows, R), rows apart by R and I. */
static void experts_hidden(const experts_call *c, const float *h, float *hid, Py_ssize_t rows) {
    for (Py_ssize_t j = 0; j < rows; j++) {
        const float *hj = h + j * c->R;
        float *o = hid + j * c->I;
        if (c->kind == EXPERT_PLAIN) {
            for (Py_ssize_t q = 0; q < c->I; q++)
                o[q] = expert_act(hj[q], c->act);
            continue;
        }
        for (Py_ssize_t q = 0; q < c->I; q++) {
            float g = c->interleaved ? hj[2 * q] : hj[q];
            float u = c->interleaved ? hj[2 * q + 1] : hj[c->I + q];
            if (c->has_limit) {
                g = g > c->limit ? c->limit : g;
                u = u > c->limit ? c->limit : u < -c->limit ? -c->limit : u;
            }
            const float a = c->has_alpha ? g / (1.0f + expf(-(g * c->alpha))) : expert_act(g, c->act);
            o[q] = c->up_offset != 0.0f ? a * (u + c->up_offset) : a * u;
        }
    }
}

/* Expert e's output row y (Hout) RMS-normed times its row of the norm (Ergo), in place. */
static void experts_norm(const experts_call *c, Py_ssize_t e, float *y) {
    float ss = 0.0f;
    for (Py_ssize_t q = 0; q < c->Hout; q++)
        ss += y[q] * y[q];
    const float r = 1.0f / sqrtf(ss / (float)c->Hout + c->norm_eps);
    const float *nw = c->norm + e * c->Hout;
    for (Py_ssize_t q = 0; q < c->Hout; q++)
        y[q] = y[q] * r * nw[q];
}

#include "_cpu_experts_q8.h"

/* A prompt chunk's m rows (the file's opening comment): one GEMM per expert hit. */
static const char *experts_chunk(const experts_call *c) {
    const Py_ssize_t m = c->m, k = c->k, E = c->E, H = c->H, R = c->R, I = c->I, Ho = c->Hout;
    const int form = c->held >= 0 ? c->held : c->form == WEIGHTS_F32 ? HELD_F32 : -1;
    if (form < 0)
        return "experts: a prompt chunk's experts are float32 or held, not a decode form";
    Py_ssize_t *start = calloc(E + 1, sizeof(Py_ssize_t));
    Py_ssize_t *pairs = malloc(sizeof(Py_ssize_t) * (m * k > 0 ? m * k : 1));
    const char *why = NULL;
    float *buf = NULL;
    if (!start || !pairs) {
        why = "experts: no memory for a chunk's routing";
        goto done;
    }
    for (Py_ssize_t r = 0; r < m; r++)  /* each expert's rows counted, checked */
        for (Py_ssize_t j = 0; j < k; j++) {
            const float v = c->route[r * 2 * k + j];
            if (!(v >= 0.0f && v < (float)E)) {
                why = "experts: a routed expert is outside the experts";
                goto done;
            }
            start[(Py_ssize_t)v + 1]++;
        }
    Py_ssize_t most = 0;
    for (Py_ssize_t e = 0; e < E; e++) {
        most = start[e + 1] > most ? start[e + 1] : most;
        start[e + 1] += start[e];
    }
    {  /* each expert's (row, slot) pairs, rows ascending */
        Py_ssize_t *at = malloc(sizeof(Py_ssize_t) * E);
        if (!at) {
            why = "experts: no memory for a chunk's routing";
            goto done;
        }
        memcpy(at, start, sizeof(Py_ssize_t) * E);
        for (Py_ssize_t r = 0; r < m; r++)
            for (Py_ssize_t j = 0; j < k; j++)
                pairs[at[(Py_ssize_t)c->route[r * 2 * k + j]]++] = r * k + j;
        free(at);
    }
    if (form == HELD_Q8_0 && H % 32 == 0 && I % 32 == 0 && eq8_ready()) {
        why = experts_q8_chunk(c, start, pairs, most);  /* _cpu_experts_q8.h */
        goto done;
    }
    /* An expert one row chose runs as two (the row twice): every product of a chunk is the
     * GEMM's, never the one-row GEMV's, whose x a block form rounds (operators/held.py). */
    most = most < 2 ? 2 : most;
    buf = malloc(sizeof(float) * most * (H + R + I + Ho));
    if (!buf) {
        why = "experts: no memory for an expert's rows";
        goto done;
    }
    float *xs = buf, *h = xs + most * H, *hid = h + most * R, *y = hid + most * I;
    const int vector = c->kind == EXPERT_GATED && !c->interleaved && !c->has_limit &&
                       !c->has_alpha && c->up_offset == 0.0f &&
                       (c->act == ACT_SILU || c->act == ACT_GELU_TANH);
    memset(c->out, 0, sizeof(float) * m * Ho);
    for (Py_ssize_t e = 0; e < E; e++) {
        const Py_ssize_t n = start[e + 1] - start[e];
        if (n == 0)
            continue;  /* an expert no row chose: never read */
        const Py_ssize_t *p = pairs + start[e];
        for (Py_ssize_t t = 0; t < n; t++) {
            const float *xr = c->x + (p[t] / k) * H;
            if (c->weight_input) {
                const float wt = c->route[(p[t] / k) * 2 * k + k + p[t] % k];
                for (Py_ssize_t q = 0; q < H; q++)
                    xs[t * H + q] = xr[q] * wt;
            } else {
                memcpy(xs + t * H, xr, sizeof(float) * H);
            }
        }
        const Py_ssize_t rows = n > 1 ? n : 2;
        if (n == 1)
            memcpy(xs + H, xs, sizeof(float) * H);
        if (gemm_held_run(h, xs, held_slice(c->w_in, form, e, R, H), form,
                          c->b_in ? c->b_in + e * R : NULL, rows, R, H) < 0) {
            why = "experts: no memory for the GEMM's panels";
            goto done;
        }
        if (vector) {  /* act(gate) * up of halves: the chunk's gated kernel (_cpu_chunk.h) */
            rows_args g = {h, h + I, hid, rows, I, R, R, I, 1, 1, c->act, 0, 0.0f};
            rows_run(rows_part, &g, rows, rows * I);
        } else {
            experts_hidden(c, h, hid, rows);
        }
        if (gemm_held_run(y, hid, held_slice(c->w_down, form, e, Ho, I), form,
                          c->b_down ? c->b_down + e * Ho : NULL, rows, Ho, I) < 0) {
            why = "experts: no memory for the GEMM's panels";
            goto done;
        }
        for (Py_ssize_t t = 0; t < n; t++) {
            float *yt = y + t * Ho, *o = c->out + (p[t] / k) * Ho;
            if (c->norm)
                experts_norm(c, e, yt);
            const float wt = c->weight_input ? 1.0f : c->route[(p[t] / k) * 2 * k + k + p[t] % k];
            for (Py_ssize_t q = 0; q < Ho; q++)
                o[q] += yt[q] * wt;
        }
    }
done:
    free(start);
    free(pairs);
    free(buf);
    return why;
}

static const char *experts_run(const experts_call *c) {
    int experts[64];
    const Py_ssize_t k = c->k;
    if (k < 1 || k > 64)
        return "experts: k is not within 1 .. 64";
    if (c->m > 1)
        return experts_chunk(c);
    for (Py_ssize_t j = 0; j < k; j++) {
        const float v = c->route[j];
        if (!(v >= 0.0f && v < (float)c->E))
            return "experts: a routed expert is outside the experts";
        experts[j] = (int)v;
    }
    const float *w = c->route + k;
    float *xs = c->scratch, *h = xs + k * c->H, *hid = h + k * c->R, *y = hid + k * c->I;
    const float *x = c->x;
    Py_ssize_t xstride = 0;
    if (c->weight_input) {  /* each slot's input times its weight (Llama4TextMoe) */
        for (Py_ssize_t j = 0; j < k; j++)
            for (Py_ssize_t q = 0; q < c->H; q++)
                xs[j * c->H + q] = c->x[q] * w[j];
        x = xs;
        xstride = c->H;
    }
    /* A held bfloat16 stack's GEMV meets each slot's x in its own order (held_bf16_order). */
    float *xp = NULL;
    const Py_ssize_t wide = c->H > c->I ? c->H : c->I;
    if (c->held == HELD_BF16 && !(xp = malloc(sizeof(float) * k * wide)))
        return "experts: no memory for x in the bfloat16 kernel's order";
    if (xp)
        for (Py_ssize_t j = 0; j < k; j++)
            held_bf16_order(x + j * xstride, c->H, simd_lanes(), xp + j * c->H);
    experts_gemv first = {c->w_in, c->form, c->b_in, x, xstride, h, experts, k, c->R, c->H,
                          c->held, xp};
    pool_run(experts_part, &first);
    experts_hidden(c, h, hid, k);
    if (xp)
        for (Py_ssize_t j = 0; j < k; j++)
            held_bf16_order(hid + j * c->I, c->I, simd_lanes(), xp + j * c->I);
    experts_gemv second = {c->w_down, c->form, c->b_down, hid, c->I, y, experts, k, c->Hout,
                           c->I, c->held, xp};
    pool_run(experts_part, &second);
    free(xp);
    for (Py_ssize_t q = 0; q < c->Hout; q++)
        c->out[q] = 0.0f;
    for (Py_ssize_t j = 0; j < k; j++) {
        float *yj = y + j * c->Hout;
        if (c->norm)  /* each slot's output RMS-normed times its expert's row (Ergo) */
            experts_norm(c, experts[j], yj);
        const float wj = c->weight_input ? 1.0f : w[j];
        for (Py_ssize_t q = 0; q < c->Hout; q++)
            c->out[q] += yj[q] * wj;
    }
    return NULL;
}

/* ---- the router of one row (operators/router.py's Router, without sparsemixer) ---------- */

enum { SCORE_SOFTMAX, SCORE_SIGMOID, SCORE_LOGITS };
enum { NORM_NONE, NORM_SUM, NORM_P };

/* ints: E, H, k, score, select_logits, weights_softmax, n_group (0: none), topk_group,
 * group_max, normalize; floats: norm_eps, norm_min, norm_p, scale. scratch: 3 E floats. */
typedef struct {
    float *out;                 /* (2, k): experts ascending, then their weights */
    const float *x;             /* (H,) */
    const void *w;              /* (E, H) in the GEMV's form */
    int form;
    const float *bias, *selection, *expert_scale;
    float *scratch;
    Py_ssize_t E, H, k, n_group, topk_group;
    int score, select_logits, weights_softmax, group_max, normalize;
    float norm_eps, norm_min, norm_p, scale;
} router_call;

static const char *router_run(const router_call *c) {
    const Py_ssize_t E = c->E, k = c->k;
    if (k < 1 || k > 64 || k > E)
        return "router: top_k is not within 1 .. min(64, experts)";
    float *l = c->scratch, *s = l + E, *m = s + E;
    gemv_args g = {c->form == WEIGHTS_F32 ? c->w : NULL, c->x, c->bias,
                   c->form == WEIGHTS_BF16 ? c->w : NULL, c->form == 2 ? c->w : NULL, l, E,
                   c->H};
    if (E * c->H >= 1 << 16)
        pool_run(gemv_part, &g);
    else
        BY_SIMD(gemv_rows, &g, 0, E);
    if (c->score == SCORE_SOFTMAX) {
        float top = l[0], sum = 0.0f;
        for (Py_ssize_t e = 1; e < E; e++)
            top = l[e] > top ? l[e] : top;
        for (Py_ssize_t e = 0; e < E; e++)
            sum += s[e] = expf(l[e] - top);
        for (Py_ssize_t e = 0; e < E; e++)
            s[e] /= sum;
    } else if (c->score == SCORE_SIGMOID) {
        for (Py_ssize_t e = 0; e < E; e++)
            s[e] = 1.0f / (1.0f + expf(-l[e]));
    } else {
        memcpy(s, l, sizeof(float) * E);
    }
    for (Py_ssize_t e = 0; e < E; e++)
        m[e] = (c->select_logits ? l[e] : s[e]) + (c->selection ? c->selection[e] : 0.0f);
    if (c->n_group > 0) {  /* the groups of the highest scores; the rest out of reach */
        const Py_ssize_t size = E / c->n_group;
        float gs[256];
        int kept[256];
        if (c->n_group > 256)
            return "router: more than 256 groups";
        for (Py_ssize_t q = 0; q < c->n_group; q++) {
            float a = -INFINITY, b = -INFINITY;  /* the group's two largest */
            for (Py_ssize_t e = q * size; e < (q + 1) * size; e++) {
                if (m[e] > a) {
                    b = a;
                    a = m[e];
                } else if (m[e] > b) {
                    b = m[e];
                }
            }
            gs[q] = c->group_max ? a : a + b;
            kept[q] = 0;
        }
        for (Py_ssize_t t = 0; t < c->topk_group; t++) {  /* ties: the lower group first */
            Py_ssize_t best = -1;
            for (Py_ssize_t q = 0; q < c->n_group; q++)
                if (!kept[q] && (best < 0 || gs[q] > gs[best]))
                    best = q;
            kept[best] = 1;
        }
        for (Py_ssize_t e = 0; e < E; e++)
            if (!kept[e / size])
                m[e] = -INFINITY;
    }
    int chosen[64];
    for (Py_ssize_t t = 0; t < k; t++) {  /* k passes: k is small; ties the lower index */
        Py_ssize_t best = -1;
        for (Py_ssize_t e = 0; e < E; e++) {
            int taken = 0;
            for (Py_ssize_t u = 0; u < t; u++)
                taken |= chosen[u] == e;
            if (!taken && (best < 0 || m[e] > m[best]))
                best = e;
        }
        chosen[t] = (int)best;
    }
    for (Py_ssize_t a = 1; a < k; a++)  /* ascending */
        for (Py_ssize_t b = a; b > 0 && chosen[b - 1] > chosen[b]; b--) {
            const int t = chosen[b];
            chosen[b] = chosen[b - 1];
            chosen[b - 1] = t;
        }
    float *out = c->out, *wt = c->out + k;
    if (c->weights_softmax) {
        float top = l[chosen[0]], sum = 0.0f;
        for (Py_ssize_t t = 1; t < k; t++)
            top = l[chosen[t]] > top ? l[chosen[t]] : top;
        for (Py_ssize_t t = 0; t < k; t++)
            sum += wt[t] = expf(l[chosen[t]] - top);
        for (Py_ssize_t t = 0; t < k; t++)
            wt[t] /= sum;
    } else {
        for (Py_ssize_t t = 0; t < k; t++)
            wt[t] = s[chosen[t]];
    }
    if (c->normalize != NORM_NONE) {
        float d = 0.0f;
        for (Py_ssize_t t = 0; t < k; t++)
            d += c->normalize == NORM_SUM ? wt[t] : powf(fabsf(wt[t]), c->norm_p);
        d = c->normalize == NORM_SUM ? d + c->norm_eps : powf(d, 1.0f / c->norm_p);
        d = d > c->norm_min ? d : c->norm_min;
        for (Py_ssize_t t = 0; t < k; t++)
            wt[t] /= d;
    }
    for (Py_ssize_t t = 0; t < k; t++) {
        if (c->scale != 1.0f)
            wt[t] *= c->scale;
        if (c->expert_scale)
            wt[t] *= c->expert_scale[chosen[t]];
        out[t] = (float)chosen[t];
    }
    return NULL;
}
