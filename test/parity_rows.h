/* The op table of the device parity test (test_parity.c): the vocabulary of a row (input
   domains, dtypes, tolerances, gradient modes), one wrapper per public op and one row per op
   variant. Included by test_parity.c only; kept apart because it is data, not the harness. */
#ifndef MT_TEST_PARITY_ROWS_H
#define MT_TEST_PARITY_ROWS_H

#include "test_util.h"

/* ------------------------------------------------------------------ the table's vocabulary */

#define MAX_IN  4
#define BIT(dt) (1u << (dt))
#define FLOATS  (BIT(MT_F32) | BIT(MT_F64) | BIT(MT_F16) | BIT(MT_BF16))
#define INTS    (BIT(MT_I64) | BIT(MT_I32))
#define ALL_DT  (FLOATS | INTS | BIT(MT_BOOL))

/* How an input in the row's dtype is laid out: the op sees the same logical shape and values
   in each, but the memory under it differs. */
enum {
    L_CONTIGUOUS, /* dense, row-major */
    L_TRANSPOSED, /* last two dims swapped in memory (a transpose view of a dense base) */
    L_BROADCAST,  /* dim 0 expanded from size 1 (stride 0) */
    L_SLICED,     /* every other row of a taller base (slice with step 2, offset 1) */
    L_NONFINITE,  /* dense, with +inf, NaN and -inf among the floating values (see
                     test_parity.c's poison): both devices must give the same non-finite
                     results, as torch's semantics fix them */
    L_COUNT
};
static const char *const layout_names[L_COUNT] = {"contiguous", "transposed", "broadcast", "sliced",
                                                  "non-finite values"};

/* Input values. Data is made once on the CPU in F64, rounded to the input's dtype there, and
   copied to the device, so both devices see identical bits. */
typedef enum {
    DOM_ANY,          /* uniform in [-2, 2) */
    DOM_POS,          /* uniform in [0.25, 2.25): log, sqrt, rsqrt, pow bases, divisors */
    DOM_GRID,         /* {-2, -1.5, ..., 2}: many ties, for comparisons and max */
    DOM_CAST,         /* rounding ties, signed zeros, subnormals and overflow of F16/BF16/F32 */
    DOM_CAST_INT,     /* fractions and negatives within +-30000: float -> integer conversions */
    DOM_LABEL,        /* class labels in [0, hi) for cross entropy */
    DOM_LABEL_IGNORE, /* the same with every third label -100 (torch's default ignore_index) */
    DOM_COND,         /* 0/1, for where's condition */
} domain;

typedef struct {
    int ndim;
    int64_t shape[4];
    domain dom;
    int fixed;   /* 0: the row's dtype (and the row's layout); else 1 + a fixed dtype, always
                    contiguous (labels, conditions, the other operand of a promotion) */
    int64_t hi;  /* DOM_LABEL*: the number of classes */
    bool finite; /* stays finite under L_NONFINITE */
} input_spec;

#define NDIMS(...) ((int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)))
#define IN(dom_, ...)                                                                              \
    { .ndim = NDIMS(__VA_ARGS__), .shape = {__VA_ARGS__}, .dom = (dom_) }
/* An input that L_NONFINITE leaves finite (a convolution's weights: see the conv rows). */
#define IN_FINITE(dom_, ...)                                                                       \
    { .ndim = NDIMS(__VA_ARGS__), .shape = {__VA_ARGS__}, .dom = (dom_), .finite = true }
#define IN_AS(dt, dom_, ...)                                                                       \
    { .ndim = NDIMS(__VA_ARGS__), .shape = {__VA_ARGS__}, .dom = (dom_), .fixed = 1 + (dt) }
#define LABELS(dom_, n, classes)                                                                   \
    { .ndim = 1, .shape = {n}, .dom = (dom_), .fixed = 1 + MT_I64, .hi = (classes) }

typedef enum {
    TOL_EXACT,    /* bit-identical */
    TOL_ELEMWISE, /* relative per element (one ulp for F16/BF16) */
    TOL_NORMED,   /* max|a - b| / max(1, max|ref|) */
} tol_class;

typedef struct op_row op_row;
typedef mt_tensor *(*op_fn)(const op_row *r, mt_tensor *const *in);

struct op_row {
    const char *name;
    op_fn fn;
    unsigned dtypes; /* BIT(dt) for each row dtype tried */
    tol_class tol;
    bool grad; /* differentiable: backward is compared for F32/F64 inputs */
    input_spec in[MAX_IN];
    /* the op's other arguments, as its wrapper uses them */
    double s;
    int dim, ndims, dims[4];
    bool keepdim;
    mt_dtype to;
    int64_t ignore;
};

/* ------------------------------------------------------------------ op wrappers */

#define W_BINARY(f)                                                                                \
    static mt_tensor *w_##f(const op_row *r, mt_tensor *const *in) {                               \
        (void)r;                                                                                   \
        return mt_##f(in[0], in[1]);                                                               \
    }
#define W_UNARY(f)                                                                                 \
    static mt_tensor *w_##f(const op_row *r, mt_tensor *const *in) {                               \
        (void)r;                                                                                   \
        return mt_##f(in[0]);                                                                      \
    }
