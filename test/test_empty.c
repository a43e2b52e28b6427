/* Every op of ops.def on zero-size tensors, as torch treats them: the result has torch's
   shape (empty, or a reduction's identity: sum 0, mean and the mean losses NaN), reductions
   with no identity over an empty dim are errors, and backward through the op gives every
   leaf a gradient of its own (empty) shape. A row per op; the table is checked against
   ops.def so a new op cannot miss it. Runs on every device. */
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>
#include "mixtape.h"
#include "test_util.h"

/* The inputs every row draws from: x, y [3, 0] F32 leaves that require grad, e [0, 5] a
   leaf with rows of 5, w [4, 0] a linear weight, k [0, 4], labels [0] I64, c [3, 0] BOOL. */
typedef struct {
    mt_tensor *x, *y, *e, *w, *k, *labels, *c;
} inputs;

typedef enum {
    EMPTY,  /* a zero-size result of the expected shape */
    ZEROS,  /* a non-empty result, all zeros (sum, matmul over an empty inner dim) */
    NAN_S,  /* a NaN scalar (the mean of nothing) */
    REFUSED /* an error, as torch raises (a max over nothing) */
} outcome;

typedef struct {
    const char *op; /* the name in ops.def */
    mt_tensor *(*run)(const inputs *in);
    outcome want;
    int ndim;
    int64_t shape[4];
    bool backward;        /* differentiable: gradients of every leaf's shape after backward */
    const char *cpu_only; /* why other devices skip the row, or NULL */
} row;

#define S(...)                                                                                     \
    { __VA_ARGS__ }

