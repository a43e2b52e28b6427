/* Elementwise kernels. Each row is processed in blocks: operands are loaded into FP32 (F64
   for F64) registers-sized buffers, the op's formula from src/math runs over the block with
   the op switch outside the loop (so the loop vectorises), and the result is stored with
   round-to-nearest-even. Contiguous F32 rows skip the buffers. */
#include <string.h>
#include "../math/scalar_ops.h"
#include "cpu.h"

#define BLOCK 256

/* ---- the formulas over arrays, stamped for float and double */
#define DEFINE_ARRAY_KERNELS(T, S)                                                                 \
    static void unary_##S(mt_op_id op, T *restrict o, const T *restrict a, int64_t n, T p) {       \
        switch (op) {                                                                              \
        case MT_OP_NEG:                                                                            \
            for (int64_t i = 0; i < n; i++) o[i] = -a[i];                                          \
            break;                                                                                 \
        case MT_OP_EXP:                                                                            \
            for (int64_t i = 0; i < n; i++) o[i] = mt_exp_##S(a[i]);                               \
            break;                                                                                 \
        case MT_OP_LOG:                                                                            \
            for (int64_t i = 0; i < n; i++) o[i] = mt_log_##S(a[i]);                               \
            break;                                                                                 \
        case MT_OP_SQRT:                                                                           \
            for (int64_t i = 0; i < n; i++) o[i] = mt_sqrt_##S(a[i]);                              \
            break;                                                                                 \
        case MT_OP_RSQRT:                                                                          \
            for (int64_t i = 0; i < n; i++) o[i] = mt_rsqrt_##S(a[i]);                             \
            break;                                                                                 \
        case MT_OP_ABS:                                                                            \
            for (int64_t i = 0; i < n; i++) o[i] = mt_abs_##S(a[i]);                               \
            break;                                                                                 \
        case MT_OP_SIGN:                                                                           \
            for (int64_t i = 0; i < n; i++) o[i] = mt_sign_##S(a[i]);                              \
            break;                                                                                 \
        case MT_OP_RELU:                                                                           \
            for (int64_t i = 0; i < n; i++) o[i] = mt_relu_##S(a[i]);                              \
            break;                                                                                 \
        case MT_OP_GELU:                                                                           \
            for (int64_t i = 0; i < n; i++) o[i] = mt_gelu_##S(a[i]);                              \
            break;                                                                                 \
        case MT_OP_GELU_TANH:                                                                      \
            for (int64_t i = 0; i < n; i++) o[i] = mt_gelu_tanh_##S(a[i]);                         \
            break;                                                                                 \
        case MT_OP_SIGMOID:                                                                        \
            for (int64_t i = 0; i < n; i++) o[i] = mt_sigmoid_##S(a[i]);                           \
            break;                                                                                 \
        case MT_OP_TANH:                                                                           \
            for (int64_t i = 0; i < n; i++) o[i] = mt_tanh_##S(a[i]);                              \
            break;                                                                                 \
        case MT_OP_ADD_SCALAR:                                                                     \
            for (int64_t i = 0; i < n; i++) o[i] = a[i] + p;                                       \
            break;                                                                                 \
        case MT_OP_MUL_SCALAR:                                                                     \
            for (int64_t i = 0; i < n; i++) o[i] = a[i] * p;                                       \
            break;                                                                                 \
        case MT_OP_RSUB_SCALAR:                                                                    \
            for (int64_t i = 0; i < n; i++) o[i] = p - a[i];                                       \
            break;                                                                                 \
        case MT_OP_RDIV_SCALAR:                                                                    \
            for (int64_t i = 0; i < n; i++) o[i] = p / a[i];                                       \
            break;                                                                                 \
        case MT_OP_POW_SCALAR:                                                                     \
            if (p == (T)2)                                                                         \
                for (int64_t i = 0; i < n; i++) o[i] = a[i] * a[i];                                \
            else                                                                                   \
                for (int64_t i = 0; i < n; i++) o[i] = mt_pow_##S(a[i], p);                        \
            break;                                                                                 \
        default:                                                                                   \
            break;                                                                                 \
        }                                                                                          \
    }                                                                                              \
    static void binary_##S(mt_op_id op, T *restrict o, const T *restrict a, const T *restrict b,   \
                           int64_t n) {                                                            \
        switch (op) {                                                                              \
        case MT_OP_ADD:                                                                            \
            for (int64_t i = 0; i < n; i++) o[i] = a[i] + b[i];                                    \
            break;                                                                                 \
        case MT_OP_SUB:                                                                            \
            for (int64_t i = 0; i < n; i++) o[i] = a[i] - b[i];                                    \
            break;                                                                                 \
        case MT_OP_MUL:                                                                            \
            for (int64_t i = 0; i < n; i++) o[i] = a[i] * b[i];                                    \
            break;                                                                                 \
        case MT_OP_DIV:                                                                            \
            for (int64_t i = 0; i < n; i++) o[i] = a[i] / b[i];                                    \
            break;                                                                                 \
        case MT_OP_POW:                                                                            \
            for (int64_t i = 0; i < n; i++) o[i] = mt_pow_##S(a[i], b[i]);                         \
            break;                                                                                 \
        case MT_OP_MAXIMUM:                                                                        \
            for (int64_t i = 0; i < n; i++) o[i] = mt_max2_##S(a[i], b[i]);                        \
            break;                                                                                 \
        case MT_OP_MINIMUM:                                                                        \
            for (int64_t i = 0; i < n; i++) o[i] = mt_min2_##S(a[i], b[i]);                        \
            break;                                                                                 \
        /* backward kernels: a = incoming gradient, b = saved input (x) or output (y) */           \
        case MT_OP_RELU_BACKWARD:                                                                  \
            for (int64_t i = 0; i < n; i++) o[i] = b[i] <= (T)0 ? (T)0 : a[i];                     \
            break;                                                                                 \
        case MT_OP_GELU_BACKWARD:                                                                  \
            for (int64_t i = 0; i < n; i++) o[i] = a[i] * mt_gelu_grad_##S(b[i]);                  \
            break;                                                                                 \
        case MT_OP_GELU_TANH_BACKWARD:                                                             \
            for (int64_t i = 0; i < n; i++) o[i] = a[i] * mt_gelu_tanh_grad_##S(b[i]);             \
            break;                                                                                 \
        case MT_OP_SIGMOID_BACKWARD:                                                               \
            for (int64_t i = 0; i < n; i++) o[i] = a[i] * b[i] * ((T)1 - b[i]);                    \
            break;                                                                                 \
        case MT_OP_TANH_BACKWARD:                                                                  \
            for (int64_t i = 0; i < n; i++) o[i] = a[i] * ((T)1 - b[i] * b[i]);                    \
            break;                                                                                 \
        default:                                                                                   \
            break;                                                                                 \
        }                                                                                          \
    }                                                                                              \
    static void compare_##S(mt_op_id op, uint8_t *restrict o, const T *restrict a,                 \
                            const T *restrict b, int64_t n) {                                      \
        switch (op) {                                                                              \
        case MT_OP_EQ:                                                                             \
            for (int64_t i = 0; i < n; i++) o[i] = a[i] == b[i];                                   \
            break;                                                                                 \
        case MT_OP_NE:                                                                             \
            for (int64_t i = 0; i < n; i++) o[i] = a[i] != b[i];                                   \
            break;                                                                                 \
        case MT_OP_LT:                                                                             \
            for (int64_t i = 0; i < n; i++) o[i] = a[i] < b[i];                                    \
            break;                                                                                 \
        case MT_OP_LE:                                                                             \
            for (int64_t i = 0; i < n; i++) o[i] = a[i] <= b[i];                                   \
            break;                                                                                 \
        case MT_OP_GT:                                                                             \
            for (int64_t i = 0; i < n; i++) o[i] = a[i] > b[i];                                    \
            break;                                                                                 \
        case MT_OP_GE:                                                                             \
            for (int64_t i = 0; i < n; i++) o[i] = a[i] >= b[i];                                   \
            break;                                                                                 \
        default:                                                                                   \
            break;                                                                                 \
        }                                                                                          \
    }