#define W_SCALAR(f)                                                                                \
    static mt_tensor *w_##f(const op_row *r, mt_tensor *const *in) {                               \
        return mt_##f(in[0], r->s);                                                                \
    }
#define W_REDUCE(f)                                                                                \
    static mt_tensor *w_##f(const op_row *r, mt_tensor *const *in) {                               \
        return mt_##f(in[0], r->ndims, r->dims, r->keepdim);                                       \
    }
#define W_DIM(f)                                                                                   \
    static mt_tensor *w_##f(const op_row *r, mt_tensor *const *in) {                               \
        return mt_##f(in[0], r->dim);                                                              \
    }

W_BINARY(add)
W_BINARY(sub)
W_BINARY(mul)
W_BINARY(div)
W_BINARY(pow)
W_BINARY(maximum)
W_BINARY(minimum)
W_BINARY(eq)
W_BINARY(ne)
W_BINARY(lt)
W_BINARY(le)
W_BINARY(gt)
W_BINARY(ge)
W_BINARY(matmul)
W_BINARY(mse_loss)
W_BINARY(cross_entropy)
W_SCALAR(add_scalar)
W_SCALAR(mul_scalar)
W_SCALAR(pow_scalar)
W_SCALAR(rsub_scalar)
W_SCALAR(rdiv_scalar)
W_UNARY(neg)
W_UNARY(exp)
W_UNARY(log)
W_UNARY(sqrt)
W_UNARY(rsqrt)
W_UNARY(abs)
W_UNARY(relu)
W_UNARY(gelu)
W_UNARY(gelu_tanh)
W_UNARY(sigmoid)
W_UNARY(tanh)
W_UNARY(sum_all)
W_UNARY(mean_all)
W_UNARY(max_all)
W_UNARY(clone)
W_UNARY(flatten)
W_REDUCE(sum)
W_REDUCE(mean)
W_REDUCE(max)
W_DIM(softmax)
W_DIM(log_softmax)

static mt_tensor *w_where(const op_row *r, mt_tensor *const *in) {
    (void)r;
    return mt_where(in[0], in[1], in[2]);
}
static mt_tensor *w_linear(const op_row *r, mt_tensor *const *in) {
    (void)r;
    return mt_linear(in[0], in[1], in[2]); /* in[2] is NULL for a row with two inputs */
}
/* the fused linear, one wrapper per activation (relu reads its output in backward, the gelus
   their pre-activation) */
static mt_tensor *w_linear_relu(const op_row *r, mt_tensor *const *in) {
    (void)r;
    return mt_linear_act(in[0], in[1], in[2], MT_ACT_RELU);
}
static mt_tensor *w_linear_gelu(const op_row *r, mt_tensor *const *in) {
    (void)r;
    return mt_linear_act(in[0], in[1], in[2], MT_ACT_GELU);
}
static mt_tensor *w_linear_gelu_tanh(const op_row *r, mt_tensor *const *in) {
    (void)r;
    return mt_linear_act(in[0], in[1], in[2], MT_ACT_GELU_TANH);
}
static mt_tensor *w_cross_entropy_ex(const op_row *r, mt_tensor *const *in) {
    return mt_cross_entropy_ex(in[0], in[1], r->ignore);
}
static int n_inputs(const op_row *r);
static mt_tensor *w_cat(const op_row *r, mt_tensor *const *in) {
    return mt_cat(in, n_inputs(r), r->dim);
}
static mt_tensor *w_stack(const op_row *r, mt_tensor *const *in) {
    return mt_stack(in, n_inputs(r), r->dim);
}
static mt_tensor *w_cast(const op_row *r, mt_tensor *const *in) {
    return mt_cast(in[0], r->to);
}
/* Views, made dense again: the copy kernels must read every layout the same way. Every
   intermediate belongs to the case's scope. */
static mt_tensor *w_transpose(const op_row *r, mt_tensor *const *in) {
    (void)r;
    return mt_contiguous(mt_transpose(in[0], 0, 1));
}
static mt_tensor *w_permute(const op_row *r, mt_tensor *const *in) {
    (void)r;
    return mt_contiguous(mt_permute(in[0], MT_DIMS(2, 0, 1)));
}
static mt_tensor *w_slice(const op_row *r, mt_tensor *const *in) {
    (void)r;
    return mt_contiguous(mt_slice(in[0], 1, 1, 7, 2));
}
static mt_tensor *w_narrow(const op_row *r, mt_tensor *const *in) {
    (void)r;
    return mt_contiguous(mt_narrow(in[0], 1, 2, 3));
}
static mt_tensor *w_expand(const op_row *r, mt_tensor *const *in) {
    (void)r;
    return mt_contiguous(mt_expand(in[0], MT_SHAPE(-1, 5)));
}
static mt_tensor *w_unsqueeze(const op_row *r, mt_tensor *const *in) {
    (void)r;
    return mt_contiguous(mt_unsqueeze(in[0], 1));
}
static mt_tensor *w_squeeze(const op_row *r, mt_tensor *const *in) {
    (void)r;
    return mt_contiguous(mt_squeeze(in[0], 1));
}
static mt_tensor *w_reshape(const op_row *r, mt_tensor *const *in) {
    (void)r;
    return mt_contiguous(mt_reshape(in[0], MT_SHAPE(3, -1)));
}