static mt_tensor *r_add(const inputs *in) {
    return mt_add(in->x, in->y);
}
static mt_tensor *r_sub(const inputs *in) {
    return mt_sub(in->x, in->y);
}
static mt_tensor *r_mul(const inputs *in) {
    return mt_mul(in->x, in->y);
}
static mt_tensor *r_div(const inputs *in) {
    return mt_div(in->x, in->y);
}
static mt_tensor *r_pow(const inputs *in) {
    return mt_pow(in->x, in->y);
}
static mt_tensor *r_maximum(const inputs *in) {
    return mt_maximum(in->x, in->y);
}
static mt_tensor *r_minimum(const inputs *in) {
    return mt_minimum(in->x, in->y);
}
static mt_tensor *r_eq(const inputs *in) {
    return mt_eq(in->x, in->y);
}
static mt_tensor *r_ne(const inputs *in) {
    return mt_ne(in->x, in->y);
}
static mt_tensor *r_lt(const inputs *in) {
    return mt_lt(in->x, in->y);
}
static mt_tensor *r_le(const inputs *in) {
    return mt_le(in->x, in->y);
}
static mt_tensor *r_gt(const inputs *in) {
    return mt_gt(in->x, in->y);
}
static mt_tensor *r_ge(const inputs *in) {
    return mt_ge(in->x, in->y);
}
static mt_tensor *r_where(const inputs *in) {
    return mt_where(in->c, in->x, in->y);
}
static mt_tensor *r_add_scalar(const inputs *in) {
    return mt_add_scalar(in->x, 2);
}
static mt_tensor *r_mul_scalar(const inputs *in) {
    return mt_mul_scalar(in->x, 2);
}
static mt_tensor *r_pow_scalar(const inputs *in) {
    return mt_pow_scalar(in->x, 2);
}
static mt_tensor *r_rsub_scalar(const inputs *in) {
    return mt_rsub_scalar(in->x, 2);
}
static mt_tensor *r_rdiv_scalar(const inputs *in) {
    return mt_rdiv_scalar(in->x, 2);
}
static mt_tensor *r_neg(const inputs *in) {
    return mt_neg(in->x);
}
static mt_tensor *r_exp(const inputs *in) {
    return mt_exp(in->x);
}
static mt_tensor *r_log(const inputs *in) {
    return mt_log(in->x);
}
static mt_tensor *r_sqrt(const inputs *in) {
    return mt_sqrt(in->x);
}
static mt_tensor *r_rsqrt(const inputs *in) {
    return mt_rsqrt(in->x);
}
static mt_tensor *r_abs(const inputs *in) {
    return mt_abs(in->x);
}
static mt_tensor *r_relu(const inputs *in) {
    return mt_relu(in->x);
}
static mt_tensor *r_gelu(const inputs *in) {
    return mt_gelu(in->x);
}
static mt_tensor *r_gelu_tanh(const inputs *in) {
    return mt_gelu_tanh(in->x);
}
static mt_tensor *r_sigmoid(const inputs *in) {
    return mt_sigmoid(in->x);
}
static mt_tensor *r_tanh(const inputs *in) {
    return mt_tanh(in->x);
}
static mt_tensor *r_sum(const inputs *in) {
    return mt_sum(in->x, MT_DIMS(1), false);
}
static mt_tensor *r_sum_all(const inputs *in) {
    return mt_sum_all(in->x);
}
static mt_tensor *r_mean(const inputs *in) {
    return mt_mean(in->x, MT_DIMS(0), false);
}
static mt_tensor *r_mean_all(const inputs *in) {
    return mt_mean_all(in->x);
}
static mt_tensor *r_max(const inputs *in) {
    return mt_max(in->x, MT_DIMS(0), true);
}
static mt_tensor *r_max_empty_dim(const inputs *in) {
    return mt_max(in->x, MT_DIMS(1), false);
}
static mt_tensor *r_max_all(const inputs *in) {
    return mt_max_all(in->x);
}
static mt_tensor *r_softmax(const inputs *in) {
    return mt_softmax(in->e, 1);
}
static mt_tensor *r_log_softmax(const inputs *in) {
    return mt_log_softmax(in->x, 1);
}
static mt_tensor *r_matmul(const inputs *in) {
    return mt_matmul(in->x, in->k);
}
static mt_tensor *r_linear(const inputs *in) {
    return mt_linear(in->x, in->w, NULL);
}
static mt_tensor *r_linear_act(const inputs *in) { /* K == 0: gelu(0) = 0 */
    return mt_linear_act(in->x, in->w, NULL, MT_ACT_GELU);
}
static mt_tensor *r_mse_loss(const inputs *in) {
    return mt_mse_loss(in->x, in->y);
}
static mt_tensor *r_cross_entropy(const inputs *in) {
    return mt_cross_entropy(in->e, in->labels);
}
static mt_tensor *r_cat(const inputs *in) {
    return mt_cat((mt_tensor *[]){in->x, in->y}, 2, 1);
}
static mt_tensor *r_stack(const inputs *in) {
    return mt_stack((mt_tensor *[]){in->x, in->y}, 2, 0);
}
static mt_tensor *r_cast(const inputs *in) {
    return mt_cast(in->x, MT_F16);
}
static mt_tensor *r_to(const inputs *in) { /* to the host and back to the device under test */
    mt_tensor *h = mt_to(in->x, MT_CPU);
    mt_tensor *r = mt_to(h, mt_test_device());
    mt_release(h);
    return r;
}
static mt_tensor *r_clone(const inputs *in) {
    return mt_clone(in->x);
}
static mt_tensor *r_contiguous(const inputs *in) {
    mt_tensor *t = mt_transpose(in->x, 0, 1);
    mt_tensor *r = mt_contiguous(t);
    mt_release(t);
    return r;
}
static mt_tensor *r_reshape(const inputs *in) {
    return mt_reshape(in->x, MT_SHAPE(0, 7, 2)); /* a -1 would be ambiguous, as in torch */
}
static mt_tensor *r_view(const inputs *in) {
    return mt_view(in->x, MT_SHAPE(0));
}
static mt_tensor *r_transpose(const inputs *in) {
    return mt_transpose(in->x, 0, 1);
}
static mt_tensor *r_permute(const inputs *in) {
    return mt_permute(in->x, MT_DIMS(1, 0));
}
static mt_tensor *r_slice(const inputs *in) {
    return mt_slice(in->e, 1, 1, 4, 2);
}
static mt_tensor *r_expand(const inputs *in) {
    mt_tensor *t = mt_unsqueeze(in->x, 0);
    mt_tensor *r = mt_expand(t, MT_SHAPE(2, 3, 0));
    mt_release(t);
    return r;
}
static mt_tensor *r_squeeze(const inputs *in) {
    mt_tensor *t = mt_unsqueeze(in->x, 0);
    mt_tensor *r = mt_squeeze(t, 0);
    mt_release(t);
    return r;
}
/* the ops of issue 9 */
static mt_tensor *r_layer_norm(const inputs *in) {
    return mt_layer_norm(in->e, 1, NULL, NULL, 1e-5);
}
static mt_tensor *with_stats(const inputs *in, bool act) {
    mt_tensor *rm = mt_zeros(MT_SHAPE(5), MT_F32, mt_test_device());
    mt_tensor *rv = mt_ones(MT_SHAPE(5), MT_F32, mt_test_device());
    mt_tensor *r =
        act ? mt_batch_norm_act(in->e, rm, rv, NULL, NULL, in->e, false, 0.1, 1e-5, MT_ACT_RELU)
            : mt_batch_norm(in->e, rm, rv, NULL, NULL, false, 0.1, 1e-5);
    mt_release(rm);
    mt_release(rv);
    return r;
}
static mt_tensor *r_batch_norm_eval(const inputs *in) {
    return with_stats(in, false);
}
static mt_tensor *r_batch_norm_act_eval(const inputs *in) {
    return with_stats(in, true);
}
static mt_tensor *r_batch_norm_train(const inputs *in) {
    return mt_batch_norm(in->e, NULL, NULL, NULL, NULL, true, 0.1, 1e-5);
}
static mt_tensor *r_dropout(const inputs *in) {
    return mt_dropout(in->x, 0.5, true);
}
static mt_tensor *r_embedding(const inputs *in) {
    return mt_embedding(in->w, in->labels);
}
static mt_tensor *r_index_select(const inputs *in) {
    return mt_index_select(in->x, 0, in->labels);
}
static mt_tensor *r_gather(const inputs *in) {
    mt_tensor *idx = mt_zeros(MT_SHAPE(3, 0), MT_I64, mt_test_device());
    mt_tensor *r = mt_gather(in->x, 1, idx);
    mt_release(idx);
    return r;
}
static mt_tensor *r_argmax(const inputs *in) {
    return mt_argmax(in->x, 0, false);
}
static mt_tensor *r_argmax_empty_dim(const inputs *in) {
    return mt_argmax(in->x, 1, false);
}

