/* operators._cpu: the decode step's memory-bound kernels, on a thread pool of our own.
 *
 * Why: a decode step streams every weight and, deep in a context, the KV cache, once per
 * token. numpy's OpenBLAS threads its GEMVs but never a 2000 x 64 one (it runs one core
 * below about 460k elements), so attention over the cache ran on one core at ~17 GB/s.
 * A second thread of any other pool (numba, OpenMP, Python) collides with OpenBLAS's
 * spinning worker and stalls for a scheduler slice (measured 8 ms a call). So the decode
 * step runs all of its GEMVs and its attention here, on one pool, and OpenBLAS keeps the
 * prompt chunk's GEMMs. Semantics are the operators' own (operators.linear,
 * operators.attention); their float64 references judge these kernels like any other.
 *
 * The pool: the caller and threads - 1 workers. A task has one part per thread, split
 * statically, so a result never depends on timing. A worker spins for ~200 us after its
 * last part, then sleeps; the caller runs part 0, then takes any part whose worker has not
 * started it (a worker slow to wake never stalls the call), then waits for the parts
 * workers took. No Python object is touched with the GIL released.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HAVE_X86 1
#endif

#define MAX_THREADS 64
#define SPIN_NS 200000L
/* How long a worker spins for the next task before it sleeps: SPIN_NS, or IRON_SPEC_SPIN_US
 * (microseconds) read when the pool starts. */
static long spin_ns = SPIN_NS;

typedef void (*task_fn)(const void *args, int part, int parts);

static struct {
    int threads;  /* the caller included; 0 until started */
    pthread_t workers[MAX_THREADS];
    pthread_mutex_t lock;
    pthread_cond_t wake;
    pthread_mutex_t busy;  /* one task at a time, whichever Python thread posts it */
    _Atomic long generation;
    _Atomic int sleepers;
    _Atomic long claim[MAX_THREADS];  /* generation a part may be taken at; -g once taken */
    _Atomic long done[MAX_THREADS];   /* generation whose part is finished */
    task_fn fn;
    const void *args;
    long posted;
} pool = {.lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER,
          .busy = PTHREAD_MUTEX_INITIALIZER};

/* The instruction set the kernels run on: the best this CPU has (PyInit, by cpuid), or the
 * one ``use`` picked (IRON_SPEC_SIMD, tests). Never a build machine's flags: every path is
 * compiled into every build. */
enum { SIMD_PORTABLE, SIMD_AVX2, SIMD_AVX512 };
static const char *const SIMD_NAMES[] = {"portable", "avx2", "avx512"};
static int simd = SIMD_PORTABLE, simd_best = SIMD_PORTABLE;

/* How far ahead (bytes) a GEMV part asks for its weight stream, per form (0: not at all),
 * into every cache level (prefetcht0). The hardware prefetcher alone keeps only a few lines
 * in flight, and a GEMV ran at about 1 / (1 / read + 1 / compute) of the two rates: loads
 * and arithmetic not overlapping, the denser forms (more arithmetic a byte) the furthest
 * below the read bandwidth. bench/gemv.py measures them (an Intel Xeon, 2 threads, loaded:
 * float32 / bfloat16 / int8 GEMVs 1.14x / 1.3x / 1.56x at 3-8 KB ahead, a flat optimum;
 * prefetchnta instead lost float32 and bfloat16 40% and 20%). _cpu.prefetch() sets them. */
enum { AHEAD_F32, AHEAD_BF16, AHEAD_Q8 };
static Py_ssize_t gemv_ahead[3] = {4096, 4096, 4096};
/* The cache level the bfloat16 GEMV's prefetches fill (the fifth figure _cpu.prefetch()
 * sets; the other forms' fill L1): 3, prefetcht0 (L1 and L2), on Intel; 2, prefetcht1 (L2
 * only), on AMD, where t0 held the stream below the hardware prefetcher's own rate (Zen 4,
 * one thread, the 1B shape's bfloat16 rows: 16.4 GB/s a CPU-second at t0, 18.9 none, 20.6
 * at t1, read 21.8), while the block forms' GEMVs lost 12% at t1 (docs/design-native.md).
 * PyInit picks by the CPU's vendor. */
static int gemv_level = 3;

static inline __attribute__((always_inline)) void gemv_prefetch(const char *p) {
    if (gemv_level == 2)
        __builtin_prefetch(p, 0, 2);
    else
        __builtin_prefetch(p, 0, 3);
}
/* A decode step's attention asks for the cache rows it walks as far ahead (bytes; 0: not
 * at all), for the same reason: the fourth distance _cpu.prefetch() sets. */
static Py_ssize_t attend_ahead = 4096;

/* The cache level attention's requests fill (the sixth figure _cpu.prefetch() sets): as
 * gemv_level, prefetcht1 on AMD, where it ran the batched decode step's attention 6-18%
 * faster than prefetcht0 (Zen 4, 2 threads, SmolLM2 Q8_0's float32 caches, 8 rows and one,
 * 190 and 620 positions: docs/design-native.md); prefetcht0 elsewhere (not measured). */
static int attend_level = 3;

/* Every cache line of the n bytes from p, attend_ahead bytes on. */
static inline __attribute__((always_inline)) void ask_ahead(const char *p, Py_ssize_t n) {
    if (attend_ahead) {
        if (attend_level == 2)
            for (Py_ssize_t b = 0; b < n; b += 64)
                __builtin_prefetch(p + attend_ahead + b, 0, 2);
        else
            for (Py_ssize_t b = 0; b < n; b += 64)
                __builtin_prefetch(p + attend_ahead + b, 0, 3);
    }
}

static inline void relax(void) {
#ifdef HAVE_X86
    _mm_pause();
#endif
}

static long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

static void *worker_main(void *arg) {
    int part = (int)(intptr_t)arg;
    long seen = 0;
    for (;;) {
        long g = atomic_load(&pool.generation);
        if (g == seen) {
            long until = now_ns() + spin_ns;
            for (int i = 1; (g = atomic_load(&pool.generation)) == seen; i++) {
                relax();
                if ((i & 255) == 0 && now_ns() > until)
                    break;
            }
        }
        if (g == seen) {
            pthread_mutex_lock(&pool.lock);
            atomic_fetch_add(&pool.sleepers, 1);
            while ((g = atomic_load(&pool.generation)) == seen)
                pthread_cond_wait(&pool.wake, &pool.lock);
            atomic_fetch_sub(&pool.sleepers, 1);
            pthread_mutex_unlock(&pool.lock);
        }
        seen = g;
        long expect = g;
        if (atomic_compare_exchange_strong(&pool.claim[part], &expect, -g)) {
            pool.fn(pool.args, part, pool.threads);
            atomic_store(&pool.done[part], g);
        }
    }
    return NULL;
}

/* A forked child has none of the parent's workers, and a lock another parent thread held
 * stays held: the child starts from an empty pool (the next call starts its own workers). */
static void pool_after_fork(void) {
    pthread_mutex_init(&pool.lock, NULL);
    pthread_cond_init(&pool.wake, NULL);
    pthread_mutex_init(&pool.busy, NULL);
    atomic_store(&pool.generation, 0);
    atomic_store(&pool.sleepers, 0);
    for (int k = 0; k < MAX_THREADS; k++) {
        atomic_store(&pool.claim[k], 0);
        atomic_store(&pool.done[k], 0);
    }
    pool.posted = 0;
    pool.threads = 0;
}

static int pool_start(int threads) {
    if (pool.threads)
        return 0;
    const char *spin = getenv("IRON_SPEC_SPIN_US");
    if (spin && *spin)
        spin_ns = 1000L * atol(spin);
    if (threads < 1)
        threads = 1;
    if (threads > MAX_THREADS)
        threads = MAX_THREADS;
    for (int k = 1; k < threads; k++) {
        if (pthread_create(&pool.workers[k], NULL, worker_main, (void *)(intptr_t)k) != 0) {
            threads = k;  /* fewer threads than asked: still correct */
            break;
        }
    }
    pool.threads = threads;
    return 0;
}

/* Run fn over the pool's parts; called with the GIL released. */
static void pool_run(task_fn fn, const void *args) {
    int T = pool.threads;
    if (T <= 1) {
        fn(args, 0, 1);
        return;
    }
    pthread_mutex_lock(&pool.busy);
    long g = ++pool.posted;
    pool.fn = fn;
    pool.args = args;
    for (int k = 1; k < T; k++)
        atomic_store(&pool.claim[k], g);
    atomic_store(&pool.generation, g);
    if (atomic_load(&pool.sleepers)) {
        pthread_mutex_lock(&pool.lock);
        pthread_cond_broadcast(&pool.wake);
        pthread_mutex_unlock(&pool.lock);
    }
    fn(args, 0, T);
    for (int k = 1; k < T; k++) {
        long expect = g;
        if (atomic_compare_exchange_strong(&pool.claim[k], &expect, -g)) {
            fn(args, k, T);
            atomic_store(&pool.done[k], g);
        }
    }
    for (int k = 1; k < T; k++)
        for (int i = 1; atomic_load(&pool.done[k]) != g; i++)
            if ((i & 1023) == 0)
                sched_yield();
            else
                relax();
    pthread_mutex_unlock(&pool.busy);
}

/* ---- GEMV: y = W x (+ b), W (n, k) row-major, as torch.nn.Linear on one row ------------ */

enum { WEIGHTS_F32, WEIGHTS_BF16 };  /* a program step's weight kind (Q8_0: 2) */
/* Q8_0, llama.cpp's 8-bit blocks: per 32 weights, a float16 scale d and 32 int8 values q,
 * weight = d * q. */
#define Q8_BLOCK 32
#define Q8_BYTES 34
/* Rows a group of the decode forms holds (operators/formats.py ROW_GROUP): a part of a
 * GEMV takes whole groups. */
#define GEMV_GROUP 4
/* x values a Q8_0 GEMV quantizes on the stack (its int16 values and scales); past them, on
 * the heap. */
#define X16_STACK 16384

/* ---- weights held as the checkpoint stores them (operators/held.py) ---------------------
 * A held weight's rows are in the file's own form, row-major: float32, float16, bfloat16, or
 * one of GGML's block formats (ggml-common.h's block_q8_0 ..., the bytes a GGUF tensor holds),
 * a row of k values being k / block blocks in order. Each form's code is GGML's type number
 * (gguf.GGMLQuantizationType). Every kernel widens what it reads to the float32 values
 * llama.cpp's dequantize_row_* gives (the same operations, so the same bits) and computes in
 * float32 from there: nothing is rounded that the stored form did not round. */
enum { HELD_F32 = 0, HELD_F16 = 1, HELD_Q4_0 = 2, HELD_Q4_1 = 3, HELD_Q5_0 = 6,
       HELD_Q5_1 = 7, HELD_Q8_0 = 8, HELD_Q4_K = 12, HELD_Q5_K = 13, HELD_Q6_K = 14,
       HELD_BF16 = 30,
       /* bfloat16 rows whose GEMM rounds x to bfloat16 too, as llama.cpp's does (VDPBF16PS:
        * _cpu_held_gemm.h): a prompt chunk's under --prefill-weights bfloat16; not a GGML
        * type, the held rows BF16's */
       HELD_BF16_X = 1030 };
#define QK_K 256

/* Values a block of ``form`` holds (its bytes into *bytes), or 0 where the code is no form. */
static int held_block(Py_ssize_t form, int *bytes) {
    switch (form) {
    case HELD_F32: *bytes = 4; return 1;
    case HELD_F16: case HELD_BF16: case HELD_BF16_X: *bytes = 2; return 1;
    case HELD_Q8_0: *bytes = 34; return 32;
    case HELD_Q4_0: *bytes = 18; return 32;
    case HELD_Q4_1: *bytes = 20; return 32;
    case HELD_Q5_0: *bytes = 22; return 32;
    case HELD_Q5_1: *bytes = 24; return 32;
    case HELD_Q4_K: *bytes = 144; return QK_K;
    case HELD_Q5_K: *bytes = 176; return QK_K;
    case HELD_Q6_K: *bytes = 210; return QK_K;
    default: *bytes = 0; return 0;
    }
}

/* Bytes a row of k values takes in ``form``; -1 where k is not a whole number of its blocks
 * or the code is no form. */
static Py_ssize_t held_row_bytes(Py_ssize_t form, Py_ssize_t k) {
    int bytes, block = held_block(form, &bytes);
    if (block == 0 || k < 1 || k % block)
        return -1;
    return k / block * bytes;
}

typedef struct {
    const float *w, *x, *b;
    const uint16_t *w16;  /* bfloat16 weights in row groups (formats.py) instead of w */
    const uint8_t *wq;    /* Q8_0 blocks in row groups (formats.py) instead of w */
    float *y;
    Py_ssize_t n, k;
    /* A held weight (held 1): rows of rb bytes from wh in ``form``; xp: x's values in the
     * order the bfloat16 kernel meets them (held_bf16_order), NULL for the other forms. */
    int held, form;
    const uint8_t *wh;
    Py_ssize_t rb;
    const float *xp;
} gemv_args;

/* bfloat16 as float32, exactly: its bits are a float32's upper half. */
static inline float bf16_to_float(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* float32 as bfloat16, as operators/formats.py's to_bfloat16 (what a bfloat16 KV cache
 * holds): to nearest, ties to even, past the largest finite infinity, NaN a quiet NaN. */
static inline uint16_t float_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* Element i of a KV cache row: float32, or (bf16) bfloat16 bits; bf16 a constant where
 * inlined, so each caller compiles one loop per form. */
static inline __attribute__((always_inline)) float kv_at(const void *row, Py_ssize_t i,
                                                         const int bf16) {
    return bf16 ? bf16_to_float(((const uint16_t *)row)[i]) : ((const float *)row)[i];
}

/* A little-endian IEEE float16 (finite) as float32, exactly: its exponent and mantissa
 * shifted into a float32's place and rescaled by 2^112 (the bias difference), which also
 * carries a float16 subnormal to its float32 value. */
static inline float half_to_float(const uint8_t *p) {
    uint32_t h = (uint32_t)p[0] | (uint32_t)p[1] << 8;
    uint32_t bits = (h & 0x7fffu) << 13;
    float f;
    memcpy(&f, &bits, 4);
    f *= 0x1p112f;
    return (h & 0x8000u) ? -f : f;
}

