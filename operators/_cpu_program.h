/* A compiled plan as one native call: a flat program of kernel calls, included by _cpu.c
 * after its kernels.
 *
 * Why: a decode step is ~400 steps a token, a prompt chunk as many; run from Python each
 * costs a call, a partial application and its argument checks (measured ~3.5 ms a token on
 * SmolLM2 beside 15-23 ms of GEMVs). ``program(steps)`` checks every step's arrays once,
 * when the plan is compiled, and keeps their addresses; ``run(program, start, rows,
 * position, first, last)`` runs steps ``first .. last`` with the GIL released, the GEMVs,
 * GEMMs, attention and a chunk's rows on the pool, a decode step's small steps on the
 * calling thread.
 *
 * Each step's arithmetic is its operator's (each operator module names its source), in one
 * body per operator whatever the rows: rms_norm, the activations and rope are _cpu_chunk.h's
 * row bodies, split over the pool where a step has more than one row, run on the calling
 * thread at one; GEMV and GEMM are gemv's and gemm's; attention is attend's one-query
 * kernel at one row, attend_chunk's at more. runtime/plan.py checks each step against its
 * operator's float64 reference by running it alone (``first + 1 == last``) under
 * ``check=True``.
 *
 * A step is a tuple ``(op, start_from, start_offset, arrays, ints, floats, rows_at,
 * capacity)``: ``op`` one of the OP_* codes below; its ``start`` attribute (RoPE's row, a
 * cache write's position, the query's position, the row take_row takes) is
 * ``call[start_from] + start_offset``, where ``call`` is the run's (start, rows, position)
 * followed by the run's per-row positions where it gives them (a batched decode step's:
 * start_from 3 + r is row r's, each row its own sequence at its own position),
 * or ``start_offset`` alone where ``start_from`` is -1 (a step whose start is the same at
 * every call, or which has none); ``arrays`` its output first, then its inputs (None for
 * an absent one); ``ints`` and ``floats`` as each OP_ code says.
 *
 * A bounded step (a prompt chunk's: its arrays hold ``capacity`` rows, a call runs the
 * call's ``rows`` of them) has ``rows_at`` >= 0: ints[rows_at], a multiple of the capacity
 * (the rows, or the rows times a width), is checked against the arrays at the capacity
 * once, and at each run taken as rows / capacity of itself, rows within 1 .. capacity.
 * Arrays are C-contiguous, but those OP_ code marks ``rows apart``: float32 (n, ...) whose
 * rows stand a stride apart, each row contiguous (a fused projection's column view).
 */

enum {
    OP_GEMV,      /* (y, x, w, b|None); (n, k[, held[, m]]); y (n) = w (n, k) x (+ b): the
                   * gemv kernel (held: the weight's held form, -1 for none); with m > 1,
                   * x (m, k) and y (m, n), each row the one-row GEMV's bit for bit, the
                   * weights read once for the m rows (gemv_batch_part) */
    OP_ATTEND,    /* (out, q, keys, values, scratch, alibi|None); (H, G, D, L, window, ring,
                   * n); (scale, softcap): n queries q (n, H, D) (rows apart) at start ..
                   * start + n into out (n, H * D): attend at one, attend_chunk at more (a
                   * ring of ring rows where L has grown to it, else position p at row p);
                   * alibi (H,) ALiBi slopes, as attend's; caches float32, or both
                   * bfloat16 bits (uint16), widened as read */
    OP_RMS_NORM,  /* (out, x, w); (rows, d, weight rows, inner); (eps): x * (1 / sqrt(mean(
                   * x^2) + eps)) * w per row of d, x and out (rows / inner, inner, d) rows
                   * apart, row r scaled by weight row r % inner (weight rows: 1 or inner) */
    OP_ADD,       /* (out, a, b); (n); (scale): a + b, or a + b * scale */
    OP_MUL,       /* (out, a, b|None); (n, m); (scale): a * b[i % m], or a * scale */
    OP_GATED,     /* (out, gate, up|None); (rows, m, act); (): act(gate) * up per row of m,
                   * each rows apart; without up, gate rows of 2m are gate then up */
    OP_ROPE,      /* (out, x, cos, sin); (heads, D, R, interleaved, table rows, n); (): n
                   * rows of x (n, heads, D) (rows apart), row r at table row start + r, the
                   * first R columns of each head turned */
    OP_KV_WRITE,  /* (cache, x); (G, capacity, D, ring, n); (): x (n, G, D) (rows apart)
                   * into rows start .. start + n (each % ring), which the capacity holds;
                   * a cache of bfloat16 bits (uint16) holds each value rounded
                   * (float_to_bf16) */
    OP_EMBEDDING, /* (out, ids, table); (vocab, hidden, n); (scale): table[ids[r]] (*
                   * scale) for r < n, each id checked */
    OP_LAYER_NORM,/* (out, x, w, b|None); (rows, d, weight rows, inner); (eps): (x - mean)
                   * / sqrt(mean((x - mean)^2) + eps) * w (+ b) per row of d, two passes; x
                   * and out (rows / inner, inner, d) rows apart, as OP_RMS_NORM's */
    OP_COLUMNS,   /* (out, x); (width, begin, end, n); (): n rows' columns begin .. end (x
                   * rows apart) */
    OP_ACTIVATION,/* (out, x); (rows, width, act); (): act(x) */
    OP_CLAMP,     /* (out, x); (rows, width); (limit): x within [-limit, limit], rows apart */
    OP_SOFTCAP,   /* (out, x); (n); (cap): tanh(x / cap) * cap */
    OP_ADD_ROWS,  /* (out, x, table); (hidden, table rows, n); (): x[r] + table[start + r] */
    OP_GEMM,      /* (out, x, w, b|None); (n, k, m); (): out (m, n) = x (m, k) w (n, k)^T
                   * (+ b), float32: the gemm kernel; w bfloat16 tiles (uint16): x rounded
                   * to bfloat16, the tile kernel (_cpu_tiles.h) */
    OP_TAKE_ROW,  /* (out, x); (d, rows); (): row start of x (rows, d) */
    OP_ROUTER,    /* (out, x, w, scratch, bias|None, selection|None, expert_scale|None); (E, H,
                   * k, score, select_logits, weights_softmax, n_group, topk_group,
                   * group_max, normalize, m); (norm_eps, norm_min, norm_p, scale): m rows'
                   * experts and weights (m, 2, k), _cpu_experts.h's router_run a row at a
                   * time; w (E, H) in a GEMV's form */
    OP_EXPERTS,   /* (out, x, routing, w_in, w_down, scratch, b_in|None, b_down|None,
                   * norm|None); (E, k, R, H, I, Hout, kind, act, flags (1 interleaved, 2
                   * weight_input, 4 has_limit, 8 has_alpha), m, held); (limit, alpha,
                   * up_offset, norm_eps): m rows (x (m, H), routing (m, 2, k)) through their
                   * routed experts, _cpu_experts.h's experts_run (one row: k GEMVs; more: a
                   * GEMM per expert hit); w_in (E, R, H) and w_down (E, Hout, I) in one GEMV
                   * form (held -1), or held (E * R, H) and (E * Hout, I) rows in HELD_* form
                   * held */
    OP_CAUSAL_CONV, /* (out, x, w, b|None, state); (n, C, K, act); (): the causal convolution
                   * of x (n, C) (rows apart) carrying state (K - 1, C), w packed (K, C), act 1
                   * silu (_cpu_recurrent.h); start 0 reads the state as zeros */
    OP_SCAN,      /* (out, x, dt, A, B, C, D, z|None, state); (n, D, N); (): Mamba's selective
                   * scan (x, dt, z (n, D), B, C (n, N), each rows apart), state (D, N) */
    OP_SSD,       /* (out, x, dt, A, B, C, D, dt_bias, state); (H, P, N, G); (dt_min, dt_max):
                   * one row of Mamba2's SSD, state (H, P, N) */
    OP_DELTA,     /* (out, q, k, v, a, b, A, dt_bias, state); (Hk, Dk, Hv, Dv, l2norm);
                   * (scale): one row of the gated delta rule, state (Hv, Dk, Dv) */
    OP_GATED_NORM,/* (out, x, z, w); (rows, W, group, weight size, gate_first); (eps): the
                   * gated RMSNorm per group of each row (x, z rows apart) */
    OP_COUNT
};

