/* Device parity: every op of the public API, run on MT_CPU (the tested reference) and on
   MT_CUDA(0) from the same inputs, forward and backward, for every dtype the op takes and for
   four input layouts. The table `rows` below has one row per op variant; each row is one test
   case, which tries all of the row's dtype x layout combinations and reports every one that
   differs (as TAP comments) before failing with the first.

   What "the same" means (see compare()):
   - bit-exact: copies, views, casts, comparisons, where, max (a selection) and random draws;
   - elementwise math: F32 within 1e-6 relative (plus a 1e-7 absolute floor, about one ulp at
     unit scale, for results that cancel to near zero), F64 within 1e-12 (floor 1e-15), F16 and
     BF16 within one ulp of the output dtype (both devices compute in FP32 and round once, so
     an FP32 difference in the last bit can move the rounded result by one ulp);
   - GEMM, reductions, softmax and losses (summation order differs between devices): the
     normalised error max|a - b| / max(1, max|cpu|) within 1e-5 (F32), 1e-12 (F64),
     1e-2 (F16), 2e-2 (BF16).
   Gradients of exact ops are compared as elementwise math, and through a broadcast (expanded)
   input, whose gradient is a sum, as a reduction.

   Without a CUDA device every case is reported skipped: nothing was compared. The one test
   that runs anyway checks the comparison itself (that it rejects what it must), on the CPU. */
#include "test_util.h"

/* The device compared with the CPU. Building with -DPARITY_DEVICE=MT_CPU runs the whole table
   CPU against CPU (a distinct copy of every input), which exercises the harness without a GPU. */
#ifndef PARITY_DEVICE
#define PARITY_DEVICE MT_CUDA(0)
#endif

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
    L_COUNT
};
static const char *const layout_names[L_COUNT] = {"contiguous", "transposed", "broadcast",
                                                  "sliced"};

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
    int fixed;  /* 0: the row's dtype (and the row's layout); else 1 + a fixed dtype, always
                   contiguous (labels, conditions, the other operand of a promotion) */
    int64_t hi; /* DOM_LABEL*: the number of classes */
} input_spec;

#define NDIMS(...) ((int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)))
#define IN(dom_, ...)                                                                              \
    { .ndim = NDIMS(__VA_ARGS__), .shape = {__VA_ARGS__}, .dom = (dom_) }
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
    /* convolution: sums in a different order on each device */
    ROW("conv2d [2,4,7,6] * [6,2,3,3] + b, stride 2x1, pad 1, dilation 1x2, groups 2", w_conv2d,
        FLOATS, TOL_NORMED, true,
        .in = {IN(DOM_ANY, 2, 4, 7, 6), IN(DOM_ANY, 6, 2, 3, 3), IN(DOM_ANY, 6)}),
    ROW("conv2d depthwise [2,4,5,5] * [4,1,3,3] + b, pad 1", w_conv2d_depthwise, FLOATS,
        TOL_NORMED, true, .in = {IN(DOM_ANY, 2, 4, 5, 5), IN(DOM_ANY, 4, 1, 3, 3), IN(DOM_ANY, 4)}),
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

/* ------------------------------------------------------------------ devices */

static const char *device_str(mt_device d, char *buf, size_t cap) {
    if (d.type == MT_DEVICE_CPU)
        snprintf(buf, cap, "cpu");
    else
        snprintf(buf, cap, "cuda:%d", d.index);
    return buf;
}

static bool device_available(mt_device d) {
    return d.type == MT_DEVICE_CPU || (d.index >= 0 && d.index < mt_cuda_device_count());
}

/* t on the other device; a distinct copy when that is the CPU too (see PARITY_DEVICE). */
static mt_tensor *to_other(mt_tensor *t) {
    mt_device d = PARITY_DEVICE;
    return d.type == MT_DEVICE_CPU ? mt_clone(t) : mt_to(t, d);
}

/* ------------------------------------------------------------------ failure log */

