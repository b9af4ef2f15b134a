/* A batched decode step's one-query attention steps of one layer as one dispatch of the
 * pool, included by _cpu_program.h.
 *
 * runtime/batch.py puts a layer's rows' attention steps side by side, each on a scratch of
 * its own. One row's step alone (attend_run) scales its query into the scratch, splits its
 * positions into T parts (T the pool's threads), one a thread, and merges the parts'
 * softmax numerators on the calling thread. Here the same parts and merge are computed for
 * every row, so each row's result is bit for bit its step's alone, but a query is owned by
 * one thread where the rows can share the threads that way: the thread scales its query,
 * computes its T parts one after another and merges them. Why: split a part a thread, a
 * query's scaling and merge ran serially on the calling thread before and after the
 * dispatch, and each thread read short runs of positions of every row's caches; at 8 rows
 * (SmolLM2, ~70 positions) the layer's attention was ~12 us a row. A query whose positions
 * are more than a thread's share of the layer's (a long prompt beside short ones), and the
 * shortest queries left over once the rest share the threads evenly by count, are split
 * as before (scaled before the dispatch, merged after it).
 *
 * The threads take the work item by item from a shared counter (the split queries' parts
 * first, then the owned queries, longest first), so a thread that starts late (its core
 * busy) takes fewer. */

typedef struct {
    attend_args a;           /* split: set up before the dispatch; owned: by its thread */
    const step_t *s;
    Py_ssize_t start, span;  /* the query's position, positions it reads */
    int split;
} attend_row;

typedef struct {
    attend_row *rows;
    const Py_ssize_t *order; /* split rows, then owned rows longest first */
    Py_ssize_t nsplit, items;
    int T;
    atomic_long next;
} attend_rows_work;

static void attend_row_setup(attend_row *r) {
    const step_t *s = r->s;
    attend_setup(&r->a, s->a[1], s->a[2], s->a[3], s->kind == WEIGHTS_BF16, s->a[4],
                 (int)s->i[0], (int)s->i[1], (int)s->i[2], s->i[3], r->start, s->i[4],
                 s->f[0], s->f[1], s->i[5], s->a[5]);
}

static void attend_rows_items(const void *args, int part, int parts) {
    attend_rows_work *w = (attend_rows_work *)args;
    const int T = w->T;
    (void)part, (void)parts;
    for (;;) {
        const Py_ssize_t i = atomic_fetch_add(&w->next, 1);
        if (i >= w->items)
            return;
        if (i < w->nsplit * T) {  /* part i % T of a split query */
            attend_part(&w->rows[w->order[i / T]].a, (int)(i % T), T);
            continue;
        }
        attend_row *r = &w->rows[w->order[w->nsplit + i - w->nsplit * T]];
        attend_row_setup(r);
        for (int p = 0; p < T; p++)  /* the parts attend_run's threads compute, in turn */
            attend_part(&r->a, p, T);
        attend_merge(r->s->a[0], &r->a, T);
    }
}

/* The one-query attention steps from ``at`` run as above. Returns how many steps ran (0:
 * fewer than two such steps, or one that attend_any would refuse: the steps then run one
 * at a time, as ever). */
static Py_ssize_t attend_rows(const program_t *p, Py_ssize_t at, Py_ssize_t last,
                              const Py_ssize_t *call, Py_ssize_t ncall) {
    attend_row rows[CALL_ROWS];
    Py_ssize_t n = 0, total = 0;
    for (Py_ssize_t k = at; k < last && n < CALL_ROWS; k++, n++) {
        const step_t *s = &p->steps[k];
        if (s->op != OP_ATTEND || s->i[6] != 1 || s->start_from >= ncall)
            break;
        const Py_ssize_t start = s->start_offset + (s->start_from < 0 ? 0 : call[s->start_from]);
        const Py_ssize_t L = s->i[3], ring = s->i[5], window = s->i[4];
        if (start < 0 || (start >= L && !(ring > 0 && L == ring)) ||
            s->len[4] / 4 < attend_need((int)s->i[0], (int)s->i[1], (int)s->i[2], start, window))
            break;
        int shared = 0;
        for (Py_ssize_t j = at; j < k; j++)
            shared |= p->steps[j].a[4] == s->a[4] || p->steps[j].a[0] == s->a[0];
        if (shared)
            break;
        rows[n].s = s;
        rows[n].start = start;
        rows[n].span = window > 0 && start + 1 > window ? window : start + 1;
        rows[n].split = 0;
        total += rows[n].span;
    }
    if (n < 2)
        return 0;
    const int T = pool.threads ? pool.threads : 1;
    /* Split: a query past a thread's share of the positions, then the shortest of the rest
     * until they share the threads evenly by count. */
    Py_ssize_t owned = n, order[CALL_ROWS], nsplit = 0;
    for (Py_ssize_t k = 0; k < n; k++)
        if (T > 1 && rows[k].span * T > total) {
            rows[k].split = 1;
            owned--;
        }
    for (Py_ssize_t extra = T > 1 ? owned % T : 0; extra > 0; extra--) {
        Py_ssize_t least = -1;
        for (Py_ssize_t k = 0; k < n; k++)
            if (!rows[k].split && (least < 0 || rows[k].span < rows[least].span))
                least = k;
        rows[least].split = 1;
        owned--;
    }
    for (Py_ssize_t k = 0; k < n; k++)
        if (rows[k].split) {
            attend_row_setup(&rows[k]);
            order[nsplit++] = k;
        }
    /* The owned rows longest first: a late thread's last item is a short one. */
    Py_ssize_t m = nsplit;
    for (Py_ssize_t k = 0; k < n; k++) {
        if (rows[k].split)
            continue;
        Py_ssize_t j = m++;
        for (; j > nsplit && rows[order[j - 1]].span < rows[k].span; j--)
            order[j] = order[j - 1];
        order[j] = k;
    }
    attend_rows_work w = {rows, order, nsplit, nsplit * T + owned, T, 0};
    pool_run(attend_rows_items, &w);
    for (Py_ssize_t k = 0; k < nsplit; k++)
        attend_merge(rows[order[k]].s->a[0], &rows[order[k]].a, T);
    return n;
}