static const char *const OP_NAMES[OP_COUNT] = {
    [OP_GEMV] = "gemv", [OP_ATTEND] = "attend", [OP_RMS_NORM] = "rms_norm", [OP_ADD] = "add",
    [OP_MUL] = "mul", [OP_GATED] = "gated", [OP_ROPE] = "rope", [OP_KV_WRITE] = "kv_write",
    [OP_EMBEDDING] = "embedding", [OP_LAYER_NORM] = "layer_norm", [OP_COLUMNS] = "columns",
    [OP_ACTIVATION] = "activation", [OP_CLAMP] = "clamp", [OP_SOFTCAP] = "softcap",
    [OP_ADD_ROWS] = "add_rows", [OP_GEMM] = "gemm", [OP_TAKE_ROW] = "take_row",
    [OP_ROUTER] = "router", [OP_EXPERTS] = "experts",
    [OP_CAUSAL_CONV] = "causal_conv", [OP_SCAN] = "selective_scan", [OP_SSD] = "ssd",
    [OP_DELTA] = "gated_delta_rule", [OP_GATED_NORM] = "gated_rms_norm"};

/* profile(True): each step's calls and wall time summed by its code, until profile(False)
 * hands them over (bench/profile.py). Off, a run reads the clock not at all. */
static int profile_on = 0;
static long profile_calls[OP_COUNT], profile_ns[OP_COUNT];

/* The arrays each code reads rows apart (bit k: array k), the rest C-contiguous. */
static const unsigned ROWS_APART[OP_COUNT] = {
    [OP_ATTEND] = 1u << 1, [OP_RMS_NORM] = 1u << 0 | 1u << 1,
    [OP_GATED] = 1u << 0 | 1u << 1 | 1u << 2, [OP_ROPE] = 1u << 1, [OP_KV_WRITE] = 1u << 1,
    [OP_LAYER_NORM] = 1u << 0 | 1u << 1, [OP_CLAMP] = 1u << 0 | 1u << 1,
    [OP_COLUMNS] = 1u << 1, [OP_CAUSAL_CONV] = 1u << 1,
    [OP_SCAN] = 1u << 1 | 1u << 2 | 1u << 4 | 1u << 5 | 1u << 7,
    [OP_SSD] = 1u << 1 | 1u << 2 | 1u << 4 | 1u << 5,
    [OP_DELTA] = 1u << 1 | 1u << 2 | 1u << 3 | 1u << 4 | 1u << 5,
    [OP_GATED_NORM] = 1u << 1 | 1u << 2};

enum { ARRAYS = 9, INTS = 12, FLOATS = 4 };
/* Per-row positions a run may give (a batched decode step's rows: runtime/batch.py). */
#define CALL_ROWS 256

typedef struct {
    int op, start_from, rows_at;
    Py_ssize_t start_offset, unit, capacity;  /* bounded: ints[rows_at] = unit * rows */
    void *a[ARRAYS];
    Py_ssize_t len[ARRAYS];  /* bytes, as its shape holds them */
    Py_ssize_t ext[ARRAYS];  /* bytes from its first to past its last */
    Py_ssize_t rs[ARRAYS];   /* elements from one row to the next */
    Py_ssize_t i[INTS];
    float f[FLOATS];
    int held;                /* OP_GEMV, OP_GEMM, OP_EMBEDDING: the weight's held form
                              * (_cpu.c's HELD_*: its last int), -1 where it has none (the
                              * legacy forms, by the array's format: ``kind``) */
    int kind;                /* OP_GEMV, OP_ROUTER, OP_EXPERTS: WEIGHTS_F32, WEIGHTS_BF16
                              * or 2 (Q8_0); OP_GEMM:
                              * WEIGHTS_F32 or WEIGHTS_BF16 (tiles, _cpu_tiles.h);
                              * OP_ATTEND, OP_KV_WRITE: the cache's, the same two */
} step_t;

typedef struct {
    Py_ssize_t count;
    step_t *steps;
    PyObject *keep;  /* the steps' tuple: every array a step points into stays alive */
} program_t;

#define PROGRAM_CAPSULE "iron_spec.operators._cpu.program"

/* _cpu.c's GEMM (py_gemm's body): -1 where x's panels find no memory. */
static int gemm_run(float *out, const float *x, const float *w, const float *b, Py_ssize_t m,
                    Py_ssize_t n, Py_ssize_t k);

static void program_free(PyObject *capsule) {
    program_t *p = PyCapsule_GetPointer(capsule, PROGRAM_CAPSULE);
    if (!p)
        return;
    Py_XDECREF(p->keep);
    free(p->steps);
    free(p);
}

/* The bytes and format of n rows of k weights in a GEMV's form (kind). */
static void weight_size(int kind, Py_ssize_t n, Py_ssize_t k, Py_ssize_t *bytes, char *fmt) {
    if (kind == 2) {
        *bytes = n * (k / Q8_BLOCK) * Q8_BYTES;
        *fmt = 'B';
    } else {
        *bytes = (kind == WEIGHTS_BF16 ? 2 : 4) * n * k;
        *fmt = kind == WEIGHTS_BF16 ? 'H' : 'f';
    }
}

/* The array a step updates in place beside its output (a recurrent state), else -1. */
static int updated_array(int op) {
    return op == OP_CAUSAL_CONV ? 4 : op == OP_SCAN || op == OP_SSD || op == OP_DELTA ? 8 : -1;
}

/* The expected bytes of each array a step reads or writes, from its ints; 0 for an absent
 * one. Returns -1 (a Python error set) where the step's ints do not describe a step. */