DEFINE_ARRAY_KERNELS(float, f)
DEFINE_ARRAY_KERNELS(double, d)

static bool is_compare(mt_op_id op) {
    return op >= MT_OP_EQ && op <= MT_OP_GE;
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

static void unary_row(char **p, const int64_t *s, int64_t n, void *vctx) {
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
            double x[BLOCK], y[BLOCK];
            mt_cpu_load_f64(p[1] + i * s[1], s[1], c->in, m, x);
            unary_d(c->op, y, x, m, c->p);
            mt_cpu_store_f64(p[0] + i * s[0], s[0], c->out, m, y);
        } else {
            float x[BLOCK], y[BLOCK];
            mt_cpu_load_f32(p[1] + i * s[1], s[1], c->in, m, x);
            unary_f(c->op, y, x, m, (float)c->p);
            mt_cpu_store_f32(p[0] + i * s[0], s[0], c->out, m, y);
        }
    }
}

static int op_cost(mt_op_id op) {
    switch (op) {
    case MT_OP_EXP:
    case MT_OP_LOG:
    case MT_OP_GELU:
    case MT_OP_GELU_TANH:
    case MT_OP_SIGMOID:
    case MT_OP_TANH:
    case MT_OP_POW:
    case MT_OP_POW_SCALAR:
    case MT_OP_GELU_BACKWARD:
    case MT_OP_GELU_TANH_BACKWARD:
        return 8;
    default:
        return 1;
    }
}

