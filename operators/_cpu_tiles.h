/* A prompt chunk's GEMM on bfloat16 tiles: out (m, n) = bf16(x) (m, k) @ w (n, k).T (+ b),
 * float32 sums of bfloat16 products, on Intel AMX where the CPU and the OS allow it, else
 * AVX-512's BF16 dot products, else a portable loop, all over the same tiles (the same
 * products: a bfloat16 times a bfloat16 is exact in float32, so the two differ only in the order of the sums).
 *
 * The weights are packed once (operators/formats.py tile_bfloat16): w padded with zeros to
 * whole 16-row, 32-column tiles, shape (n / 16, k / 32, 16, 32) uint16, tile (j, t)'s row r
 * holding columns 2r and 2r + 1 of its 32 for each of its 16 rows of w side by side: the
 * "VNNI" layout an AMX B tile reads (TDPBF16PS multiplies pairs along k). x is rounded to
 * bfloat16 (to nearest, ties to even; a NaN stays a quiet NaN) into a buffer padded with
 * zeros to whole tiles: the GEMMs' own (gemm_buffer).
 *
 * AMX's state is per thread: each pool part loads the tile configuration, runs, and releases
 * it. Linux gives a process AMX's registers only when asked (arch_prctl ARCH_REQ_XCOMP_PERM),
 * once, at import (tiles_init). */

#define TILE_N 16 /* rows of w (output columns) a tile holds */
#define TILE_K 32 /* values of k a tile holds */
#define TILE_M 16 /* rows of x an A tile holds */

typedef struct {
    const uint16_t *w; /* (nt, kt, 16, 32) */
    const float *x, *b;
    uint16_t *xb; /* x rounded, mt * 16 rows pitch apart, zeros past m and k (to kt * 32) */
    float *out;
    Py_ssize_t m, n, k, mt, nt, kt, pitch;
} tiles_args;

/* Who runs a GEMM on tiles, best first: AMX; AVX-512's BF16 dot products (VDPBF16PS, Cooper
 * Lake, Sapphire Rapids with AMX off, Zen 4 and later), which read the same tiles a row of w
 * a vector; the portable loop. */
enum { TILES_PORTABLE, TILES_AVX512BF16, TILES_AMX };
static const char *const TILES_NAMES[] = {"portable", "avx512bf16", "amx"};
static int tiles_offered[3] = {1, 0, 0}; /* by this CPU and OS (tiles_init) */
static int tiles_best = TILES_PORTABLE;
static int tiles_kernel = TILES_PORTABLE; /* _cpu.use_tiles(): the best unless told */

/* Rows [r0, r1) of x rounded into xb (to nearest, ties to even), zeros past m and k, in
 * a loop the compiler vectorizes (the NaN case a select, not a branch). */
#define TILES_ROUND_BODY                                                                     \
    const Py_ssize_t K = a->kt * TILE_K;                                                     \
    for (Py_ssize_t r = r0; r < r1; r++) {                                                   \
        uint16_t *dst = a->xb + r * a->pitch;                                                \
        Py_ssize_t c = 0;                                                                    \
        if (r < a->m) {                                                                      \
            const uint32_t *src = (const uint32_t *)(a->x + r * a->k);                       \
            for (; c < a->k; c++) {                                                          \
                const uint32_t u = src[c];                                                   \
                const uint32_t near = (u + 0x7fffu + ((u >> 16) & 1)) >> 16;                 \
                dst[c] = (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40 : near); \
            }                                                                                \
        }                                                                                    \
        for (; c < K; c++)                                                                   \
            dst[c] = 0;                                                                      \
    }

static void tiles_round_rows(const tiles_args *a, Py_ssize_t r0, Py_ssize_t r1) {
    TILES_ROUND_BODY
}

#ifdef HAVE_X86
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void tiles_round_rows_avx512(
    const tiles_args *a, Py_ssize_t r0, Py_ssize_t r1) {
    TILES_ROUND_BODY
}
#endif

static void tiles_round_part(const void *args, int part, int parts) {
    const tiles_args *a = args;
    Py_ssize_t r0, r1;
    share(a->mt * TILE_M, 1, part, parts, &r0, &r1);
#ifdef HAVE_X86
    if (simd == SIMD_AVX512) {
        tiles_round_rows_avx512(a, r0, r1);
        return;
    }
#endif
    tiles_round_rows(a, r0, r1);
}

/* Tile (i, j)'s 16 x 16 sums (row-major in c) into out, clipped to m and n, plus the bias
 * unless the sums began at it (``biased``). */