static int step_sizes(const step_t *s, Py_ssize_t want[ARRAYS], char fmt[ARRAYS]) {
    const Py_ssize_t *i = s->i;
    for (int k = 0; k < ARRAYS; k++) {
        want[k] = 0;
        fmt[k] = 'f';
    }
    if (s->held >= 0) {  /* a held weight: its rows' bytes, of any buffer format */
        const Py_ssize_t rb = held_row_bytes(s->held, i[1]);
        if (rb < 0 || i[0] < 1 || (s->op == OP_GEMM && i[2] < 1) ||
            (s->op == OP_GEMV && i[3] < 0))
            goto none;
        want[2] = i[0] * rb;
        fmt[2] = '*';
        switch (s->op) {
        case OP_GEMV:  /* i[3]: the batched rows m (0 or 1: one) */
            want[0] = 4 * i[0] * (i[3] > 1 ? i[3] : 1);
            want[1] = 4 * i[1] * (i[3] > 1 ? i[3] : 1);
            want[3] = s->a[3] ? 4 * i[0] : 0;
            return 0;
        case OP_GEMM:
            want[0] = 4 * i[2] * i[0];
            want[1] = 4 * i[2] * i[1];
            want[3] = s->a[3] ? 4 * i[0] : 0;
            return 0;
        case OP_EMBEDDING:
            if (i[2] < 1)
                goto none;
            want[0] = 4 * i[2] * i[1];
            want[1] = 4 * i[2];
            fmt[1] = 'i';
            return 0;
        }
        goto none;
    }
    switch (s->op) {
    case OP_GEMV: {  /* i[2] the held form (-1 here), i[3] the batched rows m */
        if (i[0] < 1 || i[1] < 1 || i[3] < 0)
            break;
        const Py_ssize_t m = i[3] > 1 ? i[3] : 1;
        want[0] = 4 * i[0] * m;
        want[1] = 4 * i[1] * m;
        if (s->kind == 2) {
            if (i[1] % Q8_BLOCK)
                break;
            want[2] = i[0] * (i[1] / Q8_BLOCK) * Q8_BYTES;
            fmt[2] = 'B';
        } else {
            want[2] = (s->kind == WEIGHTS_BF16 ? 2 : 4) * i[0] * i[1];
            fmt[2] = s->kind == WEIGHTS_BF16 ? 'H' : 'f';
        }
        want[3] = s->a[3] ? 4 * i[0] : 0;
        return 0;
    }
    case OP_GEMM:
        if (i[0] < 1 || i[1] < 1 || i[2] < 1)
            break;
        want[0] = 4 * i[2] * i[0];
        want[1] = 4 * i[2] * i[1];
        if (s->kind == WEIGHTS_BF16) { /* tiles (_cpu_tiles.h), padded to whole tiles */
            want[2] = 2 * ((i[0] + TILE_N - 1) / TILE_N * TILE_N) *
                      ((i[1] + TILE_K - 1) / TILE_K * TILE_K);
            fmt[2] = 'H';
        } else {
            want[2] = 4 * i[0] * i[1];
        }
        want[3] = s->a[3] ? 4 * i[0] : 0;
        return 0;
    case OP_ATTEND:
        if (i[0] < 1 || i[1] < 1 || i[0] % i[1] || i[2] < 1 || i[3] < 1 || i[4] < 0 ||
            i[5] < 0 || (i[5] > 0 && (i[4] == 0 || i[4] > i[5])) || i[6] < 1)
            break;
        want[0] = want[1] = 4 * i[6] * i[0] * i[2];
        want[2] = want[3] = (s->kind == WEIGHTS_BF16 ? 2 : 4) * i[1] * i[3] * i[2];
        fmt[2] = fmt[3] = s->kind == WEIGHTS_BF16 ? 'H' : 'f';
        want[4] = -1;  /* the scratch: checked at each run, by the position */
        want[5] = s->a[5] ? 4 * i[0] : 0;
        return 0;
    case OP_RMS_NORM:
        if (i[0] < 1 || i[1] < 1 || i[3] < 1 || i[0] % i[3] || (i[2] != 1 && i[2] != i[3]))
            break;
        want[0] = want[1] = 4 * i[0] * i[1];
        want[2] = 4 * i[2] * i[1];
        return 0;
    case OP_ADD:
        if (i[0] < 1)
            break;
        want[0] = want[1] = want[2] = 4 * i[0];
        return 0;
    case OP_MUL:
        if (i[0] < 1 || (s->a[2] && (i[1] < 1 || i[0] % i[1])))
            break;
        want[0] = want[1] = 4 * i[0];
        want[2] = s->a[2] ? 4 * i[1] : 0;
        return 0;
    case OP_GATED:
        if (i[0] < 1 || i[1] < 1 || i[2] < 0 || i[2] >= ACT_COUNT)
            break;
        want[0] = 4 * i[0] * i[1];
        want[1] = 4 * i[0] * i[1] * (s->a[2] ? 1 : 2);
        want[2] = s->a[2] ? 4 * i[0] * i[1] : 0;
        return 0;
    case OP_ROPE:
        if (i[0] < 1 || i[1] < 1 || i[2] < 2 || i[2] % 2 || i[2] > i[1] || i[4] < 1 || i[5] < 1)
            break;
        want[0] = want[1] = 4 * i[5] * i[0] * i[1];
        want[2] = want[3] = 4 * i[4] * i[2];
        return 0;
    case OP_KV_WRITE:
        if (i[0] < 1 || i[1] < 1 || i[2] < 1 || i[3] < 0 || i[4] < 1)
            break;
        want[0] = (s->kind == WEIGHTS_BF16 ? 2 : 4) * i[0] * i[1] * i[2];
        fmt[0] = s->kind == WEIGHTS_BF16 ? 'H' : 'f';
        want[1] = 4 * i[4] * i[0] * i[2];
        return 0;
    case OP_EMBEDDING:
        if (i[0] < 1 || i[1] < 1 || i[2] < 1)
            break;
        want[0] = 4 * i[2] * i[1];
        want[1] = 4 * i[2];
        fmt[1] = 'i';
        want[2] = 4 * i[0] * i[1];
        return 0;
    case OP_LAYER_NORM:
        if (i[0] < 1 || i[1] < 1 || i[3] < 1 || i[0] % i[3] || (i[2] != 1 && i[2] != i[3]))
            break;
        want[0] = want[1] = 4 * i[0] * i[1];
        want[2] = 4 * i[2] * i[1];
        want[3] = s->a[3] ? want[2] : 0;
        return 0;
    case OP_COLUMNS:
        if (i[0] < 1 || i[1] < 0 || i[2] <= i[1] || i[2] > i[0] || i[3] < 1)
            break;
        want[0] = 4 * i[3] * (i[2] - i[1]);
        want[1] = 4 * i[3] * i[0];
        return 0;
    case OP_ACTIVATION:
        if (i[0] < 1 || i[1] < 1 || i[2] < 0 || i[2] >= ACT_COUNT)
            break;
        want[0] = want[1] = 4 * i[0] * i[1];
        return 0;
    case OP_CLAMP:
        if (i[0] < 1 || i[1] < 1 || !(s->f[0] > 0.0f))
            break;
        want[0] = want[1] = 4 * i[0] * i[1];
        return 0;
    case OP_SOFTCAP:
        if (i[0] < 1 || !(s->f[0] > 0.0f))
            break;
        want[0] = want[1] = 4 * i[0];
        return 0;
    case OP_ADD_ROWS:
        if (i[0] < 1 || i[1] < 1 || i[2] < 1)
            break;
        want[0] = want[1] = 4 * i[2] * i[0];
        want[2] = 4 * i[0] * i[1];
        return 0;
    case OP_TAKE_ROW:
        if (i[0] < 1 || i[1] < 1)
            break;
        want[0] = 4 * i[0];
        want[1] = 4 * i[1] * i[0];
        return 0;
    case OP_ROUTER:
        if (i[0] < 1 || i[1] < 1 || i[2] < 1 || i[2] > i[0] || i[2] > 64 || i[3] < 0 ||
            i[3] > 2 || i[9] < 0 || i[9] > 2 ||
            (i[6] > 0 && (i[0] % i[6] || i[7] < 1 || i[7] > i[6] || i[6] > 256)) ||
            (s->kind == 2 && i[1] % Q8_BLOCK) || i[10] < 1)
            break;
        want[0] = 4 * 2 * i[2] * i[10];
        want[1] = 4 * i[1] * i[10];
        weight_size(s->kind, i[0], i[1], &want[2], &fmt[2]);
        want[3] = s->len[3] >= 4 * 3 * i[0] ? s->len[3] : 4 * 3 * i[0];
        want[4] = s->a[4] ? 4 * i[0] : 0;
        want[5] = s->a[5] ? 4 * i[0] : 0;
        want[6] = s->a[6] ? 4 * i[0] : 0;
        return 0;
    case OP_EXPERTS: {
        const Py_ssize_t E = i[0], k = i[1], R = i[2], H = i[3], I = i[4], Ho = i[5], m = i[9],
                         held = i[10];
        if (E < 1 || k < 1 || k > 64 || k > E || R < 1 || H < 1 || I < 1 || Ho < 1 ||
            i[6] < 0 || i[6] > 1 || i[7] < 0 || i[7] >= ACT_COUNT || i[8] < 0 || i[8] > 15 ||
            m < 1 || held < -1 || R != (i[6] == EXPERT_GATED ? 2 * I : I) ||
            (held < 0 && s->kind == 2 && (H % Q8_BLOCK || I % Q8_BLOCK)) ||
            (held >= 0 && (held_row_bytes(held, H) < 0 || held_row_bytes(held, I) < 0)))
            break;
        want[0] = 4 * m * Ho;
        want[1] = 4 * m * H;
        want[2] = 4 * m * 2 * k;
        if (held >= 0) {  /* held stacks: their rows' bytes, of any buffer format */
            want[3] = E * R * held_row_bytes(held, H);
            want[4] = E * Ho * held_row_bytes(held, I);
            fmt[3] = fmt[4] = '*';
        } else {
            weight_size(s->kind, E * R, H, &want[3], &fmt[3]);
            weight_size(s->kind, E * Ho, I, &want[4], &fmt[4]);
        }
        const Py_ssize_t need = 4 * k * (H + R + I + Ho);
        want[5] = s->len[5] >= need ? s->len[5] : need;
        want[6] = s->a[6] ? 4 * E * R : 0;
        want[7] = s->a[7] ? 4 * E * Ho : 0;
        want[8] = s->a[8] ? 4 * E * Ho : 0;
        return 0;
    }
    case OP_CAUSAL_CONV:  /* (n, C, K, act) */
        if (i[0] < 1 || i[1] < 1 || i[2] < 2 || i[3] < 0 || i[3] > 1)
            break;
        want[0] = want[1] = 4 * i[0] * i[1];
        want[2] = 4 * i[2] * i[1];
        want[3] = s->a[3] ? 4 * i[1] : 0;
        want[4] = 4 * (i[2] - 1) * i[1];
        return 0;
    case OP_SCAN:  /* (n, D, N) */
        if (i[0] < 1 || i[1] < 1 || i[2] < 1)
            break;
        want[0] = want[1] = want[2] = 4 * i[0] * i[1];
        want[3] = want[8] = 4 * i[1] * i[2];
        want[4] = want[5] = 4 * i[0] * i[2];
        want[6] = 4 * i[1];
        want[7] = s->a[7] ? 4 * i[0] * i[1] : 0;
        return 0;
    case OP_SSD:  /* (H, P, N, G): one row */
        if (i[0] < 1 || i[1] < 1 || i[2] < 1 || i[3] < 1 || i[0] % i[3] ||
            !(s->f[0] <= s->f[1]))
            break;
        want[0] = want[1] = 4 * i[0] * i[1];
        want[2] = want[3] = want[6] = want[7] = 4 * i[0];
        want[4] = want[5] = 4 * i[3] * i[2];
        want[8] = 4 * i[0] * i[1] * i[2];
        return 0;
    case OP_DELTA:  /* (Hk, Dk, Hv, Dv, l2norm): one row */
        if (i[0] < 1 || i[1] < 1 || i[2] < 1 || i[3] < 1 || i[2] % i[0] || i[1] > 4096 ||
            i[3] > 4096)
            break;
        want[0] = want[3] = 4 * i[2] * i[3];
        want[1] = want[2] = 4 * i[0] * i[1];
        want[4] = want[5] = want[6] = want[7] = 4 * i[2];
        want[8] = 4 * i[2] * i[1] * i[3];
        return 0;
    case OP_GATED_NORM:  /* (rows, W, group, weight size, gate_first) */
        if (i[0] < 1 || i[1] < 1 || i[2] < 1 || i[1] % i[2] || (i[3] != i[1] && i[3] != i[2]))
            break;
        want[0] = want[1] = want[2] = 4 * i[0] * i[1];
        want[3] = 4 * i[3];
        return 0;
    }
none:
    PyErr_Format(PyExc_ValueError, "program: step of op %d has sizes that describe none",
                 s->op);
    return -1;
}

