/* A compiled decode step as one native call: a flat program of kernel calls, included by
 * _cpu.c after its kernels.
 *
 * Why: a decode step is ~400 steps a token; run from Python each costs a call, a partial
 * application and its argument checks (measured ~3.5 ms a token on SmolLM2 beside 15-23 ms
 * of GEMVs). ``program(steps)`` checks every step's arrays once, when the plan is compiled,
 * and keeps their addresses; ``run(program, start, rows, position, first, last)`` runs steps
 * ``first .. last`` with the GIL released, the GEMVs and attention on the pool as the
 * per-step calls do, the small steps on the calling thread.
 *
 * Each step's arithmetic is its operator's (each operator module names its source): the same
 * float32 operations in the same order where the numpy kernel's order is the definition's,
 * the same GEMV and attention kernels as ``gemv`` and ``attend``. runtime/plan.py checks
 * each step against its operator's float64 reference by running it alone (``first + 1 ==
 * last``) under ``check=True``.
 *
 * A step is a tuple ``(op, start_from, start_offset, arrays, ints, floats)``: ``op`` one of
 * the OP_* codes below; its ``start`` attribute (RoPE's row, a cache write's position, the
 * query's position) is ``call[start_from] + start_offset``, where ``call`` is the run's
 * (start, rows, position), or ``start_offset`` alone where ``start_from`` is -1 (a step
 * whose start is the same at every call, or which has none); ``arrays`` its
 * output first, then its inputs (None for an absent one); ``ints`` and ``floats`` as each
 * OP_ code says.
 */

enum {
    OP_GEMV,      /* (y, x, w, b|None); (n, k); y (n) = w (n, k) x (+ b): the gemv kernel */
    OP_ATTEND,    /* (out, q, keys, values, scratch); (H, G, D, L, window, ring);
                   * (scale, softcap): one query at start, as attend (a ring of
                   * ring rows where L has grown to it, else position p at row p) */
    OP_RMS_NORM,  /* (out, x, w); (rows, d, weight rows); (eps): x * (1 / sqrt(mean(x^2) +
                   * eps)) * w per row of d, row r scaled by weight row r % weight rows */
    OP_ADD,       /* (out, a, b); (n); (scale): a + b, or a + b * scale */
    OP_MUL,       /* (out, a, b|None); (n, m); (scale): a * b[i % m], or a * scale */
    OP_GATED,     /* (out, gate, up|None); (rows, m, act); (): act(gate) * up per row of m;
                   * without up, gate rows of 2m are gate then up */
    OP_ROPE,      /* (out, x, cos, sin); (heads, D, R, interleaved, table rows); ():
                   * one row, table row start, the first R columns of each head turned */
    OP_KV_WRITE,  /* (cache, x); (G, capacity, D, ring); (): x (G, D) into row start
                   * (% ring), which the capacity must hold */
    OP_EMBEDDING, /* (out, ids, table); (vocab, hidden); (scale): table[ids[0]] (* scale) */
    OP_LAYER_NORM,/* (out, x, w, b|None); (rows, d, weight rows); (eps): (x - mean) / sqrt(
                   * mean((x - mean)^2) + eps) * w (+ b) per row of d, two passes */
    OP_COLUMNS,   /* (out, x); (width, begin, end); (): one row's columns begin .. end */
    OP_ACTIVATION,/* (out, x); (n, act); (): act(x) */
    OP_CLAMP,     /* (out, x); (n); (limit): x within [-limit, limit] */
    OP_SOFTCAP,   /* (out, x); (n); (cap): tanh(x / cap) * cap */
    OP_ADD_ROWS,  /* (out, x, table); (hidden, table rows); (): x + table[start] */
    OP_COUNT
};

/* Activations by their operators/activation.py names: silu (and swish), the tanh form of
 * gelu (gelu_new, gelu_pytorch_tanh, ...), the erf form (gelu, gelu_python), relu,
 * quick_gelu, relu2 (relu squared). */
enum { ACT_SILU, ACT_GELU_TANH, ACT_GELU_ERF, ACT_RELU, ACT_QUICK_GELU, ACT_RELU2, ACT_COUNT };
enum { ARRAYS = 5, INTS = 6, FLOATS = 2 };

typedef struct {
    int op, start_from;
    Py_ssize_t start_offset;
    void *a[ARRAYS];
    Py_ssize_t len[ARRAYS];  /* bytes */
    Py_ssize_t i[INTS];
    float f[FLOATS];
    int kind;                /* OP_GEMV: WEIGHTS_F32, WEIGHTS_BF16 or 2 (Q8_0) */
} step_t;

