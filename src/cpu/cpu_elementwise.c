/* Elementwise kernels. Each row is processed in blocks: operands are loaded into FP32 (F64
   for F64) registers-sized buffers, the op's formula from src/math runs over the block with
   the op switch outside the loop (so the loop vectorises), and the result is stored with
   round-to-nearest-even. Contiguous F32 rows skip the buffers. The switches are generated
   from the formula lists of src/math/elementwise_ops.h, a loop per op. */
/* Loops start on 32-byte boundaries: the tightest ones (neg, relu over a block) run at one
   iteration per cycle only when the loop sits in one 32-byte decode window, and otherwise
   change speed by 20% with any unrelated change to the code before them. */
#pragma GCC optimize("align-loops=32")
#include <string.h>
#include "../math/elementwise_ops.h"
#include "cpu.h"

/* Elements per block of the buffered (converting or strided) path. The buffers are aligned
   to cache lines: a vector store that splits a line runs at half speed, and the stack
   alignment would otherwise depend on the caller's frame. */
#define BLOCK 256

/* ---- the formulas over arrays, stamped for float and double. The lists' expressions name
   x and p (unary), a and b (binary, compare); each case declares them per element, which
   compiles to the same vector loop as indexing the arrays in the expression. elem_t is the
   function's element type (the case macros are expanded inside it). */
#define UNARY_CASE(ID, COST, EXPR)                                                                 \
    case MT_OP_##ID:                                                                               \
        for (int64_t i = 0; i < n; i++) {                                                          \
            elem_t x = pa[i];                                                                      \
            o[i] = (EXPR);                                                                         \
        }                                                                                          \
        break;
#define BINARY_CASE(ID, COST, EXPR)                                                                \
    case MT_OP_##ID:                                                                               \
        for (int64_t i = 0; i < n; i++) {                                                          \
            elem_t a = pa[i], b = pb[i];                                                           \
            o[i] = (EXPR);                                                                         \
        }                                                                                          \
        break;
#define COMPARE_CASE(ID, EXPR)                                                                     \
    case MT_OP_##ID:                                                                               \
        for (int64_t i = 0; i < n; i++) {                                                          \
            elem_t a = pa[i], b = pb[i];                                                           \
            o[i] = (uint8_t)(EXPR);                                                                \
        }                                                                                          \
        break;

/* The array kernels are inlined into each clone of the row functions below (MT_CPU_INLINE). */
#define DEFINE_ARRAY_KERNELS(T, S)                                                                 \
    MT_CPU_INLINE void unary_##S(mt_op_id op, T *restrict o, const T *restrict pa, int64_t n,      \
                                 T p) {                                                            \
        typedef T elem_t;                                                                          \
        /* the formula's p == 2 branch taken once, not per element: the loop then vectorises       \
           without relying on -O3's loop unswitching */                                            \
        if (op == MT_OP_POW_SCALAR && p == (T)2) {                                                 \
            for (int64_t i = 0; i < n; i++) o[i] = pa[i] * pa[i];                                  \
            return;                                                                                \
        }                                                                                          \
        switch (op) {                                                                              \
            MT_UNARY_FORMULAS(UNARY_CASE, T, S)                                                    \
        default:                                                                                   \
            break;                                                                                 \
        }                                                                                          \
    }                                                                                              \
    MT_CPU_INLINE void binary_##S(mt_op_id op, T *restrict o, const T *restrict pa,                \
                                  const T *restrict pb, int64_t n) {                               \
        typedef T elem_t;                                                                          \
        switch (op) {                                                                              \
            MT_BINARY_FORMULAS(BINARY_CASE, T, S)                                                  \
        default:                                                                                   \
            break;                                                                                 \
        }                                                                                          \
    }                                                                                              \
    MT_CPU_INLINE void compare_##S(mt_op_id op, uint8_t *restrict o, const T *restrict pa,         \
                                   const T *restrict pb, int64_t n) {                              \
        typedef T elem_t;                                                                          \
        switch (op) {                                                                              \
            MT_COMPARE_FORMULAS(COMPARE_CASE)                                                      \
        default:                                                                                   \
            break;                                                                                 \
        }                                                                                          \
    }

DEFINE_ARRAY_KERNELS(float, f)
DEFINE_ARRAY_KERNELS(double, d)

#define COMPARE_ID(ID, EXPR) case MT_OP_##ID:
static bool is_compare(mt_op_id op) {
    switch (op) {
        MT_COMPARE_FORMULAS(COMPARE_ID)
        return true;
    default:
        return false;
    }
}

/* Compute in double for F64 and for integer inputs (comparisons of I64 labels). */
static bool wide_dtype(mt_dtype dt) {
    return dt == MT_F64 || dt == MT_I64 || dt == MT_I32;
}