/* An array's layout: its bytes, extent and row stride (elements); 0 where it is C-contiguous,
 * 1 where its rows stand apart (each row contiguous, rows a whole number of elements apart
 * and none over another), -1 where neither. */
static int layout(const Py_buffer *v, Py_ssize_t *ext, Py_ssize_t *rs) {
    Py_ssize_t item = v->itemsize, row = item, n = v->ndim ? v->shape[0] : 1;
    int inner = 1;
    for (int d = v->ndim - 1; d >= 1; d--) {
        if (v->shape[d] > 1 && v->strides[d] != row)
            inner = 0;
        row *= v->shape[d];
    }
    Py_ssize_t step = n > 1 ? v->strides[0] : row;
    *rs = item ? step / item : 0;
    *ext = n > 0 ? (n - 1) * step + row : 0;
    if (!inner || step < row || step % item)
        return -1;
    return step == row ? 0 : v->ndim >= 2 ? 1 : -1;
}

/* program(steps) -> a capsule run() runs; ValueError naming the first step that does not
 * fit (its index, its array). */
static PyObject *py_program(PyObject *self, PyObject *arg) {
    if (!PyTuple_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "program takes a tuple of steps");
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(arg);
    program_t *p = calloc(1, sizeof *p);
    if (!p)
        return PyErr_NoMemory();
    p->steps = calloc(n ? n : 1, sizeof(step_t));
    if (!p->steps) {
        free(p);
        return PyErr_NoMemory();
    }
    p->count = n;
    for (Py_ssize_t j = 0; j < n; j++) {
        step_t *s = &p->steps[j];
        PyObject *arrays, *ints, *floats;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(arg, j), "iinO!O!O!in;a step is (op, "
                              "start_from, start_offset, arrays, ints, floats, rows_at, "
                              "capacity)", &s->op, &s->start_from, &s->start_offset,
                              &PyTuple_Type, &arrays, &PyTuple_Type, &ints, &PyTuple_Type,
                              &floats, &s->rows_at, &s->capacity))
            goto fail;
        if (s->op < 0 || s->op >= OP_COUNT || s->start_from < -1 ||
            s->start_from > 2 + CALL_ROWS ||
            PyTuple_GET_SIZE(arrays) > ARRAYS || PyTuple_GET_SIZE(ints) > INTS ||
            PyTuple_GET_SIZE(floats) > FLOATS || s->rows_at < -1 ||
            s->rows_at >= PyTuple_GET_SIZE(ints)) {
            PyErr_Format(PyExc_ValueError, "program: step %zd is no step", j);
            goto fail;
        }
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(ints); k++)
            if ((s->i[k] = PyLong_AsSsize_t(PyTuple_GET_ITEM(ints, k))) == -1 && PyErr_Occurred())
                goto fail;
        {  /* a last int past the legacy ones: the weight's held form */
            const Py_ssize_t nints = PyTuple_GET_SIZE(ints);
            s->held = (s->op == OP_GEMV && (nints == 3 || nints == 4)) ? (int)s->i[2]
                      : ((s->op == OP_GEMM || s->op == OP_EMBEDDING) && nints == 4) ? (int)s->i[3]
                      : -1;
            if (s->held < -1 || (s->held >= 0 && held_row_bytes(s->held, 32 * QK_K) < 0)) {
                PyErr_Format(PyExc_ValueError, "program: step %zd holds weights in form %d, "
                             "none of _cpu.c's", j, s->held);
                goto fail;
            }
        }
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(floats); k++)
            if ((s->f[k] = (float)PyFloat_AsDouble(PyTuple_GET_ITEM(floats, k))) == -1.0f &&
                PyErr_Occurred())
                goto fail;
        if (s->rows_at >= 0) {
            Py_ssize_t at = s->i[s->rows_at];
            if (s->capacity < 1 || at < s->capacity || at % s->capacity) {
                PyErr_Format(PyExc_ValueError, "program: step %zd (op %d): int %d (%zd) is "
                             "no multiple of its capacity of %zd rows", j, s->op, s->rows_at,
                             at, s->capacity);
                goto fail;
            }
            s->unit = at / s->capacity;
        }
        char formats[ARRAYS] = {0};
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(arrays); k++) {
            PyObject *obj = PyTuple_GET_ITEM(arrays, k);
            if (obj == Py_None)
                continue;
            Py_buffer view;
            int flags = PyBUF_STRIDES | PyBUF_FORMAT |
                        (k == 0 || k == updated_array(s->op) ? PyBUF_WRITABLE : 0);
            int apart = (ROWS_APART[s->op] >> k) & 1, form = -1;
            if (PyObject_GetBuffer(obj, &view, flags) == 0) {
                form = layout(&view, &s->ext[k], &s->rs[k]);
                s->a[k] = view.buf;
                s->len[k] = view.len;
                formats[k] = view.format && view.format[1] == 0 ? view.format[0] : '?';
                if (formats[k] == 'l' && view.itemsize == 4)
                    formats[k] = 'i';
                PyBuffer_Release(&view);
            } else {
                PyErr_Clear();
            }
            if (form < 0 || (form == 1 && !apart)) {
                PyErr_Format(PyExc_ValueError, "program: step %zd's array %zd is not a "
                             "C-contiguous%s%s array", j, k, k == 0 ? " writable" : "",
                             apart ? " (or float32 rows apart)" : "");
                goto fail;
            }
        }
        if (s->op == OP_GEMV || s->op == OP_ROUTER)
            s->kind = formats[2] == 'H' ? WEIGHTS_BF16 : formats[2] == 'B' ? 2 : WEIGHTS_F32;
        if (s->op == OP_EXPERTS) {
            s->kind = formats[3] == 'H' ? WEIGHTS_BF16 : formats[3] == 'B' ? 2 : WEIGHTS_F32;
            if (formats[4] != formats[3]) {
                PyErr_Format(PyExc_ValueError, "program: step %zd (op %d): w_in and w_down "
                             "are in two forms ('%c', '%c')", j, s->op, formats[3], formats[4]);
                goto fail;
            }
        }
        if (s->op == OP_GEMM)
            s->kind = formats[2] == 'H' ? WEIGHTS_BF16 : WEIGHTS_F32;
        if (s->op == OP_ATTEND)  /* the caches' form: both as the keys */
            s->kind = formats[2] == 'H' ? WEIGHTS_BF16 : WEIGHTS_F32;
        if (s->op == OP_KV_WRITE)
            s->kind = formats[0] == 'H' ? WEIGHTS_BF16 : WEIGHTS_F32;
        Py_ssize_t want[ARRAYS];
        char fmt[ARRAYS];
        if (step_sizes(s, want, fmt) < 0)
            goto fail;
        for (int k = 0; k < ARRAYS; k++) {
            if (want[k] == 0 && s->a[k] == NULL)
                continue;
            int sized = want[k] < 0 ? s->len[k] > 0 : s->len[k] == want[k];
            if (!s->a[k] || !sized || (formats[k] != fmt[k] && fmt[k] != '*')) {
                PyErr_Format(PyExc_ValueError, "program: step %zd (op %d): array %d is %zd "
                             "bytes of '%c', not %zd of '%c'", j, s->op, k, s->len[k],
                             formats[k] ? formats[k] : '-', want[k], fmt[k]);
                goto fail;
            }
        }
        for (int k = 1; k < ARRAYS; k++)  /* an output apart from what the step reads */
            if (s->a[k] && s->op != OP_KV_WRITE) {
                const char *o = s->a[0], *x = s->a[k];
                if (o < x + s->ext[k] && x < o + s->ext[0] &&
                    !(s->op == OP_ADD || s->op == OP_MUL || s->op == OP_RMS_NORM ||
                      s->op == OP_GATED || s->op == OP_ACTIVATION || s->op == OP_CLAMP ||
                      s->op == OP_SOFTCAP || s->op == OP_ADD_ROWS || s->op == OP_LAYER_NORM)) {
                    PyErr_Format(PyExc_ValueError, "program: step %zd's output overlaps its "
                                 "array %d", j, k);
                    goto fail;
                }
            }
    }
    Py_INCREF(arg);
    p->keep = arg;
    PyObject *capsule = PyCapsule_New(p, PROGRAM_CAPSULE, program_free);
    if (!capsule) {
        Py_DECREF(arg);
        p->keep = NULL;
        goto fail;
    }
    return capsule;