/* normalisation, dropout and indexing (issue 9) */
static mt_tensor *w_layer_norm(const op_row *r, mt_tensor *const *in) {
    return mt_layer_norm(in[0], r->ndims, in[1], in[2], 1e-5);
}
static mt_tensor *w_batch_norm_train(const op_row *r, mt_tensor *const *in) {
    (void)r;
    return mt_batch_norm(in[0], NULL, NULL, in[1], in[2], true, 0.1, 1e-5);
}
static mt_tensor *w_batch_norm_eval(const op_row *r, mt_tensor *const *in) {
    (void)r;
    return mt_batch_norm(in[0], in[1], in[2], NULL, NULL, false, 0.1, 1e-5);
}
static mt_tensor *w_batch_norm_add_relu(const op_row *r, mt_tensor *const *in) {
    (void)r;
    return mt_batch_norm_act(in[0], NULL, NULL, in[1], in[2], in[3], true, 0.1, 1e-5, MT_ACT_RELU);
}
/* the same seed on both devices: the same Philox stream, so the same mask */
static mt_tensor *w_dropout(const op_row *r, mt_tensor *const *in) {
    mt_manual_seed(77);
    return mt_dropout(in[0], r->s, true);
}
static mt_tensor *w_index_select(const op_row *r, mt_tensor *const *in) {
    return mt_index_select(in[0], r->dim, in[1]);
}
static mt_tensor *w_gather(const op_row *r, mt_tensor *const *in) {
    return mt_gather(in[0], r->dim, in[1]);
}
static mt_tensor *w_embedding(const op_row *r, mt_tensor *const *in) {
    (void)r;
    return mt_embedding(in[0], in[1]);
}
/* convolution: cuDNN on CUDA, oneDNN (or F64 loops) on the CPU */
static mt_tensor *w_conv2d(const op_row *r, mt_tensor *const *in) {
    (void)r;
    mt_conv2d_opts o = {.stride = {2, 1}, .padding = {1, 1}, .dilation = {1, 2}, .groups = 2};
    return mt_conv2d(in[0], in[1], in[2], &o);
}
static mt_tensor *w_conv2d_depthwise(const op_row *r, mt_tensor *const *in) {
    (void)r;
    mt_conv2d_opts o = {.padding = {1, 1}, .groups = 4};
    return mt_conv2d(in[0], in[1], in[2], &o);
}
/* pooling: the same window rules on both devices */
static mt_tensor *w_max_pool2d(const op_row *r, mt_tensor *const *in) {
    (void)r;
    mt_pool2d_opts o = {.kernel = {3, 2}, .stride = {2, 2}, .padding = {1, 1}, .ceil_mode = true};
    return mt_max_pool2d(in[0], &o);
}
static mt_tensor *w_avg_pool2d(const op_row *r, mt_tensor *const *in) {
    mt_pool2d_opts o = {.kernel = {3, 3},
                        .stride = {2, 2},
                        .padding = {1, 1},
                        .ceil_mode = true,
                        .exclude_pad = r->keepdim};
    return mt_avg_pool2d(in[0], &o);
}
static mt_tensor *w_adaptive_avg_pool2d(const op_row *r, mt_tensor *const *in) {
    (void)r;
    return mt_adaptive_avg_pool2d(in[0], 3, 4);
}
static mt_tensor *w_argmax(const op_row *r, mt_tensor *const *in) {
    return mt_argmax(in[0], r->dim, r->keepdim);
}

/* ------------------------------------------------------------------ the table */

#define ROW(name_, fn_, dtypes_, tol_, grad_, ...)                                                 \
    {                                                                                              \
        .name = (name_), .fn = (fn_), .dtypes = (dtypes_), .tol = (tol_), .grad = (grad_),         \
        __VA_ARGS__                                                                                \
    }

#define INDICES(hi_, ...)                                                                          \
    {                                                                                              \
        .ndim = NDIMS(__VA_ARGS__), .shape = {__VA_ARGS__}, .dom = DOM_LABEL, .fixed = 1 + MT_I64, \
        .hi = (hi_)                                                                                \
    }