/* A Q8_0 group's rows side by side (GEMV_GROUP = 4 lanes, whatever the instruction set). */
typedef float f4v __attribute__((vector_size(16)));
typedef int32_t i4v __attribute__((vector_size(16)));
typedef uint32_t u4v __attribute__((vector_size(16)));

/* n (<= 4) little-endian float16 scales (finite), one after another from p, as float32
 * lanes (0 past n), exactly, as half_to_float does. */
static inline __attribute__((always_inline)) f4v halves4(const uint8_t *p, int n) {
    u4v h = {0, 0, 0, 0};
    for (int i = 0; i < n; i++)
        h[i] = (uint32_t)p[2 * i] | (uint32_t)p[2 * i + 1] << 8;
    f4v f = (f4v)((h & 0x7fffu) << 13) * 0x1p112f;
    return (f4v)((u4v)f | (h & 0x8000u) << 16);
}

typedef struct {
    const float *w, *b, *x;
    float *xt;  /* x in transposed panels (_cpu_gemv.h), mp rows padded with zeros */
    float *out;
    Py_ssize_t m, n, k, mp;
    /* A held weight other than float32 (held 1): rows of rb bytes from wh in ``form``, each
     * block of a part's rows widened into wbuf[part] (GEMM_JB rows of k floats) first. */
    int held, form;
    const uint8_t *wh;
    Py_ssize_t rb;
    float **wbuf;
} gemm_args;

/* A prompt chunk's attention (_cpu_chunk.h): q (n, H, D) with rows qstride floats apart,
 * caches (G, L, D) of float32 or (kv16) bfloat16 bits, position p at row p % rows; out
 * (n, H * D). */
typedef struct {
    const float *q;
    const void *keys, *values;
    float *out, *scratch;  /* scratch: per part, (D + span) * 2W floats */
    Py_ssize_t n, start, L, rows, window, qstride, span;
    int H, G, D, kv16;
    float scale, softcap;  /* softcap 0: none */
    const float *alibi;    /* (H,) slopes: head h's score of key j from query i gains
                            * alibi[h] * (j - i) after the softcap; NULL: none */
} chunk_args;

/* A prompt chunk's rows, elementwise (_cpu_chunk.h): gated (act(x) * u, or act(x) where u
 * is NULL; act one of _cpu_chunk.h's ACT_*) or rms (x's norm times the weight u); strides
 * in floats. */
typedef struct {
    const float *x, *u;
    float *out;
    Py_ssize_t rows, d, xs, us, os, inner, wrows;
    int act, rms;
    float eps;
} rows_args;

/* A prompt chunk's rotary embedding (_cpu_chunk.h): x (n, heads, D), rows xs floats apart;
 * out (n, heads, D); tables (positions, R) per column. */
typedef struct {
    const float *x, *cos, *sin;
    float *out;
    Py_ssize_t n, heads, D, R, xs, start;
    int interleaved;
} rope_args;

/* A held block form's decode GEMV on AVX-512 VNNI (_cpu_held_x8.h's _vnni instance): used in
 * place of the AVX-512 one where the CPU has VNNI (PyInit) and ``vnni`` has not turned it off. */
static int held_vnni = 0, held_vnni_offered = 0;
static void x8_rows_vnni(const gemv_args *a, Py_ssize_t r0, Py_ssize_t r1);
static int skinny_on = 1;  /* _cpu_skinny.h's batched GEMVs in use (py_skinny) */
static int skinny_x8_vnni(const gemv_args *a, Py_ssize_t r0, Py_ssize_t r1, Py_ssize_t m,
                          Py_ssize_t xs, Py_ssize_t ys);  /* _cpu_skinny.h's */

/* One body (_cpu_vec.h, _cpu_gemv.h, _cpu_chunk.h), compiled once per instruction set. */
#define SUFFIX _portable
#define W 4
#include "_cpu_vec.h"
#include "_cpu_gemv.h"
#include "_cpu_held.h"
#include "_cpu_held_x8.h"
#include "_cpu_skinny.h"
#include "_cpu_chunk.h"
#include "_cpu_recurrent.h"
#undef SUFFIX
#undef W

#ifdef HAVE_X86
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif
#define SUFFIX _avx2
#define W 8
#include "_cpu_vec.h"
#include "_cpu_gemv.h"
#include "_cpu_held.h"
#include "_cpu_held_x8.h"
#include "_cpu_skinny.h"
#include "_cpu_chunk.h"
#include "_cpu_recurrent.h"
#undef SUFFIX
#undef W
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#endif
#define SUFFIX _avx512
#define W 16
#include "_cpu_vec.h"
#include "_cpu_gemv.h"
#include "_cpu_held.h"
#include "_cpu_held_x8.h"
#include "_cpu_skinny.h"
#include "_cpu_chunk.h"
#include "_cpu_recurrent.h"
#undef SUFFIX
#undef W
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
#endif
#define SUFFIX _vnni
#define W 16
#define X8_VNNI 1
#include "_cpu_held_k.h"
#include "_cpu_held_x8.h"
#include "_cpu_skinny.h"
#undef X8_VNNI
#undef SUFFIX
#undef W
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif

/* Part ``part`` of ``parts``' share of n items in whole groups of ``group`` (the last part's
 * clipped to n): a static split, so each item's result is the same at any thread count. */
static inline void share(Py_ssize_t n, Py_ssize_t group, int part, int parts, Py_ssize_t *lo,
                         Py_ssize_t *hi) {
    Py_ssize_t groups = (n + group - 1) / group;
    *lo = groups * part / parts * group;
    *hi = groups * (part + 1) / parts * group;
    if (*hi > n)
        *hi = n;
}

/* fn's instance for the instruction set in use (fn_avx512, fn_avx2 or fn_portable). */
#ifdef HAVE_X86
#define BY_SIMD(fn, ...)                                                                    \
    (simd == SIMD_AVX512 ? fn##_avx512(__VA_ARGS__)                                         \
     : simd == SIMD_AVX2 ? fn##_avx2(__VA_ARGS__) : fn##_portable(__VA_ARGS__))
#else
#define BY_SIMD(fn, ...) fn##_portable(__VA_ARGS__)
#endif

static void gemv_part(const void *args, int part, int parts) {
    const gemv_args *a = args;
    Py_ssize_t r0, r1;  /* whole row groups: the decode forms' */
    share(a->n, GEMV_GROUP, part, parts, &r0, &r1);
    if (r0 < r1)
        BY_SIMD(gemv_rows, a, r0, r1);
}

/* A GEMV over m rows of x at once (a batched decode step's: runtime/batch.py): each row's
 * sums are gemv_rows' own, bit for bit (the same group kernel on the same x), so a row's
 * result is the one-row GEMV's; what changes is the order the weights are read in. A part
 * takes its rows a block at a time (GEMV_BLOCK bytes of weights, whole row groups) and runs
 * the block for every x before the next, so each weight comes from memory once a step and
 * from the cache for the other rows. */
#define GEMV_BLOCK (48 * 1024)
typedef struct {
    gemv_args a;
    Py_ssize_t m, xs, ys;  /* rows of x, and elements from one row of x (of y) to the next */
} gemv_batch_args;

static Py_ssize_t gemv_row_bytes(const gemv_args *a) {
    return a->held ? a->rb : a->wq ? a->k / Q8_BLOCK * Q8_BYTES : a->w16 ? 2 * a->k : 4 * a->k;
}

static void gemv_batch_part(const void *args, int part, int parts) {
    const gemv_batch_args *b = args;
    Py_ssize_t r0, r1;
    share(b->a.n, GEMV_GROUP, part, parts, &r0, &r1);
    if (r0 >= r1 || (skinny_on && BY_SIMD(skinny_rows, &b->a, r0, r1, b->m, b->xs, b->ys)) ||
        BY_SIMD(gemv_rows_multi, &b->a, r0, r1, b->m, b->xs, b->ys))
        return;  /* each weight row read once for the x rows (held: _cpu_skinny.h) */
    Py_ssize_t block = GEMV_BLOCK / gemv_row_bytes(&b->a) / GEMV_GROUP * GEMV_GROUP;
    if (block < GEMV_GROUP)
        block = GEMV_GROUP;
    for (Py_ssize_t r = r0; r < r1; r += block) {
        const Py_ssize_t e = r + block < r1 ? r + block : r1;
        for (Py_ssize_t j = 0; j < b->m; j++) {
            gemv_args a = b->a;
            a.x += j * b->xs;
            a.y += j * b->ys;
            if (a.xp)  /* a held bfloat16 weight: each row's x in the kernel's order */
                a.xp += j * b->xs;
            BY_SIMD(gemv_rows, &a, r, e);
        }
    }
}

static int simd_lanes(void) { return simd == SIMD_AVX512 ? 16 : simd == SIMD_AVX2 ? 8 : 4; }

static void gemm_part(const void *args, int part, int parts) {
    const gemm_args *a = args;
    Py_ssize_t j0, j1;  /* whole tiles of output columns (_cpu_gemv.h's GEMM_MR) */
    share(a->n, simd == SIMD_AVX512 ? 12 : 6, part, parts, &j0, &j1);
    if (j0 < j1)
        BY_SIMD(gemm_cols, a, j0, j1, a->held ? a->wbuf[part] : NULL);
}

/* x's panels [i0, i1) of 2W rows into xt, each transposed to (k, 2W) (gemm_cols reads them
 * so): a block of 16 values of p at a time, so each source row is read in runs and each
 * panel row written whole. On the pool: x of a chunk's down projection (256 x 1536) took
 * 0.55 ms on one thread, a fifth of its GEMM. */
static void panel_part(const void *args, int part, int parts) {
    const gemm_args *a = args;
    const Py_ssize_t P = 2 * simd_lanes(), K = a->k, PB = 16;
    Py_ssize_t i0, i1;
    share(a->mp, P, part, parts, &i0, &i1);
    for (Py_ssize_t i = i0; i < i1; i += P) {
        float *dst = a->xt + i * K;
        const Py_ssize_t live = a->m - i < P ? a->m - i : P;  /* rows past m: zeros */
        for (Py_ssize_t p0 = 0; p0 < K; p0 += PB) {
            const Py_ssize_t p1 = p0 + PB < K ? p0 + PB : K;
            for (Py_ssize_t r = 0; r < P; r++) {
                const float *src = a->x + (i + r) * K;
                for (Py_ssize_t p = p0; p < p1; p++)
                    dst[p * P + r] = r < live ? src[p] : 0.0f;
            }
        }
    }
}

static void chunk_part(const void *args, int part, int parts) {
    const chunk_args *a = args;
    const Py_ssize_t P = 2 * simd_lanes(), units = a->H * ((a->n + P - 1) / P);
    Py_ssize_t u0, u1;
    share(units, 1, part, parts, &u0, &u1);
    float *scratch = a->scratch + (Py_ssize_t)part * (a->D + a->span) * P;
    BY_SIMD(chunk_units, a, u0, u1, scratch);
}

static void rows_part(const void *args, int part, int parts) {
    const rows_args *a = args;
    Py_ssize_t r0, r1;
    share(a->rows, 1, part, parts, &r0, &r1);
    if (a->rms)
        BY_SIMD(rms_rows, a, r0, r1);
    else
        BY_SIMD(gated_rows, a, r0, r1);
}

static void rope_part(const void *args, int part, int parts) {
    const rope_args *a = args;
    Py_ssize_t r0, r1;
    share(a->n, 1, part, parts, &r0, &r1);
    BY_SIMD(rope_rows, a, r0, r1);
}

/* A GEMM's copy of x (transposed panels, or rounded tiles: _cpu_tiles.h) in a buffer kept
 * between calls, one GEMM at a time (gemm_lock held). */
static pthread_mutex_t gemm_lock = PTHREAD_MUTEX_INITIALIZER;
static void *gemm_x = NULL;
static Py_ssize_t gemm_x_bytes = 0;

/* The buffer, grown to at least ``bytes`` (gemm_lock held); NULL where no memory. */
static void *gemm_buffer(Py_ssize_t bytes) {
    if (bytes > gemm_x_bytes) {
        free(gemm_x);
        gemm_x = malloc(bytes);
        gemm_x_bytes = gemm_x ? bytes : 0;
    }
    return gemm_x;
}

/* ---- attention of one query over a KV cache (a decode step) ----------------------------- */

typedef struct {
    const float *q;                  /* (H, D) already scaled */
    const void *keys, *values;       /* caches (G, L, D): float32, or (kv16) bfloat16 bits */
    float *scores, *partial;         /* (T, R, span) and (T, H, D + 2) */
    int H, G, D, kv16;
    Py_ssize_t L, lo, t, span;
    Py_ssize_t rows;                 /* position p at row p % rows: a ring's, else L */
    float softcap;                   /* 0: none */
    const float *alibi;              /* (H,) slopes as chunk_args'; NULL: none */
} attend_args;

/* Positions are walked by a row pointer (bytes: pitch a row) that wraps at the cache's
 * end, in the same code with or without a ring, so a ring's results are bit for bit a
 * whole cache's. */
#define ROW_AT(base, j) ((base) + ((j) % a->rows) * pitch)
#define NEXT_ROW(ptr, base) ((ptr) += pitch, (ptr) = (ptr) == (base) + a->rows * pitch ? (base) : (ptr))

#ifdef HAVE_X86
__attribute__((target("avx2,fma"))) static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* exp(x) for x <= 0 to ~2 ulp: x = n ln2 + r, |r| <= ln2 / 2, a degree-6 polynomial in r
 * (Cephes' expf coefficients), times 2^n; below -87.3 it is 0, as expf's underflow. */
__attribute__((target("avx2,fma"))) static inline __m256 exp256(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.33654f);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(x, lo);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(under, y);
}

/* Eight values of a cache row from element d: float32, or (bf16) bfloat16 bits widened. */
__attribute__((target("avx2,fma"))) static inline __attribute__((always_inline)) __m256
kv_load8(const char *row, int d, const int bf16) {
    if (bf16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(row + 2 * (Py_ssize_t)d))), 16));
    return _mm256_loadu_ps((const float *)row + d);
}