fail:
    free(p->steps);
    free(p);
    return NULL;
}

#ifdef HAVE_X86
/* tanh of 8 values: sign(z) (1 - e) / (1 + e), e = exp(-2 |z|) (exp256, ~2 ulp). */
__attribute__((target("avx2,fma"))) static inline __m256 tanh256(__m256 z) {
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    __m256 e = exp256(_mm256_mul_ps(_mm256_andnot_ps(sign, z), _mm256_set1_ps(-2.0f)));
    __m256 t = _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e));
    return _mm256_or_ps(t, _mm256_and_ps(sign, z));
}

/* tanh(x / cap) * cap over n values, 8 at a time; the columns past the last 8 are left. */
__attribute__((target("avx2,fma"))) static Py_ssize_t softcap_avx2(float *out, const float *x,
                                                                   Py_ssize_t n, float cap) {
    const __m256 c = _mm256_set1_ps(cap);
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_mul_ps(tanh256(_mm256_div_ps(_mm256_loadu_ps(x + i), c)), c));
    return i;
}

#endif

/* Values below which a row step runs on the calling thread: a batched decode step's few
 * rows (8 x 576 on SmolLM2) cost less than waking the pool, whose wake-up a busy machine
 * stretches to a scheduler slice. A row's values are the same either way. */
#define ROWS_POOL_WORK 32768

/* The pool for a step of more than one row (a prompt chunk's) and at least ROWS_POOL_WORK
 * values, the calling thread otherwise (a decode step's: a small step's wake-up would cost
 * more than it shares). */
static void rows_run(task_fn fn, const void *args, Py_ssize_t rows, Py_ssize_t work) {
    if (rows > 1 && work >= ROWS_POOL_WORK)
        pool_run(fn, args);
    else
        fn(args, 0, 1);
}