typedef struct {
    mt_op_id op;
    mt_dtype out, in;
    double p;
} ew_ctx;

MT_CPU_CLONES static void unary_row(char **p, const int64_t *s, int64_t n, void *vctx) {
    const ew_ctx *c = vctx;
    if (c->in == MT_F32 && s[0] == 4 && s[1] == 4) {
        unary_f(c->op, (float *)p[0], (const float *)p[1], n, (float)c->p);
        return;
    }
    if (c->in == MT_F64 && s[0] == 8 && s[1] == 8) {
        unary_d(c->op, (double *)p[0], (const double *)p[1], n, c->p);
        return;
    }
    for (int64_t i = 0; i < n; i += BLOCK) {
        int64_t m = n - i < BLOCK ? n - i : BLOCK;
        if (wide_dtype(c->in)) {
            _Alignas(64) double x[BLOCK], y[BLOCK];
            mt_cpu_load_f64(p[1] + i * s[1], s[1], c->in, m, x);
            unary_d(c->op, y, x, m, c->p);
            mt_cpu_store_f64(p[0] + i * s[0], s[0], c->out, m, y);
        } else {
            _Alignas(64) float x[BLOCK], y[BLOCK];
            mt_cpu_load_f32(p[1] + i * s[1], s[1], c->in, m, x);
            unary_f(c->op, y, x, m, (float)c->p);
            mt_cpu_store_f32(p[0] + i * s[0], s[0], c->out, m, y);
        }
    }
}

#define COST_CASE(ID, COST, EXPR)                                                                  \
    case MT_OP_##ID:                                                                               \
        return COST;
static int op_cost(mt_op_id op) {
    switch (op) {
        MT_UNARY_FORMULAS(COST_CASE, float, f)
        MT_BINARY_FORMULAS(COST_CASE, float, f)
    default:
        return 1;
    }
}

/* Small contiguous F32/F64 operands skip the iterator: for tiny tensors its set-up costs
   more than the arithmetic. The entry points are cloned too, so that this direct path runs
   the array kernels with this CPU's vector and FMA instructions (in baseline code src/math's
   fmaf is a libm call); the backend table holds the resolved clone, so the call costs
   nothing extra. */
static bool direct(const mt_tensor *out, const mt_tensor *a, const mt_tensor *b, mt_op_id op) {
    return (out->dtype == MT_F32 || out->dtype == MT_F64) && a->dtype == out->dtype &&
           (!b || b->dtype == out->dtype) && out->numel * op_cost(op) < MT_CPU_PARALLEL_MIN &&
           mt_is_contiguous(out) && mt_is_contiguous(a) && (!b || mt_is_contiguous(b));
}

MT_CPU_CLONES int mt_cpu_unary(mt_op_id op, mt_tensor *out, const mt_tensor *a, double p) {
    if (direct(out, a, NULL, op)) {
        if (out->dtype == MT_F32)
            unary_f(op, mt_tensor_data(out), mt_tensor_data(a), out->numel, (float)p);
        else
            unary_d(op, mt_tensor_data(out), mt_tensor_data(a), out->numel, p);
        return 0;
    }
    const mt_tensor *ops[2] = {out, a};
    mt_cpu_iter it;
    mt_cpu_iter_init(&it, 2, ops);
    ew_ctx c = {op, out->dtype, a->dtype, p};
    mt_cpu_iter_run(&it, unary_row, &c, op_cost(op));
    return 0;
}

/* Integer comparisons compare the integers themselves (through double, int64 values past
   2^53 would compare equal to their neighbours). */
#define INT_COMPARE_CASE(ID, EXPR)                                                                 \
    case MT_OP_##ID:                                                                               \
        for (int64_t i = 0; i < n; i++) {                                                          \
            elem_t a = *(const elem_t *)(p[1] + i * s[1]), b = *(const elem_t *)(p[2] + i * s[2]); \
            p[0][i * s[0]] = (char)(EXPR);                                                         \
        }                                                                                          \
        break;
#define DEFINE_INT_COMPARE(T, NAME)                                                                \
    static void NAME(mt_op_id op, char **p, const int64_t *s, int64_t n) {                         \
        typedef T elem_t;                                                                          \
        switch (op) {                                                                              \
            MT_COMPARE_FORMULAS(INT_COMPARE_CASE)                                                  \
        default:                                                                                   \
            break;                                                                                 \
        }                                                                                          \
    }
DEFINE_INT_COMPARE(int64_t, int_compare_i64)
DEFINE_INT_COMPARE(int32_t, int_compare_i32)
DEFINE_INT_COMPARE(uint8_t, int_compare_u8)