/* Up to ATTEND_HEADS query heads of one kv head per sweep over its rows: each key and value
 * row read from memory once for all of them (a GQA group shares its kv head's rows). */
#define ATTEND_HEADS 8

/* Eight rows' dot products (one accumulator each, 8 lanes) summed across into one vector,
 * row i in lane i: three rounds of pairwise horizontal adds. */
__attribute__((target("avx2,fma"))) static inline __attribute__((always_inline)) __m256
sum8x8(const __m256 *u) {
    __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(u[0], u[1]), _mm256_hadd_ps(u[2], u[3]));
    __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(u[4], u[5]), _mm256_hadd_ps(u[6], u[7]));
    /* a: rows 0-3's sums of lanes 0-3 | of lanes 4-7; b likewise for rows 4-7 */
    return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

/* Value rows weighted per block: their pointers taken by the walk of ROW_AT / NEXT_ROW
 * (a ring wraps inside a block too), the block's 64 x D floats then read from L1 per head. */
#define ATTEND_BLOCK 64

/* Eight keys' scores x (from rows jb .., nb of them) of head h of kv head g: the softcap
 * and ALiBi applied, stored at out; returned with the lanes past nb at -FLT_MAX, for the
 * running max. */
__attribute__((target("avx2,fma"))) static inline __attribute__((always_inline)) __m256
scores_out(const attend_args *a, int g, int h, Py_ssize_t jb, int nb, float *out, __m256 x) {
    if (a->softcap > 0.0f || a->alibi || nb < 8) {
        float t[8];
        _mm256_storeu_ps(t, x);
        const float slope = a->alibi ? a->alibi[g * (a->H / a->G) + h] : 0.0f;
        for (int i = 0; i < nb; i++) {
            if (a->softcap > 0.0f)
                t[i] = tanhf(t[i] / a->softcap) * a->softcap;
            if (a->alibi)  /* the query is at t - 1 */
                t[i] += slope * (float)(jb + i - (a->t - 1));
            out[i] = t[i];
        }
        for (int i = nb; i < 8; i++)
            t[i] = -FLT_MAX;
        return _mm256_loadu_ps(t);
    }
    _mm256_storeu_ps(out, x);
    return x;
}

/* A head's n scores x in place as exp(x - m), m the max of the running max mx: m into *m,
 * the sum into *l. */
__attribute__((target("avx2,fma"))) static inline __attribute__((always_inline)) void
softmax_numerators(float *x, Py_ssize_t n, __m256 mx, float *m, float *l) {
    float t[8];
    _mm256_storeu_ps(t, mx);
    *m = t[0];
    for (int i = 1; i < 8; i++)
        *m = t[i] > *m ? t[i] : *m;
    __m256 total = _mm256_setzero_ps(), mv = _mm256_set1_ps(*m);
    Py_ssize_t j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(x + j), mv));
        _mm256_storeu_ps(x + j, e);
        total = _mm256_add_ps(total, e);
    }
    *l = hsum8(total);
    for (; j < n; j++) {
        x[j] = expf(x[j] - *m);
        *l += x[j];
    }
}

/* Scores and values of the heads of kv head g against rows j0 .. j1 (D a multiple of 8).
 * Scores eight keys at a time, per head in 8 independent accumulators (one chain per key,
 * so the FMAs never wait on each other) summed across by sum8x8; the eight rows are read
 * from memory for the first head, from L1 for the rest. Values a block of rows at a time,
 * per head 64 columns' sums in registers over the block's rows, in the rows' order.
 * Measured against the kernel before it (one key at a time, its sums summed across per
 * key; values 16 columns over every row): 1.3-1.4x at 2000 positions, cold caches.
 * Into s (head r's numerators at s + r * n) and partial (head r's D sums, then its max
 * and denominator). */
/* head_dim up to which attend_blocked_of widens a bfloat16 block's rows once (stack: 8 + 64
 * rows of it, 72 KB at 256); past it each read widens its own. */
#define ATTEND_STAGE_D 256

/* Rows rows[0 .. n) of bfloat16 bits (D values each, D a multiple of 8) widened into out
 * (n, D) float32, and rows[i] pointed at its copy. */
__attribute__((target("avx2,fma"))) static inline __attribute__((always_inline)) void
widen_rows(const char **rows, int n, int D, float *out) {
    for (int i = 0; i < n; i++) {
        float *o = out + (Py_ssize_t)i * D;
        for (int d = 0; d < D; d += 8)
            _mm256_storeu_ps(o + d, kv_load8(rows[i], d, 1));
        rows[i] = (const char *)o;
    }
}

__attribute__((target("avx2,fma"))) static inline __attribute__((always_inline)) void
attend_blocked_of(const attend_args *a, int g, Py_ssize_t j0, Py_ssize_t j1, float *s,
                  float *partial, const int bf16) {
    const int R = a->H / a->G, D = a->D;
    const Py_ssize_t n = j1 - j0, pitch = (Py_ssize_t)D * (bf16 ? 2 : 4);
    const char *K = (const char *)a->keys + (Py_ssize_t)g * a->L * pitch;
    const char *V = (const char *)a->values + (Py_ssize_t)g * a->L * pitch;
    const float *qg = a->q + (Py_ssize_t)g * R * D;
    const char *rows[ATTEND_BLOCK];
    /* bfloat16 rows widened once into float32 (L1, L2) where D allows, not once per query
     * head of the group: each is read R times (measured 1.3x faster on SmolLM2's 3 heads a
     * group than widening at every read). Then the loops below read float32. */
    const int stage = bf16 && D <= ATTEND_STAGE_D, wide = bf16 && !stage;
    float kw[stage ? 8 * D : 1], vw[stage ? ATTEND_BLOCK * D : 1];
    __m256 mx[ATTEND_HEADS];
    float m[ATTEND_HEADS], l[ATTEND_HEADS];
    for (int r0 = 0; r0 < R; r0 += ATTEND_HEADS) {
        const int rb = R - r0 < ATTEND_HEADS ? R - r0 : ATTEND_HEADS;
        for (int r = 0; r < rb; r++)
            mx[r] = _mm256_set1_ps(-FLT_MAX);
        const char *k = ROW_AT(K, j0);
        for (Py_ssize_t jb = j0; jb < j1; jb += 8) {
            const int nb = j1 - jb < 8 ? (int)(j1 - jb) : 8;
            for (int i = 0; i < 8; i++) {
                rows[i] = i < nb ? k : rows[0];  /* past the end: row 0 again, discarded */
                if (i < nb) {
                    ask_ahead(k, pitch);
                    NEXT_ROW(k, K);
                }
            }
            if (stage) {
                widen_rows(rows, nb, D, kw);
                for (int i = nb; i < 8; i++)
                    rows[i] = rows[0];
            }
            for (int r = 0; r < rb; r++) {
                const float *q = qg + (Py_ssize_t)(r0 + r) * D;
                __m256 u[8];
                for (int i = 0; i < 8; i++)
                    u[i] = _mm256_setzero_ps();
                for (int d = 0; d < D; d += 8) {
                    __m256 qv = _mm256_loadu_ps(q + d);
                    for (int i = 0; i < 8; i++)
                        u[i] = _mm256_fmadd_ps(qv, kv_load8(rows[i], d, wide), u[i]);
                }
                __m256 x = scores_out(a, g, r0 + r, jb, nb,
                                      s + (Py_ssize_t)(r0 + r) * n + (jb - j0), sum8x8(u));
                mx[r] = _mm256_max_ps(mx[r], x);
            }
        }
        for (int r = 0; r < rb; r++) {
            softmax_numerators(s + (Py_ssize_t)(r0 + r) * n, n, mx[r], &m[r], &l[r]);
            float *o = partial + ((Py_ssize_t)g * R + r0 + r) * (D + 2);
            memset(o, 0, sizeof(float) * D);
        }
        const char *v = ROW_AT(V, j0);
        for (Py_ssize_t jb = j0; jb < j1; jb += ATTEND_BLOCK) {
            const int nb = j1 - jb < ATTEND_BLOCK ? (int)(j1 - jb) : ATTEND_BLOCK;
            for (int i = 0; i < nb; i++) {
                rows[i] = v;
                ask_ahead(v, pitch);
                NEXT_ROW(v, V);
            }
            if (stage)
                widen_rows(rows, nb, D, vw);
            for (int r = 0; r < rb; r++) {
                const float *p = s + (Py_ssize_t)(r0 + r) * n + (jb - j0);
                float *o = partial + ((Py_ssize_t)g * R + r0 + r) * (D + 2);
                for (int d0 = 0; d0 < D; d0 += 64) {
                    const int nv = D - d0 < 64 ? (D - d0) / 8 : 8;
                    __m256 acc[8];
                    for (int c = 0; c < 8; c++)
                        acc[c] = c < nv ? _mm256_loadu_ps(o + d0 + 8 * c) : _mm256_setzero_ps();
                    if (nv == 8) {  /* a constant count: the column loop unrolls into registers */
                        for (int i = 0; i < nb; i++) {
                            __m256 pv = _mm256_set1_ps(p[i]);
                            for (int c = 0; c < 8; c++)
                                acc[c] = _mm256_fmadd_ps(pv, kv_load8(rows[i], d0 + 8 * c, wide),
                                                         acc[c]);
                        }
                    } else {
                        for (int i = 0; i < nb; i++) {
                            __m256 pv = _mm256_set1_ps(p[i]);
                            for (int c = 0; c < nv; c++)
                                acc[c] = _mm256_fmadd_ps(pv, kv_load8(rows[i], d0 + 8 * c, wide),
                                                         acc[c]);
                        }
                    }
                    for (int c = 0; c < nv; c++)
                        _mm256_storeu_ps(o + d0 + 8 * c, acc[c]);
                }
            }
        }
        for (int r = 0; r < rb; r++) {
            float *o = partial + ((Py_ssize_t)g * R + r0 + r) * (D + 2);
            o[D] = m[r];
            o[D + 1] = l[r];
        }
    }
}

/* ---- the same on AVX-512: a group's query heads three at a time ------------------------
 *
 * Why: the AVX2 kernel scores one query head at a time over eight keys, and its time grows
 * with the heads a kv head serves (measured on SmolLM2's shape, 2000 positions in cache,
 * 2 threads: 34 / 89 / 156 us at 1 / 3 / 8 heads a group, 25-50 GF/s). Here eight keys are
 * scored against up to three heads at once, 24 accumulators of 16 lanes, each key's
 * 16-value piece loaded once for the three; the values are weighted for the same heads from
 * one load of each row. Same semantics (each score's sum in another order: within the
 * reference's tolerance, not the AVX2 kernel's bits). */

#define AT3_HEADS 3  /* query heads a pass holds (24 + 1 of the 32 registers) */

/* The sums across lanes of zmm in[m] (m < 16; of 8 with `half`), folded in four rounds of
 * pairs, each round halving the lanes a sum still spans (256-bit halves, 128-bit quarters,
 * pairs, single lanes): in[k + 4j]'s sum lands in lane 4k + j. 45 instructions for 16 sums
 * (25 for 8, with the last permute), where extracting each zmm's halves and pairing them
 * by horizontal adds took 37 for 8. Why it matters: per-key work (these sums, the softmax)
 * was about half of a decode step's attention at head_dim 64 (one thread, caches in L3:
 * 105 us a layer against 150 at head_dim 128, twice the FMAs). */
__attribute__((target("avx512f,avx512dq,avx512vl,avx2,fma"))) static inline
__attribute__((always_inline)) __m512 fold16(const __m512 *in, const int half) {
    const int n = half ? 8 : 16;
    __m512 w[8], x[4], y[2];
    for (int i = 0; i < n / 2; i++)
        w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(in[2 * i], in[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(in[2 * i], in[2 * i + 1], 0xEE));
    for (int i = 0; i < n / 4; i++)
        x[i] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], 0xDD));
    for (int i = 0; i < n / 8; i++)
        /* pairs of lanes moved as doubles, added as floats */
        y[i] = _mm512_add_ps(
            _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(x[2 * i]),
                                                _mm512_castps_pd(x[2 * i + 1]))),
            _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(x[2 * i]),
                                                _mm512_castps_pd(x[2 * i + 1]))));
    const __m512 b = half ? y[0] : y[1];
    return _mm512_add_ps(_mm512_shuffle_ps(y[0], b, 0x88), _mm512_shuffle_ps(y[0], b, 0xDD));
}

/* Sixteen zmm's lanes summed across, a[i]'s into lane i and b[i]'s into lane 8 + i
 * (fold16's order undone by feeding it u[4 (m % 4) + m / 4] as its in[m]). */
__attribute__((target("avx512f,avx512dq,avx512vl,avx2,fma"))) static inline
__attribute__((always_inline)) __m512 sum16x16(const __m512 *a, const __m512 *b) {
    __m512 in[16];
    for (int m = 0; m < 16; m++) {
        const int i = 4 * (m % 4) + m / 4;
        in[m] = i < 8 ? a[i] : b[i - 8];
    }
    return fold16(in, 0);
}

/* Eight zmm's lanes summed across, u[i]'s into lane i of a ymm: fold16 of eight puts
 * in[k + 4j] (j < 2) in lane 4k + j, gathered back by one permute. */
__attribute__((target("avx512f,avx512dq,avx512vl,avx2,fma"))) static inline
__attribute__((always_inline)) __m256 sum8x16(const __m512 *u) {
    const __m512i back = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_castps512_ps256(_mm512_permutexvar_ps(back, fold16(u, 1)));
}

/* Sixteen values of a cache row from element d: float32, or (bf16) bfloat16 bits widened
 * in the register, once for every head that reads them (no copy of the row staged). */
__attribute__((target("avx512f,avx512dq,avx512vl,avx2,fma"))) static inline
__attribute__((always_inline)) __m512 kv_load16(const char *row, int d, const int bf16) {
    if (bf16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(row + 2 * (Py_ssize_t)d))),
            16));
    return _mm512_loadu_ps((const float *)row + d);
}

/* Eight keys' scores (rows k[0..8), float32 or (bf16) bfloat16 bits, D a multiple of 16)
 * against rb (<= 3) heads' queries q + r * D, summed across into x[r] (key i in lane i). */