/* n queries at start: checks, then attend's kernel at one (a decode step's), attend_chunk's
 * at more or wherever ``chunk`` (a prompt chunk's call, of one row too: a row's bits then do
 * not depend on how many rows its call holds, so a session may resume at any position);
 * 0 or why not (a position past the cache, a scratch short of it). q (n, H, D) rows qstride
 * apart. */
static const char *attend_any(float *out, const float *q, Py_ssize_t qstride, const void *keys,
                              const void *values, int kv16, float *scratch,
                              Py_ssize_t scratch_floats,
                              int H, int G, int D, Py_ssize_t L, Py_ssize_t n, Py_ssize_t start,
                              Py_ssize_t window, float scale, float softcap, Py_ssize_t ring,
                              const float *alibi, int chunk) {
    if (n == 1 && !chunk) {
        /* A ring not yet grown to its rows holds positions at their own rows (as attend). */
        if (start < 0 || (start >= L && !(ring > 0 && L == ring)))
            return "the query's position is past the cache";
        if (scratch_floats < attend_need(H, G, D, start, window))
            return "the scratch is short for this position";
        attend_run(out, q, keys, values, kv16, scratch, H, G, D, L, start, window, scale,
                   softcap, ring, alibi);
        return NULL;
    }
    const Py_ssize_t P = 2 * simd_lanes();
    const int T = pool.threads ? pool.threads : 1;
    if (start < 0 || start + n >= INT32_MAX / 2 ||
        !(ring > 0 && ring == L ? window + n - 1 <= ring : start + n <= L))
        return "the queries' positions are past the cache (a ring: past window + n - 1 rows)";
    /* A ring still growing (fewer rows than the ring) holds its positions at their own rows. */
    Py_ssize_t span = start + n;
    if (window > 0 && window + P - 1 < span)
        span = window + P - 1;
    if (scratch_floats < (Py_ssize_t)T * P * (D + span))
        return "the scratch is short for these positions";
    chunk_args a = {q, keys, values, out, scratch, n, start, L,
                    ring > 0 && ring <= L ? ring : L, window, qstride, span, H, G, D, kv16,
                    scale, softcap, alibi};
    pool_run(chunk_part, &a);
    return NULL;
}

static void conv_part(const void *args, int part, int parts) {
    const conv_args *a = args;
    Py_ssize_t c0, c1;
    share(a->C, 16, part, parts, &c0, &c1);
    if (c0 < c1)
        BY_SIMD(conv_cols, a, c0, c1);
}

static void scan_part(const void *args, int part, int parts) {
    const scan_args *a = args;
    Py_ssize_t d0, d1;
    share(a->D, 16, part, parts, &d0, &d1);
    if (d0 < d1)
        BY_SIMD(scan_chans, a, d0, d1);
}

static void ssd_part(const void *args, int part, int parts) {
    const ssd_args *a = args;
    Py_ssize_t h0, h1;
    share(a->H, 1, part, parts, &h0, &h1);
    if (h0 < h1)
        BY_SIMD(ssd_heads, a, h0, h1);
}

static void delta_part(const void *args, int part, int parts) {
    const delta_args *a = args;
    Py_ssize_t h0, h1;
    share(a->Hv, 1, part, parts, &h0, &h1);
    if (h0 < h1)
        BY_SIMD(delta_heads, a, h0, h1);
}

static void gnorm_part(const void *args, int part, int parts) {
    const gnorm_args *a = args;
    Py_ssize_t r0, r1;
    share(a->rows, 1, part, parts, &r0, &r1);
    if (r0 < r1)
        BY_SIMD(gnorm_rows, a, r0, r1);
}

/* A recurrent step's work: on the pool where it is large (a prompt chunk's rows, a big
 * state), else on the calling thread (a small decode step's wake-up costs more). */
static void work_run(task_fn fn, const void *args, Py_ssize_t flops) {
    if (flops >= 65536)
        pool_run(fn, args);
    else
        fn(args, 0, 1);
}

/* One step at the call's (start, rows, position); 0, or an error message (a position or
 * rows past what the step's arrays hold, an id outside the vocabulary) in msg. */