/* convolution and pooling over a batch of 0 images (their CUDA kernels come with cuDNN) */
static mt_tensor *empty_images(void) {
    mt_tensor *x = mt_zeros(MT_SHAPE(0, 3, 5, 5), MT_F32, mt_test_device());
    mt_set_requires_grad(x, true);
    return x;
}
static mt_tensor *r_conv2d(const inputs *in) {
    (void)in;
    mt_tensor *x = empty_images(), *w = mt_ones(MT_SHAPE(4, 3, 3, 3), MT_F32, mt_test_device());
    mt_set_requires_grad(w, true);
    mt_tensor *r = mt_conv2d(x, w, NULL, NULL);
    mt_release(x);
    mt_release(w);
    return r;
}
static mt_tensor *pool(int kind) {
    mt_tensor *x = empty_images();
    const mt_pool2d_opts o = {.kernel = {2, 2}};
    mt_tensor *r = kind == 0   ? mt_max_pool2d(x, &o)
                   : kind == 1 ? mt_avg_pool2d(x, &o)
                               : mt_adaptive_avg_pool2d(x, 2, 2);
    mt_release(x);
    return r;
}
static mt_tensor *r_max_pool2d(const inputs *in) {
    (void)in;
    return pool(0);
}
static mt_tensor *r_avg_pool2d(const inputs *in) {
    (void)in;
    return pool(1);
}
static mt_tensor *r_adaptive_avg_pool2d(const inputs *in) {
    (void)in;
    return pool(2);
}
static mt_tensor *r_to_channels_last(const inputs *in) {
    (void)in;
    mt_tensor *x = empty_images(), *r = mt_to_channels_last(x);
    mt_release(x);
    return r;
}

static mt_tensor *r_unsqueeze(const inputs *in) {
    return mt_unsqueeze(in->x, 2);
}

#define ROW(op, fn, want, shape, nd, bw)                                                           \
    { op, fn, want, nd, shape, bw, NULL }
/* rows whose CUDA kernels are still to come: reported skipped on other devices */
#define ROW_CPU(op, fn, want, shape, nd, bw)                                                       \
    { op, fn, want, nd, shape, bw, "CUDA kernels (cuDNN): issue 9" }