/* The failures of one test case: each is printed at once as a TAP comment (up to a limit);
   the first is kept for the test's failure message. */
typedef struct {
    int count;
    bool quiet; /* the harness self-test expects failures: print nothing */
    char first[512];
} failures;

#define SHOW_MAX 12

static void note(failures *f, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (f->count == 0) snprintf(f->first, sizeof f->first, "%s", msg);
    if (!f->quiet && f->count < SHOW_MAX) printf("# %s\n", msg);
    if (!f->quiet && f->count == SHOW_MAX) printf("# (more differences not shown)\n");
    f->count++;
}

/* ------------------------------------------------------------------ host-side values */

static double half_to_double(uint16_t h) {
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
    return h >> 15 ? -v : v;
}

static double bf16_to_double(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Element i of a host buffer holding a tensor's contiguous bytes, as a double: converted
   here, not by the library, so a conversion bug on one device cannot hide in both. */
static double host_value(const unsigned char *buf, mt_dtype dt, int64_t i) {
    size_t sz = mt_dtype_size(dt);
    const unsigned char *p = buf + (size_t)i * sz;
    switch (dt) {
    case MT_F32: {
        float v;
        memcpy(&v, p, sizeof v);
        return v;
    }
    case MT_F64: {
        double v;
        memcpy(&v, p, sizeof v);
        return v;
    }
    case MT_F16:
    case MT_BF16: {
        uint16_t v;
        memcpy(&v, p, sizeof v);
        return dt == MT_F16 ? half_to_double(v) : bf16_to_double(v);
    }
    case MT_I64: {
        int64_t v;
        memcpy(&v, p, sizeof v);
        return (double)v;
    }
    case MT_I32: {
        int32_t v;
        memcpy(&v, p, sizeof v);
        return v;
    }
    default:
        return *p;
    }
}

/* The spacing of dt's values at |x| (one ulp), for F16 and BF16. */
static double ulp_of(double x, mt_dtype dt) {
    int mant = dt == MT_F16 ? 10 : 7, emin = dt == MT_F16 ? -14 : -126;
    x = fabs(x);
    if (x < ldexp(1, emin)) return ldexp(1, emin - mant); /* subnormal spacing */
    int e;
    frexp(x, &e); /* x = m 2^e, m in [0.5, 1): x in [2^(e-1), 2^e) */
    return ldexp(1, e - 1 - mant);
}

/* The tensor's bytes on the host, contiguous (malloc'd; NULL and a note on failure). */
static unsigned char *download(failures *f, const char *ctx, const mt_tensor *t) {
    size_t n = (size_t)mt_numel(t) * mt_dtype_size(mt_dtype_of(t));
    unsigned char *buf = malloc(n ? n : 1);
    if (!buf || mt_copy_to_host(t, buf, n) != 0) {
        note(f, "%s: mt_copy_to_host failed: %s", ctx, mt_last_error());
        mt_clear_error();
        free(buf);
        return NULL;
    }
    return buf;
}

/* "[1, 2, 0]": the index of flat element i in shape. */
static const char *index_str(const mt_tensor *t, int64_t i, char *buf, size_t cap) {
    int nd = mt_ndim(t);
    int64_t idx[MT_MAX_DIMS];
    for (int d = nd - 1; d >= 0; d--) {
        int64_t n = mt_dim(t, d);
        idx[d] = n ? i % n : 0;
        i = n ? i / n : 0;
    }
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < nd && k < cap; d++)
        k += (size_t)snprintf(buf + k, cap - k, d ? ", %lld" : "%lld", (long long)idx[d]);
    if (k < cap) snprintf(buf + k, cap - k, "]");
    return buf;
}

/* ------------------------------------------------------------------ comparison */

/* Compares `got` (the other device) with `ref` (the CPU) under tolerance class tol; notes the
   first bad element (or the worst, for TOL_NORMED) naming ctx and what. Returns true when
   they agree. */