__attribute__((target("avx512f,avx512dq,avx512vl,avx2,fma"))) static inline
__attribute__((always_inline)) void scores8x3(const char *const *k, const float *q, int D,
                                             __m256 *x, const int rb, const int bf16) {
    __m512 u[AT3_HEADS][8];
    for (int r = 0; r < rb; r++)
        for (int i = 0; i < 8; i++)
            u[r][i] = _mm512_setzero_ps();
    for (int d = 0; d < D; d += 16)
        for (int i = 0; i < 8; i++) {
            __m512 kv = kv_load16(k[i], d, bf16);
            for (int r = 0; r < rb; r++)
                u[r][i] = _mm512_fmadd_ps(kv, _mm512_loadu_ps(q + (Py_ssize_t)r * D + d), u[r][i]);
        }
    if (rb >= 2) {  /* heads 0 and 1 in one fold: head 0's keys in lanes 0-7, head 1's 8-15 */
        const __m512 both = sum16x16(u[0], u[1]);
        x[0] = _mm512_castps512_ps256(both);
        x[1] = _mm512_extractf32x8_ps(both, 1);
    }
    for (int r = rb >= 2 ? 2 : 0; r < rb; r++)
        x[r] = sum8x16(u[r]);
}

/* Columns [d0, d0 + 64) (c16 pieces of 16) of rb heads' value sums over rows v[0..nb)
 * (float32 or bfloat16 bits, as scores8x3's), row i weighted by p[r * n + i]: acc (rb, 4)
 * in and out. */
__attribute__((target("avx512f,avx512dq,avx512vl,avx2,fma"))) static inline
__attribute__((always_inline)) void values3(const char *const *v, int nb, const float *p,
                                           Py_ssize_t n, int d0, int c16, __m512 acc[][4],
                                           const int rb, const int bf16) {
    for (int i = 0; i < nb; i++) {
        __m512 row[4];
        for (int c = 0; c < c16; c++)
            row[c] = kv_load16(v[i], d0 + 16 * c, bf16);
        for (int r = 0; r < rb; r++) {
            __m512 pv = _mm512_set1_ps(p[r * n + i]);
            for (int c = 0; c < c16; c++)
                acc[r][c] = _mm512_fmadd_ps(pv, row[c], acc[r][c]);
        }
    }
}

/* scores8x3 or values3 for rb heads, rb of 1 .. 3 a constant in each. */
#define AT3_BY_HEADS(rb, call1, call2, call3)                                                \
    do {                                                                                     \
        if ((rb) == 1) { call1; } else if ((rb) == 2) { call2; } else { call3; }             \
    } while (0)

/* attend_blocked_of's work (kv head g, rows j0 .. j1, into s and partial) on AVX-512,
 * ATTEND_HEADS heads a sweep as it, three at a time within each block of rows (so each row
 * comes from memory once a sweep); the caches float32 or (bf16) bfloat16 bits, widened in
 * the registers as they are read (kv_load16). Staged instead into float32 copies a block at
 * a time, as the AVX2 kernel does, a bfloat16 cache ran 1.3x slower than a float32 one with
 * its rows in L3 (one thread, SmolLM2's shape at 2000 positions: 125 us against 94), the
 * copies' stores and loads costing more than the bytes saved. */
__attribute__((target("avx512f,avx512dq,avx512vl,avx2,fma"))) static inline
__attribute__((always_inline)) void attend_avx512_of(const attend_args *a, int g, Py_ssize_t j0,
                                                     Py_ssize_t j1, float *s, float *partial,
                                                     const int bf16) {
    const int R = a->H / a->G, D = a->D;
    const Py_ssize_t n = j1 - j0, pitch = (Py_ssize_t)D * (bf16 ? 2 : 4);
    const char *K = (const char *)a->keys + (Py_ssize_t)g * a->L * pitch;
    const char *V = (const char *)a->values + (Py_ssize_t)g * a->L * pitch;
    const char *rows[ATTEND_BLOCK];
    __m256 mx[ATTEND_HEADS];
    float m[ATTEND_HEADS], l[ATTEND_HEADS];
    for (int r0 = 0; r0 < R; r0 += ATTEND_HEADS) {
        const int rb = R - r0 < ATTEND_HEADS ? R - r0 : ATTEND_HEADS;
        const float *qh = a->q + ((Py_ssize_t)g * R + r0) * D;
        for (int r = 0; r < rb; r++)
            mx[r] = _mm256_set1_ps(-FLT_MAX);
        const char *k = ROW_AT(K, j0);
        for (Py_ssize_t jb = j0; jb < j1; jb += 8) {
            const int nb = j1 - jb < 8 ? (int)(j1 - jb) : 8;
            for (int i = 0; i < 8; i++) {
                rows[i] = i < nb ? k : rows[0];  /* past the end: row 0 again, discarded */
                if (i < nb) {
                    ask_ahead(k, pitch);
                    NEXT_ROW(k, K);
                }
            }
            __m256 x[ATTEND_HEADS];
            for (int h = 0; h < rb; h += AT3_HEADS) {
                const float *qr = qh + (Py_ssize_t)h * D;
                AT3_BY_HEADS(rb - h, scores8x3(rows, qr, D, x + h, 1, bf16),
                             scores8x3(rows, qr, D, x + h, 2, bf16),
                             scores8x3(rows, qr, D, x + h, 3, bf16));
            }
            for (int r = 0; r < rb; r++)
                mx[r] = _mm256_max_ps(mx[r], scores_out(a, g, r0 + r, jb, nb, s + (Py_ssize_t)(
                                                        r0 + r) * n + (jb - j0), x[r]));
        }
        for (int r = 0; r < rb; r++) {
            softmax_numerators(s + (Py_ssize_t)(r0 + r) * n, n, mx[r], &m[r], &l[r]);
            memset(partial + ((Py_ssize_t)g * R + r0 + r) * (D + 2), 0, sizeof(float) * D);
        }
        const char *v = ROW_AT(V, j0);
        for (Py_ssize_t jb = j0; jb < j1; jb += ATTEND_BLOCK) {
            const int nb = j1 - jb < ATTEND_BLOCK ? (int)(j1 - jb) : ATTEND_BLOCK;
            for (int i = 0; i < nb; i++) {
                rows[i] = v;
                ask_ahead(v, pitch);
                NEXT_ROW(v, V);
            }
            const char *const *vr = rows;
            for (int h = 0; h < rb; h += AT3_HEADS) {
                const int hb = rb - h < AT3_HEADS ? rb - h : AT3_HEADS;
                const float *p = s + (Py_ssize_t)(r0 + h) * n + (jb - j0);
                for (int d0 = 0; d0 < D; d0 += 64) {
                    const int c16 = D - d0 < 64 ? (D - d0) / 16 : 4;
                    __m512 acc[AT3_HEADS][4];
                    for (int r = 0; r < hb; r++) {
                        const float *o = partial + ((Py_ssize_t)g * R + r0 + h + r) * (D + 2) + d0;
                        for (int c = 0; c < c16; c++)
                            acc[r][c] = _mm512_loadu_ps(o + 16 * c);
                    }
                    if (c16 == 4)  /* a constant count: the loops unroll into registers */
                        AT3_BY_HEADS(hb, values3(vr, nb, p, n, d0, 4, acc, 1, bf16),
                                     values3(vr, nb, p, n, d0, 4, acc, 2, bf16),
                                     values3(vr, nb, p, n, d0, 4, acc, 3, bf16));
                    else
                        AT3_BY_HEADS(hb, values3(vr, nb, p, n, d0, c16, acc, 1, bf16),
                                     values3(vr, nb, p, n, d0, c16, acc, 2, bf16),
                                     values3(vr, nb, p, n, d0, c16, acc, 3, bf16));
                    for (int r = 0; r < hb; r++) {
                        float *o = partial + ((Py_ssize_t)g * R + r0 + h + r) * (D + 2) + d0;
                        for (int c = 0; c < c16; c++)
                            _mm512_storeu_ps(o + 16 * c, acc[r][c]);
                    }
                }
            }
        }
        for (int r = 0; r < rb; r++) {
            float *o = partial + ((Py_ssize_t)g * R + r0 + r) * (D + 2);
            o[D] = m[r];
            o[D + 1] = l[r];
        }
    }
}

__attribute__((target("avx512f,avx512dq,avx512vl,avx2,fma"))) static void
attend_avx512(const attend_args *a, int g, Py_ssize_t j0, Py_ssize_t j1, float *s,
              float *partial) {
    if (a->kv16)
        attend_avx512_of(a, g, j0, j1, s, partial, 1);
    else
        attend_avx512_of(a, g, j0, j1, s, partial, 0);
}

/* The blocked kernel, one copy per cache form. */
__attribute__((target("avx2,fma"))) static void attend_blocked_avx2(const attend_args *a, int g,
                                                                   Py_ssize_t j0, Py_ssize_t j1,
                                                                   float *s, float *partial) {
    if (a->kv16)
        attend_blocked_of(a, g, j0, j1, s, partial, 1);
    else
        attend_blocked_of(a, g, j0, j1, s, partial, 0);
}

#endif

static inline __attribute__((always_inline)) void attend_plain_of(const attend_args *a, int g,
                                                                Py_ssize_t j0, Py_ssize_t j1,
                                                                float *s, float *partial,
                                                                const int bf16) {
    const int R = a->H / a->G, D = a->D;
    const Py_ssize_t n = j1 - j0, pitch = (Py_ssize_t)D * (bf16 ? 2 : 4);
    const char *K = (const char *)a->keys + (Py_ssize_t)g * a->L * pitch;
    const char *V = (const char *)a->values + (Py_ssize_t)g * a->L * pitch;
    for (int r = 0; r < R; r++) {
        const float *q = a->q + ((Py_ssize_t)g * R + r) * D;
        float *sr = s + (Py_ssize_t)r * n;
        float m = -FLT_MAX, l = 0.0f;
        const char *k = ROW_AT(K, j0);
        for (Py_ssize_t j = j0; j < j1; j++, NEXT_ROW(k, K)) {
            float x = 0.0f;
            for (int d = 0; d < D; d++)
                x += q[d] * kv_at(k, d, bf16);
            if (a->softcap > 0.0f)
                x = tanhf(x / a->softcap) * a->softcap;
            if (a->alibi)
                x += a->alibi[g * R + r] * (float)(j - (a->t - 1));
            sr[j - j0] = x;
            m = x > m ? x : m;
        }
        for (Py_ssize_t j = 0; j < n; j++) {
            sr[j] = expf(sr[j] - m);
            l += sr[j];
        }
        float *o = partial + ((Py_ssize_t)g * R + r) * (D + 2);
        for (int d = 0; d < D; d++)
            o[d] = 0.0f;
        const char *row = ROW_AT(V, j0);
        for (Py_ssize_t j = 0; j < n; j++, NEXT_ROW(row, V))
            for (int d = 0; d < D; d++)
                o[d] += sr[j] * kv_at(row, d, bf16);
        o[D] = m;
        o[D + 1] = l;
    }
}

static void attend_plain(const attend_args *a, int g, Py_ssize_t j0, Py_ssize_t j1, float *s,
                         float *partial) {
    if (a->kv16)
        attend_plain_of(a, g, j0, j1, s, partial, 1);
    else
        attend_plain_of(a, g, j0, j1, s, partial, 0);
}

static void attend_part(const void *args, int part, int parts) {
    const attend_args *a = args;
    Py_ssize_t w = a->t - a->lo;
    Py_ssize_t j0 = a->lo + w * part / parts, j1 = a->lo + w * (part + 1) / parts;
    int R = a->H / a->G;
    float *s = a->scores + (Py_ssize_t)part * R * a->span;
    float *partial = a->partial + (Py_ssize_t)part * a->H * (a->D + 2);
    for (int g = 0; g < a->G; g++) {
        if (j0 >= j1) {  /* an empty share: weight 0 in the merge */
            for (int r = 0; r < R; r++) {
                float *o = partial + ((Py_ssize_t)g * R + r) * (a->D + 2);
                memset(o, 0, sizeof(float) * a->D);
                o[a->D] = -FLT_MAX;
                o[a->D + 1] = 0.0f;
            }
            continue;
        }
#ifdef HAVE_X86
        if (simd >= SIMD_AVX512 && a->D % 16 == 0) {
            attend_avx512(a, g, j0, j1, s, partial);
            continue;
        }
        if (simd >= SIMD_AVX2 && a->D % 8 == 0) {
            attend_blocked_avx2(a, g, j0, j1, s, partial);
            continue;
        }
#endif
        attend_plain(a, g, j0, j1, s, partial);
    }
}

/* floats of scratch attend_run needs for one query at ``start``. */
static Py_ssize_t attend_need(int H, int G, int D, Py_ssize_t start, Py_ssize_t window) {
    int T = pool.threads ? pool.threads : 1;
    Py_ssize_t t = start + 1, lo = window > 0 && t > window ? t - window : 0;
    Py_ssize_t span = (t - lo + T - 1) / T + 1;
    return (Py_ssize_t)H * D + (Py_ssize_t)T * (H / G) * span + (Py_ssize_t)T * H * (D + 2);
}

static void attend_merge(float *out, const attend_args *a0, int T);

/* One query (H, D) at ``start`` over caches (G, L, D) into out (H, D): q scaled into the
 * scratch (attend_need floats), the positions shared by the pool's threads, their softmax
 * numerators merged. Called with the GIL released; shapes checked by the caller. */
static void attend_setup(attend_args *a, const float *q, const void *keys, const void *values,
                         int kv16, float *scratch, int H, int G, int D, Py_ssize_t L,
                         Py_ssize_t start, Py_ssize_t window, float scale, float softcap,
                         Py_ssize_t ring, const float *alibi);

static void attend_run(float *out, const float *q, const void *keys, const void *values,
                       int kv16, float *scratch, int H, int G, int D, Py_ssize_t L,
                       Py_ssize_t start, Py_ssize_t window, float scale, float softcap,
                       Py_ssize_t ring, const float *alibi) {
    attend_args a;
    attend_setup(&a, q, keys, values, kv16, scratch, H, G, D, L, start, window, scale, softcap,
                 ring, alibi);
    pool_run(attend_part, &a);
    attend_merge(out, &a, pool.threads ? pool.threads : 1);
}