/* Small contiguous F32/F64 operands skip the iterator: for tiny tensors its set-up costs
   more than the arithmetic. */
static bool direct(const mt_tensor *out, const mt_tensor *a, const mt_tensor *b, mt_op_id op) {
    return (out->dtype == MT_F32 || out->dtype == MT_F64) && a->dtype == out->dtype &&
           (!b || b->dtype == out->dtype) && out->numel * op_cost(op) < MT_CPU_PARALLEL_MIN &&
           mt_is_contiguous(out) && mt_is_contiguous(a) && (!b || mt_is_contiguous(b));
}

int mt_cpu_unary(mt_op_id op, mt_tensor *out, const mt_tensor *a, double p) {
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
#define INT_COMPARE(T, OP)                                                                         \
    for (int64_t i = 0; i < n; i++)                                                                \
        p[0][i * s[0]] = (char)(*(const T *)(p[1] + i * s[1]) OP * (const T *)(p[2] + i * s[2]));
#define INT_COMPARE_ALL(T)                                                                         \
    switch (op) {                                                                                  \
    case MT_OP_EQ:                                                                                 \
        INT_COMPARE(T, ==) break;                                                                  \
    case MT_OP_NE:                                                                                 \
        INT_COMPARE(T, !=) break;                                                                  \
    case MT_OP_LT:                                                                                 \
        INT_COMPARE(T, <) break;                                                                   \
    case MT_OP_LE:                                                                                 \
        INT_COMPARE(T, <=) break;                                                                  \
    case MT_OP_GT:                                                                                 \
        INT_COMPARE(T, >) break;                                                                   \
    default:                                                                                       \
        INT_COMPARE(T, >=) break;                                                                  \
    }

static void int_compare_row(mt_op_id op, mt_dtype dt, char **p, const int64_t *s, int64_t n) {
    if (dt == MT_I64) {
        INT_COMPARE_ALL(int64_t)
    } else if (dt == MT_I32) {
        INT_COMPARE_ALL(int32_t)
    } else {
        INT_COMPARE_ALL(uint8_t)
    }
}

static void binary_row(char **p, const int64_t *s, int64_t n, void *vctx) {
    const ew_ctx *c = vctx;
    bool cmp = is_compare(c->op);
    if (!cmp && c->in == MT_F32 && s[0] == 4 && s[1] == 4 && s[2] == 4) {
        binary_f(c->op, (float *)p[0], (const float *)p[1], (const float *)p[2], n);
        return;
    }
    if (cmp && !mt_dtype_is_floating(c->in)) {
        int_compare_row(c->op, c->in, p, s, n);
        return;
    }
    for (int64_t i = 0; i < n; i += BLOCK) {
        int64_t m = n - i < BLOCK ? n - i : BLOCK;
        if (wide_dtype(c->in)) {
            double x[BLOCK], y[BLOCK], z[BLOCK];
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
            float x[BLOCK], y[BLOCK], z[BLOCK];
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

int mt_cpu_binary(mt_op_id op, mt_tensor *out, const mt_tensor *a, const mt_tensor *b) {
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

static void where_row(char **p, const int64_t *s, int64_t n, void *vctx) {
    const ew_ctx *c = vctx;
    switch (mt_dtype_size(c->out)) { /* the element size known to the compiler */
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