static bool compare(failures *f, const char *ctx, const char *what, const mt_tensor *ref,
                    const mt_tensor *got, tol_class tol) {
    char dev[16], ib[64];
    device_str(PARITY_DEVICE, dev, sizeof dev);
    mt_dtype dt = mt_dtype_of(ref);
    if (mt_dtype_of(got) != dt) {
        note(f, "%s: %s: dtype cpu %s, %s %s", ctx, what, mt_dtype_name(dt), dev,
             mt_dtype_name(mt_dtype_of(got)));
        return false;
    }
    bool same_shape = mt_ndim(got) == mt_ndim(ref);
    for (int d = 0; same_shape && d < mt_ndim(ref); d++)
        same_shape = mt_dim(got, d) == mt_dim(ref, d);
    if (!same_shape) {
        note(f, "%s: %s: shapes differ (ndim cpu %d, %s %d; numel %lld vs %lld)", ctx, what,
             mt_ndim(ref), dev, mt_ndim(got), (long long)mt_numel(ref), (long long)mt_numel(got));
        return false;
    }
    unsigned char *a = download(f, ctx, ref), *b = a ? download(f, ctx, got) : NULL;
    if (!b) {
        free(a);
        return false;
    }
    int64_t n = mt_numel(ref);
    size_t sz = mt_dtype_size(dt);
    bool exact = tol == TOL_EXACT || !mt_dtype_is_floating(dt);
    bool ok = true;
    if (exact) {
        for (int64_t i = 0; i < n && ok; i++) {
            if (memcmp(a + (size_t)i * sz, b + (size_t)i * sz, sz) == 0) continue;
            note(f, "%s: %s: element %lld %s is cpu %.9g, %s %.9g (must be bit-identical)", ctx,
                 what, (long long)i, index_str(ref, i, ib, sizeof ib), host_value(a, dt, i), dev,
                 host_value(b, dt, i));
            ok = false;
        }
    } else if (tol == TOL_ELEMWISE) {
        double rtol = dt == MT_F64 ? 1e-12 : 1e-6, atol = dt == MT_F64 ? 1e-15 : 1e-7;
        for (int64_t i = 0; i < n && ok; i++) {
            double x = host_value(a, dt, i), y = host_value(b, dt, i), lim;
            if (isnan(x) || isnan(y) || isinf(x) || isinf(y)) {
                ok = (isnan(x) && isnan(y)) || x == y;
                lim = 0;
            } else {
                lim = dt == MT_F16 || dt == MT_BF16 ? ulp_of(fmax(fabs(x), fabs(y)), dt)
                                                    : atol + rtol * fabs(x);
                ok = fabs(x - y) <= lim;
            }
            if (!ok)
                note(f, "%s: %s: element %lld %s is cpu %.9g, %s %.9g (|diff| %.3g > %.3g)", ctx,
                     what, (long long)i, index_str(ref, i, ib, sizeof ib), x, dev, y, fabs(x - y),
                     lim);
        }
    } else {
        double lim = dt == MT_F64 ? 1e-12 : dt == MT_F32 ? 1e-5 : dt == MT_F16 ? 1e-2 : 2e-2;
        double worst = 0, scale = 1;
        int64_t at = -1;
        for (int64_t i = 0; i < n; i++) {
            double x = host_value(a, dt, i), y = host_value(b, dt, i);
            bool finite = isfinite(x) && isfinite(y);
            if (!finite && !((isnan(x) && isnan(y)) || x == y)) {
                worst = INFINITY;
                at = i;
                break;
            }
            if (!finite) continue;
            scale = fmax(scale, fabs(x));
            if (fabs(x - y) > worst) {
                worst = fabs(x - y);
                at = i;
            }
        }
        ok = worst / scale <= lim;
        if (!ok)
            note(f,
                 "%s: %s: normalised error %.3g > %.3g (max|diff| %.3g, max(1, max|cpu|) %.3g); "
                 "worst element %lld %s is cpu %.9g, %s %.9g",
                 ctx, what, worst / scale, lim, worst, scale, (long long)at,
                 index_str(ref, at, ib, sizeof ib), host_value(a, dt, at), dev,
                 host_value(b, dt, at));
    }
    free(a);
    free(b);
    return ok;
}