typedef struct {
    Py_ssize_t count;
    step_t *steps;
    PyObject *keep;  /* the steps' tuple: every array a step points into stays alive */
} program_t;

#define PROGRAM_CAPSULE "iron_spec.operators._cpu.program"

static void program_free(PyObject *capsule) {
    program_t *p = PyCapsule_GetPointer(capsule, PROGRAM_CAPSULE);
    if (!p)
        return;
    Py_XDECREF(p->keep);
    free(p->steps);
    free(p);
}

/* The expected bytes of each array a step reads or writes, from its ints; 0 for an absent
 * one. Returns -1 (a Python error set) where the step's ints do not describe a step. */
static int step_sizes(const step_t *s, Py_ssize_t want[ARRAYS], char fmt[ARRAYS]) {
    const Py_ssize_t *i = s->i;
    for (int k = 0; k < ARRAYS; k++) {
        want[k] = 0;
        fmt[k] = 'f';
    }
    switch (s->op) {
    case OP_GEMV:
        if (i[0] < 1 || i[1] < 1)
            break;
        want[0] = 4 * i[0];
        want[1] = 4 * i[1];
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
    case OP_ATTEND:
        if (i[0] < 1 || i[1] < 1 || i[0] % i[1] || i[2] < 1 || i[3] < 1 || i[4] < 0 ||
            i[5] < 0 || (i[5] > 0 && (i[4] == 0 || i[4] > i[5])))
            break;
        want[0] = want[1] = 4 * i[0] * i[2];
        want[2] = want[3] = 4 * i[1] * i[3] * i[2];
        want[4] = -1;  /* the scratch: checked at each run, by the position */
        return 0;
    case OP_RMS_NORM:
        if (i[0] < 1 || i[1] < 1 || i[2] < 1 || i[0] % i[2])
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
        if (i[0] < 1 || i[1] < 1 || i[2] < 2 || i[2] % 2 || i[2] > i[1] || i[4] < 1)
            break;
        want[0] = want[1] = 4 * i[0] * i[1];
        want[2] = want[3] = 4 * i[4] * i[2];
        return 0;
    case OP_KV_WRITE:
        if (i[0] < 1 || i[1] < 1 || i[2] < 1 || i[3] < 0)
            break;
        want[0] = 4 * i[0] * i[1] * i[2];
        want[1] = 4 * i[0] * i[2];
        return 0;
    case OP_EMBEDDING:
        if (i[0] < 1 || i[1] < 1)
            break;
        want[0] = 4 * i[1];
        want[1] = -1;  /* the ids: at least one int32 */
        fmt[1] = 'i';
        want[2] = 4 * i[0] * i[1];
        return 0;
    case OP_LAYER_NORM:
        if (i[0] < 1 || i[1] < 1 || i[2] < 1 || i[0] % i[2])
            break;
        want[0] = want[1] = 4 * i[0] * i[1];
        want[2] = 4 * i[2] * i[1];
        want[3] = s->a[3] ? want[2] : 0;
        return 0;
    case OP_COLUMNS:
        if (i[0] < 1 || i[1] < 0 || i[2] <= i[1] || i[2] > i[0])
            break;
        want[0] = 4 * (i[2] - i[1]);
        want[1] = 4 * i[0];
        return 0;
    case OP_ACTIVATION:
        if (i[0] < 1 || i[1] < 0 || i[1] >= ACT_COUNT)
            break;
        want[0] = want[1] = 4 * i[0];
        return 0;
    case OP_CLAMP:
    case OP_SOFTCAP:
        if (i[0] < 1 || !(s->f[0] > 0.0f))
            break;
        want[0] = want[1] = 4 * i[0];
        return 0;
    case OP_ADD_ROWS:
        if (i[0] < 1 || i[1] < 1)
            break;
        want[0] = want[1] = 4 * i[0];
        want[2] = 4 * i[0] * i[1];
        return 0;
    }
    PyErr_Format(PyExc_ValueError, "program: step of op %d has sizes that describe none",
                 s->op);
    return -1;
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
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(arg, j), "iinO!O!O!;a step is (op, start_from, "
                              "start_offset, arrays, ints, floats)", &s->op, &s->start_from,
                              &s->start_offset, &PyTuple_Type, &arrays, &PyTuple_Type, &ints,
                              &PyTuple_Type, &floats))
            goto fail;
        if (s->op < 0 || s->op >= OP_COUNT || s->start_from < -1 || s->start_from > 2 ||
            PyTuple_GET_SIZE(arrays) > ARRAYS || PyTuple_GET_SIZE(ints) > INTS ||
            PyTuple_GET_SIZE(floats) > FLOATS) {
            PyErr_Format(PyExc_ValueError, "program: step %zd is no step", j);
            goto fail;
        }
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(ints); k++)
            if ((s->i[k] = PyLong_AsSsize_t(PyTuple_GET_ITEM(ints, k))) == -1 && PyErr_Occurred())
                goto fail;
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(floats); k++)
            if ((s->f[k] = (float)PyFloat_AsDouble(PyTuple_GET_ITEM(floats, k))) == -1.0f &&
                PyErr_Occurred())
                goto fail;
        char formats[ARRAYS] = {0};
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(arrays); k++) {
            PyObject *obj = PyTuple_GET_ITEM(arrays, k);
            if (obj == Py_None)
                continue;
            Py_buffer view;
            int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (k == 0 ? PyBUF_WRITABLE : 0);
            if (PyObject_GetBuffer(obj, &view, flags) != 0) {
                PyErr_Format(PyExc_ValueError, "program: step %zd's array %zd is not a "
                             "C-contiguous%s array", j, k, k == 0 ? " writable" : "");
                goto fail;
            }
            s->a[k] = view.buf;
            s->len[k] = view.len;
            formats[k] = view.format && view.format[1] == 0 ? view.format[0] : '?';
            if (formats[k] == 'l' && view.itemsize == 4)
                formats[k] = 'i';
            PyBuffer_Release(&view);
        }
        if (s->op == OP_GEMV)
            s->kind = formats[2] == 'H' ? WEIGHTS_BF16 : formats[2] == 'B' ? 2 : WEIGHTS_F32;
        Py_ssize_t want[ARRAYS];
        char fmt[ARRAYS];
        if (step_sizes(s, want, fmt) < 0)
            goto fail;
        for (int k = 0; k < ARRAYS; k++) {
            if (want[k] == 0 && s->a[k] == NULL)
                continue;
            int sized = want[k] < 0 ? s->len[k] > 0 : s->len[k] == want[k];
            if (!s->a[k] || !sized || formats[k] != fmt[k]) {
                PyErr_Format(PyExc_ValueError, "program: step %zd (op %d): array %d is %zd "
                             "bytes of '%c', not %zd of '%c'", j, s->op, k, s->len[k],
                             formats[k] ? formats[k] : '-', want[k], fmt[k]);
                goto fail;
            }
        }
        for (int k = 1; k < ARRAYS; k++)  /* an output apart from what the step reads */
            if (s->a[k] && s->op != OP_KV_WRITE) {
                const char *o = s->a[0], *x = s->a[k];
                if (o < x + s->len[k] && x < o + s->len[0] &&
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

static inline float silu(float x) { return x / (1.0f + expf(-x)); }

/* gelu's erf form as operators/activation.py's _gelu32: 0.5 x erfc(-x / sqrt(2)), no
 * cancellation for negative x. */
static inline float gelu_erf(float x) { return erfcf(x * -0.70710678118654752f) * x * 0.5f; }

/* As operators/activation.py's _gelu_tanh32, operation for operation. */
static inline float gelu_tanh(float x) {
    float t = x * x;
    t *= x;
    t *= 0.044715f;
    t += x;
    t *= 0.7978845608028654f;  /* sqrt(2 / pi), rounded to float32 as the numpy kernel's */
    t = tanhf(t) + 1.0f;
    return x * t * 0.5f;
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

/* act(gate) (* up, where given) over n values, 8 at a time, for silu and gelu's tanh form
 * (0 columns for any other act): exp256 (x <= 0, ~2 ulp) of -|x| serves both signs, silu(x)
 * = x / (1 + e) for x >= 0, x e / (1 + e) below; tanh256. The rest of the row as act_plain. */
__attribute__((target("avx2,fma"))) static Py_ssize_t gated_avx2(float *out, const float *g,
                                                                 const float *u, Py_ssize_t n,
                                                                 int act) {
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    Py_ssize_t c = 0;
    if (act != ACT_SILU && act != ACT_GELU_TANH)
        return 0;
    for (; c + 8 <= n; c += 8) {
        __m256 x = _mm256_loadu_ps(g + c), y;
        if (act == ACT_SILU) {
            __m256 e = exp256(_mm256_or_ps(x, sign));  /* exp(-|x|) */
            __m256 neg = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ);
            __m256 num = _mm256_blendv_ps(x, _mm256_mul_ps(x, e), neg);
            y = _mm256_div_ps(num, _mm256_add_ps(one, e));
        } else {
            __m256 t = _mm256_mul_ps(x, x);
            t = _mm256_mul_ps(t, x);
            t = _mm256_mul_ps(t, _mm256_set1_ps(0.044715f));
            t = _mm256_add_ps(t, x);
            t = _mm256_mul_ps(t, _mm256_set1_ps(0.7978845608028654f));
            __m256 th = tanh256(t);
            y = _mm256_mul_ps(_mm256_mul_ps(x, _mm256_add_ps(th, one)), _mm256_set1_ps(0.5f));
        }
        _mm256_storeu_ps(out + c, u ? _mm256_mul_ps(y, _mm256_loadu_ps(u + c)) : y);
    }
    return c;
}
#endif

static inline float act_one(float x, int act) {
    switch (act) {
    case ACT_SILU: return silu(x);
    case ACT_GELU_TANH: return gelu_tanh(x);
    case ACT_GELU_ERF: return gelu_erf(x);
    case ACT_RELU: return x < 0.0f ? 0.0f : x;  /* NaN stays NaN, as numpy's maximum */
    case ACT_RELU2: return x < 0.0f ? 0.0f : x * x;
    default: return x / (1.0f + expf(-1.702f * x));  /* quick_gelu */
    }
}

/* act(g) (* u, where u is given) from column c on. */
static void act_plain(float *out, const float *g, const float *u, Py_ssize_t c, Py_ssize_t n,
                      int act) {
    for (; c < n; c++)
        out[c] = u ? act_one(g[c], act) * u[c] : act_one(g[c], act);
}

/* One step; 0, or an error message (a position past what the step's arrays hold). */
static const char *step_run(const step_t *s, const Py_ssize_t call[3]) {
    const Py_ssize_t *i = s->i;
    Py_ssize_t start = s->start_offset + (s->start_from < 0 ? 0 : call[s->start_from]);
    float *out = s->a[0];
    switch (s->op) {
    case OP_GEMV: {
        gemv_args a = {s->kind == WEIGHTS_F32 ? s->a[2] : NULL, s->a[1], s->a[3],
                       s->kind == WEIGHTS_BF16 ? s->a[2] : NULL, s->kind == 2 ? s->a[2] : NULL,
                       out, i[0], i[1]};
        pool_run(gemv_part, &a);
        return NULL;
    }
    case OP_ATTEND: {
        int H = (int)i[0], G = (int)i[1], D = (int)i[2];
        Py_ssize_t L = i[3];
        /* A ring not yet grown to its rows holds positions at their own rows (as attend). */
        if (start < 0 || (start >= L && !(i[5] > 0 && L == i[5])))
            return "attention: the query's position is past the cache";
        if (s->len[4] / 4 < attend_need(H, G, D, start, i[4]))
            return "attention: the scratch is short for this position";
        attend_run(out, s->a[1], s->a[2], s->a[3], s->a[4], H, G, D, L, start, i[4], s->f[0],
                   s->f[1], i[5]);
        return NULL;
    }
    case OP_RMS_NORM: {
        const float *x = s->a[1], *w = s->a[2];
        const Py_ssize_t d = i[1];
        for (Py_ssize_t r = 0; r < i[0]; r++, x += d, out += d) {
            const float *wr = w + (r % i[2]) * d;
            float acc[8] = {0};
            Py_ssize_t c = 0;
            for (; c + 8 <= d; c += 8)
                for (int l = 0; l < 8; l++)
                    acc[l] += x[c + l] * x[c + l];
            float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
            for (; c < d; c++)
                sum += x[c] * x[c];
            float inv = 1.0f / sqrtf(sum / (float)d + s->f[0]);
            for (c = 0; c < d; c++)
                out[c] = x[c] * inv * wr[c];
        }
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
        const Py_ssize_t m = i[1];
        const float *g = s->a[1], *u = s->a[2];
        for (Py_ssize_t r = 0; r < i[0]; r++, out += m) {
            const float *gr = u ? g + r * m : g + r * 2 * m, *ur = u ? u + r * m : gr + m;
            Py_ssize_t c = 0;
#ifdef HAVE_X86
            if (simd >= SIMD_AVX2)
                c = gated_avx2(out, gr, ur, m, (int)i[2]);
#endif
            act_plain(out, gr, ur, c, m, (int)i[2]);
        }
        return NULL;
    }
    case OP_ROPE: {
        const Py_ssize_t D = i[1], R = i[2], half = R / 2;
        if (start < 0 || start >= i[4])
            return "rope: the position is past the table";
        const float *x = s->a[1], *cs = (const float *)s->a[2] + start * R,
                    *sn = (const float *)s->a[3] + start * R;
        for (Py_ssize_t h = 0; h < i[0]; h++, x += D, out += D) {
            /* x * cos + partner(x) * sin, the tables widened per column (Rope.pack). */
            if (i[3])
                for (Py_ssize_t c = 0; c < R; c++)
                    out[c] = x[c] * cs[c] + x[c ^ 1] * sn[c];
            else
                for (Py_ssize_t c = 0; c < R; c++)
                    out[c] = x[c] * cs[c] + x[c < half ? c + half : c - half] * sn[c];
            for (Py_ssize_t c = R; c < D; c++)
                out[c] = x[c];
        }
        return NULL;
    }
    case OP_KV_WRITE: {
        const Py_ssize_t G = i[0], L = i[1], D = i[2];
        Py_ssize_t row = i[3] ? start % i[3] : start;
        if (start < 0 || row >= L)
            return "kv_write: the position is past the cache";
        const float *x = s->a[1];
        for (Py_ssize_t g = 0; g < G; g++)
            memcpy(out + (g * L + row) * D, x + g * D, sizeof(float) * D);
        return NULL;
    }
    case OP_EMBEDDING: {
        int32_t id = *(const int32_t *)s->a[1];
        if (id < 0 || id >= i[0])
            return "embedding: a token id outside the vocabulary";
        const float *row = (const float *)s->a[2] + (Py_ssize_t)id * i[1];
        if (s->f[0] == 1.0f)
            memcpy(out, row, sizeof(float) * i[1]);
        else
            for (Py_ssize_t c = 0; c < i[1]; c++)
                out[c] = row[c] * s->f[0];
        return NULL;
    }
    case OP_LAYER_NORM: {
        const float *x = s->a[1], *w = s->a[2], *b = s->a[3];
        const Py_ssize_t d = i[1];
        for (Py_ssize_t r = 0; r < i[0]; r++, x += d, out += d) {
            const Py_ssize_t at = (r % i[2]) * d;
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
    case OP_COLUMNS:
        memcpy(out, (const float *)s->a[1] + i[1], sizeof(float) * (i[2] - i[1]));
        return NULL;
    case OP_ACTIVATION: {
        Py_ssize_t c = 0;
#ifdef HAVE_X86
        if (simd >= SIMD_AVX2)
            c = gated_avx2(out, s->a[1], NULL, i[0], (int)i[1]);
#endif
        act_plain(out, s->a[1], NULL, c, i[0], (int)i[1]);
        return NULL;
    }
    case OP_CLAMP: {
        const float *x = s->a[1], c = s->f[0];
        for (Py_ssize_t k = 0; k < i[0]; k++)
            out[k] = x[k] > c ? c : x[k] < -c ? -c : x[k];
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
        if (start < 0 || start >= i[1])
            return "add_rows: the position is past the table";
        const float *x = s->a[1], *t = (const float *)s->a[2] + start * i[0];
        for (Py_ssize_t k = 0; k < i[0]; k++)
            out[k] = x[k] + t[k];
        return NULL;
    }
    }
    return "an unknown step";
}

/* run(program, start, rows, position, first, last): steps first .. last, GIL released.
 * ValueError (naming the step) where a step's position is past its arrays; the steps
 * before it have run. */
static PyObject *py_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "run(program, start, rows, position, first, last)");
        return NULL;
    }
    program_t *p = PyCapsule_GetPointer(args[0], PROGRAM_CAPSULE);
    if (!p)
        return NULL;
    Py_ssize_t call[3], first, last;
    for (int k = 0; k < 3; k++)
        if ((call[k] = PyLong_AsSsize_t(args[1 + k])) == -1 && PyErr_Occurred())
            return NULL;
    if (((first = PyLong_AsSsize_t(args[4])) == -1 || (last = PyLong_AsSsize_t(args[5])) == -1)
        && PyErr_Occurred())
        return NULL;
    if (first < 0 || last > p->count || first > last) {
        PyErr_Format(PyExc_ValueError, "run: steps %zd .. %zd are not within 0 .. %zd", first,
                     last, p->count);
        return NULL;
    }
    const char *error = NULL;
    Py_ssize_t at = first;
    Py_BEGIN_ALLOW_THREADS
    for (; at < last && !error; at++)
        error = step_run(&p->steps[at], call);
    Py_END_ALLOW_THREADS
    if (error) {
        PyErr_Format(PyExc_ValueError, "run: step %zd: %s", at - 1, error);
        return NULL;
    }
    Py_RETURN_NONE;
}