static const char *step_run(const step_t *s, const Py_ssize_t *call, Py_ssize_t ncall,
                            char *msg, size_t size) {
    Py_ssize_t i[INTS];
    memcpy(i, s->i, sizeof i);
    if (s->rows_at >= 0) {
        if (call[1] < 1 || call[1] > s->capacity) {
            snprintf(msg, size, "rows %zd are not within 1 .. the capacity of %zd", call[1],
                     s->capacity);
            return msg;
        }
        i[s->rows_at] = s->unit * call[1];
    }
    if (s->start_from >= ncall) {
        snprintf(msg, size, "the step reads row %d's position, and the run gives %zd rows",
                 s->start_from - 3, ncall - 3);
        return msg;
    }
    Py_ssize_t start = s->start_offset + (s->start_from < 0 ? 0 : call[s->start_from]);
    float *out = s->a[0];
    switch (s->op) {
    case OP_GEMV: {
        const Py_ssize_t m = i[3] > 1 ? i[3] : 1;  /* a batched decode step's rows */
        if (s->held >= 0)
            return (m > 1 ? gemv_held_batch_run(out, s->a[1], s->a[2], s->held, s->a[3], i[0],
                                                i[1], m)
                          : gemv_held_run(out, s->a[1], s->a[2], s->held, s->a[3], i[0], i[1]))
                           < 0 ? "gemv: no memory for x's order" : NULL;
        gemv_args a = {s->kind == WEIGHTS_F32 ? s->a[2] : NULL, s->a[1], s->a[3],
                       s->kind == WEIGHTS_BF16 ? s->a[2] : NULL, s->kind == 2 ? s->a[2] : NULL,
                       out, i[0], i[1]};
        if (m > 1) {
            gemv_batch_args b = {a, m, i[1], i[0]};
            pool_run(gemv_batch_part, &b);
        } else {
            pool_run(gemv_part, &a);
        }
        return NULL;
    }
    case OP_GEMM:
        if (s->held >= 0)
            return gemm_held_run(out, s->a[1], s->a[2], s->held, s->a[3], i[2], i[0], i[1]) < 0
                       ? "gemm: no memory for x's panels or the widened rows" : NULL;
        if ((s->kind == WEIGHTS_BF16
                 ? tiles_run(out, s->a[1], s->a[2], s->a[3], i[2], i[0], i[1])
                 : gemm_run(out, s->a[1], s->a[2], s->a[3], i[2], i[0], i[1])) < 0)
            return "gemm: no memory for x's panels";
        return NULL;
    case OP_ATTEND: {
        const char *why = attend_any(out, s->a[1], s->rs[1], s->a[2], s->a[3],
                                     s->kind == WEIGHTS_BF16, s->a[4], s->len[4] / 4,
                                     (int)i[0], (int)i[1], (int)i[2], i[3], i[6], start, i[4],
                                     s->f[0], s->f[1], i[5], s->a[5], s->rows_at >= 0);
        if (why)
            snprintf(msg, size, "attention: %s", why);
        return why ? msg : NULL;
    }
    case OP_RMS_NORM: {
        rows_args a = {s->a[1], s->a[2], out, i[0], i[1], s->rs[1], 0, s->rs[0], i[3], i[2],
                       0, 1, s->f[0]};
        rows_run(rows_part, &a, i[0] / i[3], i[0] * i[1]);
        return NULL;
    }
    case OP_ADD: {
        const float *a = s->a[1], *b = s->a[2];
        if (s->f[0] == 1.0f)
            for (Py_ssize_t c = 0; c < i[0]; c++)
                out[c] = a[c] + b[c];
        else
            for (Py_ssize_t c = 0; c < i[0]; c++)
                out[c] = a[c] + b[c] * s->f[0];
        return NULL;
    }
    case OP_MUL: {
        const float *a = s->a[1], *b = s->a[2];
        if (b)
            for (Py_ssize_t c = 0; c < i[0]; c++)
                out[c] = a[c] * b[c % i[1]];
        else
            for (Py_ssize_t c = 0; c < i[0]; c++)
                out[c] = a[c] * s->f[0];
        return NULL;
    }
    case OP_GATED: {
        const float *g = s->a[1], *u = s->a[2];
        rows_args a = {g, u ? u : g + i[1], out, i[0], i[1], s->rs[1], u ? s->rs[2] : s->rs[1],
                       s->rs[0], 1, 1, (int)i[2], 0, 0.0f};
        rows_run(rows_part, &a, i[0], i[0] * i[1]);
        return NULL;
    }
    case OP_ACTIVATION: {
        rows_args a = {s->a[1], NULL, out, i[0], i[1], i[1], 0, i[1], 1, 1, (int)i[2], 0, 0.0f};
        rows_run(rows_part, &a, i[0], i[0] * i[1]);
        return NULL;
    }
    case OP_ROPE: {
        if (start < 0 || start + i[5] > i[4]) {
            snprintf(msg, size, "rope: positions %zd .. %zd are past the table's %zd", start,
                     start + i[5] - 1, i[4]);
            return msg;
        }
        rope_args a = {s->a[1], s->a[2], s->a[3], out, i[5], i[0], i[1], i[2], s->rs[1], start,
                       (int)i[3]};
        rows_run(rope_part, &a, i[5], i[5] * i[0] * i[1]);
        return NULL;
    }
    case OP_KV_WRITE: {
        /* As KVWrite.kernel: position p at row p (% ring); every row checked first, so a
         * refused call writes nothing. */
        const Py_ssize_t G = i[0], L = i[1], D = i[2], ring = i[3], n = i[4];
        const Py_ssize_t r0 = ring && start >= 0 ? start % ring : start;
        const Py_ssize_t hi = ring ? (r0 + n <= ring ? r0 + n : ring) : start + n;
        if (start < 0 || (ring && n > ring) || hi > L) {
            snprintf(msg, size, "kv_write: positions %zd .. %zd are past the cache's %zd rows",
                     start, start + n - 1, L);
            return msg;
        }
        const float *x = s->a[1];
        for (Py_ssize_t r = 0; r < n; r++) {
            const Py_ssize_t row = ring ? (start + r) % ring : start + r;
            for (Py_ssize_t g = 0; g < G; g++) {
                const float *from = x + r * s->rs[1] + g * D;
                if (s->kind == WEIGHTS_BF16) {  /* a bfloat16 cache: each value rounded */
                    uint16_t *to = (uint16_t *)s->a[0] + (g * L + row) * D;
                    for (Py_ssize_t d = 0; d < D; d++)
                        to[d] = float_to_bf16(from[d]);
                } else {
                    memcpy(out + (g * L + row) * D, from, sizeof(float) * D);
                }
            }
        }
        return NULL;
    }
    case OP_EMBEDDING: {
        const int32_t *ids = s->a[1];
        for (Py_ssize_t r = 0; r < i[2]; r++)
            if (ids[r] < 0 || ids[r] >= i[0]) {
                snprintf(msg, size, "embedding: row %zd's token id %d is outside the "
                         "vocabulary (0 .. %zd)", r, (int)ids[r], i[0] - 1);
                return msg;
            }
        if (s->held >= 0) {  /* each id's row widened, then scaled */
            const Py_ssize_t rb = held_row_bytes(s->held, i[1]);
            for (Py_ssize_t r = 0; r < i[2]; r++, out += i[1]) {
                held_widen(s->held, s->a[2], rb, ids[r], ids[r] + 1, i[1], out);
                if (s->f[0] != 1.0f)
                    for (Py_ssize_t c = 0; c < i[1]; c++)
                        out[c] *= s->f[0];
            }
            return NULL;
        }
        for (Py_ssize_t r = 0; r < i[2]; r++, out += i[1]) {
            const float *row = (const float *)s->a[2] + (Py_ssize_t)ids[r] * i[1];
            if (s->f[0] == 1.0f)
                memcpy(out, row, sizeof(float) * i[1]);
            else
                for (Py_ssize_t c = 0; c < i[1]; c++)
                    out[c] = row[c] * s->f[0];
        }
        return NULL;
    }
    case OP_LAYER_NORM: {
        const float *w = s->a[2], *b = s->a[3];
        const Py_ssize_t d = i[1], inner = i[3];
        for (Py_ssize_t r = 0; r < i[0]; r++) {
            const Py_ssize_t at = (r % i[2]) * d;
            const float *x = (const float *)s->a[1] + r / inner * s->rs[1] + r % inner * d;
            float *out = (float *)s->a[0] + r / inner * s->rs[0] + r % inner * d;
            float sum = 0.0f;
            for (Py_ssize_t c = 0; c < d; c++)
                sum += x[c];
            const float mean = sum * (1.0f / (float)d);
            float sq = 0.0f;
            for (Py_ssize_t c = 0; c < d; c++) {
                out[c] = x[c] - mean;
                sq += out[c] * out[c];
            }
            const float sd = sqrtf(sq * (1.0f / (float)d) + s->f[0]);
            for (Py_ssize_t c = 0; c < d; c++)
                out[c] = b ? out[c] / sd * w[at + c] + b[at + c] : out[c] / sd * w[at + c];
        }
        return NULL;
    }
    case OP_COLUMNS: {  /* x's rows rs[1] apart: a fused projection's column view too */
        const float *x = (const float *)s->a[1] + i[1];
        for (Py_ssize_t r = 0; r < i[3]; r++, x += s->rs[1], out += i[2] - i[1])
            memcpy(out, x, sizeof(float) * (i[2] - i[1]));
        return NULL;
    }
    case OP_CLAMP: {
        const float c = s->f[0];
        for (Py_ssize_t r = 0; r < i[0]; r++) {
            const float *x = (const float *)s->a[1] + r * s->rs[1];
            float *o = out + r * s->rs[0];
            for (Py_ssize_t k = 0; k < i[1]; k++)
                o[k] = x[k] > c ? c : x[k] < -c ? -c : x[k];
        }
        return NULL;
    }
    case OP_SOFTCAP: {
        const float *x = s->a[1], cap = s->f[0];
        Py_ssize_t k = 0;
#ifdef HAVE_X86
        if (simd >= SIMD_AVX2)
            k = softcap_avx2(out, x, i[0], cap);
#endif
        for (; k < i[0]; k++)
            out[k] = tanhf(x[k] / cap) * cap;
        return NULL;
    }
    case OP_ADD_ROWS: {
        if (start < 0 || start + i[2] > i[1]) {
            snprintf(msg, size, "add_rows: positions %zd .. %zd are past the table's %zd",
                     start, start + i[2] - 1, i[1]);
            return msg;
        }
        const float *x = s->a[1], *t = (const float *)s->a[2] + start * i[0];
        for (Py_ssize_t k = 0; k < i[2] * i[0]; k++)
            out[k] = x[k] + t[k];
        return NULL;
    }
    case OP_ROUTER: {
        /* m rows (a prompt chunk's) one at a time: each row's choice the decode step's */
        router_call c = {out, s->a[1], s->a[2], s->kind, s->a[4], s->a[5], s->a[6], s->a[3],
                         i[0], i[1], i[2], i[6], i[7], (int)i[3], (int)i[4], (int)i[5],
                         (int)i[8], (int)i[9], s->f[0], s->f[1], s->f[2], s->f[3]};
        for (Py_ssize_t r = 0; r < i[10]; r++, c.out += 2 * i[2], c.x += i[1]) {
            const char *why = router_run(&c);
            if (why)
                return why;
        }
        return NULL;
    }
    case OP_EXPERTS: {
        experts_call c = {out, s->a[1], s->a[2], s->a[6], s->a[7], s->a[8], s->a[3], s->a[4],
                          s->kind, s->a[5], i[0], i[1], i[2], i[3], i[4], i[5], (int)i[6],
                          (int)i[7], (int)(i[8] & 1), (int)(i[8] >> 1 & 1), (int)(i[8] >> 2 & 1),
                          (int)(i[8] >> 3 & 1), s->f[0], s->f[1], s->f[2], s->f[3], i[9],
                          (int)i[10]};
        return experts_run(&c);
    }
    case OP_TAKE_ROW:
        if (start < 0 || start >= i[1]) {
            snprintf(msg, size, "take_row: row %zd is not within the %zd rows", start, i[1]);
            return msg;
        }
        memcpy(out, (const float *)s->a[1] + start * i[0], sizeof(float) * i[0]);
        return NULL;
    case OP_CAUSAL_CONV: {
        conv_args a = {s->a[1], s->a[2], s->a[3], out, s->a[4], i[0], i[1], i[2], s->rs[1],
                       (int)i[3], start == 0};
        work_run(conv_part, &a, i[0] * i[1] * i[2]);
        return NULL;
    }
    case OP_SCAN: {
        scan_args a = {s->a[1], s->a[2], s->a[3], s->a[4], s->a[5], s->a[6], s->a[7], out,
                       s->a[8], i[0], i[1], i[2], s->rs[1], s->rs[2], s->rs[4], s->rs[5],
                       s->a[7] ? s->rs[7] : 0, start == 0};
        work_run(scan_part, &a, i[0] * i[1] * i[2] * 4);
        return NULL;
    }
    case OP_SSD: {
        ssd_args a = {s->a[1], s->a[2], s->a[3], s->a[4], s->a[5], s->a[6], s->a[7], out,
                      s->a[8], i[0], i[1], i[2], i[3], s->f[0], s->f[1], start == 0};
        work_run(ssd_part, &a, i[0] * i[1] * i[2] * 4);
        return NULL;
    }
    case OP_DELTA: {
        delta_args a = {s->a[1], s->a[2], s->a[3], s->a[4], s->a[5], s->a[6], s->a[7], out,
                        s->a[8], i[0], i[1], i[2], i[3], s->f[0], start == 0, (int)i[4]};
        work_run(delta_part, &a, i[2] * i[1] * i[3] * 4);
        return NULL;
    }
    case OP_GATED_NORM: {
        gnorm_args a = {s->a[1], s->a[2], s->a[3], out, i[0], i[1], i[2], i[3], s->rs[1],
                        s->rs[2], s->f[0], (int)i[4]};
        rows_run(gnorm_part, &a, i[0], i[0] * i[1]);
        return NULL;
    }
    }
    return "an unknown step";
}