/* A query's q scaled into the scratch and its attend_args: attend_run's first half, and each
 * query's of several run as one dispatch (attend_rows). */
static void attend_setup(attend_args *a, const float *q, const void *keys, const void *values,
                         int kv16, float *scratch, int H, int G, int D, Py_ssize_t L,
                         Py_ssize_t start, Py_ssize_t window, float scale, float softcap,
                         Py_ssize_t ring, const float *alibi) {
    int T = pool.threads ? pool.threads : 1;
    Py_ssize_t HD = (Py_ssize_t)H * D;
    Py_ssize_t t = start + 1, lo = window > 0 && t > window ? t - window : 0;
    Py_ssize_t span = (t - lo + T - 1) / T + 1;
    float *qs = scratch;
    for (Py_ssize_t i = 0; i < HD; i++)
        qs[i] = q[i] * scale;
    attend_args made = {qs, keys, values, qs + HD, qs + HD + (Py_ssize_t)T * (H / G) * span,
                        H, G, D, kv16, L, lo, t, span, ring > 0 && ring <= L ? ring : L,
                        softcap, alibi};
    *a = made;
}

/* The parts' softmax numerators of one query (attend_args a, T parts) merged into out. */
static void attend_merge(float *out, const attend_args *a0, int T) {
    const attend_args a = *a0;
    const int H = a.H, D = a.D;
    /* The parts' softmax numerators merged, each scaled by exp(its max - the max). */
    float *o = out;
    for (int h = 0; h < H; h++) {
        float m = -FLT_MAX, l = 0.0f;
        for (int p = 0; p < T; p++) {
            float mp = a.partial[((Py_ssize_t)p * H + h) * (D + 2) + D];
            m = mp > m ? mp : m;
        }
        float *oh = o + (Py_ssize_t)h * D;
        for (int d = 0; d < D; d++)
            oh[d] = 0.0f;
        for (int p = 0; p < T; p++) {
            const float *part = a.partial + ((Py_ssize_t)p * H + h) * (D + 2);
            if (part[D + 1] == 0.0f)
                continue;
            float f = expf(part[D] - m);
            l += part[D + 1] * f;
            for (int d = 0; d < D; d++)
                oh[d] += part[d] * f;
        }
        for (int d = 0; d < D; d++)
            oh[d] /= l;
    }
}

/* Below, beside the float32 GEMM: the held forms' runs. */
static int gemm_held_run(float *out, const float *x, const void *w, int form, const float *b,
                         Py_ssize_t m, Py_ssize_t n, Py_ssize_t k);
static int gemv_held_run(float *y, const float *x, const void *w, int form, const float *b,
                         Py_ssize_t n, Py_ssize_t k);
static int gemv_held_batch_run(float *y, const float *x, const void *w, int form,
                               const float *b, Py_ssize_t n, Py_ssize_t k, Py_ssize_t m);
static void held_widen(int form, const uint8_t *w, Py_ssize_t rb, Py_ssize_t r0, Py_ssize_t r1,
                       Py_ssize_t k, float *out);

#include "_cpu_tiles.h"
#include "_cpu_held_gemm.h"
#include "_cpu_experts.h"
#include "_cpu_program.h"


/* ---- Python --------------------------------------------------------------------------- */

static int get_floats(PyObject *obj, Py_buffer *view, int writable, const char *name) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) != 0) {
        PyErr_Format(PyExc_ValueError, "%s must be a C-contiguous%s float32 array", name,
                     writable ? " writable" : "");
        return -1;
    }
    if (view->itemsize != 4 || !view->format || strcmp(view->format, "f") != 0) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_ValueError, "%s must be float32", name);
        return -1;
    }
    return 0;
}

static int overlaps(const Py_buffer *a, const Py_buffer *b) {
    const char *a0 = a->buf, *b0 = b->buf;
    return a0 < b0 + b->len && b0 < a0 + a->len;
}

/* Weights: float32, bfloat16 as its 16-bit patterns (numpy uint16), or Q8_0 blocks as
 * bytes (numpy uint8); the reduced two in row groups (operators/formats.py). */
static int get_weights(PyObject *obj, Py_buffer *view) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) {
        PyErr_SetString(PyExc_ValueError, "w must be a C-contiguous float32 array, bfloat16 "
                        "as uint16, or Q8_0 blocks as uint8");
        return -1;
    }
    int f32 = view->itemsize == 4 && view->format && strcmp(view->format, "f") == 0;
    int u16 = view->itemsize == 2 && view->format && strcmp(view->format, "H") == 0;
    int u8 = view->itemsize == 1 && view->format && strcmp(view->format, "B") == 0;
    if (!f32 && !u16 && !u8) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "w must be float32, bfloat16 as uint16, or Q8_0 "
                        "blocks as uint8");
        return -1;
    }
    return 0;
}

/* ---- read: an array streamed on the pool, the floor a decode step's bytes meet ---------- */

typedef struct {
    const float *x;
    Py_ssize_t n;
    double sums[MAX_THREADS];
} read_args;

#ifdef HAVE_X86
__attribute__((target("avx2,fma"))) static double read_avx2(const float *x, Py_ssize_t lo,
                                                           Py_ssize_t hi) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    const Py_ssize_t ahead = gemv_ahead[AHEAD_F32] / 4;
    for (Py_ssize_t i = lo; i < hi; i += 32) {
        if (ahead) {  /* as the GEMVs ask for their streams: a floor they can meet, not pass */
            __builtin_prefetch(x + i + ahead, 0, 3);
            __builtin_prefetch(x + i + ahead + 16, 0, 3);
        }
        s0 = _mm256_add_ps(s0, _mm256_loadu_ps(x + i));
        s1 = _mm256_add_ps(s1, _mm256_loadu_ps(x + i + 8));
        s2 = _mm256_add_ps(s2, _mm256_loadu_ps(x + i + 16));
        s3 = _mm256_add_ps(s3, _mm256_loadu_ps(x + i + 24));
    }
    return (double)hsum8(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
}
#endif

/* Each part sums its share in 32 lanes (independent adds: bound by the loads alone). */
static void read_part(const void *args, int part, int parts) {
    read_args *a = (read_args *)args;
    Py_ssize_t lo = a->n / 32 * part / parts * 32, hi = a->n / 32 * (part + 1) / parts * 32;
#ifdef HAVE_X86
    if (simd >= SIMD_AVX2) {
        a->sums[part] = read_avx2(a->x, lo, hi);
        return;
    }
#endif
    float acc[32] = {0};
    for (Py_ssize_t i = lo; i < hi; i += 32)
        for (int l = 0; l < 32; l++)
            acc[l] += a->x[i + l];
    double s = 0.0;
    for (int l = 0; l < 32; l++)
        s += acc[l];
    a->sums[part] = s;
}

static PyObject *py_read(PyObject *self, PyObject *arg) {
    Py_buffer x;
    if (get_floats(arg, &x, 0, "x") < 0)
        return NULL;
    read_args a = {x.buf, x.len / 4, {0}};
    Py_BEGIN_ALLOW_THREADS
    pool_run(read_part, &a);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&x);
    double s = 0.0;
    for (int p = 0; p < MAX_THREADS; p++)
        s += a.sums[p];
    return PyFloat_FromDouble(s);
}

static PyObject *py_start(PyObject *self, PyObject *arg) {
    long threads = PyLong_AsLong(arg);
    if (threads == -1 && PyErr_Occurred())
        return NULL;
    pool_start((int)threads);
    return PyLong_FromLong(pool.threads);
}

/* A held weight's bytes (any C-contiguous buffer): ``form``'s rows of k values, n of them.
 * -1 (a ValueError naming ``who``) where the form is none or the bytes are not n such rows. */
static int get_held(PyObject *obj, PyObject *form_obj, Py_ssize_t n, Py_ssize_t k, Py_buffer *view,
                    int *form, const char *who) {
    long f = PyLong_AsLong(form_obj);
    if (f == -1 && PyErr_Occurred())
        return -1;
    const Py_ssize_t rb = held_row_bytes(f, k);
    if (rb < 0) {
        PyErr_Format(PyExc_ValueError, "%s: form %ld holds no row of %zd values (a GGML type: "
                     "F32 0, F16 1, Q4_0 2, Q4_1 3, Q5_0 6, Q5_1 7, Q8_0 8, Q4_K 12, Q5_K 13, "
                     "Q6_K 14, BF16 30; k a whole number of its blocks)", who, f, k);
        return -1;
    }
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS) != 0)
        return -1;
    if (view->len != n * rb) {
        PyErr_Format(PyExc_ValueError, "%s: w holds %zd bytes, not %zd rows of %zd values in "
                     "form %ld (%zd bytes each)", who, view->len, n, k, f, rb);
        PyBuffer_Release(view);
        return -1;
    }
    *form = (int)f;
    return 0;
}

/* gemv(y, x, w, b, form): y = w @ x (+ b), w n rows held in ``form``. */
static PyObject *py_gemv_held(PyObject *const *args) {
    Py_buffer y, x, w, b = {0};
    int form, has_b = args[3] != Py_None, failed = 0;
    if (get_floats(args[0], &y, 1, "y") < 0)
        return NULL;
    if (get_floats(args[1], &x, 0, "x") < 0) {
        PyBuffer_Release(&y);
        return NULL;
    }
    if (get_held(args[2], args[4], y.len / 4, x.len / 4, &w, &form, "gemv") < 0) {
        PyBuffer_Release(&x);
        PyBuffer_Release(&y);
        return NULL;
    }
    if (has_b && get_floats(args[3], &b, 0, "b") < 0) {
        failed = 2;
    } else if ((has_b && b.len != y.len) || overlaps(&y, &x) || overlaps(&y, &w) ||
               (has_b && overlaps(&y, &b))) {
        PyErr_SetString(PyExc_ValueError, "gemv: b None or (len(y),); y apart from x, w and b");
        failed = 1;
    }
    if (!failed) {
        int r;
        Py_BEGIN_ALLOW_THREADS
        r = gemv_held_run(y.buf, x.buf, w.buf, form, has_b ? b.buf : NULL, y.len / 4, x.len / 4);
        Py_END_ALLOW_THREADS
        if (r < 0) {
            PyErr_NoMemory();
            failed = 1;
        }
    }
    if (has_b && failed != 2)
        PyBuffer_Release(&b);
    PyBuffer_Release(&w);
    PyBuffer_Release(&x);
    PyBuffer_Release(&y);
    if (failed)
        return NULL;
    Py_RETURN_NONE;
}

/* gemm(out, x, w, b, form): out (m, n) = x (m, k) @ w.T (+ b), w n rows held in ``form``. */
static PyObject *py_gemm_held(PyObject *const *args) {
    Py_buffer out, x, w, b = {0};
    int form, has_b = args[3] != Py_None, failed = 0;
    if (get_floats(args[0], &out, 1, "out") < 0)
        return NULL;
    if (get_floats(args[1], &x, 0, "x") < 0) {
        PyBuffer_Release(&out);
        return NULL;
    }
    if (out.ndim != 2 || x.ndim != 2 || out.shape[0] != x.shape[0]) {
        PyErr_SetString(PyExc_ValueError, "gemm: out (m, n) and x (m, k)");
        PyBuffer_Release(&x);
        PyBuffer_Release(&out);
        return NULL;
    }
    const Py_ssize_t m = x.shape[0], n = out.shape[1], k = x.shape[1];
    if (get_held(args[2], args[4], n, k, &w, &form, "gemm") < 0) {
        PyBuffer_Release(&x);
        PyBuffer_Release(&out);
        return NULL;
    }
    if (has_b && get_floats(args[3], &b, 0, "b") < 0) {
        failed = 2;
    } else if ((has_b && b.len != 4 * n) || overlaps(&out, &x) || overlaps(&out, &w) ||
               (has_b && overlaps(&out, &b))) {
        PyErr_SetString(PyExc_ValueError, "gemm: b None or (n,); out apart from x, w and b");
        failed = 1;
    }
    if (!failed) {
        int r;
        Py_BEGIN_ALLOW_THREADS
        r = gemm_held_run(out.buf, x.buf, w.buf, form, has_b ? b.buf : NULL, m, n, k);
        Py_END_ALLOW_THREADS
        if (r < 0) {
            PyErr_NoMemory();
            failed = 1;
        }
    }
    if (has_b && failed != 2)
        PyBuffer_Release(&b);
    PyBuffer_Release(&w);
    PyBuffer_Release(&x);
    PyBuffer_Release(&out);
    if (failed)
        return NULL;
    Py_RETURN_NONE;
}

/* ---- nonfinite: how many values of a held weight are NaN or infinite ------------------------
 * A float form's values by their exponent bits; a block form's by its float16 scale and
 * minimum (its values are finite exactly where they are), each counted for its block's
 * values. On the pool: the first pass over a memory-mapped file's pages, so it also brings
 * them in. */
typedef struct {
    const uint8_t *w;
    Py_ssize_t n;  /* values (float forms) or blocks */
    int form, block, bytes;
    Py_ssize_t counts[MAX_THREADS];
} nonfinite_args;

static void nonfinite_part(const void *args, int part, int parts) {
    nonfinite_args *a = (nonfinite_args *)args;
    Py_ssize_t lo, hi, bad = 0;
    share(a->n, 1024, part, parts, &lo, &hi);
    switch (a->form) {
    case HELD_F32: {
        const uint32_t *v = (const uint32_t *)a->w;
        for (Py_ssize_t i = lo; i < hi; i++)
            bad += (v[i] & 0x7f800000u) == 0x7f800000u;
        break;
    }
    case HELD_BF16: case HELD_F16: {
        const uint16_t *v = (const uint16_t *)a->w;
        const uint16_t m = a->form == HELD_BF16 ? 0x7f80 : 0x7c00;
        for (Py_ssize_t i = lo; i < hi; i++)
            bad += (v[i] & m) == m;
        break;
    }
    default: {
        /* where each block form keeps its float16 scale (and minimum): ggml-common.h */
        const int at = a->form == HELD_Q6_K ? 208 : 0;
        const int two = a->form == HELD_Q4_1 || a->form == HELD_Q5_1 || a->form == HELD_Q4_K ||
                        a->form == HELD_Q5_K;
        for (Py_ssize_t i = lo; i < hi; i++) {
            const uint8_t *b = a->w + i * a->bytes;
            const int s0 = (b[at + 1] & 0x7c) == 0x7c, s1 = two && (b[3] & 0x7c) == 0x7c;
            bad += (s0 | s1) ? a->block : 0;
        }
    }
    }
    a->counts[part] = bad;
}