/* ------------------------------------------------------------------ inputs */

static uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15u;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9u;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBu;
    return x ^ (x >> 31);
}

static uint64_t name_hash(const char *s) {
    uint64_t h = 1469598103934665603u; /* FNV-1a: data follows the row, not its position */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211u;
    return h;
}

/* Values that round differently under slightly wrong conversions: ties to even in F16, BF16
   and F32, signed zero, F16 subnormals and underflow, the F16 overflow boundary (65520 is
   the first value that rounds to inf), F32 overflow, integers beyond F32's 24 bits. */
/* clang-format off */
static const double cast_specials[] = {
    0.0, -0.0,                                      /* signed zero */
    1.00048828125, 1.00146484375,                   /* 1 + 2^-11, 1 + 3 2^-11: F16 ties */
    1.00390625, 1.01171875,                         /* 1 + 2^-8, 1 + 3 2^-8: BF16 ties */
    1.000000059604644775390625,                     /* 1 + 2^-24: an F32 tie (from F64) */
    1.000000178813934326171875,                     /* 1 + 3 2^-24 */
    3e-6, -4e-8, 1e-8,                              /* F16 subnormal, rounding to 2^-24, to 0 */
    65504, 65519, 65520, -70000,                    /* F16 max, below and at the inf boundary */
    3e38, 1e39,                                     /* BF16 finite, F32 overflow */
    16777217, -33554435,                            /* integers beyond F32's 24 bits */
    2.5, -2.5, 0.5, -0.5, 123456.789, -7.999,
};
static const double cast_int_specials[] = {
    0.0, -0.0, 0.5, -0.5, 2.5, -2.5, 0.99, -0.99, 127.9, -128.9, 30000, -30000, 255.5, 7,
};
/* clang-format on */
#define N_SPECIALS(a) ((int64_t)(sizeof a / sizeof a[0]))

/* Value k of input `which` of row r, for an input of dtype dt. */
static double gen(const op_row *r, int which, const input_spec *s, mt_dtype dt, int64_t k) {
    uint64_t h =
        splitmix64(name_hash(r->name) ^ splitmix64((uint64_t)which * 1000003u + (uint64_t)k));
    double u = (double)(h >> 11) * 0x1p-53; /* [0, 1) */
    switch (s->dom) {
    case DOM_ANY:
        return 4 * u - 2;
    case DOM_POS:
        return 0.25 + 2 * u;
    case DOM_GRID:
        return 0.5 * (double)(h % 9) - 2;
    case DOM_CAST: {
        double v = k < N_SPECIALS(cast_specials)
                       ? cast_specials[k]
                       : (6 * u - 3) * (double[]){1e-3, 1, 100, 1e5}[h % 4];
        /* an integer or bool input is made from this by a host cast: keep that defined */
        if (!mt_dtype_is_floating(dt) && fabs(v) > 2e9) v = v > 0 ? 2e9 : -2e9;
        return v;
    }
    case DOM_CAST_INT:
        return k < N_SPECIALS(cast_int_specials) ? cast_int_specials[k] : 600 * u - 300;
    case DOM_LABEL:
        return (double)((k * 3 + 1) % s->hi); /* every class, 2 included, in a fixed order */
    case DOM_LABEL_IGNORE:
        return k % 3 == 0 ? -100 : (double)((k * 3 + 1) % s->hi);
    case DOM_COND:
        return (double)(h & 1);
    }
    return 0;
}

/* Whether layout l changes the memory under input spec s (a row runs a layout only when it
   changes some input: the others would repeat the contiguous case). */
static bool layout_changes(const input_spec *s, int l) {
    if (s->fixed) return false;
    switch (l) {
    case L_TRANSPOSED:
        return s->ndim >= 2;
    case L_BROADCAST:
        return s->shape[0] > 1;
    case L_SLICED:
        return true;
    default:
        return false;
    }
}