/* clang-format off */
static const op_row rows[] = {
    /* normalisation: sums over rows and channels, in a different order on each device */
    ROW("layer_norm [6,37] over the last dim", w_layer_norm, BIT(MT_F32) | BIT(MT_F64), TOL_NORMED,
        true, .in = {IN(DOM_ANY, 6, 37), IN(DOM_ANY, 37), IN(DOM_ANY, 37)}, .ndims = 1),
    ROW("layer_norm [4,3,300] over the last two dims", w_layer_norm, BIT(MT_F32) | BIT(MT_F64),
        TOL_NORMED, true, .in = {IN(DOM_ANY, 4, 3, 300), IN(DOM_ANY, 3, 300), IN(DOM_ANY, 3, 300)},
        .ndims = 2),
    ROW("layer_norm [6,37] (low activation, f32 parameters)", w_layer_norm,
        BIT(MT_F16) | BIT(MT_BF16), TOL_NORMED, false,
        .in = {IN(DOM_ANY, 6, 37), IN_AS(MT_F32, DOM_ANY, 37), IN_AS(MT_F32, DOM_ANY, 37)},
        .ndims = 1),
    ROW("batch_norm training [4,3,5,7]", w_batch_norm_train, BIT(MT_F32), TOL_NORMED, true,
        .in = {IN(DOM_ANY, 4, 3, 5, 7), IN_AS(MT_F32, DOM_ANY, 3), IN_AS(MT_F32, DOM_ANY, 3)}),
    ROW("batch_norm training [8,5] (low activation)", w_batch_norm_train,
        BIT(MT_F16) | BIT(MT_BF16), TOL_NORMED, false,
        .in = {IN(DOM_ANY, 8, 5), IN_AS(MT_F32, DOM_ANY, 5), IN_AS(MT_F32, DOM_ANY, 5)}),
    ROW("batch_norm eval [4,3,5]", w_batch_norm_eval, BIT(MT_F32) | BIT(MT_F16) | BIT(MT_BF16),
        TOL_NORMED, false,
        .in = {IN(DOM_ANY, 4, 3, 5), IN_AS(MT_F32, DOM_ANY, 3), IN_AS(MT_F32, DOM_POS, 3)}),
    ROW("batch_norm_act relu(bn(x) + residual) [4,3,6]", w_batch_norm_add_relu, BIT(MT_F32),
        TOL_NORMED, true,
        .in = {IN(DOM_ANY, 4, 3, 6), IN_AS(MT_F32, DOM_ANY, 3), IN_AS(MT_F32, DOM_ANY, 3),
               IN(DOM_ANY, 4, 3, 6)}),
    /* convolution: sums in a different order on each device. The weights stay finite under
       L_NONFINITE: a NaN or inf weight on a tap that falls in the padding gives NaN where the
       implementation multiplies the padding's zeros (im2col, the CPU here) and nothing where
       it skips the tap (the fake cuDNN), and convolution libraries differ on that */
    ROW("conv2d [2,4,7,6] * [6,2,3,3] + b, stride 2x1, pad 1, dilation 1x2, groups 2", w_conv2d,
        FLOATS, TOL_NORMED, true,
        .in = {IN(DOM_ANY, 2, 4, 7, 6), IN_FINITE(DOM_ANY, 6, 2, 3, 3), IN(DOM_ANY, 6)}),
    ROW("conv2d depthwise [2,4,5,5] * [4,1,3,3] + b, pad 1", w_conv2d_depthwise, FLOATS,
        TOL_NORMED, true,
        .in = {IN(DOM_ANY, 2, 4, 5, 5), IN_FINITE(DOM_ANY, 4, 1, 3, 3), IN(DOM_ANY, 4)}),
    ROW("max_pool2d 3x2 stride 2 pad 1 ceil_mode (ties)", w_max_pool2d, FLOATS, TOL_EXACT, true,
        .in = {IN(DOM_GRID, 2, 3, 8, 7)}),
    ROW("avg_pool2d 3x3 stride 2 pad 1 ceil_mode count_include_pad", w_avg_pool2d, FLOATS,
        TOL_NORMED, true, .in = {IN(DOM_ANY, 2, 3, 8, 7)}),
    ROW("avg_pool2d 3x3 stride 2 pad 1 ceil_mode exclude_pad", w_avg_pool2d, FLOATS, TOL_NORMED,
        true, .in = {IN(DOM_ANY, 2, 3, 8, 7)}, .keepdim = true),
    ROW("adaptive_avg_pool2d [2,3,7,9] -> 3x4 (uneven windows)", w_adaptive_avg_pool2d, FLOATS,
        TOL_NORMED, true, .in = {IN(DOM_ANY, 2, 3, 7, 9)}),
    /* dropout: the mask is a function of (seed, offset, index) on both devices */
    ROW("dropout p 0.3", w_dropout, FLOATS, TOL_EXACT, true, .in = {IN(DOM_ANY, 7, 33)}, .s = 0.3),
    /* indexing: copies and fixed-order sums, the same bits on both devices */
    ROW("index_select dim 0", w_index_select, FLOATS, TOL_EXACT, true,
        .in = {IN(DOM_ANY, 6, 5), INDICES(6, 9)}, .dim = 0),
    ROW("index_select dim 1", w_index_select, FLOATS, TOL_EXACT, true,
        .in = {IN(DOM_ANY, 4, 6, 3), INDICES(6, 8)}, .dim = 1),
    ROW("gather dim 1", w_gather, FLOATS, TOL_EXACT, true,
        .in = {IN(DOM_ANY, 4, 6), INDICES(6, 4, 9)}, .dim = 1),
    ROW("gather dim 0 (index smaller than x)", w_gather, FLOATS, TOL_EXACT, true,
        .in = {IN(DOM_ANY, 5, 6), INDICES(5, 3, 4)}, .dim = 0),
    ROW("embedding", w_embedding, FLOATS, TOL_EXACT, true,
        .in = {IN(DOM_ANY, 10, 7), INDICES(10, 3, 5)}),
    ROW("argmax dim 1 (ties)", w_argmax, FLOATS, TOL_EXACT, false,
        .in = {IN(DOM_GRID, 4, 9, 3)}, .dim = 1),
    ROW("argmax dim -1 keepdim", w_argmax, FLOATS, TOL_EXACT, false,
        .in = {IN(DOM_ANY, 5, 11)}, .dim = -1, .keepdim = true),
    /* binary elementwise (differentiable in both inputs) */
    ROW("add", w_add, FLOATS, TOL_ELEMWISE, true, .in = {IN(DOM_ANY, 5, 6), IN(DOM_ANY, 5, 6)}),
    ROW("sub", w_sub, FLOATS, TOL_ELEMWISE, true, .in = {IN(DOM_ANY, 5, 6), IN(DOM_ANY, 5, 6)}),
    ROW("mul", w_mul, FLOATS, TOL_ELEMWISE, true, .in = {IN(DOM_ANY, 5, 6), IN(DOM_ANY, 5, 6)}),
    ROW("div", w_div, FLOATS, TOL_ELEMWISE, true, .in = {IN(DOM_ANY, 5, 6), IN(DOM_POS, 5, 6)}),
    ROW("pow", w_pow, FLOATS, TOL_ELEMWISE, true, .in = {IN(DOM_POS, 5, 6), IN(DOM_ANY, 5, 6)}),
    ROW("maximum", w_maximum, FLOATS, TOL_EXACT, true,
        .in = {IN(DOM_GRID, 5, 6), IN(DOM_GRID, 5, 6)}),
    ROW("minimum", w_minimum, FLOATS, TOL_EXACT, true,
        .in = {IN(DOM_GRID, 5, 6), IN(DOM_GRID, 5, 6)}),
    ROW("add (numpy broadcast [4,1,5] + [3,5])", w_add, FLOATS, TOL_ELEMWISE, true,
        .in = {IN(DOM_ANY, 4, 1, 5), IN(DOM_ANY, 3, 5)}),
    ROW("mul (numpy broadcast [5,6] * [6])", w_mul, FLOATS, TOL_ELEMWISE, true,
        .in = {IN(DOM_ANY, 5, 6), IN(DOM_ANY, 6)}),
    ROW("div (promoted: row dtype / f32)", w_div, FLOATS, TOL_ELEMWISE, true,
        .in = {IN(DOM_ANY, 5, 6), IN_AS(MT_F32, DOM_POS, 5, 6)}),
    /* tensor-scalar */
    ROW("add_scalar 0.75", w_add_scalar, FLOATS, TOL_ELEMWISE, true,
        .in = {IN(DOM_ANY, 5, 6)}, .s = 0.75),
    ROW("mul_scalar -1.5", w_mul_scalar, FLOATS, TOL_ELEMWISE, true,
        .in = {IN(DOM_ANY, 5, 6)}, .s = -1.5),
    ROW("pow_scalar 2", w_pow_scalar, FLOATS, TOL_ELEMWISE, true,
        .in = {IN(DOM_ANY, 5, 6)}, .s = 2),
    ROW("pow_scalar 3", w_pow_scalar, FLOATS, TOL_ELEMWISE, true,
        .in = {IN(DOM_ANY, 5, 6)}, .s = 3),
    ROW("pow_scalar 0.5", w_pow_scalar, FLOATS, TOL_ELEMWISE, true,
        .in = {IN(DOM_POS, 5, 6)}, .s = 0.5),
    ROW("pow_scalar -1.5", w_pow_scalar, FLOATS, TOL_ELEMWISE, true,
        .in = {IN(DOM_POS, 5, 6)}, .s = -1.5),
    ROW("rsub_scalar 2", w_rsub_scalar, FLOATS, TOL_ELEMWISE, true,
        .in = {IN(DOM_ANY, 5, 6)}, .s = 2),
    ROW("rdiv_scalar 1.5", w_rdiv_scalar, FLOATS, TOL_ELEMWISE, true,
        .in = {IN(DOM_POS, 5, 6)}, .s = 1.5),
    /* unary */
    ROW("neg", w_neg, FLOATS, TOL_ELEMWISE, true, .in = {IN(DOM_ANY, 3, 4, 5)}),
    ROW("exp", w_exp, FLOATS, TOL_ELEMWISE, true, .in = {IN(DOM_ANY, 3, 4, 5)}),
    ROW("log", w_log, FLOATS, TOL_ELEMWISE, true, .in = {IN(DOM_POS, 3, 4, 5)}),
    ROW("sqrt", w_sqrt, FLOATS, TOL_ELEMWISE, true, .in = {IN(DOM_POS, 3, 4, 5)}),
    ROW("rsqrt", w_rsqrt, FLOATS, TOL_ELEMWISE, true, .in = {IN(DOM_POS, 3, 4, 5)}),
    ROW("abs", w_abs, FLOATS, TOL_ELEMWISE, true, .in = {IN(DOM_ANY, 3, 4, 5)}),
    ROW("relu", w_relu, FLOATS, TOL_ELEMWISE, true, .in = {IN(DOM_ANY, 3, 4, 5)}),
    ROW("gelu", w_gelu, FLOATS, TOL_ELEMWISE, true, .in = {IN(DOM_ANY, 3, 4, 5)}),
    ROW("gelu_tanh", w_gelu_tanh, FLOATS, TOL_ELEMWISE, true, .in = {IN(DOM_ANY, 3, 4, 5)}),
    ROW("sigmoid", w_sigmoid, FLOATS, TOL_ELEMWISE, true, .in = {IN(DOM_ANY, 3, 4, 5)}),
    ROW("tanh", w_tanh, FLOATS, TOL_ELEMWISE, true, .in = {IN(DOM_ANY, 3, 4, 5)}),
    /* comparisons (BOOL out, with ties) and where */
    ROW("eq", w_eq, ALL_DT, TOL_EXACT, false, .in = {IN(DOM_GRID, 5, 6), IN(DOM_GRID, 5, 6)}),
    ROW("ne", w_ne, ALL_DT, TOL_EXACT, false, .in = {IN(DOM_GRID, 5, 6), IN(DOM_GRID, 5, 6)}),
    ROW("lt", w_lt, ALL_DT, TOL_EXACT, false, .in = {IN(DOM_GRID, 5, 6), IN(DOM_GRID, 5, 6)}),
    ROW("le", w_le, ALL_DT, TOL_EXACT, false, .in = {IN(DOM_GRID, 5, 6), IN(DOM_GRID, 5, 6)}),
    ROW("gt", w_gt, ALL_DT, TOL_EXACT, false, .in = {IN(DOM_GRID, 5, 6), IN(DOM_GRID, 5, 6)}),
    ROW("ge", w_ge, ALL_DT, TOL_EXACT, false, .in = {IN(DOM_GRID, 5, 6), IN(DOM_GRID, 5, 6)}),
    ROW("lt (numpy broadcast [4,1,5] < [3,5])", w_lt, ALL_DT, TOL_EXACT, false,
        .in = {IN(DOM_GRID, 4, 1, 5), IN(DOM_GRID, 3, 5)}),
    ROW("where", w_where, FLOATS, TOL_EXACT, true,
        .in = {IN_AS(MT_BOOL, DOM_COND, 5, 6), IN(DOM_ANY, 5, 6), IN(DOM_ANY, 5, 6)}),
    ROW("where (broadcast cond [5,1], a [5,6], b [6])", w_where, FLOATS, TOL_EXACT, true,
        .in = {IN_AS(MT_BOOL, DOM_COND, 5, 1), IN(DOM_ANY, 5, 6), IN(DOM_ANY, 6)}),
    /* reductions */
    ROW("sum dims {0}", w_sum, FLOATS, TOL_NORMED, true,
        .in = {IN(DOM_ANY, 4, 5, 6)}, .ndims = 1, .dims = {0}),
    ROW("sum dims {-1} keepdim", w_sum, FLOATS, TOL_NORMED, true,
        .in = {IN(DOM_ANY, 4, 5, 6)}, .ndims = 1, .dims = {-1}, .keepdim = true),
    ROW("sum dims {0, 2}", w_sum, FLOATS, TOL_NORMED, true,
        .in = {IN(DOM_ANY, 4, 5, 6)}, .ndims = 2, .dims = {0, 2}),
    ROW("sum dims {1} (rows of 257)", w_sum, FLOATS, TOL_NORMED, true,
        .in = {IN(DOM_ANY, 129, 257)}, .ndims = 1, .dims = {1}),
    ROW("sum_all", w_sum_all, FLOATS, TOL_NORMED, true, .in = {IN(DOM_ANY, 4, 5, 6)}),
    ROW("sum_all (33153 elements)", w_sum_all, FLOATS, TOL_NORMED, true,
        .in = {IN(DOM_ANY, 129, 257)}),
    ROW("mean dims {1}", w_mean, FLOATS, TOL_NORMED, true,
        .in = {IN(DOM_ANY, 4, 5, 6)}, .ndims = 1, .dims = {1}),
    ROW("mean dims {0, 2} keepdim", w_mean, FLOATS, TOL_NORMED, true,
        .in = {IN(DOM_ANY, 4, 5, 6)}, .ndims = 2, .dims = {0, 2}, .keepdim = true),
    ROW("mean dims {0} (columns of 1031)", w_mean, FLOATS, TOL_NORMED, true,
        .in = {IN(DOM_ANY, 1031, 37)}, .ndims = 1, .dims = {0}),
    ROW("mean_all", w_mean_all, FLOATS, TOL_NORMED, true, .in = {IN(DOM_ANY, 4, 5, 6)}),
    ROW("max dims {1}", w_max, FLOATS, TOL_EXACT, true,
        .in = {IN(DOM_ANY, 4, 5, 6)}, .ndims = 1, .dims = {1}),
    ROW("max dims {-1} keepdim (ties)", w_max, FLOATS, TOL_EXACT, true,
        .in = {IN(DOM_GRID, 4, 5, 6)}, .ndims = 1, .dims = {-1}, .keepdim = true),
    ROW("max dims {1} (rows of 1031)", w_max, FLOATS, TOL_EXACT, true,
        .in = {IN(DOM_ANY, 37, 1031)}, .ndims = 1, .dims = {1}),
    ROW("max_all", w_max_all, FLOATS, TOL_EXACT, true, .in = {IN(DOM_ANY, 4, 5, 6)}),
    ROW("softmax dim -1", w_softmax, FLOATS, TOL_NORMED, true,
        .in = {IN(DOM_ANY, 6, 37)}, .dim = -1),
    ROW("softmax dim 0", w_softmax, FLOATS, TOL_NORMED, true, .in = {IN(DOM_ANY, 6, 37)}, .dim = 0),
    ROW("softmax dim -1 (rows of 1500)", w_softmax, FLOATS, TOL_NORMED, true,
        .in = {IN(DOM_ANY, 8, 1500)}, .dim = -1),
    ROW("log_softmax dim -1", w_log_softmax, FLOATS, TOL_NORMED, true,
        .in = {IN(DOM_ANY, 6, 37)}, .dim = -1),
    ROW("log_softmax dim 0", w_log_softmax, FLOATS, TOL_NORMED, true,
        .in = {IN(DOM_ANY, 6, 37)}, .dim = 0),
    /* GEMM */
    ROW("matmul [7,9] @ [9,5]", w_matmul, FLOATS, TOL_NORMED, true,
        .in = {IN(DOM_ANY, 7, 9), IN(DOM_ANY, 9, 5)}),
    ROW("matmul [65,129] @ [129,33]", w_matmul, FLOATS, TOL_NORMED, true,
        .in = {IN(DOM_ANY, 65, 129), IN(DOM_ANY, 129, 33)}),
    ROW("matmul batched [3,7,9] @ [3,9,5]", w_matmul, FLOATS, TOL_NORMED, true,
        .in = {IN(DOM_ANY, 3, 7, 9), IN(DOM_ANY, 3, 9, 5)}),
    ROW("matmul broadcast batch [3,7,9] @ [1,9,5]", w_matmul, FLOATS, TOL_NORMED, true,
        .in = {IN(DOM_ANY, 3, 7, 9), IN(DOM_ANY, 1, 9, 5)}),
    ROW("matmul broadcast batch [3,7,9] @ [9,5]", w_matmul, FLOATS, TOL_NORMED, true,
        .in = {IN(DOM_ANY, 3, 7, 9), IN(DOM_ANY, 9, 5)}),
    ROW("matmul broadcast batch [2,1,7,9] @ [3,9,5]", w_matmul, FLOATS, TOL_NORMED, true,
        .in = {IN(DOM_ANY, 2, 1, 7, 9), IN(DOM_ANY, 3, 9, 5)}),
    ROW("matmul [9] @ [9,5]", w_matmul, FLOATS, TOL_NORMED, true,
        .in = {IN(DOM_ANY, 9), IN(DOM_ANY, 9, 5)}),
    ROW("matmul [7,9] @ [9]", w_matmul, FLOATS, TOL_NORMED, true,
        .in = {IN(DOM_ANY, 7, 9), IN(DOM_ANY, 9)}),
    ROW("linear with bias", w_linear, FLOATS, TOL_NORMED, true,
        .in = {IN(DOM_ANY, 6, 9), IN(DOM_ANY, 5, 9), IN(DOM_ANY, 5)}),
    ROW("linear without bias", w_linear, FLOATS, TOL_NORMED, true,
        .in = {IN(DOM_ANY, 6, 9), IN(DOM_ANY, 5, 9)}),
    ROW("linear with bias, x [2,6,9]", w_linear, FLOATS, TOL_NORMED, true,
        .in = {IN(DOM_ANY, 2, 6, 9), IN(DOM_ANY, 5, 9), IN(DOM_ANY, 5)}),
    ROW("linear_act relu with bias", w_linear_relu, FLOATS, TOL_NORMED, true,
        .in = {IN(DOM_ANY, 6, 9), IN(DOM_ANY, 5, 9), IN(DOM_ANY, 5)}),
    ROW("linear_act relu without bias, x [2,6,9]", w_linear_relu, FLOATS, TOL_NORMED, true,
        .in = {IN(DOM_ANY, 2, 6, 9), IN(DOM_ANY, 5, 9)}),
    ROW("linear_act gelu with bias", w_linear_gelu, FLOATS, TOL_NORMED, true,
        .in = {IN(DOM_ANY, 6, 9), IN(DOM_ANY, 5, 9), IN(DOM_ANY, 5)}),
    ROW("linear_act gelu_tanh with bias", w_linear_gelu_tanh, FLOATS, TOL_NORMED, true,
        .in = {IN(DOM_ANY, 6, 9), IN(DOM_ANY, 5, 9), IN(DOM_ANY, 5)}),
    /* losses */
    ROW("mse_loss", w_mse_loss, FLOATS, TOL_NORMED, true,
        .in = {IN(DOM_ANY, 5, 6), IN(DOM_ANY, 5, 6)}),
    ROW("cross_entropy", w_cross_entropy, FLOATS, TOL_NORMED, true,
        .in = {IN(DOM_ANY, 8, 5), LABELS(DOM_LABEL, 8, 5)}),
    ROW("cross_entropy (labels -100 ignored)", w_cross_entropy, FLOATS, TOL_NORMED, true,
        .in = {IN(DOM_ANY, 8, 5), LABELS(DOM_LABEL_IGNORE, 8, 5)}),
    ROW("cross_entropy_ex ignore_index 2", w_cross_entropy_ex, FLOATS, TOL_NORMED, true,
        .in = {IN(DOM_ANY, 8, 5), LABELS(DOM_LABEL, 8, 5)}, .ignore = 2),
    ROW("cross_entropy_ex MT_IGNORE_INDEX_NONE", w_cross_entropy_ex, FLOATS, TOL_NORMED, true,
        .in = {IN(DOM_ANY, 8, 5), LABELS(DOM_LABEL, 8, 5)}, .ignore = MT_IGNORE_INDEX_NONE),
    ROW("cross_entropy (1000 classes)", w_cross_entropy, FLOATS, TOL_NORMED, true,
        .in = {IN(DOM_ANY, 4, 1000), LABELS(DOM_LABEL, 4, 1000)}),
    /* joining */
    ROW("cat dim 0", w_cat, ALL_DT, TOL_EXACT, true,
        .in = {IN(DOM_ANY, 2, 5), IN(DOM_ANY, 3, 5), IN(DOM_ANY, 1, 5)}, .dim = 0),
    ROW("cat dim 1", w_cat, ALL_DT, TOL_EXACT, true,
        .in = {IN(DOM_ANY, 4, 2), IN(DOM_ANY, 4, 3)}, .dim = 1),
    ROW("cat (promoted: row dtype with f64)", w_cat, ALL_DT, TOL_EXACT, true,
        .in = {IN(DOM_ANY, 2, 5), IN_AS(MT_F64, DOM_ANY, 3, 5)}, .dim = 0),
    ROW("stack dim 0", w_stack, ALL_DT, TOL_EXACT, true,
        .in = {IN(DOM_ANY, 3, 4), IN(DOM_ANY, 3, 4), IN(DOM_ANY, 3, 4)}, .dim = 0),
    ROW("stack dim -1", w_stack, ALL_DT, TOL_EXACT, true,
        .in = {IN(DOM_ANY, 3, 4), IN(DOM_ANY, 3, 4)}, .dim = -1),
    /* casts: the row dtype is the source, every source to every target */
    ROW("cast to f32", w_cast, ALL_DT, TOL_EXACT, true, .in = {IN(DOM_CAST, 6, 8)}, .to = MT_F32),
    ROW("cast to f64", w_cast, ALL_DT, TOL_EXACT, true, .in = {IN(DOM_CAST, 6, 8)}, .to = MT_F64),
    ROW("cast to f16", w_cast, ALL_DT, TOL_EXACT, true, .in = {IN(DOM_CAST, 6, 8)}, .to = MT_F16),
    ROW("cast to bf16", w_cast, ALL_DT, TOL_EXACT, true, .in = {IN(DOM_CAST, 6, 8)}, .to = MT_BF16),
    ROW("cast to bool", w_cast, ALL_DT, TOL_EXACT, true, .in = {IN(DOM_CAST, 6, 8)}, .to = MT_BOOL),
    ROW("cast to i64", w_cast, ALL_DT, TOL_EXACT, true,
        .in = {IN(DOM_CAST_INT, 6, 8)}, .to = MT_I64),
    ROW("cast to i32", w_cast, ALL_DT, TOL_EXACT, true,
        .in = {IN(DOM_CAST_INT, 6, 8)}, .to = MT_I32),
    /* views, then contiguous */
    ROW("transpose + contiguous", w_transpose, ALL_DT, TOL_EXACT, true, .in = {IN(DOM_ANY, 4, 6)}),
    ROW("permute {2,0,1} + contiguous", w_permute, ALL_DT, TOL_EXACT, true,
        .in = {IN(DOM_ANY, 2, 3, 4)}),
    ROW("slice dim 1 step 2 + contiguous", w_slice, ALL_DT, TOL_EXACT, true,
        .in = {IN(DOM_ANY, 5, 7)}),
    ROW("narrow + contiguous", w_narrow, ALL_DT, TOL_EXACT, true, .in = {IN(DOM_ANY, 5, 7)}),
    ROW("expand [4,1] -> [4,5] + contiguous", w_expand, ALL_DT, TOL_EXACT, true,
        .in = {IN(DOM_ANY, 4, 1)}),
    ROW("unsqueeze + contiguous", w_unsqueeze, ALL_DT, TOL_EXACT, true, .in = {IN(DOM_ANY, 4, 5)}),
    ROW("squeeze + contiguous", w_squeeze, ALL_DT, TOL_EXACT, true, .in = {IN(DOM_ANY, 4, 1, 5)}),
    ROW("reshape [4,6] -> [3,8] + contiguous", w_reshape, ALL_DT, TOL_EXACT, true,
        .in = {IN(DOM_ANY, 4, 6)}),
    ROW("flatten", w_flatten, ALL_DT, TOL_EXACT, true, .in = {IN(DOM_ANY, 2, 3, 4)}),
    ROW("clone", w_clone, ALL_DT, TOL_EXACT, true, .in = {IN(DOM_ANY, 4, 6)}),
};
/* clang-format on */
#define N_ROWS (sizeof rows / sizeof rows[0])

static int n_inputs(const op_row *r) {
    int n = 0;
    while (n < MAX_IN && r->in[n].ndim > 0) n++;
    return n;
}

#endif