/* nonfinite(w, form): the values of w (any C-contiguous buffer of whole values or blocks of
 * ``form``) that are NaN or infinite. */
static PyObject *py_nonfinite(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "nonfinite(w, form) takes 2 arguments");
        return NULL;
    }
    long f = PyLong_AsLong(args[1]);
    if (f == -1 && PyErr_Occurred())
        return NULL;
    int bytes, block = held_block(f, &bytes);
    if (block == 0) {
        PyErr_Format(PyExc_ValueError, "nonfinite: form %ld is none of _cpu.c's", f);
        return NULL;
    }
    Py_buffer w;
    if (PyObject_GetBuffer(args[0], &w, PyBUF_C_CONTIGUOUS) != 0)
        return NULL;
    if (w.len % bytes) {
        PyErr_Format(PyExc_ValueError, "nonfinite: %zd bytes are not whole blocks of %d",
                     w.len, bytes);
        PyBuffer_Release(&w);
        return NULL;
    }
    nonfinite_args a = {w.buf, w.len / bytes, (int)f, block, bytes, {0}};
    Py_BEGIN_ALLOW_THREADS
    pool_run(nonfinite_part, &a);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&w);
    Py_ssize_t bad = 0;
    for (int p = 0; p < MAX_THREADS; p++)
        bad += a.counts[p];
    return PyLong_FromSsize_t(bad);
}

/* widen(out, w, form): out (rows, k) float32 = w's rows held in ``form``, as llama.cpp's
 * dequantize_row_* gives them. */
static PyObject *py_widen(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "widen(out, w, form) takes 3 arguments");
        return NULL;
    }
    Py_buffer out, w;
    int form;
    if (get_floats(args[0], &out, 1, "out") < 0)
        return NULL;
    if (out.ndim != 2) {
        PyErr_SetString(PyExc_ValueError, "widen: out is (rows, k)");
        PyBuffer_Release(&out);
        return NULL;
    }
    const Py_ssize_t rows = out.shape[0], k = out.shape[1];
    if (get_held(args[1], args[2], rows, k, &w, &form, "widen") < 0) {
        PyBuffer_Release(&out);
        return NULL;
    }
    int apart = !overlaps(&out, &w);
    if (apart) {
        Py_BEGIN_ALLOW_THREADS
        held_widen(form, w.buf, held_row_bytes(form, k), 0, rows, k, out.buf);
        Py_END_ALLOW_THREADS
    } else {
        PyErr_SetString(PyExc_ValueError, "widen: out must not share memory with w");
    }
    PyBuffer_Release(&w);
    PyBuffer_Release(&out);
    if (!apart)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *py_gemv(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs == 5)
        return py_gemv_held(args);
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "gemv(y, x, w, b[, form]) takes 4 or 5 arguments");
        return NULL;
    }
    Py_buffer y, x, w, b = {0};
    if (get_floats(args[0], &y, 1, "y") < 0)
        return NULL;
    if (get_floats(args[1], &x, 0, "x") < 0)
        goto fail_y;
    if (get_weights(args[2], &w) < 0)
        goto fail_x;
    int has_b = args[3] != Py_None;
    if (has_b && get_floats(args[3], &b, 0, "b") < 0)
        goto fail_w;
    int half = w.itemsize == 2, q8 = w.itemsize == 1;
    gemv_args a = {half || q8 ? NULL : w.buf, x.buf, has_b ? b.buf : NULL,
                   half ? w.buf : NULL, q8 ? w.buf : NULL, y.buf, y.len / 4, x.len / 4};
    if (q8 && (a.k % Q8_BLOCK || w.ndim != 2 || w.shape[0] != a.n ||
               w.shape[1] != a.k / Q8_BLOCK * Q8_BYTES)) {
        PyErr_Format(PyExc_ValueError, "gemv: Q8_0 w must be (len(y), len(x) / 32 * 34) = "
                     "(%zd, %zd / 32 * 34) bytes, len(x) a multiple of 32, not %zd bytes in %d "
                     "dimensions", a.n, a.k, w.len, w.ndim);
        goto fail_b;
    }
    if (!q8 && (w.ndim != 2 || w.shape[0] != a.n || w.shape[1] != a.k)) {
        PyErr_Format(PyExc_ValueError, "gemv: w must be (len(y), len(x)) = (%zd, %zd), not %zd "
                     "values in %d dimensions", a.n, a.k, w.len / w.itemsize, w.ndim);
        goto fail_b;
    }
    if (overlaps(&y, &x) || overlaps(&y, &w) || (has_b && overlaps(&y, &b))) {
        PyErr_SetString(PyExc_ValueError, "gemv: y must not share memory with x, w or b");
        goto fail_b;
    }
    if (has_b && b.len / 4 != a.n) {
        PyErr_Format(PyExc_ValueError, "gemv: b holds %zd values, not y's %zd", b.len / 4, a.n);
        goto fail_b;
    }
    Py_BEGIN_ALLOW_THREADS
    pool_run(gemv_part, &a);
    Py_END_ALLOW_THREADS
    if (has_b)
        PyBuffer_Release(&b);
    PyBuffer_Release(&w);
    PyBuffer_Release(&x);
    PyBuffer_Release(&y);
    Py_RETURN_NONE;
fail_b:
    if (has_b)
        PyBuffer_Release(&b);
fail_w:
    PyBuffer_Release(&w);
fail_x:
    PyBuffer_Release(&x);
fail_y:
    PyBuffer_Release(&y);
    return NULL;
}

/* Each pool part's buffer a held weight's block of rows is widened into (gemm_cols), kept
 * between calls (gemm_lock held), grown to the widest k met. */
static float *held_wbuf[MAX_THREADS];
static Py_ssize_t held_wbuf_floats = 0;

/* out (m, n) = x (m, k) @ w (n, k).T (+ b), float32 out and x, row-major, on the pool; w
 * float32, or (form other than HELD_F32) rows of rb bytes held in ``form``; called with the
 * GIL released (py_gemm, a program's OP_GEMM). -1 where x's panels (or the widened rows) find
 * no memory. */
static int gemm_held_run(float *out, const float *x, const void *w, int form, const float *b,
                         Py_ssize_t m, Py_ssize_t n, Py_ssize_t k) {
    /* HELD_BF16_X: bfloat16 rows whose x is rounded to bfloat16 (asked for); HELD_BF16's x
     * is met as it is, float32 products of the stored values. */
    const int round_bf16 = form == HELD_BF16_X;
    if (round_bf16)
        form = HELD_BF16;
    /* One row of a held form's product is the GEMV's, whichever entry it came by (so one row
     * of a block form meets x8 wherever it runs: operators/held.py). */
    if (m == 1 && form != HELD_F32)
        return gemv_held_run(out, x, w, form, b, n, k);
    /* bfloat16 rows asked to round x: x rounded to bfloat16; Q8_0 rows: x quantized to 8 bits
     * a block; as llama.cpp's GEMMs (_cpu_held_gemm.h). Where the CPU has no kernel for it,
     * the same rounded x through the widening GEMM below. */
    float *rounded = NULL;
    if (round_bf16 || form == HELD_Q8_0) {
        const int done = form == HELD_BF16 ? hgemm_bf16_run(out, x, w, b, m, n, k)
                                           : hq8_run(out, x, w, b, m, n, k);
        if (done <= 0)
            return done;
        rounded = form == HELD_BF16 ? hgemm_rounded(x, m, k) : hq8_values(x, m, k);
        if (!(x = rounded))
            return -1;
    }
    gemm_args a = {form == HELD_F32 ? w : NULL, b, x, NULL, out, m, n, k, 0};
    int failed = 0;
    pthread_mutex_lock(&gemm_lock);
    const Py_ssize_t panel = 2 * simd_lanes();
    a.mp = (a.m + panel - 1) / panel * panel;
    a.xt = gemm_buffer(sizeof(float) * a.mp * a.k);
    if (form != HELD_F32) {
        a.held = 1;
        a.form = form;
        a.wh = w;
        a.rb = held_row_bytes(form, k);
        a.wbuf = held_wbuf;
        const Py_ssize_t need = 96 * k;  /* GEMM_JB rows at most (96: AVX2's) */
        if (need > held_wbuf_floats) {
            for (int p = 0; p < MAX_THREADS; p++) {
                free(held_wbuf[p]);
                held_wbuf[p] = NULL;
            }
            held_wbuf_floats = need;
        }
        for (int p = 0; p < (pool.threads > 1 ? pool.threads : 1); p++)
            if (!held_wbuf[p] && !(held_wbuf[p] = malloc(sizeof(float) * held_wbuf_floats)))
                failed = 1;
    }
    if (!a.xt || failed) {
        failed = 1;
    } else {
        pool_run(panel_part, &a);
        pool_run(gemm_part, &a);
    }
    pthread_mutex_unlock(&gemm_lock);
    free(rounded);
    return failed ? -1 : 0;
}

static int gemm_run(float *out, const float *x, const float *w, const float *b, Py_ssize_t m,
                    Py_ssize_t n, Py_ssize_t k) {
    return gemm_held_run(out, x, w, HELD_F32, b, m, n, k);
}

/* x (k) in the order the bfloat16 GEMV meets it on ``lanes``-wide vectors: per 2 * lanes
 * values, the even ones, then the odd ones (_cpu_held.h's bf16_rows); the rest as they are. */
static void held_bf16_order(const float *x, Py_ssize_t k, int lanes, float *xp) {
    const Py_ssize_t C = k / (2 * lanes);
    for (Py_ssize_t c = 0; c < C; c++)
        for (int l = 0; l < lanes; l++) {
            xp[c * 2 * lanes + l] = x[c * 2 * lanes + 2 * l];
            xp[c * 2 * lanes + lanes + l] = x[c * 2 * lanes + 2 * l + 1];
        }
    memcpy(xp + C * 2 * lanes, x + C * 2 * lanes, sizeof(float) * (k - C * 2 * lanes));
}

/* y (n) = w (n, k) x (+ b), w rows of held_row_bytes(form, k) bytes in ``form``, on the pool;
 * called with the GIL released. -1 where a long row's reordered x finds no memory. */
static int gemv_held_run(float *y, const float *x, const void *w, int form, const float *b,
                         Py_ssize_t n, Py_ssize_t k) {
    gemv_args a = {NULL, x, b, NULL, NULL, y, n, k};
    if (form == HELD_BF16_X)  /* one row: the GEMV's, x as it is (the decode step's) */
        form = HELD_BF16;
    if (form == HELD_F32) {
        a.w = w;
        pool_run(gemv_part, &a);
        return 0;
    }
    a.held = 1;
    a.form = form;
    a.wh = w;
    a.rb = held_row_bytes(form, k);
    float stack[X16_STACK], *xp = NULL;
    if (form == HELD_BF16) {
        xp = k <= X16_STACK ? stack : malloc(sizeof(float) * k);
        if (!xp)
            return -1;
        held_bf16_order(x, k, simd_lanes(), xp);
        a.xp = xp;
    }
    pool_run(gemv_part, &a);
    if (xp && xp != stack)
        free(xp);
    return 0;
}

/* gemv_held_run over m rows of x (m, k) into y (m, n) (a batched decode step's): each
 * row's sums the one-row call's, bit for bit (the same kernels on the same x, each row's x
 * in the bfloat16 kernel's order of its own), the weights read a block at a time for all
 * the rows (gemv_batch_part). -1 where the rows' reordered x find no memory. */
static int gemv_held_batch_run(float *y, const float *x, const void *w, int form,
                               const float *b, Py_ssize_t n, Py_ssize_t k, Py_ssize_t m) {
    gemv_batch_args g = {{NULL, x, b, NULL, NULL, y, n, k}, m, k, n};
    if (form == HELD_BF16_X)  /* rows of a decode step: x as it is, as gemv_held_run's */
        form = HELD_BF16;
    if (form == HELD_F32) {
        g.a.w = w;
        pool_run(gemv_batch_part, &g);
        return 0;
    }
    g.a.held = 1;
    g.a.form = form;
    g.a.wh = w;
    g.a.rb = held_row_bytes(form, k);
    float *xp = NULL;
    if (form == HELD_BF16) {
        xp = malloc(sizeof(float) * k * m);
        if (!xp)
            return -1;
        for (Py_ssize_t j = 0; j < m; j++)
            held_bf16_order(x + j * k, k, simd_lanes(), xp + j * k);
        g.a.xp = xp;
    }
    pool_run(gemv_batch_part, &g);
    free(xp);
    return 0;
}

/* Rows [r0, r1) of a held weight widened into out (k floats a row): the embedding's gather. */
static void held_widen(int form, const uint8_t *w, Py_ssize_t rb, Py_ssize_t r0, Py_ssize_t r1,
                       Py_ssize_t k, float *out) {
    BY_SIMD(held_widen_rows, form, w, rb, r0, r1, k, out);
}