/* The base tensor's shape for logical shape s under layout l. */
static void base_shape(const input_spec *s, int l, int64_t *out) {
    for (int d = 0; d < s->ndim; d++) out[d] = s->shape[d];
    if (!layout_changes(s, l)) return;
    if (l == L_TRANSPOSED) {
        out[s->ndim - 2] = s->shape[s->ndim - 1];
        out[s->ndim - 1] = s->shape[s->ndim - 2];
    } else if (l == L_BROADCAST) {
        out[0] = 1;
    } else if (l == L_SLICED) {
        out[0] = 2 * s->shape[0] + 1;
    }
}

/* The logical input from its base under layout l: a view, recorded by autograd so that the
   base (the leaf) receives the gradient through it. */
static mt_tensor *layout_view(mt_tensor *base, const input_spec *s, int l) {
    if (!layout_changes(s, l)) return base;
    switch (l) {
    case L_TRANSPOSED:
        return mt_transpose(base, s->ndim - 2, s->ndim - 1);
    case L_BROADCAST:
        return mt_expand(base, s->ndim, s->shape);
    default:
        return mt_slice(base, 0, 1, 2 * s->shape[0] + 1, 2);
    }
}

/* Input `which` of row r on both devices: leaves base[0] (cpu) and base[1] (other device),
   holding identical bits, and the op's inputs in[0], in[1] viewed through the layout. */
static bool make_input(failures *f, const char *ctx, const op_row *r, int which, mt_dtype row_dt,
                       int l, mt_tensor **base, mt_tensor **in) {
    const input_spec *s = &r->in[which];
    mt_dtype dt = s->fixed ? (mt_dtype)(s->fixed - 1) : row_dt;
    int64_t shape[4], n = 1;
    base_shape(s, l, shape);
    for (int d = 0; d < s->ndim; d++) n *= shape[d];
    double *v = malloc((size_t)n * sizeof *v);
    assert_non_null(v);
    for (int64_t k = 0; k < n; k++) v[k] = gen(r, which, s, dt, k);
    mt_tensor *t64 = mt_from_data(v, MT_F64, s->ndim, shape, MT_CPU);
    free(v);
    base[0] = mt_cast(t64, dt);
    base[1] = to_other(base[0]);
    if (r->grad && (dt == MT_F32 || dt == MT_F64)) {
        mt_set_requires_grad(base[0], true);
        mt_set_requires_grad(base[1], true);
    }
    in[0] = layout_view(base[0], s, l);
    in[1] = layout_view(base[1], s, l);
    if (!in[0] || !in[1] || mt_last_status() != MT_OK) {
        note(f, "%s: making input %d failed: %s", ctx, which, mt_last_error());
        mt_clear_error();
        return false;
    }
    return true;
}

/* ------------------------------------------------------------------ one case */