static void int_compare_row(mt_op_id op, mt_dtype dt, char **p, const int64_t *s, int64_t n) {
    if (dt == MT_I64)
        int_compare_i64(op, p, s, n);
    else if (dt == MT_I32)
        int_compare_i32(op, p, s, n);
    else
        int_compare_u8(op, p, s, n);
}

MT_CPU_CLONES static void binary_row(char **p, const int64_t *s, int64_t n, void *vctx) {
    const ew_ctx *c = vctx;
    bool cmp = is_compare(c->op);
    if (!cmp && c->in == MT_F32 && s[0] == 4 && s[1] == 4 && s[2] == 4) {
        binary_f(c->op, (float *)p[0], (const float *)p[1], (const float *)p[2], n);
        return;
    }
    if (!cmp && c->in == MT_F64 && s[0] == 8 && s[1] == 8 && s[2] == 8) {
        binary_d(c->op, (double *)p[0], (const double *)p[1], (const double *)p[2], n);
        return;
    }
    if (cmp && !mt_dtype_is_floating(c->in)) {
        int_compare_row(c->op, c->in, p, s, n);
        return;
    }
    for (int64_t i = 0; i < n; i += BLOCK) {
        int64_t m = n - i < BLOCK ? n - i : BLOCK;
        if (wide_dtype(c->in)) {
            _Alignas(64) double x[BLOCK], y[BLOCK], z[BLOCK];
            mt_cpu_load_f64(p[1] + i * s[1], s[1], c->in, m, x);
            mt_cpu_load_f64(p[2] + i * s[2], s[2], c->in, m, y);
            if (cmp) {
                uint8_t r[BLOCK];
                compare_d(c->op, r, x, y, m);
                for (int64_t j = 0; j < m; j++) p[0][(i + j) * s[0]] = (char)r[j];
            } else {
                binary_d(c->op, z, x, y, m);
                mt_cpu_store_f64(p[0] + i * s[0], s[0], c->out, m, z);
            }
        } else {
            _Alignas(64) float x[BLOCK], y[BLOCK], z[BLOCK];
            mt_cpu_load_f32(p[1] + i * s[1], s[1], c->in, m, x);
            mt_cpu_load_f32(p[2] + i * s[2], s[2], c->in, m, y);
            if (cmp) {
                uint8_t r[BLOCK];
                compare_f(c->op, r, x, y, m);
                for (int64_t j = 0; j < m; j++) p[0][(i + j) * s[0]] = (char)r[j];
            } else {
                binary_f(c->op, z, x, y, m);
                mt_cpu_store_f32(p[0] + i * s[0], s[0], c->out, m, z);
            }
        }
    }
}

MT_CPU_CLONES int mt_cpu_binary(mt_op_id op, mt_tensor *out, const mt_tensor *a,
                                const mt_tensor *b) {
    if (direct(out, a, b, op)) { /* comparisons write BOOL, so they never get here */
        if (out->dtype == MT_F32)
            binary_f(op, mt_tensor_data(out), mt_tensor_data(a), mt_tensor_data(b), out->numel);
        else
            binary_d(op, mt_tensor_data(out), mt_tensor_data(a), mt_tensor_data(b), out->numel);
        return 0;
    }
    const mt_tensor *ops[3] = {out, a, b};
    mt_cpu_iter it;
    mt_cpu_iter_init(&it, 3, ops);
    ew_ctx c = {op, out->dtype, a->dtype, 0};
    mt_cpu_iter_run(&it, binary_row, &c, op_cost(op));
    return 0;
}

#define WHERE_LOOP(T)                                                                              \
    for (int64_t i = 0; i < n; i++)                                                                \
        *(T *)(p[0] + i * s[0]) =                                                                  \
            p[1][i * s[1]] ? *(const T *)(p[2] + i * s[2]) : *(const T *)(p[3] + i * s[3]);

MT_CPU_CLONES static void where_row(char **p, const int64_t *s, int64_t n, void *vctx) {
    const ew_ctx *c = vctx;
    switch (mt_dtype_size(c->out)) { /* the element size known to the compiler */
    case 1:
        WHERE_LOOP(uint8_t) break;
    case 2:
        WHERE_LOOP(uint16_t) break;
    case 4:
        WHERE_LOOP(uint32_t) break;
    default:
        WHERE_LOOP(uint64_t) break;
    }
}

int mt_cpu_where(mt_tensor *out, const mt_tensor *cond, const mt_tensor *a, const mt_tensor *b) {
    const mt_tensor *ops[4] = {out, cond, a, b};
    mt_cpu_iter it;
    mt_cpu_iter_init(&it, 4, ops);
    ew_ctx c = {MT_OP_WHERE, out->dtype, a->dtype, 0};
    mt_cpu_iter_run(&it, where_row, &c, 1);
    return 0;
}