static void tiles_store(const tiles_args *a, const float *c, Py_ssize_t i, Py_ssize_t j,
                        int biased) {
    const Py_ssize_t r1 = (i + 1) * TILE_M < a->m ? TILE_M : a->m - i * TILE_M;
    const Py_ssize_t c1 = (j + 1) * TILE_N < a->n ? TILE_N : a->n - j * TILE_N;
    for (Py_ssize_t r = 0; r < r1; r++) {
        float *o = a->out + (i * TILE_M + r) * a->n + j * TILE_N;
        for (Py_ssize_t q = 0; q < c1; q++)
            o[q] = c[r * TILE_N + q] + (a->b && !biased ? a->b[j * TILE_N + q] : 0.0f);
    }
}

/* The portable loop: one row of x against one tile column at a time, each tile's pairs in
 * the order TDPBF16PS takes them. */
static void tiles_portable(const tiles_args *a, Py_ssize_t j0, Py_ssize_t j1) {
    float c[TILE_M * TILE_N];
    for (Py_ssize_t j = j0; j < j1; j++)
        for (Py_ssize_t i = 0; i < a->mt; i++) {
            if (i * TILE_M >= a->m)
                break;
            for (int r = 0; r < TILE_M; r++) {
                float acc[TILE_N] = {0};
                const uint16_t *xr = a->xb + (i * TILE_M + r) * a->pitch;
                for (Py_ssize_t t = 0; t < a->kt; t++) {
                    const uint16_t *wt = a->w + (j * a->kt + t) * (TILE_N * TILE_K);
                    for (int p = 0; p < TILE_K / 2; p++) {
                        const float x0 = bf16_to_float(xr[t * TILE_K + 2 * p]);
                        const float x1 = bf16_to_float(xr[t * TILE_K + 2 * p + 1]);
                        for (int q = 0; q < TILE_N; q++)
                            acc[q] += x0 * bf16_to_float(wt[p * 32 + 2 * q]) +
                                      x1 * bf16_to_float(wt[p * 32 + 2 * q + 1]);
                    }
                }
                memcpy(c + r * TILE_N, acc, sizeof acc);
            }
            tiles_store(a, c, i, j, 0);
        }
}

#ifdef HAVE_X86
#include <sys/syscall.h>
#include <unistd.h>

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) tile_config;

/* Tiles 0-3: sums of a 32 x 32 block of out (rows i, i + 1 by columns j, j + 1); 4, 5: x's
 * two 16-row tiles; 6, 7: w's two tiles. Each step of k reads 4 KB and makes 4 products of
 * 16 x 16 x 32. A block's sums go through c (clipped at the edges) to out. */
__attribute__((target("amx-tile,amx-bf16"))) static void tiles_amx_cols(const tiles_args *a,
                                                                      Py_ssize_t j0,
                                                                      Py_ssize_t j1) {
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = 16;
        cfg.colsb[t] = 64;
    }
    _tile_loadconfig(&cfg);
    const Py_ssize_t P = a->pitch, stride = P * 2, tile = TILE_N * TILE_K;
    float c[TILE_M * TILE_N];
    const Py_ssize_t ostride = a->n * 4;
    for (Py_ssize_t j = j0; j < j1; j += 2) {
        const int two = j + 1 < j1;
        const uint16_t *w0 = a->w + j * a->kt * tile;
        const uint16_t *w1 = two ? w0 + a->kt * tile : w0;
        /* Columns of out whole in tile j, j + 1: their sums start at the bias (a row read
         * 16 times: stride 0) and are stored straight into out. */
        const int whole0 = (j + 1) * TILE_N <= a->n, whole1 = two && (j + 2) * TILE_N <= a->n;
        for (Py_ssize_t i = 0; i * TILE_M < a->m; i += 2) {
            const uint16_t *x0 = a->xb + i * TILE_M * P;
            const uint16_t *x1 = x0 + TILE_M * P; /* mt is even: this tile exists */
            const int rows0 = (i + 1) * TILE_M <= a->m, rows1 = (i + 2) * TILE_M <= a->m;
            if (a->b && whole0) {
                _tile_loadd(0, a->b + j * TILE_N, 0);
                _tile_loadd(2, a->b + j * TILE_N, 0);
            } else {
                _tile_zero(0);
                _tile_zero(2);
            }
            if (a->b && whole1) {
                _tile_loadd(1, a->b + (j + 1) * TILE_N, 0);
                _tile_loadd(3, a->b + (j + 1) * TILE_N, 0);
            } else {
                _tile_zero(1);
                _tile_zero(3);
            }
            for (Py_ssize_t t = 0; t < a->kt; t++) {
                _tile_loadd(4, x0 + t * TILE_K, stride);
                _tile_loadd(5, x1 + t * TILE_K, stride);
                _tile_loadd(6, w0 + t * tile, 64);
                _tile_loadd(7, w1 + t * tile, 64);
                _tile_dpbf16ps(0, 4, 6);
                _tile_dpbf16ps(1, 4, 7);
                _tile_dpbf16ps(2, 5, 6);
                _tile_dpbf16ps(3, 5, 7);
            }
            float *o0 = a->out + i * TILE_M * a->n + j * TILE_N, *o1 = o0 + TILE_M * a->n;
            /* Each tile straight into out where it is whole there; else through c, clipped
             * (and its bias added there, where it began at zero). */
#define TILE_OUT(t, whole, rows, dst, ti, tj)                                                \
            if ((whole) && (rows)) {                                                         \
                _tile_stored(t, dst, ostride);                                               \
            } else if ((ti) * TILE_M < a->m) {                                               \
                _tile_stored(t, c, 64);                                                      \
                tiles_store(a, c, ti, tj, whole);                                            \
            }
            TILE_OUT(0, whole0, rows0, o0, i, j)
            TILE_OUT(2, whole0, rows1, o1, i + 1, j)
            if (two) {
                TILE_OUT(1, whole1, rows0, o0 + TILE_N, i, j + 1)
                TILE_OUT(3, whole1, rows1, o1 + TILE_N, i + 1, j + 1)
            }
#undef TILE_OUT
        }
    }
    _tile_release();
}