static const row rows[] = {
    ROW("add", r_add, EMPTY, S(3, 0), 2, true),
    ROW("sub", r_sub, EMPTY, S(3, 0), 2, true),
    ROW("mul", r_mul, EMPTY, S(3, 0), 2, true),
    ROW("div", r_div, EMPTY, S(3, 0), 2, true),
    ROW("pow", r_pow, EMPTY, S(3, 0), 2, true),
    ROW("maximum", r_maximum, EMPTY, S(3, 0), 2, true),
    ROW("minimum", r_minimum, EMPTY, S(3, 0), 2, true),
    ROW("eq", r_eq, EMPTY, S(3, 0), 2, false),
    ROW("ne", r_ne, EMPTY, S(3, 0), 2, false),
    ROW("lt", r_lt, EMPTY, S(3, 0), 2, false),
    ROW("le", r_le, EMPTY, S(3, 0), 2, false),
    ROW("gt", r_gt, EMPTY, S(3, 0), 2, false),
    ROW("ge", r_ge, EMPTY, S(3, 0), 2, false),
    ROW("where", r_where, EMPTY, S(3, 0), 2, true),
    ROW("add_scalar", r_add_scalar, EMPTY, S(3, 0), 2, true),
    ROW("mul_scalar", r_mul_scalar, EMPTY, S(3, 0), 2, true),
    ROW("pow_scalar", r_pow_scalar, EMPTY, S(3, 0), 2, true),
    ROW("rsub_scalar", r_rsub_scalar, EMPTY, S(3, 0), 2, true),
    ROW("rdiv_scalar", r_rdiv_scalar, EMPTY, S(3, 0), 2, true),
    ROW("neg", r_neg, EMPTY, S(3, 0), 2, true),
    ROW("exp", r_exp, EMPTY, S(3, 0), 2, true),
    ROW("log", r_log, EMPTY, S(3, 0), 2, true),
    ROW("sqrt", r_sqrt, EMPTY, S(3, 0), 2, true),
    ROW("rsqrt", r_rsqrt, EMPTY, S(3, 0), 2, true),
    ROW("abs", r_abs, EMPTY, S(3, 0), 2, true),
    ROW("relu", r_relu, EMPTY, S(3, 0), 2, true),
    ROW("gelu", r_gelu, EMPTY, S(3, 0), 2, true),
    ROW("gelu_tanh", r_gelu_tanh, EMPTY, S(3, 0), 2, true),
    ROW("sigmoid", r_sigmoid, EMPTY, S(3, 0), 2, true),
    ROW("tanh", r_tanh, EMPTY, S(3, 0), 2, true),
    ROW("sum", r_sum, ZEROS, S(3), 1, true),
    ROW("sum", r_sum_all, ZEROS, S(0), 0, true),
    ROW("mean", r_mean, EMPTY, S(0), 1, true),
    ROW("mean", r_mean_all, NAN_S, S(0), 0, true),
    ROW("max", r_max, EMPTY, S(1, 0), 2, true),
    ROW("max", r_max_empty_dim, REFUSED, S(0), 0, false),
    ROW("max", r_max_all, REFUSED, S(0), 0, false),
    ROW("softmax", r_softmax, EMPTY, S(0, 5), 2, true),
    ROW("log_softmax", r_log_softmax, EMPTY, S(3, 0), 2, true),
    ROW("matmul", r_matmul, ZEROS, S(3, 4), 2, true),
    ROW("linear", r_linear, ZEROS, S(3, 4), 2, true),
    ROW("linear_act", r_linear_act, ZEROS, S(3, 4), 2, true),
    ROW("mse_loss", r_mse_loss, NAN_S, S(0), 0, true),
    ROW("cross_entropy", r_cross_entropy, NAN_S, S(0), 0, true),
    ROW("cat", r_cat, EMPTY, S(3, 0), 2, true),
    ROW("stack", r_stack, EMPTY, S(2, 3, 0), 3, true),
    ROW("cast", r_cast, EMPTY, S(3, 0), 2, true),
    ROW("to", r_to, EMPTY, S(3, 0), 2, true),
    ROW("clone", r_clone, EMPTY, S(3, 0), 2, true),
    ROW("contiguous", r_contiguous, EMPTY, S(0, 3), 2, true),
    ROW("reshape", r_reshape, EMPTY, S(0, 7, 2), 3, true),
    ROW("view", r_view, EMPTY, S(0), 1, true),
    ROW("transpose", r_transpose, EMPTY, S(0, 3), 2, true),
    ROW("permute", r_permute, EMPTY, S(0, 3), 2, true),
    ROW("slice", r_slice, EMPTY, S(0, 2), 2, true),
    ROW("expand", r_expand, EMPTY, S(2, 3, 0), 3, true),
    ROW("squeeze", r_squeeze, EMPTY, S(3, 0), 2, true),
    ROW("unsqueeze", r_unsqueeze, EMPTY, S(3, 0, 1), 3, true),
    ROW("layer_norm", r_layer_norm, EMPTY, S(0, 5), 2, true),
    ROW("batch_norm", r_batch_norm_eval, EMPTY, S(0, 5), 2, true),
    ROW("batch_norm", r_batch_norm_train, EMPTY, S(0, 5), 2, true),
    ROW("batch_norm_act", r_batch_norm_act_eval, EMPTY, S(0, 5), 2, true),
    ROW("dropout", r_dropout, EMPTY, S(3, 0), 2, true),
    ROW("embedding", r_embedding, EMPTY, S(0, 0), 2, true),
    ROW("index_select", r_index_select, EMPTY, S(0, 0), 2, true),
    ROW("gather", r_gather, EMPTY, S(3, 0), 2, true),
    ROW("argmax", r_argmax, EMPTY, S(0), 1, false),
    ROW("argmax", r_argmax_empty_dim, REFUSED, S(0), 0, false),
    ROW("conv2d", r_conv2d, EMPTY, S(0, 4, 3, 3), 4, true),
    ROW("max_pool2d", r_max_pool2d, EMPTY, S(0, 3, 2, 2), 4, true),
    ROW("avg_pool2d", r_avg_pool2d, EMPTY, S(0, 3, 2, 2), 4, true),
    ROW("adaptive_avg_pool2d", r_adaptive_avg_pool2d, EMPTY, S(0, 3, 2, 2), 4, true),
    ROW("to_channels_last", r_to_channels_last, EMPTY, S(0, 3, 5, 5), 4, true),
};
#define N_ROWS (sizeof rows / sizeof *rows)