/* gemm(out, x, w, b): out (m, n) = x (m, k) @ w (n, k).T (+ b), float32, row-major. */
static PyObject *py_gemm(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs == 5)
        return py_gemm_held(args);
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "gemm(out, x, w, b[, form]) takes 4 or 5 arguments");
        return NULL;
    }
    Py_buffer out, x, w, b = {0};
    if (get_floats(args[0], &out, 1, "out") < 0)
        return NULL;
    if (get_floats(args[1], &x, 0, "x") < 0)
        goto g0;
    if (get_weights(args[2], &w) < 0)
        goto g1;
    int has_b = args[3] != Py_None;
    if (has_b && get_floats(args[3], &b, 0, "b") < 0)
        goto g2;
    /* float32 (n, k), or bfloat16 tiles (ceil(n / 16), ceil(k / 32), 16, 32): _cpu_tiles.h */
    int tiles = w.itemsize == 2 && w.ndim == 4;
    Py_ssize_t n = tiles ? out.shape[1] : w.shape[0];
    int fits = tiles ? w.shape[0] == (n + TILE_N - 1) / TILE_N &&
                       w.shape[1] == (x.shape[1] + TILE_K - 1) / TILE_K &&
                       w.shape[2] == TILE_N && w.shape[3] == TILE_K
                     : w.itemsize == 4 && w.ndim == 2 && x.shape[1] == w.shape[1];
    if (x.ndim != 2 || out.ndim != 2 || !fits || out.shape[0] != x.shape[0] ||
        out.shape[1] != n || (has_b && b.len / 4 != n) || overlaps(&out, &x) ||
        overlaps(&out, &w) || (has_b && overlaps(&out, &b))) {
        PyErr_SetString(PyExc_ValueError, "gemm: out (m, n), x (m, k), w float32 (n, k) or "
                        "bfloat16 tiles (ceil(n / 16), ceil(k / 32), 16, 32) as uint16, b "
                        "None or (n,); out apart from the rest");
        goto g3;
    }
    int failed;
    Py_BEGIN_ALLOW_THREADS
    failed = (tiles ? tiles_run(out.buf, x.buf, w.buf, has_b ? b.buf : NULL, x.shape[0], n,
                                x.shape[1])
                    : gemm_run(out.buf, x.buf, w.buf, has_b ? b.buf : NULL, x.shape[0], n,
                               x.shape[1])) < 0;
    Py_END_ALLOW_THREADS
    if (failed) {
        PyErr_NoMemory();
        goto g3;
    }
    if (has_b)
        PyBuffer_Release(&b);
    PyBuffer_Release(&w);
    PyBuffer_Release(&x);
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
g3:
    if (has_b)
        PyBuffer_Release(&b);
g2:
    PyBuffer_Release(&w);
g1:
    PyBuffer_Release(&x);
g0:
    PyBuffer_Release(&out);
    return NULL;
}

/* attend's and attend_chunk's arguments, (out, q, keys, values, scratch, kv_heads, start,
 * window, scale, softcap, ring), parsed alike: out, the caches and scratch C-contiguous
 * float32 (out and scratch writable), q float32 with its strides (attend_chunk's rows may
 * stand apart), the ints within what either reads. 0 with every buffer held (attend_free),
 * or -1 with a ValueError naming ``name``. */
typedef struct {
    Py_buffer out, q, k, v, scratch, alibi;  /* alibi.buf NULL: none */
    int G;
    Py_ssize_t start, window, ring;
    float scale, softcap;
} attend_call;

static void attend_free(attend_call *c) {
    if (c->alibi.buf)
        PyBuffer_Release(&c->alibi);
    PyBuffer_Release(&c->scratch);
    PyBuffer_Release(&c->v);
    PyBuffer_Release(&c->k);
    PyBuffer_Release(&c->q);
    PyBuffer_Release(&c->out);
}

/* A KV cache: C-contiguous float32, or bfloat16 bits (uint16). */
static int get_cache(PyObject *obj, Py_buffer *view, const char *name) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) {
        PyErr_Format(PyExc_ValueError, "%s must be a C-contiguous float32 or uint16 (bfloat16 "
                     "bits) array", name);
        return -1;
    }
    if (!view->format || !((view->itemsize == 4 && strcmp(view->format, "f") == 0) ||
                           (view->itemsize == 2 && strcmp(view->format, "H") == 0))) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_ValueError, "%s must be float32 or uint16 (bfloat16 bits)", name);
        return -1;
    }
    return 0;
}

static int attend_parse(PyObject *const *args, Py_ssize_t nargs, const char *name,
                        attend_call *c) {
    if (nargs != 11 && nargs != 12) {
        PyErr_Format(PyExc_TypeError, "%s takes 11 or 12 arguments", name);
        return -1;
    }
    long G = PyLong_AsLong(args[5]);
    Py_ssize_t start = PyLong_AsSsize_t(args[6]), window = PyLong_AsSsize_t(args[7]);
    double scale = PyFloat_AsDouble(args[8]), softcap = PyFloat_AsDouble(args[9]);
    Py_ssize_t ring = PyLong_AsSsize_t(args[10]);
    if (PyErr_Occurred())
        return -1;
    if (start < 0 || start >= INT32_MAX / 2 || window < 0 || G < 1 || G > INT32_MAX ||
        ring < 0 || (ring > 0 && (window == 0 || window > ring))) {
        PyErr_Format(PyExc_ValueError, "%s: start must be within the cache, window >= 0 (0: "
                     "none), kv_heads >= 1, ring >= 0 (0: none) holding the window", name);
        return -1;
    }
    *c = (attend_call){.G = (int)G, .start = start, .window = window, .ring = ring,
                       .scale = (float)scale, .softcap = (float)softcap};
    if (get_floats(args[0], &c->out, 1, "out") < 0)
        return -1;
    if (PyObject_GetBuffer(args[1], &c->q, PyBUF_STRIDES | PyBUF_FORMAT) != 0)
        goto a0;
    if (c->q.itemsize != 4 || !c->q.format || strcmp(c->q.format, "f") != 0) {
        PyErr_SetString(PyExc_ValueError, "q must be float32");
        goto a1;
    }
    if (get_cache(args[2], &c->k, "keys") < 0)
        goto a1;
    if (get_cache(args[3], &c->v, "values") < 0)
        goto a2;
    if (c->v.itemsize != c->k.itemsize) {
        PyErr_Format(PyExc_ValueError, "%s: keys and values must be of one dtype", name);
        goto a3;
    }
    if (get_floats(args[4], &c->scratch, 1, "scratch") < 0)
        goto a3;
    if (nargs == 12 && args[11] != Py_None && get_floats(args[11], &c->alibi, 0, "alibi") < 0)
        goto a4;
    return 0;
a4:
    PyBuffer_Release(&c->scratch);
a3:
    PyBuffer_Release(&c->v);
a2:
    PyBuffer_Release(&c->k);
a1:
    PyBuffer_Release(&c->q);
a0:
    PyBuffer_Release(&c->out);
    return -1;
}

/* Whether out and scratch stand apart from each other and from what attention reads. */
static int attend_apart(const attend_call *c) {
    return !overlaps(&c->out, &c->q) && !overlaps(&c->out, &c->k) &&
           !overlaps(&c->out, &c->v) && !overlaps(&c->out, &c->scratch) &&
           !overlaps(&c->scratch, &c->q) && !overlaps(&c->scratch, &c->k) &&
           !overlaps(&c->scratch, &c->v);
}

/* Run n queries (attend_any, as a program's OP_ATTEND step) where the shapes fit (ok), else
 * a ValueError "name: shapes do not fit (why)". */
static PyObject *attend_call_run(attend_call *c, const char *name, int ok, int H, int D,
                                 Py_ssize_t n, Py_ssize_t qstride, const char *shapes,
                                 int chunk) {
    const char *why = ok ? NULL : shapes;
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        why = attend_any(c->out.buf, c->q.buf, qstride, c->k.buf, c->v.buf, c->k.itemsize == 2,
                         c->scratch.buf,
                         c->scratch.len / 4, H, c->G, D, c->k.shape[1], n, c->start,
                         c->window, c->scale, c->softcap, c->ring, c->alibi.buf, chunk);
        Py_END_ALLOW_THREADS
    }
    attend_free(c);
    if (why) {
        PyErr_Format(PyExc_ValueError, "%s: shapes do not fit (%s)", name, why);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* attend(out, q, keys, values, scratch, kv_heads, start, window, scale, softcap, ring[,
 * alibi]): out (H, D) over q (H, D) at position ``start``; caches (kv_heads, L, D), position
 * p at row p % ring (ring 0: at row p); window 0: none; softcap 0: none; alibi None (none)
 * or float32 (H,) slopes, head h's score of position p gaining alibi[h] * (p - start) after
 * the softcap; scratch: scratch_size(...) floats. q is scaled into the scratch. */
static PyObject *py_attend(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    attend_call c;
    if (attend_parse(args, nargs, "attend", &c) < 0)
        return NULL;
    const Py_buffer *k = &c.k;
    int D = k->ndim == 3 && k->shape[0] == c.G ? (int)k->shape[2] : 0;
    int H = D > 0 ? (int)(c.q.len / 4 / D) : 0;
    int ok = D > 0 && H > 0 && H % c.G == 0 && (Py_ssize_t)H * D * 4 == c.q.len &&
             PyBuffer_IsContiguous(&c.q, 'C') && c.out.len == c.q.len && c.v.len == k->len &&
             (!c.alibi.buf || c.alibi.len == 4 * (Py_ssize_t)H) && attend_apart(&c);
    return attend_call_run(&c, "attend", ok, H, D, 1, (Py_ssize_t)H * D,
                           "q (H, D) C-contiguous, caches (kv_heads, L, D), out as q, alibi "
                           "None or (H,), out and scratch apart from the rest", 0);
}

/* attend_chunk(out, q, keys, values, scratch, kv_heads, start, window, scale, softcap,
 * ring[, alibi]): out (n, H * D) over q (n, H, D) (its rows may stand apart: a column view)
 * at positions start .. start + n; caches (kv_heads, L, D), position p at row p % ring (ring
 * 0: at row p); window 0: none; softcap 0: none; alibi as attend's (a query's own position
 * in place of start); scratch: at least threads * 32 * (D + L + 32) floats. */
static PyObject *py_attend_chunk(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    attend_call c;
    if (attend_parse(args, nargs, "attend_chunk", &c) < 0)
        return NULL;
    const Py_buffer *q = &c.q, *k = &c.k;
    int ok = q->ndim == 3 && k->ndim == 3 && k->shape[0] == c.G && c.v.len == k->len &&
             q->shape[2] == k->shape[2] && q->shape[1] % c.G == 0 && q->strides[2] == 4 &&
             q->strides[1] == 4 * q->shape[2] &&
             q->strides[0] >= 4 * q->shape[1] * q->shape[2] && q->strides[0] % 4 == 0 &&
             c.out.ndim == 2 && c.out.shape[0] == q->shape[0] &&
             c.out.shape[1] == q->shape[1] * q->shape[2] && q->shape[0] > 0 &&
             q->shape[1] > 0 && q->shape[2] > 0 &&
             (!c.alibi.buf || c.alibi.len == 4 * q->shape[1]) && attend_apart(&c);
    return attend_call_run(&c, "attend_chunk", ok, ok ? (int)q->shape[1] : 0,
                           ok ? (int)q->shape[2] : 0, ok ? q->shape[0] : 0,
                           ok ? q->strides[0] / 4 : 0,
                           "q (n, H, D) float32 with rows apart at most, caches (kv_heads, L, "
                           "D), out (n, H * D), alibi None or (H,), out and scratch apart from "
                           "the rest", 1);
}

/* A float32 array of 2 (or, where allowed, 3) dimensions whose last is contiguous (and,
 * in 3, the middle one too): rows a stride apart, as a column view of a fused projection. */
static int get_rows(PyObject *obj, Py_buffer *view, int writable, int three, const char *name) {
    int flags = PyBUF_STRIDES | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) != 0)
        return -1;
    int nd = view->ndim;
    if (view->itemsize != 4 || !view->format || strcmp(view->format, "f") != 0 ||
        !(nd == 2 || (three && nd == 3)) || view->strides[nd - 1] != 4 ||
        (nd == 3 && view->strides[1] != 4 * view->shape[2]) || view->strides[0] % 4 ||
        view->strides[0] < 4 * (nd == 3 ? view->shape[1] * view->shape[2] : view->shape[1])) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_ValueError, "%s must be float32 (n, d)%s, its rows apart at most",
                     name, three ? " or (n, heads, d)" : "");
        return -1;
    }
    return 0;
}

/* gated(out, gate, up, act): out = act(gate) * up, each (n, m), rows apart at most;
 * act 0: silu, 1: gelu (tanh). rms_norm(out, x, w, eps): each row of x (n, d) or (n,
 * heads, d) over its root mean square plus eps, times w (d,) or (heads, d). On the pool,
 * rows split statically (each row's values the same at any thread count). */
static PyObject *rows_call(PyObject *const *args, int rms) {
    Py_buffer out, x, u;
    const char *what = rms ? "rms_norm" : "gated";
    if (get_rows(args[0], &out, 1, rms, "out") < 0)
        return NULL;
    if (get_rows(args[1], &x, 0, rms, "x") < 0)
        goto r0;
    if (rms ? get_floats(args[2], &u, 0, "w") < 0 : get_rows(args[2], &u, 0, 0, "up") < 0)
        goto r1;
    double f = PyFloat_AsDouble(args[3]);
    if (PyErr_Occurred())
        goto r2;
    int nd = x.ndim, same = out.ndim == nd;
    for (int i = 0; same && i < nd; i++)
        same = out.shape[i] == x.shape[i];
    Py_ssize_t d = x.shape[nd - 1], inner = nd == 3 ? x.shape[1] : 1;
    int ok = same && d > 0 && !overlaps(&out, &u) &&
             (rms ? (u.len / 4 == d || (nd == 3 && u.len / 4 == inner * d))
                  : (u.ndim == 2 && u.shape[0] == x.shape[0] && u.shape[1] == d &&
                     (f == ACT_SILU || f == ACT_GELU_TANH)));
    if (!ok) {
        PyErr_Format(PyExc_ValueError, "%s: out, x and %s do not fit (out and x alike; %s)",
                     what, rms ? "w" : "up", rms ? "w (d,) or (heads, d)"
                     : "up as gate, act 0 (silu) or 1 (gelu tanh)");
        goto r2;
    }
    rows_args a = {x.buf, u.buf, out.buf, x.shape[0] * inner, d, x.strides[0] / 4,
                   rms ? 0 : u.strides[0] / 4, out.strides[0] / 4, inner,
                   rms ? u.len / 4 / d : 1, rms ? 0 : (int)f, rms, rms ? (float)f : 0.0f};
    Py_BEGIN_ALLOW_THREADS
    pool_run(rows_part, &a);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&u);
    PyBuffer_Release(&x);
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
r2:
    PyBuffer_Release(&u);
r1:
    PyBuffer_Release(&x);
r0:
    PyBuffer_Release(&out);
    return NULL;
}