/* AVX-512 BF16: a 32 x 16-bit vector of w's tile row p is its 16 rows' pairs (columns 2p,
 * 2p + 1 of the tile's 32), so VDPBF16PS of it against one row of x's pair, broadcast, adds
 * both products into that row's 16 output columns. R rows of x (12 at most: 24 sums, two
 * w vectors and the broadcasts in 32 registers) by two tile columns per block; w's two
 * columns (k / 32 KB each) are read from L2 by every block of rows in turn. Each lane's sum
 * runs over k in order, a pair at a time (as AMX's), from the bias; VDPBF16PS, as AMX's
 * TDPBF16PS, treats subnormal inputs and results as zero. */
#define TILES_BF16_BODY(R)                                                                   \
    do {                                                                                     \
        __m512 c[R][2];                                                                      \
        for (int r = 0; r < (R); r++) {                                                      \
            c[r][0] = b0;                                                                    \
            c[r][1] = b1;                                                                    \
        }                                                                                    \
        const uint16_t *x = a->xb + i * P;                                                   \
        for (Py_ssize_t t = 0; t < a->kt; t++) {                                             \
            const uint16_t *v0 = w0 + t * tile, *v1 = w1 + t * tile;                         \
            const uint16_t *xt = x + t * TILE_K;                                             \
            for (int p = 0; p < TILE_K / 2; p++) {                                           \
                const __m512bh u0 = (__m512bh)_mm512_loadu_si512(v0 + p * 32);               \
                const __m512bh u1 = (__m512bh)_mm512_loadu_si512(v1 + p * 32);               \
                for (int r = 0; r < (R); r++) {                                              \
                    uint32_t pair;                                                           \
                    memcpy(&pair, xt + r * P + 2 * p, sizeof pair);                          \
                    const __m512bh xp = (__m512bh)_mm512_set1_epi32((int)pair);              \
                    c[r][0] = _mm512_dpbf16_ps(c[r][0], xp, u0);                             \
                    c[r][1] = _mm512_dpbf16_ps(c[r][1], xp, u1);                             \
                }                                                                            \
            }                                                                                \
        }                                                                                    \
        for (int r = 0; r < (R) && i + r < a->m; r++) {                                      \
            float *o = a->out + (i + r) * a->n + j * TILE_N;                                 \
            _mm512_mask_storeu_ps(o, m0, c[r][0]);                                           \
            if (two)                                                                         \
                _mm512_mask_storeu_ps(o + TILE_N, m1, c[r][1]);                              \
        }                                                                                    \
    } while (0)