/* ops.def rows that are kernels of other ops' backward, not callable on their own (sign
   serves abs's backward) */
static const char *const internal_ops[] = {
    "sign",         "relu_backward", "gelu_backward", "gelu_tanh_backward", "sigmoid_backward",
    "tanh_backward"};

static mt_tensor *leaf(mt_dtype dt, int ndim, const int64_t *shape, bool grad) {
    mt_tensor *t = mt_zeros(ndim, shape, dt, mt_test_device());
    if (grad) mt_set_requires_grad(t, true);
    return t;
}

static void inputs_make(inputs *in) {
    in->x = leaf(MT_F32, MT_SHAPE(3, 0), true);
    in->y = leaf(MT_F32, MT_SHAPE(3, 0), true);
    in->e = leaf(MT_F32, MT_SHAPE(0, 5), true);
    in->w = leaf(MT_F32, MT_SHAPE(4, 0), true);
    in->k = leaf(MT_F32, MT_SHAPE(0, 4), true);
    in->labels = leaf(MT_I64, MT_SHAPE(0), false);
    in->c = leaf(MT_BOOL, MT_SHAPE(3, 0), false);
}

static void inputs_free(inputs *in) {
    mt_tensor *all[] = {in->x, in->y, in->e, in->w, in->k, in->labels, in->c};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) mt_release(all[i]);
}

static void check_values(const row *r, mt_tensor *out) {
    mt_tensor *h = mt_to(out, MT_CPU), *d = mt_cast(h, MT_F64);
    const double *v = mt_data_ptr(d);
    for (int64_t i = 0; i < mt_numel(d); i++) {
        if (r->want == ZEROS && v[i] != 0)
            fail_msg("%s: element %lld is %g", r->op, (long long)i, v[i]);
        if (r->want == NAN_S && !isnan(v[i])) fail_msg("%s: %g, torch gives nan", r->op, v[i]);
    }
    mt_release(h);
    mt_release(d);
}