static void run_case_body(failures *f, const char *ctx, const op_row *r, mt_dtype dt, int l) {
    char dev[16];
    device_str(PARITY_DEVICE, dev, sizeof dev);
    int n = n_inputs(r);
    mt_tensor *base[MAX_IN][2], *in[2][MAX_IN] = {{NULL}};
    bool any_grad = false;
    for (int i = 0; i < n; i++) {
        mt_tensor *view[2];
        if (!make_input(f, ctx, r, i, dt, l, base[i], view)) return;
        in[0][i] = view[0];
        in[1][i] = view[1];
        any_grad |= mt_requires_grad(base[i][0]);
    }
    mt_tensor *out[2];
    for (int d = 0; d < 2; d++) {
        out[d] = r->fn(r, in[d]);
        if (!out[d] || mt_last_status() != MT_OK) {
            note(f, "%s: forward on %s failed: %s", ctx, d ? dev : "cpu", mt_last_error());
            mt_clear_error();
            return;
        }
    }
    if (!compare(f, ctx, "forward", out[0], out[1], r->tol)) return;
    if (!any_grad || !mt_dtype_is_floating(mt_dtype_of(out[0]))) return;

    /* backward from the same random cotangent on both devices */
    int64_t nout = mt_numel(out[0]);
    double *c = malloc((size_t)(nout ? nout : 1) * sizeof *c);
    assert_non_null(c);
    input_spec cs = {.dom = DOM_ANY};
    for (int64_t k = 0; k < nout; k++) c[k] = gen(r, 99, &cs, MT_F64, k);
    mt_tensor *c64 = mt_from_data(c, MT_F64, mt_ndim(out[0]), mt_shape(out[0]), MT_CPU);
    free(c);
    mt_tensor *cot[2];
    cot[0] = mt_cast(c64, mt_dtype_of(out[0]));
    cot[1] = to_other(cot[0]);
    for (int d = 0; d < 2; d++) {
        if (mt_backward(out[d], cot[d]) != 0 || mt_last_status() != MT_OK) {
            note(f, "%s: backward on %s failed: %s", ctx, d ? dev : "cpu", mt_last_error());
            mt_clear_error();
            return;
        }
    }
    /* exact forward ops (copies, selections) have exact-ish gradients, except that the
       gradient of an expanded input is a sum */
    tol_class gtol = r->tol == TOL_EXACT ? TOL_ELEMWISE : r->tol;
    if (l == L_BROADCAST && gtol == TOL_ELEMWISE) gtol = TOL_NORMED;
    for (int i = 0; i < n; i++) {
        if (!mt_requires_grad(base[i][0])) continue;
        mt_tensor *g0 = mt_grad(base[i][0]), *g1 = mt_grad(base[i][1]);
        char what[32];
        snprintf(what, sizeof what, "gradient of input %d", i);
        if (!g0 || !g1)
            note(f, "%s: %s: missing on %s", ctx, what, g0 ? dev : "cpu");
        else
            compare(f, ctx, what, g0, g1, gtol);
    }
}

/* One (row, dtype, layout) case in its own scope: every tensor it makes is freed at the end,
   whatever happened, so a failing case leaks nothing into the next one. */
static void run_case(failures *f, const op_row *r, mt_dtype dt, int l) {
    char ctx[160];
    snprintf(ctx, sizeof ctx, "%s | %s | %s", r->name, mt_dtype_name(dt), layout_names[l]);
    mt_scope_begin();
    run_case_body(f, ctx, r, dt, l);
    mt_scope_end();
}

/* ------------------------------------------------------------------ tests */

static const op_row *current_row;

/* The fixture of test_util.h, plus handing the row (cmocka's initial state) to the test. */
static int row_setup(void **state) {
    current_row = *state;
    return mt_test_setup(state);
}

static void test_row(void **state) {
    (void)state;
    const op_row *r = current_row;
    failures f = {0};
    int cases = 0;
    for (int dt = 0; dt < MT_DTYPE_COUNT; dt++) {
        if (!(r->dtypes & BIT(dt))) continue;
        for (int l = 0; l < L_COUNT; l++) {
            bool changes = l == L_CONTIGUOUS;
            for (int i = 0; i < n_inputs(r); i++) changes |= layout_changes(&r->in[i], l);
            if (!changes) continue;
            run_case(&f, r, (mt_dtype)dt, l);
            cases++;
        }
    }
    if (f.count) fail_msg("%d difference(s) in %d cases; first: %s", f.count, cases, f.first);
}

/* mt_rand / mt_randn after the same mt_manual_seed: bit-identical on both devices (Philox is
   counter based), for each floating dtype, including the offset a first draw leaves for the
   next (7 elements: not a multiple of Philox's 4 lanes). */