static PyObject *py_gated(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "gated(out, gate, up, act) takes 4 arguments");
        return NULL;
    }
    return rows_call(args, 0);
}

static PyObject *py_rms_norm(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "rms_norm(out, x, w, eps) takes 4 arguments");
        return NULL;
    }
    return rows_call(args, 1);
}

/* rope(out, x, cos, sin, start, interleaved): a prompt chunk's rows of x (n, heads, D), its
 * rows apart at most, turned at positions start .. start + n by the tables (positions, R),
 * R <= D even; out (n, heads, D). */
static PyObject *py_rope(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "rope(out, x, cos, sin, start, interleaved) takes 6 "
                        "arguments");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[4]);
    int interleaved = PyObject_IsTrue(args[5]);
    if (PyErr_Occurred() || interleaved < 0)
        return NULL;
    Py_buffer out, x, c, sn;
    if (get_floats(args[0], &out, 1, "out") < 0)
        return NULL;
    if (get_rows(args[1], &x, 0, 1, "x") < 0)
        goto o0;
    if (get_floats(args[2], &c, 0, "cos") < 0)
        goto o1;
    if (get_floats(args[3], &sn, 0, "sin") < 0)
        goto o2;
    int ok = x.ndim == 3 && out.ndim == 3 && c.ndim == 2 && sn.ndim == 2 &&
             out.shape[0] == x.shape[0] && out.shape[1] == x.shape[1] &&
             out.shape[2] == x.shape[2] && c.shape[0] == sn.shape[0] &&
             c.shape[1] == sn.shape[1] && c.shape[1] % 2 == 0 && c.shape[1] <= x.shape[2] &&
             start >= 0 && start + x.shape[0] <= c.shape[0] && !overlaps(&out, &x) &&
             !overlaps(&out, &c) && !overlaps(&out, &sn);
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "rope: out and x (n, heads, D) alike, cos and sin "
                        "(positions, R) alike, R even and <= D, start + n within the tables");
        goto o3;
    }
    rope_args a = {x.buf, c.buf, sn.buf, out.buf, x.shape[0], x.shape[1], x.shape[2],
                   c.shape[1], x.strides[0] / 4, start, interleaved};
    Py_BEGIN_ALLOW_THREADS
    pool_run(rope_part, &a);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&sn);
    PyBuffer_Release(&c);
    PyBuffer_Release(&x);
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
o3:
    PyBuffer_Release(&sn);
o2:
    PyBuffer_Release(&c);
o1:
    PyBuffer_Release(&x);
o0:
    PyBuffer_Release(&out);
    return NULL;
}

static PyObject *py_threads(PyObject *self, PyObject *unused) {
    return PyLong_FromLong(pool.threads);
}

static PyObject *py_simd(PyObject *self, PyObject *unused) {
    return PyUnicode_FromString(SIMD_NAMES[simd]);
}

static PyObject *py_available(PyObject *self, PyObject *unused) {
    PyObject *out = PyTuple_New(simd_best + 1);
    if (!out)
        return NULL;
    for (int i = 0; i <= simd_best; i++)
        PyTuple_SET_ITEM(out, i, PyUnicode_FromString(SIMD_NAMES[i]));
    return out;
}

static PyObject *py_use(PyObject *self, PyObject *arg) {
    const char *name = PyUnicode_AsUTF8(arg);
    if (!name)
        return NULL;
    for (int i = 0; i <= SIMD_AVX512; i++)
        if (strcmp(name, SIMD_NAMES[i]) == 0) {
            if (i > simd_best) {
                PyErr_Format(PyExc_ValueError, "%s kernels need an instruction set this CPU "
                             "lacks; it runs %s at best", name, SIMD_NAMES[simd_best]);
                return NULL;
            }
            /* Taken between calls: the pool is idle whenever Python holds the GIL here. */
            simd = i;
            Py_RETURN_NONE;
        }
    PyErr_Format(PyExc_ValueError, "%s is not an instruction set of these kernels: portable, "
                 "avx2 or avx512", name);
    return NULL;
}

static PyObject *py_prefetch(PyObject *self, PyObject *args) {
    Py_ssize_t f = gemv_ahead[0], b = gemv_ahead[1], q = gemv_ahead[2], at = attend_ahead;
    int level = gemv_level, at_level = attend_level;
    if (!PyArg_ParseTuple(args, "|nnnnii", &f, &b, &q, &at, &level, &at_level))
        return NULL;
    if (f < 0 || b < 0 || q < 0 || at < 0 || f > 65536 || b > 65536 || q > 65536 ||
        at > 65536) {
        PyErr_SetString(PyExc_ValueError, "prefetch distances are bytes from 0 to 65536");
        return NULL;
    }
    if ((level != 2 && level != 3) || (at_level != 2 && at_level != 3)) {
        PyErr_Format(PyExc_ValueError, "prefetch level %d: 3 (prefetcht0, into L1) or 2 "
                     "(prefetcht1, into L2)", level != 2 && level != 3 ? level : at_level);
        return NULL;
    }
    PyObject *was = Py_BuildValue("(nnnnii)", gemv_ahead[0], gemv_ahead[1], gemv_ahead[2],
                                  attend_ahead, gemv_level, attend_level);
    gemv_level = level;
    attend_level = at_level;
    gemv_ahead[0] = f; /* between calls: the pool is idle */
    gemv_ahead[1] = b;
    gemv_ahead[2] = q;
    attend_ahead = at;
    return was;
}

/* vnni([on]): whether a held block form's decode GEMV runs on AVX-512 VNNI (the default where
 * the CPU has it); with ``on``, set it (tests run the other paths too) and return what was. */
static PyObject *py_vnni(PyObject *self, PyObject *args) {
    int on = -1;
    if (!PyArg_ParseTuple(args, "|p", &on))
        return NULL;
    const int was = held_vnni;
    if (on == 1 && !held_vnni_offered) {
        PyErr_SetString(PyExc_ValueError, "vnni kernels need AVX-512 VNNI, which this CPU lacks");
        return NULL;
    }
    if (on >= 0)
        held_vnni = on; /* between calls: the pool is idle */
    return PyBool_FromLong(was);
}

/* skinny([on]): whether a batched decode step's GEMV runs _cpu_skinny.h's kernels (else each
 * row's one-row kernel a block at a time, as before them: bench/batch_gemv.py's side by side). */
static PyObject *py_skinny(PyObject *self, PyObject *args) {
    int on = -1;
    if (!PyArg_ParseTuple(args, "|p", &on))
        return NULL;
    const int was = skinny_on;
    if (on >= 0)
        skinny_on = on; /* between calls: the pool is idle */
    return PyBool_FromLong(was);
}

static PyObject *py_tiles(PyObject *self, PyObject *unused) {
    return PyUnicode_FromString(TILES_NAMES[tiles_running()]);
}

static PyObject *py_use_tiles(PyObject *self, PyObject *arg) {
    const char *name = PyUnicode_AsUTF8(arg);
    if (!name)
        return NULL;
    for (int i = TILES_PORTABLE; i <= TILES_AMX; i++)
        if (strcmp(name, TILES_NAMES[i]) == 0) {
            if (!tiles_offered[i]) {
                PyErr_Format(PyExc_ValueError, "%s tiles need an instruction set this CPU (or "
                             "its OS) does not offer; it runs %s at best", name,
                             TILES_NAMES[tiles_best]);
                return NULL;
            }
            tiles_kernel = i; /* between calls: the pool is idle */
            Py_RETURN_NONE;
        }
    PyErr_Format(PyExc_ValueError, "%s is not a tile kernel: amx, avx512bf16 or portable", name);
    return NULL;
}

static PyMethodDef methods[] = {
    {"start", py_start, METH_O, "start(threads): start the pool once; returns its threads"},
    {"threads", py_threads, METH_NOARGS, "the pool's threads (0: not started)"},
    {"skinny", py_skinny, METH_VARARGS, "skinny([on]): whether a batched decode step's GEMV "
     "reads each weight once for all its rows (_cpu_skinny.h); with on, set it, return what was"},
    {"vnni", py_vnni, METH_VARARGS, "vnni([on]): whether a held block form's decode GEMV runs "
     "on AVX-512 VNNI (VPDPBUSD); with on, set it and return what was (ValueError where the "
     "CPU lacks it)"},
    {"simd", py_simd, METH_NOARGS, "the kernels' instruction set: portable, avx2 or avx512"},
    {"available", py_available, METH_NOARGS,
     "the instruction sets this CPU runs, portable first, the best last"},
    {"use", py_use, METH_O, "use(name): run the kernels on portable, avx2 or avx512 "
     "(ValueError where this CPU lacks it)"},
    {"gemv", (PyCFunction)(void (*)(void))py_gemv, METH_FASTCALL,
     "gemv(y, x, w, b): y = w @ x (+ b); w (len(y), len(x)) float32 row-major, or "
     "bfloat16 as uint16 (len(y), len(x)) or Q8_0 blocks as uint8 (len(y), len(x) / 32 * 34) "
     "in row groups (operators.formats.group_bfloat16, group_q8_0); b None or (len(y),). "
     "gemv(y, x, w, b, form): w len(y) rows held in form (operators.held)"},
    {"gemm", (PyCFunction)(void (*)(void))py_gemm, METH_FASTCALL,
     "gemm(out, x, w, b): out = x @ w.T (+ b); out (m, n), x (m, k), w (n, k), float32 "
     "row-major, or bfloat16 tiles (formats.tile_bfloat16) with x rounded to bfloat16; b "
     "None or (n,). gemm(out, x, w, b, form): w n rows held in form (operators.held)"},
    {"nonfinite", (PyCFunction)(void (*)(void))py_nonfinite, METH_FASTCALL,
     "nonfinite(w, form): how many values of w, held in form, are NaN or infinite (a block "
     "form's counted by its scales), on the pool"},
    {"widen", (PyCFunction)(void (*)(void))py_widen, METH_FASTCALL,
     "widen(out, w, form): out (rows, k) float32 = the values of w's rows held in form (a "
     "GGML type number: operators.held), as ggml's dequantize_row_* gives them"},
    {"prefetch", py_prefetch, METH_VARARGS,
     "prefetch([float32, bfloat16, int8, attend, level, attend_level]): how far ahead (bytes, "
     "0: off) a GEMV asks for its weights, per form, and a decode step's attention for its "
     "cache rows, and the cache level the bfloat16 GEMV's and the attention's requests fill "
     "(3: prefetcht0, 2: prefetcht1); "
     "returns "
     "the settings before"},
    {"profile", py_profile, METH_O,
     "profile(on): count each program step's calls and ns by its code from now (True) or "
     "stop (False); returns {code: (calls, ns)} since the last call, and clears it"},
    {"tiles", py_tiles, METH_NOARGS,
     "tiles(): who runs a GEMM on bfloat16 tiles: amx, avx512bf16 or portable"},
    {"use_tiles", py_use_tiles, METH_O,
     "use_tiles(name): run GEMMs on bfloat16 tiles on amx, avx512bf16 (where the CPU and OS "
     "allow it) or portable"},
    {"attend", (PyCFunction)(void (*)(void))py_attend, METH_FASTCALL,
     "attend(out, q, keys, values, scratch, kv_heads, start, window, scale, softcap, ring[, "
     "alibi]): one query q (H, D) at start; alibi None or (H,) ALiBi slopes"},
    {"read", py_read, METH_O,
     "read(x): the sum of float32 x's whole 32-value groups, read on the pool's threads "
     "(bench's read bandwidth)"},
    {"program", py_program, METH_O,
     "program(steps): a compiled decode step's steps checked once, as a capsule for run "
     "(operators/_cpu_program.h)"},
    {"run", (PyCFunction)(void (*)(void))py_run, METH_FASTCALL,
     "run(program, start, rows, position, first, last): steps first .. last of a program"},
    {"gated", (PyCFunction)(void (*)(void))py_gated, METH_FASTCALL,
     "gated(out, gate, up, act): out = act(gate) * up over a prompt chunk's rows (n, m); act "
     "0: silu, 1: gelu (tanh)"},
    {"rms_norm", (PyCFunction)(void (*)(void))py_rms_norm, METH_FASTCALL,
     "rms_norm(out, x, w, eps): x (n, d) or (n, heads, d) over each row's root mean square "
     "(plus eps), times w (d,) or (heads, d)"},
    {"rope", (PyCFunction)(void (*)(void))py_rope, METH_FASTCALL,
     "rope(out, x, cos, sin, start, interleaved): a prompt chunk's rows of x (n, heads, D) "
     "turned at start .. start + n by the per-column tables (positions, R)"},
    {"attend_chunk", (PyCFunction)(void (*)(void))py_attend_chunk, METH_FASTCALL,
     "attend_chunk(out, q, keys, values, scratch, kv_heads, start, window, scale, softcap, "
     "ring[, alibi]): a prompt chunk's queries q (n, H, D) at start .. start + n; out (n, H * "
     "D); alibi None or (H,) ALiBi slopes"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cpu",
                                    "The decode step's kernels on a thread pool of our own.",
                                    -1, methods};

PyMODINIT_FUNC PyInit__cpu(void) {
#ifdef HAVE_X86
    __builtin_cpu_init();
    /* libgcc's cpuid also asks the OS (xgetbv) whether it saves the wider registers. */
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c"))
        simd_best = SIMD_AVX2;
    if (simd_best == SIMD_AVX2 && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq"))
        simd_best = SIMD_AVX512;
    simd = simd_best;
    held_vnni = held_vnni_offered = simd_best == SIMD_AVX512 && __builtin_cpu_supports("avx512vnni");
    if (__builtin_cpu_is("amd"))
        gemv_level = attend_level = 2;
#endif
    tiles_init();
    pthread_atfork(NULL, NULL, pool_after_fork);
    PyObject *m = PyModule_Create(&module);
#ifndef IRON_SPEC_SOURCE_DIGEST
#define IRON_SPEC_SOURCE_DIGEST ""
#endif
    /* What operators/native.py compares with the sources beside it (operators/_sources.py). */
    if (m != NULL && PyModule_AddStringConstant(m, "SOURCE_DIGEST", IRON_SPEC_SOURCE_DIGEST) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