#include "_cpu_attend_rows.h"

/* run(program, start, rows, position, first, last[, positions]): steps first .. last, GIL
 * released; positions, a tuple of ints, each row's position (a batched decode step's).
 * ValueError (naming the step) where a step's position or rows are past its arrays; the
 * steps before it have run. */
static PyObject *py_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6 && nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "run(program, start, rows, position, first, last"
                                         "[, positions])");
        return NULL;
    }
    program_t *p = PyCapsule_GetPointer(args[0], PROGRAM_CAPSULE);
    if (!p)
        return NULL;
    Py_ssize_t call[3 + CALL_ROWS], ncall = 3, first, last;
    for (int k = 0; k < 3; k++)
        if ((call[k] = PyLong_AsSsize_t(args[1 + k])) == -1 && PyErr_Occurred())
            return NULL;
    if (nargs == 7) {
        if (!PyTuple_Check(args[6]) || PyTuple_GET_SIZE(args[6]) > CALL_ROWS) {
            PyErr_Format(PyExc_TypeError, "run: positions is a tuple of at most %d ints",
                         CALL_ROWS);
            return NULL;
        }
        for (Py_ssize_t r = 0; r < PyTuple_GET_SIZE(args[6]); r++)
            if ((call[ncall++] = PyLong_AsSsize_t(PyTuple_GET_ITEM(args[6], r))) == -1 &&
                PyErr_Occurred())
                return NULL;
    }
    if (((first = PyLong_AsSsize_t(args[4])) == -1 || (last = PyLong_AsSsize_t(args[5])) == -1)
        && PyErr_Occurred())
        return NULL;
    if (first < 0 || last > p->count || first > last) {
        PyErr_Format(PyExc_ValueError, "run: steps %zd .. %zd are not within 0 .. %zd", first,
                     last, p->count);
        return NULL;
    }
    const char *error = NULL;
    char msg[192];
    Py_ssize_t at = first;
    Py_BEGIN_ALLOW_THREADS
    if (profile_on) {
        for (; at < last && !error; at++) {
            const long t0 = now_ns();
            Py_ssize_t grouped = ncall > 3 ? attend_rows(p, at, last, call, ncall) : 0;
            if (grouped) {
                profile_ns[OP_ATTEND] += now_ns() - t0;
                profile_calls[OP_ATTEND] += grouped;
                at += grouped - 1;
                continue;
            }
            error = step_run(&p->steps[at], call, ncall, msg, sizeof msg);
            profile_ns[p->steps[at].op] += now_ns() - t0;
            profile_calls[p->steps[at].op]++;
        }
    } else {
        for (; at < last && !error; at++) {
            Py_ssize_t grouped = ncall > 3 ? attend_rows(p, at, last, call, ncall) : 0;
            if (grouped) {
                at += grouped - 1;
                continue;
            }
            error = step_run(&p->steps[at], call, ncall, msg, sizeof msg);
        }
    }
    Py_END_ALLOW_THREADS
    if (error) {
        PyErr_Format(PyExc_ValueError, "run: step %zd: %s", at - 1, error);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* profile(on): start (True) or stop (False) counting; returns what was counted since the
 * last call, {code name: (calls, ns)}, and clears it. */
static PyObject *py_profile(PyObject *self, PyObject *arg) {
    const int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    PyObject *d = PyDict_New();
    if (!d)
        return NULL;
    for (int k = 0; k < OP_COUNT; k++) {
        if (!profile_calls[k])
            continue;
        PyObject *v = Py_BuildValue("(ll)", profile_calls[k], profile_ns[k]);
        if (!v || PyDict_SetItemString(d, OP_NAMES[k], v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(v);
    }
    memset(profile_calls, 0, sizeof profile_calls);
    memset(profile_ns, 0, sizeof profile_ns);
    profile_on = on; /* between runs: Python holds the GIL here, no run is counting */
    return d;
}