/* After backward, each leaf the row used has a gradient of its own shape (zero-size leaves:
   an empty gradient; others: zeros). */
static void check_grads(const row *r, const inputs *in) {
    mt_tensor *leaves[] = {in->x, in->y, in->e, in->w, in->k};
    for (size_t i = 0; i < sizeof leaves / sizeof *leaves; i++) {
        mt_tensor *g = mt_grad(leaves[i]);
        if (!g) continue; /* not an input of this row */
        assert_int_equal(mt_ndim(g), mt_ndim(leaves[i]));
        for (int d = 0; d < mt_ndim(g); d++)
            if (mt_shape(g)[d] != mt_shape(leaves[i])[d])
                fail_msg("%s: a gradient of the wrong shape", r->op);
        assert_int_equal(mt_numel(g), 0);
        mt_release(g);
    }
}

static const row *current_row;
static int row_setup(void **state) {
    current_row = *state;
    return mt_test_setup(state);
}

static void test_row(void **state) {
    (void)state;
    const row *r = current_row;
    inputs in;
    inputs_make(&in);
    assert_no_error();
    mt_tensor *out = r->run(&in);
    if (r->want == REFUSED) {
        assert_null(out);
        char needle[64];
        snprintf(needle, sizeof needle, "mt_%s", r->op); /* a clear error naming the op */
        if (mt_last_status() == MT_OK || !strstr(mt_last_error(), needle))
            fail_msg("%s: refused with \"%s\"", r->op, mt_last_error());
        mt_clear_error();
        inputs_free(&in);
        return;
    }
    if (!out) fail_msg("%s failed on zero-size input: %s", r->op, mt_last_error());
    assert_on_test_device(out);
    assert_int_equal(mt_ndim(out), r->ndim);
    for (int d = 0; d < r->ndim; d++)
        if (mt_shape(out)[d] != r->shape[d])
            fail_msg("%s: dim %d is %lld, torch gives %lld", r->op, d, (long long)mt_shape(out)[d],
                     (long long)r->shape[d]);
    if (r->want == EMPTY) assert_int_equal(mt_numel(out), 0);
    check_values(r, out);
    if (r->backward) {
        mt_tensor *loss = mt_sum_all(out);
        assert_int_equal(mt_backward(loss, NULL), 0);
        check_grads(r, &in);
        mt_release(loss);
    }
    assert_no_error();
    mt_release(out);
    inputs_free(&in);
}

static bool listed(const char *name) {
    for (size_t i = 0; i < N_ROWS; i++)
        if (strcmp(rows[i].op, name) == 0) return true;
    for (size_t i = 0; i < sizeof internal_ops / sizeof *internal_ops; i++)
        if (strcmp(internal_ops[i], name) == 0) return true;
    return false;
}

/* Every op of ops.def has a row here (or is an internal backward kernel). */
static void check_listed(const char *name, const char *rule, void *ctx) {
    (void)rule;
    (void)ctx;
    if (!listed(name)) fail_msg("op \"%s\" of ops.def has no zero-size row in test_empty.c", name);
}

static void test_every_op_has_a_row(void **state) {
    (void)state;
    assert_true(mt_test_for_each_op(check_listed, NULL) > 0);
}

int main(void) {
    static struct CMUnitTest tests[N_ROWS + 1];
    static char names[N_ROWS][128];
    for (size_t i = 0; i < N_ROWS; i++) {
        if (rows[i].cpu_only && !mt_test_device_is_cpu()) {
            snprintf(names[i], sizeof names[i], "%s_%zu # SKIP %s", rows[i].op, i,
                     rows[i].cpu_only);
            tests[i] = (struct CMUnitTest){.name = names[i], .test_func = mt_test_not_run};
            continue;
        }
        snprintf(names[i], sizeof names[i], "%s_%zu", rows[i].op, i);
        tests[i] = (struct CMUnitTest){.name = names[i],
                                       .test_func = test_row,
                                       .setup_func = row_setup,
                                       .teardown_func = mt_test_teardown,
                                       .initial_state = (void *)&rows[i]};
    }
    tests[N_ROWS] = (struct CMUnitTest)MT_TEST(test_every_op_has_a_row);
    return MT_RUN_TESTS(tests);
}