__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) static void tiles_bf16_cols(
    const tiles_args *a, Py_ssize_t j0, Py_ssize_t j1) {
    const Py_ssize_t P = a->pitch, tile = TILE_N * TILE_K, M = a->mt * TILE_M;
    for (Py_ssize_t j = j0; j < j1; j += 2) {
        const int two = j + 1 < j1;
        const uint16_t *w0 = a->w + j * a->kt * tile;
        const uint16_t *w1 = two ? w0 + a->kt * tile : w0;
        /* columns past n: masked off in the stores, their sums (of zero rows) unused */
        const Py_ssize_t n0 = a->n - j * TILE_N, n1 = n0 - TILE_N;
        const __mmask16 m0 = n0 >= TILE_N ? 0xffff : (__mmask16)((1u << n0) - 1);
        const __mmask16 m1 = n1 >= TILE_N ? 0xffff : n1 <= 0 ? 0 : (__mmask16)((1u << n1) - 1);
        const __m512 b0 = a->b ? _mm512_maskz_loadu_ps(m0, a->b + j * TILE_N) : _mm512_setzero_ps();
        const __m512 b1 = a->b && two ? _mm512_maskz_loadu_ps(m1, a->b + (j + 1) * TILE_N)
                                      : _mm512_setzero_ps();
        /* xb holds M rows, a multiple of 32 (zeros past m): blocks of 12, the last of 4 or 8 */
        Py_ssize_t i = 0;
        for (; i + 12 <= M && i < a->m; i += 12)
            TILES_BF16_BODY(12);
        if (i < a->m && M - i == 8)
            TILES_BF16_BODY(8);
        else if (i < a->m)
            TILES_BF16_BODY(4);
    }
}
#undef TILES_BF16_BODY

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* After the instruction sets are known (simd_best): AVX-512 BF16 needs the OS to keep
 * AVX-512's registers, as the avx512 kernels do. */
static void tiles_init(void) {
    tiles_offered[TILES_AVX512BF16] =
        simd_best == SIMD_AVX512 && __builtin_cpu_supports("avx512bf16");
    tiles_offered[TILES_AMX] =
        __builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-bf16") &&
        syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
    for (int i = TILES_PORTABLE; i <= TILES_AMX; i++)
        if (tiles_offered[i])
            tiles_best = i;
    tiles_kernel = tiles_best;
}
#else
static void tiles_init(void) {}
#endif

/* The tile kernel a GEMM runs: the one chosen, but never an AVX-512 one where the float32
 * kernels were told to run on less (IRON_SPEC_SIMD=avx2: a lesser CPU's whole path). */
static int tiles_running(void) {
    return tiles_kernel == TILES_AVX512BF16 && simd != SIMD_AVX512 ? TILES_PORTABLE
                                                                    : tiles_kernel;
}

static void tiles_part(const void *args, int part, int parts) {
    const tiles_args *a = args;
    Py_ssize_t j0, j1; /* whole pairs of tile columns: the same blocks at any thread count */
    share(a->nt, 2, part, parts, &j0, &j1);
    if (j0 >= j1)
        return;
#ifdef HAVE_X86
    switch (tiles_running()) {
    case TILES_AMX: tiles_amx_cols(a, j0, j1); return;
    case TILES_AVX512BF16: tiles_bf16_cols(a, j0, j1); return;
    default: break;
    }
#endif
    tiles_portable(a, j0, j1);
}

/* out (m, n) = bf16(x) (m, k) @ w.T (+ b), w in tiles (nt = ceil(n / 16), kt = ceil(k / 32)),
 * on the pool; called with the GIL released (py_gemm on tiles, a program's OP_GEMM on tiles).
 * -1 where x's rounded copy finds no memory. */
static int tiles_run(float *out, const float *x, const uint16_t *w, const float *b,
                     Py_ssize_t m, Py_ssize_t n, Py_ssize_t k) {
    const Py_ssize_t kt = (k + TILE_K - 1) / TILE_K;
    tiles_args a = {.w = w, .x = x, .b = b, .out = out, .m = m, .n = n, .k = k,
                    /* even: AMX's blocks are two tiles high */
                    .mt = (m + 2 * TILE_M - 1) / (2 * TILE_M) * 2,
                    .nt = (n + TILE_N - 1) / TILE_N, .kt = kt,
                    /* A cache line more than the row: rows a power of two bytes apart
                     * (k = 1024, 2048) would put a tile's 16 rows in one L1 set. */
                    .pitch = kt * TILE_K + 32};
    int failed = 0;
    pthread_mutex_lock(&gemm_lock);
    a.xb = gemm_buffer(sizeof(uint16_t) * a.mt * TILE_M * a.pitch);
    if (!a.xb) {
        failed = 1;
    } else {
        pool_run(tiles_round_part, &a);
        pool_run(tiles_part, &a);
    }
    pthread_mutex_unlock(&gemm_lock);
    return failed ? -1 : 0;
}