static void test_random_same_seed(void **state) {
    (void)state;
    failures f = {0};
    const mt_dtype dts[] = {MT_F32, MT_F64, MT_F16, MT_BF16};
    for (int k = 0; k < 4; k++) {
        for (int normal = 0; normal < 2; normal++) {
            char ctx[64];
            snprintf(ctx, sizeof ctx, "%s | %s", normal ? "randn" : "rand", mt_dtype_name(dts[k]));
            mt_scope_begin();
            mt_tensor *t[2][2];
            for (int d = 0; d < 2; d++) {
                mt_device dev = d ? PARITY_DEVICE : MT_CPU;
                mt_manual_seed(1234 + (uint64_t)k);
                for (int j = 0; j < 2; j++)
                    t[d][j] = normal ? (j ? mt_randn(MT_SHAPE(5, 13), dts[k], dev)
                                          : mt_randn(MT_SHAPE(7), dts[k], dev))
                                     : (j ? mt_rand(MT_SHAPE(5, 13), dts[k], dev)
                                          : mt_rand(MT_SHAPE(7), dts[k], dev));
            }
            if (mt_last_status() != MT_OK) {
                note(&f, "%s: %s", ctx, mt_last_error());
                mt_clear_error();
            } else {
                compare(&f, ctx, "first draw", t[0][0], t[1][0], TOL_EXACT);
                compare(&f, ctx, "second draw", t[0][1], t[1][1], TOL_EXACT);
            }
            mt_scope_end();
        }
    }
    if (f.count) fail_msg("%d difference(s); first: %s", f.count, f.first);
}

/* The comparison itself, on the CPU (runs without a device): each tolerance class accepts
   what it should and rejects a difference just outside it, so a parity case that passes has
   really compared numbers. */
static mt_tensor *host_tensor(const double *v, mt_dtype dt, int64_t n) {
    return mt_cast(mt_from_data(v, MT_F64, 1, &n, MT_CPU), dt);
}

static bool cmp_values(tol_class tol, mt_dtype dt, const double *x, const double *y, int n) {
    mt_scope_begin();
    mt_tensor *a = host_tensor(x, dt, n), *b = host_tensor(y, dt, n);
    failures f = {.quiet = true};
    bool ok = compare(&f, "self-test", "values", a, b, tol);
    mt_scope_end();
    assert_no_error();
    assert_int_equal(f.count, ok ? 0 : 1);
    return ok;
}

