/* The vectors of one instruction set, shared by its kernels' bodies (_cpu_gemv.h,
 * _cpu_chunk.h): included by _cpu.c once per instruction set, before them, inside its target
 * region, with SUFFIX (the names' suffix) and W (float32 lanes a vector holds: 4, 8 or 16)
 * defined. GCC's vector extensions, so one source serves every width.
 */

#define VEC_CAT_(a, b) a##b
#define VEC_CAT(a, b) VEC_CAT_(a, b)
#define VEC_FN(name) VEC_CAT(name, SUFFIX)

typedef float VEC_FN(fv) __attribute__((vector_size(4 * W)));     /* W float32 lanes */
typedef uint32_t VEC_FN(uv) __attribute__((vector_size(4 * W)));  /* their bits */
typedef int32_t VEC_FN(sv) __attribute__((vector_size(4 * W)));   /* masks, signed lanes */

/* W floats from p (any alignment), and into p. */
static inline __attribute__((always_inline)) VEC_FN(fv) VEC_FN(xload)(const float *p) {
    VEC_FN(fv) v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline __attribute__((always_inline)) void VEC_FN(xstore)(float *p, VEC_FN(fv) v) {
    memcpy(p, &v, sizeof v);
}

#undef VEC_FN
#undef VEC_CAT
#undef VEC_CAT_