static void test_harness_detects_differences(void **state) {
    (void)state;
    const double one_ulp_f32 = 0x1p-22; /* at 2.0 */
    double ref[2] = {1.0, 2.0}, y[2] = {1.0, 2.0};
    assert_true(cmp_values(TOL_EXACT, MT_F32, ref, y, 2));
    y[1] = 2.0 + one_ulp_f32;
    assert_false(cmp_values(TOL_EXACT, MT_F32, ref, y, 2));
    assert_true(cmp_values(TOL_ELEMWISE, MT_F32, ref, y, 2)); /* 1.2e-7 relative */
    y[1] = 2.0 * (1 + 3e-6);
    assert_false(cmp_values(TOL_ELEMWISE, MT_F32, ref, y, 2));
    /* F16/BF16: one ulp passes, two fail (ulp at 1 is 2^-10 and 2^-7) */
    double h1[2] = {1.0, 1.0 + 0x1p-10}, h2[2] = {1.0, 1.0 + 0x1p-9};
    double r1[2] = {1.0, 1.0};
    assert_true(cmp_values(TOL_ELEMWISE, MT_F16, r1, h1, 2));
    assert_false(cmp_values(TOL_ELEMWISE, MT_F16, r1, h2, 2));
    double b1[2] = {1.0, 1.0 + 0x1p-7}, b2[2] = {1.0, 1.0 + 0x1p-6};
    assert_true(cmp_values(TOL_ELEMWISE, MT_BF16, r1, b1, 2));
    assert_false(cmp_values(TOL_ELEMWISE, MT_BF16, r1, b2, 2));
    /* F64: 1e-12 relative */
    double d1[1] = {3.0}, d2[1] = {3.0 * (1 + 5e-13)}, d3[1] = {3.0 * (1 + 5e-12)};
    assert_true(cmp_values(TOL_ELEMWISE, MT_F64, d1, d2, 1));
    assert_false(cmp_values(TOL_ELEMWISE, MT_F64, d1, d3, 1));
    /* normalised: an error of 5e-4 next to a 100 passes in F32 (5e-6), one of 1e-2 fails */
    double n0[2] = {100, 1}, n1[2] = {100, 1 + 5e-4}, n2[2] = {100 + 1e-2, 1};
    assert_true(cmp_values(TOL_NORMED, MT_F32, n0, n1, 2));
    assert_false(cmp_values(TOL_NORMED, MT_F32, n0, n2, 2));
    /* non-finite values must match exactly, NaN matching NaN */
    double i0[2] = {INFINITY, NAN}, i1[2] = {INFINITY, NAN}, i2[2] = {-INFINITY, NAN};
    assert_true(cmp_values(TOL_NORMED, MT_F32, i0, i1, 2));
    assert_false(cmp_values(TOL_NORMED, MT_F32, i0, i2, 2));
    assert_false(cmp_values(TOL_ELEMWISE, MT_F32, i0, i2, 2));
    /* signed zero is a different bit pattern: casts must keep it */
    double z0[1] = {0.0}, z1[1] = {-0.0};
    assert_false(cmp_values(TOL_EXACT, MT_F16, z0, z1, 1));
    /* shapes and dtypes must agree before any value is looked at */
    mt_scope_begin();
    failures f = {.quiet = true};
    mt_tensor *a = mt_zeros(MT_SHAPE(2, 3), MT_F32, MT_CPU),
              *b = mt_zeros(MT_SHAPE(3, 2), MT_F32, MT_CPU);
    mt_tensor *c = mt_zeros(MT_SHAPE(2, 3), MT_F64, MT_CPU);
    assert_false(compare(&f, "self-test", "shape", a, b, TOL_NORMED));
    assert_false(compare(&f, "self-test", "dtype", a, c, TOL_NORMED));
    assert_int_equal(f.count, 2);
    mt_scope_end();
    assert_no_error();
}

/* A case that cannot run here is reported skipped (see MT_TEST_SKIPPED in test_util.h). */
static struct CMUnitTest runnable(const char *name, CMUnitTestFunction fn, CMFixtureFunction setup,
                                  void *initial_state, const char *skip_why, char *name_buf,
                                  size_t cap) {
    if (!skip_why)
        return (struct CMUnitTest){.name = name,
                                   .test_func = fn,
                                   .setup_func = setup,
                                   .teardown_func = mt_test_teardown,
                                   .initial_state = initial_state};
    snprintf(name_buf, cap, "%s # SKIP %s", name, skip_why);
    return (struct CMUnitTest){.name = name_buf, .test_func = mt_test_not_run};
}

int main(void) {
    /* F32 GEMMs must not use TF32 on the device, or they could not match the CPU's (this is
       the default; set here so that the comparison never depends on it) */
    mt_cuda_set_allow_tf32(false);
    char dev[16], why[128];
    snprintf(why, sizeof why, "%s is not available (no CUDA device in this build or machine)",
             device_str(PARITY_DEVICE, dev, sizeof dev));
    const char *skip_why = device_available(PARITY_DEVICE) ? NULL : why;
    static struct CMUnitTest tests[N_ROWS + 2];
    static char names[N_ROWS + 1][256];
    for (size_t i = 0; i < N_ROWS; i++)
        tests[i] = runnable(rows[i].name, test_row, row_setup, (void *)&rows[i], skip_why, names[i],
                            sizeof names[i]);
    tests[N_ROWS] = runnable("test_random_same_seed", test_random_same_seed, mt_test_setup, NULL,
                             skip_why, names[N_ROWS], sizeof names[N_ROWS]);
    tests[N_ROWS + 1] = (struct CMUnitTest)MT_TEST(test_harness_detects_differences);
    return MT_RUN_TESTS(tests);
}
