/* Autocast: the per-op decision table under O1/O2 for F16 and BF16 (checked against an
   independent copy of DESIGN.md's rules and against ops.def itself), real output dtypes of
   the main ops, custom lists, nesting, per-thread state, the cast cache, FP32 gradients of
   FP32 parameters, operator statistics and the numeric checker. */
#include <pthread.h>
#include "test_util.h"

/* ------------------------------------------------------------------ expected rules */

typedef enum { R_NONE, R_LOWER, R_FP32, R_PROMOTE, R_MIXED, R_FIXED, R_INTERNAL } rule;

typedef struct {
    const char *name;
    rule r;
} op_rule;

/* Every op of ops.def, with the rule DESIGN.md section 4 gives it. R_INTERNAL marks ops
   that are not public entry points (fused backward kernels, sign). */
static const op_rule expected[] = {
    {"add", R_PROMOTE},
    {"sub", R_PROMOTE},
    {"mul", R_PROMOTE},
    {"div", R_PROMOTE},
    {"pow", R_FP32},
    {"maximum", R_PROMOTE},
    {"minimum", R_PROMOTE},
    {"eq", R_NONE},
    {"ne", R_NONE},
    {"lt", R_NONE},
    {"le", R_NONE},
    {"gt", R_NONE},
    {"ge", R_NONE},
    {"where", R_PROMOTE},
    {"add_scalar", R_NONE},
    {"mul_scalar", R_NONE},
    {"pow_scalar", R_FP32},
    {"rsub_scalar", R_NONE},
    {"rdiv_scalar", R_FP32},
    {"neg", R_NONE},
    {"exp", R_FP32},
    {"log", R_FP32},
    {"sqrt", R_NONE},
    {"rsqrt", R_FP32},
    {"abs", R_NONE},
    {"sign", R_INTERNAL},
    {"relu", R_NONE},
    {"gelu", R_NONE},
    {"gelu_tanh", R_NONE},
    {"sigmoid", R_NONE},
    {"tanh", R_NONE},
    {"relu_backward", R_INTERNAL},
    {"gelu_backward", R_INTERNAL},
    {"gelu_tanh_backward", R_INTERNAL},
    {"sigmoid_backward", R_INTERNAL},
    {"tanh_backward", R_INTERNAL},
    {"sum", R_FP32},
    {"mean", R_FP32},
    {"max", R_NONE},
    {"softmax", R_FP32},
    {"log_softmax", R_FP32},
    /* normalisations: the activation keeps its dtype (weight and bias go to FP32) */
    {"layer_norm", R_MIXED},
    {"batch_norm", R_MIXED},
    {"batch_norm_act", R_MIXED},
    {"dropout", R_NONE},
    {"embedding", R_NONE},
    {"index_select", R_NONE},
    {"gather", R_NONE},
    {"argmax", R_NONE},
    {"matmul", R_LOWER},
    {"linear", R_LOWER},
    {"linear_act", R_LOWER},
    {"conv2d", R_LOWER},
    {"max_pool2d", R_NONE},
    {"avg_pool2d", R_NONE},
    {"adaptive_avg_pool2d", R_NONE},
    {"mse_loss", R_FP32},
    {"cross_entropy", R_FP32},
    {"cat", R_PROMOTE},
    {"stack", R_PROMOTE},
    {"cast", R_FIXED},
    {"to", R_FIXED},
    {"clone", R_FIXED},
    {"contiguous", R_FIXED},
    {"to_channels_last", R_FIXED},
    {"reshape", R_FIXED},
    {"view", R_FIXED},
    {"transpose", R_FIXED},
    {"permute", R_FIXED},
    {"slice", R_FIXED},
    {"expand", R_FIXED},
    {"squeeze", R_FIXED},
    {"unsqueeze", R_FIXED},
};
#define N_EXPECTED ((int)(sizeof expected / sizeof expected[0]))

static const op_rule *find_expected(const char *name) {
    for (int i = 0; i < N_EXPECTED; i++)
        if (strcmp(expected[i].name, name) == 0) return &expected[i];
    return NULL;
}

/* What DESIGN.md says op `r` computes in for a floating input `in`. */
static mt_dtype expect_dtype(rule r, mt_amp_level level, mt_dtype low, mt_dtype in) {
    if (in == MT_F64) return MT_F64; /* autocast never touches double */
    switch (r) {
    case R_LOWER:
        return low;
    case R_FP32:
        return MT_F32;
    case R_PROMOTE:
        return level == MT_AMP_O2 ? low : in;
    default:
        return in;
    }
}

static const mt_dtype floats[] = {MT_F32, MT_F16, MT_BF16, MT_F64};

/* ops.def and this table agree: every op is listed here with the same rule, so a new op or
   a changed rule cannot slip past this file. */
static void check_op_rule(const char *name, const char *r, void *ctx) {
    (void)ctx;
    const op_rule *e = find_expected(name);
    if (!e) fail_msg("op \"%s\" of ops.def has no row in test_amp.c", name);
    rule want = strcmp(r, "LOWER") == 0     ? R_LOWER
                : strcmp(r, "FP32") == 0    ? R_FP32
                : strcmp(r, "PROMOTE") == 0 ? R_PROMOTE
                : strcmp(r, "MIXED") == 0   ? R_MIXED
                : strcmp(r, "FIXED") == 0   ? R_FIXED
                                            : R_NONE;
    if (e->r != R_INTERNAL && e->r != want)
        fail_msg("op \"%s\": ops.def says %s, the design says otherwise", name, r);
}

static void test_table_matches_ops_def(void **state) {
    (void)state;
    assert_int_equal(mt_test_for_each_op(check_op_rule, NULL), N_EXPECTED);
}

static void check_table(mt_dtype low, mt_amp_level level) {
    mt_autocast_begin(low, level);
    assert_true(mt_autocast_enabled());
    assert_int_equal(mt_autocast_dtype(), low);
    for (int i = 0; i < N_EXPECTED; i++) {
        for (int k = 0; k < 4; k++) {
            mt_dtype in = floats[k];
            mt_dtype want =
                expected[i].r == R_INTERNAL ? in : expect_dtype(expected[i].r, level, low, in);
            if (expected[i].r == R_INTERNAL) continue;
            mt_dtype got = mt_autocast_compute_dtype(expected[i].name, in);
            if (got != want)
                fail_msg("%s %s, %s input: computes in %s, expected %s", expected[i].name,
                         level == MT_AMP_O1 ? "O1" : "O2", mt_dtype_name(in), mt_dtype_name(got),
                         mt_dtype_name(want));
        }
        /* integer inputs are never cast */
        if (expected[i].r != R_INTERNAL)
            assert_int_equal(mt_autocast_compute_dtype(expected[i].name, MT_I64), MT_I64);
    }
    mt_autocast_end();
    assert_false(mt_autocast_enabled());
    assert_no_error();
}

static void test_table_o1_f16(void **state) {
    (void)state;
    check_table(MT_F16, MT_AMP_O1);
}
static void test_table_o1_bf16(void **state) {
    (void)state;
    check_table(MT_BF16, MT_AMP_O1);
}
static void test_table_o2_f16(void **state) {
    (void)state;
    check_table(MT_F16, MT_AMP_O2);
}
static void test_table_o2_bf16(void **state) {
    (void)state;
    check_table(MT_BF16, MT_AMP_O2);
}

static void test_table_outside_region(void **state) {
    (void)state;
    assert_false(mt_autocast_enabled());
    assert_int_equal(mt_autocast_dtype(), MT_F32);
    for (int i = 0; i < N_EXPECTED; i++)
        for (int k = 0; k < 4; k++)
            assert_int_equal(mt_autocast_compute_dtype(expected[i].name, floats[k]), floats[k]);
    assert_no_error();
    assert_int_equal(mt_autocast_compute_dtype("no_such_op", MT_F32), MT_F32);
    assert_error(MT_ERR_INVALID, "unknown op \"no_such_op\"");
    assert_int_equal(mt_autocast_compute_dtype(NULL, MT_F32), MT_F32);
    assert_error(MT_ERR_NULL, "mt_autocast_compute_dtype: arg 1: op name is NULL");
}

/* ------------------------------------------------------------------ real output dtypes */

/* A tensor of dtype dt drawn from the normal distribution. */
static mt_tensor *randn(mt_dtype dt, int ndim, const int64_t *shape) {
    mt_tensor *t = mt_randn(ndim, shape, MT_F32, mt_test_device());
    mt_tensor *c = mt_cast(t, dt);
    mt_test_drop(t);
    return c;
}

static void expect_dt(mt_tensor *t, mt_dtype want, const char *what) {
    if (!t) fail_msg("%s: NULL (%s)", what, mt_last_error());
    if (mt_dtype_of(t) != want)
        fail_msg("%s: output %s, expected %s", what, mt_dtype_name(mt_dtype_of(t)),
                 mt_dtype_name(want));
}

/* Runs the main ops inside a region and checks each output dtype against both the design's
   expectation and mt_autocast_compute_dtype. */
static void run_ops(mt_dtype low, mt_amp_level level) {
    mt_manual_seed(1);
    mt_scope_begin();
    mt_tensor *x32 = randn(MT_F32, MT_SHAPE(4, 8));
    mt_tensor *x16 = randn(low, MT_SHAPE(4, 8));
    mt_tensor *w = randn(MT_F32, MT_SHAPE(3, 8));
    mt_tensor *b = randn(MT_F32, MT_SHAPE(3));
    mt_tensor *w2 = randn(MT_F32, MT_SHAPE(8, 3));
    mt_tensor *labels =
        mt_from_data((const int64_t[]){0, 2, 1, 2}, MT_I64, MT_SHAPE(4), mt_test_device());
    bool o2 = level == MT_AMP_O2;
    mt_autocast_begin(low, level);
    struct {
        const char *name;
        mt_tensor *out;
        mt_dtype want;
        mt_dtype widest; /* widest floating input */
    } rows[] = {
        {"matmul", mt_matmul(x32, w2), low, MT_F32},
        {"linear", mt_linear(x32, w, b), low, MT_F32},
        {"linear", mt_linear(x16, w, NULL), low, MT_F32},
        {"linear_act", mt_linear_act(x32, w, b, MT_ACT_GELU), low, MT_F32},
        {"add", mt_add(x32, x16), o2 ? low : MT_F32, MT_F32},
        {"add", mt_add(x16, x16), low, low},
        {"sub", mt_sub(x16, x32), o2 ? low : MT_F32, MT_F32},
        {"mul", mt_mul(x32, x32), o2 ? low : MT_F32, MT_F32},
        {"div", mt_div(x16, x16), low, low},
        {"exp", mt_exp(x16), MT_F32, low},
        {"log", mt_log(x16), MT_F32, low},
        {"pow_scalar", mt_pow_scalar(x16, 2.0), MT_F32, low},
        {"sum", mt_sum_all(x16), MT_F32, low},
        {"sum", mt_sum(x16, MT_DIMS(1), false), MT_F32, low},
        {"mean", mt_mean_all(x16), MT_F32, low},
        {"softmax", mt_softmax(x16, -1), MT_F32, low},
        {"log_softmax", mt_log_softmax(x16, 1), MT_F32, low},
        {"max", mt_max(x16, MT_DIMS(0), false), low, low},
        {"relu", mt_relu(x16), low, low},
        {"relu", mt_relu(x32), MT_F32, MT_F32},
        {"gelu", mt_gelu(x16), low, low},
        {"sigmoid", mt_sigmoid(x16), low, low},
        {"tanh", mt_tanh(x32), MT_F32, MT_F32},
        {"neg", mt_neg(x16), low, low},
        {"mul_scalar", mt_mul_scalar(x16, 3.0), low, low},
        {"cast", mt_cast(x32, low), low, MT_F32},
        {"cast", mt_cast(x16, MT_F32), MT_F32, low},
        {"reshape", mt_reshape(x16, MT_SHAPE(8, 4)), low, low},
        {"transpose", mt_transpose(x16, 0, 1), low, low},
        {"cross_entropy", mt_cross_entropy(x16, labels), MT_F32, low},
        {"cross_entropy", mt_cross_entropy(mt_linear(x32, w, b), labels), MT_F32, low},
        {"mse_loss", mt_mse_loss(x16, x16), MT_F32, low},
        {"cat", mt_cat((mt_tensor *[]){x16, x16}, 2, 0), low, low},
        {"cat", mt_cat((mt_tensor *[]){x32, x16}, 2, 0), o2 ? low : MT_F32, MT_F32},
        {"where", mt_where(mt_gt(x16, x16), x16, x32), o2 ? low : MT_F32, MT_F32},
    };
    mt_tensor *cmp = mt_lt(x16, x16);
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        char what[96];
        snprintf(what, sizeof what, "%s %s %s row %zu", rows[i].name, mt_dtype_name(low),
                 o2 ? "O2" : "O1", i);
        expect_dt(rows[i].out, rows[i].want, what);
        mt_dtype decided = mt_autocast_compute_dtype(rows[i].name, rows[i].widest);
        if (strcmp(rows[i].name, "cast") != 0 && decided != rows[i].want)
            fail_msg("%s: mt_autocast_compute_dtype says %s", what, mt_dtype_name(decided));
    }
    expect_dt(cmp, MT_BOOL, "lt");
    mt_autocast_end();
    /* the linear output is right to low precision */
    mt_tensor *ref = mt_linear(x32, w, b);
    double *r = mt_test_values(ref);
    assert_tensor_close(rows[1].out, r, 12, 0.05, 0.02);
    free(r);
    assert_no_error();
    mt_scope_end();
}

static void test_ops_o1_f16(void **state) {
    (void)state;
    run_ops(MT_F16, MT_AMP_O1);
}
static void test_ops_o1_bf16(void **state) {
    (void)state;
    run_ops(MT_BF16, MT_AMP_O1);
}
static void test_ops_o2_f16(void **state) {
    (void)state;
    run_ops(MT_F16, MT_AMP_O2);
}
static void test_ops_o2_bf16(void **state) {
    (void)state;
    run_ops(MT_BF16, MT_AMP_O2);
}

/* F64 passes through any region untouched, and outside a region nothing is cast. */
static void test_ops_f64_and_no_region(void **state) {
    (void)state;
    mt_scope_begin();
    mt_tensor *a = randn(MT_F64, MT_SHAPE(3, 3));
    mt_tensor *x = randn(MT_F32, MT_SHAPE(3, 3));
    mt_autocast_begin(MT_F16, MT_AMP_O2);
    expect_dt(mt_matmul(a, a), MT_F64, "matmul f64");
    expect_dt(mt_exp(a), MT_F64, "exp f64");
    mt_autocast_end();
    expect_dt(mt_matmul(x, x), MT_F32, "matmul outside");
    assert_no_error();
    mt_scope_end();
}

/* ------------------------------------------------------------------ custom lists */

static void test_custom_lists(void **state) {
    (void)state;
    mt_scope_begin();
    mt_tensor *x = randn(MT_F32, MT_SHAPE(2, 4));
    mt_tensor *w = randn(MT_F32, MT_SHAPE(4, 4));
    assert_int_equal(mt_autocast_set_lists((const char *[]){"exp", "sum", NULL},
                                           (const char *[]){"matmul", NULL}),
                     0);
    mt_autocast_begin(MT_F16, MT_AMP_O1);
    assert_int_equal(mt_autocast_compute_dtype("exp", MT_F32), MT_F16);
    assert_int_equal(mt_autocast_compute_dtype("sum", MT_BF16), MT_F16);
    assert_int_equal(mt_autocast_compute_dtype("matmul", MT_F16), MT_F32);
    assert_int_equal(mt_autocast_compute_dtype("linear", MT_F32), MT_F16); /* untouched */
    expect_dt(mt_exp(x), MT_F16, "white exp");
    expect_dt(mt_matmul(x, w), MT_F32, "black matmul");
    mt_autocast_end();
    /* O2 too: black beats the level */
    mt_autocast_begin(MT_BF16, MT_AMP_O2);
    expect_dt(mt_matmul(x, w), MT_F32, "black matmul O2");
    assert_int_equal(mt_autocast_compute_dtype("add", MT_F32), MT_BF16);
    mt_autocast_end();

    /* ops that run in their input's dtype follow the lists too: the indexing ops and
       dropout, forward and backward (the gradient reaches the FP32 table in FP32) */
    assert_int_equal(mt_autocast_set_lists((const char *[]){"embedding", "index_select", "gather",
                                                            "dropout", "argmax", NULL},
                                           NULL),
                     0);
    mt_tensor *table = randn(MT_F32, MT_SHAPE(5, 4));
    mt_set_requires_grad(table, true);
    mt_tensor *idx = mt_from_data((const int64_t[]){4, 0, 4}, MT_I64, MT_SHAPE(3), MT_CPU);
    mt_tensor *index = mt_to(idx, mt_test_device());
    mt_tensor *gidx = mt_zeros(MT_SHAPE(5, 1), MT_I64, mt_test_device());
    mt_tensor *near =
        mt_to(mt_from_data((const float[]){1.0001f, 1.0002f}, MT_F32, MT_SHAPE(2), MT_CPU),
              mt_test_device());
    assert_true(mt_item(mt_argmax(near, 0, false)) == 1); /* outside a region */
    for (int level = MT_AMP_O1; level <= MT_AMP_O2; level++) {
        mt_autocast_begin(MT_F16, (mt_amp_level)level);
        mt_tensor *rows[] = {mt_embedding(table, index), mt_index_select(table, 0, index),
                             mt_gather(table, 1, gidx), mt_dropout(table, 0.5, true)};
        const char *names[] = {"white embedding", "white index_select", "white gather",
                               "white dropout"};
        mt_tensor *loss = NULL;
        for (int i = 0; i < 4; i++) {
            expect_dt(rows[i], MT_F16, names[i]);
            mt_tensor *part = mt_sum_all(rows[i]);
            loss = loss ? mt_add(loss, part) : part;
        }
        /* 1.0001 and 1.0002 are one value in F16: argmax then picks the first */
        mt_tensor *am = mt_argmax(near, 0, false);
        assert_true(mt_item(am) == 0);
        mt_autocast_end();
        assert_int_equal(mt_backward(loss, NULL), 0);
        expect_dt(mt_grad(table), MT_F32, "grad of the table");
        mt_zero_grad(table);
    }
    mt_autocast_begin(MT_F16, MT_AMP_O1);
    assert_int_equal(mt_autocast_compute_dtype("embedding", MT_F32), MT_F16);
    mt_autocast_end();

    /* a cast, copy or view has its own dtype: the lists refuse one, naming it */
    assert_true(mt_autocast_set_lists((const char *[]){"exp", "clone", NULL}, NULL) < 0);
    assert_error(MT_ERR_INVALID, "arg 1: \"clone\" is a cast, copy or view");
    assert_true(mt_autocast_set_lists(NULL, (const char *[]){"reshape", NULL}) < 0);
    assert_error(MT_ERR_INVALID, "arg 2: \"reshape\" is a cast, copy or view");
    mt_autocast_begin(MT_F16, MT_AMP_O1); /* the lists above are still in place */
    assert_int_equal(mt_autocast_compute_dtype("embedding", MT_F32), MT_F16);
    assert_int_equal(mt_autocast_compute_dtype("exp", MT_F32), MT_F32);
    mt_autocast_end();
    assert_int_equal(mt_autocast_set_lists((const char *[]){"exp", "sum", NULL},
                                           (const char *[]){"matmul", NULL}),
                     0);

    /* errors leave the previous lists in place */
    assert_true(
        mt_autocast_set_lists((const char *[]){"exp", NULL}, (const char *[]){"exp", NULL}) < 0);
    assert_error(MT_ERR_INVALID, "\"exp\" is in both");
    assert_true(mt_autocast_set_lists((const char *[]){"expp", NULL}, NULL) < 0);
    assert_error(MT_ERR_INVALID, "unknown op \"expp\"");
    assert_true(mt_autocast_set_lists(NULL, (const char *[]){"softmax", "nope", NULL}) < 0);
    assert_error(MT_ERR_INVALID, "arg 2: unknown op \"nope\"");
    mt_autocast_begin(MT_F16, MT_AMP_O1);
    assert_int_equal(mt_autocast_compute_dtype("matmul", MT_F32), MT_F32);
    mt_autocast_end();

    /* clearing restores the defaults */
    assert_int_equal(mt_autocast_set_lists(NULL, NULL), 0);
    mt_autocast_begin(MT_F16, MT_AMP_O1);
    assert_int_equal(mt_autocast_compute_dtype("exp", MT_F32), MT_F32);
    assert_int_equal(mt_autocast_compute_dtype("matmul", MT_F32), MT_F16);
    mt_autocast_end();
    assert_no_error();
    mt_scope_end();
}

/* ------------------------------------------------------------------ nesting */

static void test_nesting(void **state) {
    (void)state;
    mt_scope_begin();
    mt_tensor *x = randn(MT_F32, MT_SHAPE(2, 2));
    mt_autocast_begin(MT_F16, MT_AMP_O1);
    expect_dt(mt_matmul(x, x), MT_F16, "outer");
    mt_autocast_begin(MT_F32, MT_AMP_O1); /* disables */
    assert_false(mt_autocast_enabled());
    assert_int_equal(mt_autocast_dtype(), MT_F32);
    expect_dt(mt_matmul(x, x), MT_F32, "disabled inner");
    mt_autocast_begin(MT_BF16, MT_AMP_O2); /* re-enabled, other dtype and level */
    expect_dt(mt_matmul(x, x), MT_BF16, "bf16 inner");
    expect_dt(mt_add(x, x), MT_BF16, "O2 add inner");
    mt_autocast_end();
    expect_dt(mt_matmul(x, x), MT_F32, "back in disabled");
    mt_autocast_end();
    assert_true(mt_autocast_enabled());
    assert_int_equal(mt_autocast_dtype(), MT_F16);
    expect_dt(mt_matmul(x, x), MT_F16, "back in outer");
    expect_dt(mt_add(x, x), MT_F32, "O1 add outer");
    mt_autocast_end();
    assert_false(mt_autocast_enabled());
    expect_dt(mt_matmul(x, x), MT_F32, "after");
    assert_no_error();
    mt_scope_end();
}

static void test_region_errors(void **state) {
    (void)state;
    mt_autocast_end();
    assert_error(MT_ERR_STATE, "no autocast region is open");
    mt_autocast_begin(MT_F64, MT_AMP_O1);
    assert_error(MT_ERR_DTYPE, "low dtype must be f16 or bf16");
    assert_false(mt_autocast_enabled()); /* a bad region is a disabled one, still to end */
    mt_autocast_end();
    mt_autocast_begin(MT_F16, (mt_amp_level)7);
    assert_error(MT_ERR_INVALID, "level 7");
    assert_false(mt_autocast_enabled());
    mt_autocast_end();
    assert_no_error();
    /* 64 regions deep: one more cannot open, and is a disabled region like any failed
       begin; the GradScaler and clipping still work there (they take no nesting slot) */
    for (int i = 0; i < 64; i++) mt_autocast_begin(MT_F16, MT_AMP_O2);
    assert_no_error();
    mt_autocast_begin(MT_F32, MT_AMP_O1);
    assert_error(MT_ERR_STATE, "regions nest at most 64 deep");
    assert_false(mt_autocast_enabled());
    mt_autocast_end();
    assert_true(mt_autocast_enabled());
    mt_grad_scaler *s = mt_grad_scaler_new(NULL);
    mt_tensor *loss = mt_full(MT_SHAPE(1), MT_F32, mt_test_device(), 2.0);
    mt_tensor *scaled = mt_grad_scaler_scale(s, loss);
    assert_no_error();
    assert_int_equal(mt_dtype_of(scaled), MT_F32);
    assert_true(mt_item(scaled) == 131072.0);
    mt_release(scaled);
    mt_release(loss);
    mt_grad_scaler_free(s);
    for (int i = 0; i < 64; i++) mt_autocast_end();
    assert_no_error();
    assert_false(mt_autocast_enabled());
}

/* Out of memory inside the cast cache: the call fails and changes nothing, so a retry gives
   the twin's gradients bit for bit (a cast left out of the cache made W's two uses two cast
   nodes, whose F16 gradients then summed in F32: other bits than the twin's). */
static void reuse_w_step(int64_t fail_at, float *gw) {
    mt_scope_begin();
    mt_manual_seed(5);
    mt_tensor *w = mt_randn(MT_SHAPE(6, 6), MT_F32, mt_test_device());
    mt_set_requires_grad(w, true);
    mt_tensor *x = mt_randn(MT_SHAPE(4, 6), MT_F32, mt_test_device());
    mt_autocast_begin(MT_F16, MT_AMP_O1);
    mt_debug_fail_nth_alloc(fail_at);
    mt_tensor *y1 = mt_linear(x, w, NULL);
    mt_debug_fail_nth_alloc(0);
    if (!y1) {
        assert_error(MT_ERR_OOM, "mt_linear");
        y1 = mt_linear(x, w, NULL);
    }
    assert_no_error();
    mt_tensor *y2 = mt_linear(y1, w, NULL);
    mt_autocast_end();
    assert_int_equal(mt_backward(mt_sum_all(y2), NULL), 0);
    assert_int_equal(mt_copy_to_host(mt_grad(w), gw, 36 * sizeof *gw), 0);
    mt_scope_end();
}

static void test_cast_cache_out_of_memory(void **state) {
    (void)state;
    float twin[36], got[36];
    reuse_w_step(0, twin);
    for (int64_t n = 1; n <= 12; n++) {
        reuse_w_step(n, got);
        if (memcmp(got, twin, sizeof twin) != 0)
            fail_msg("allocation %lld failed: W's gradient differs from the twin's", (long long)n);
    }
}

/* ------------------------------------------------------------------ threads */

typedef struct {
    mt_dtype low;
    mt_amp_level level;
    pthread_barrier_t *barrier;
    mt_dtype matmul_decided, add_decided, matmul_out, exp_out;
    bool enabled_before, ok;
    int cache_size;
} thread_job;

static void *thread_main(void *arg) {
    thread_job *j = arg;
    j->enabled_before = mt_autocast_enabled();
    mt_tensor *x = mt_ones(MT_SHAPE(2, 2), MT_F32, mt_test_device());
    mt_tensor *w = mt_ones(MT_SHAPE(2, 2), MT_F32, mt_test_device());
    mt_set_requires_grad(w, true);
    if (j->low == MT_BF16) mt_autocast_set_lists((const char *[]){"exp", NULL}, NULL);
    mt_autocast_begin(j->low, j->level);
    pthread_barrier_wait(j->barrier); /* both regions open at the same time */
    j->matmul_decided = mt_autocast_compute_dtype("matmul", MT_F32);
    j->add_decided = mt_autocast_compute_dtype("add", MT_F32);
    mt_tensor *y = mt_matmul(x, w), *e = mt_exp(x);
    j->matmul_out = y ? mt_dtype_of(y) : MT_DTYPE_COUNT;
    j->exp_out = e ? mt_dtype_of(e) : MT_DTYPE_COUNT;
    j->cache_size = mt_amp_cast_cache_size();
    pthread_barrier_wait(j->barrier);
    mt_release(y);
    mt_release(e);
    mt_autocast_end();
    mt_autocast_set_lists(NULL, NULL);
    j->ok = mt_last_status() == MT_OK && mt_amp_cast_cache_size() == 0;
    mt_release(x);
    mt_release(w);
    return NULL;
}

static void test_thread_isolation(void **state) {
    (void)state;
    pthread_barrier_t barrier;
    pthread_barrier_init(&barrier, NULL, 3);
    thread_job a = {.low = MT_F16, .level = MT_AMP_O1, .barrier = &barrier};
    thread_job b = {.low = MT_BF16, .level = MT_AMP_O2, .barrier = &barrier};
    pthread_t ta, tb;
    mt_autocast_begin(MT_F16, MT_AMP_O2); /* the main thread's own region */
    assert_int_equal(pthread_create(&ta, NULL, thread_main, &a), 0);
    assert_int_equal(pthread_create(&tb, NULL, thread_main, &b), 0);
    pthread_barrier_wait(&barrier);
    /* the main thread's decisions ignore the other threads' regions and lists */
    assert_int_equal(mt_autocast_compute_dtype("add", MT_F32), MT_F16);
    assert_int_equal(mt_autocast_compute_dtype("exp", MT_F32), MT_F32);
    pthread_barrier_wait(&barrier);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    mt_autocast_end();
    pthread_barrier_destroy(&barrier);

    assert_false(a.enabled_before); /* a new thread starts outside any region */
    assert_false(b.enabled_before);
    assert_int_equal(a.matmul_decided, MT_F16);
    assert_int_equal(a.add_decided, MT_F32);
    assert_int_equal(a.matmul_out, MT_F16);
    assert_int_equal(a.exp_out, MT_F32);
    assert_int_equal(b.matmul_decided, MT_BF16);
    assert_int_equal(b.add_decided, MT_BF16);
    assert_int_equal(b.matmul_out, MT_BF16);
    assert_int_equal(b.exp_out, MT_BF16); /* thread b's own white list */
    assert_int_equal(a.cache_size, 1);    /* each thread's own cache holds its w */
    assert_int_equal(b.cache_size, 1);
    assert_true(a.ok);
    assert_true(b.ok);
    assert_int_equal(mt_amp_cast_cache_size(), 0);
    assert_no_error();
}

/* ------------------------------------------------------------------ cast cache */

static void test_cast_cache(void **state) {
    (void)state;
    mt_scope_begin();
    mt_tensor *x = randn(MT_F32, MT_SHAPE(4, 8));
    mt_tensor *w = randn(MT_F32, MT_SHAPE(8, 3));
    mt_set_requires_grad(w, true);
    assert_int_equal(mt_amp_cast_cache_size(), 0);
    int64_t hits0 = mt_amp_cast_cache_hits();
    mt_autocast_begin(MT_F16, MT_AMP_O1);
    mt_tensor *y1 = mt_matmul(x, w);
    assert_int_equal(mt_amp_cast_cache_size(), 1); /* x needs no grad: not cached */
    assert_int_equal(mt_amp_cast_cache_hits(), hits0);
    mt_autocast_begin(MT_F16, MT_AMP_O1); /* an inner region shares the cache */
    mt_tensor *y2 = mt_matmul(x, w);
    mt_autocast_end();
    assert_int_equal(mt_amp_cast_cache_size(), 1);
    assert_int_equal(mt_amp_cast_cache_hits(), hits0 + 1);
    double *v1 = mt_test_values(y1);
    assert_tensor_close(y2, v1, 12, 0, 0);
    /* a BF16 region inside wants another cast of the same parameter */
    mt_autocast_begin(MT_BF16, MT_AMP_O1);
    expect_dt(mt_matmul(x, w), MT_BF16, "bf16 inner matmul");
    mt_autocast_end();
    assert_int_equal(mt_amp_cast_cache_size(), 2);

    /* an in-place change of the parameter is seen: recast, not a stale hit */
    bool prev = mt_set_grad_enabled(false);
    assert_int_equal(mt_mul_scalar_inplace(w, 2.0), 0);
    mt_set_grad_enabled(prev);
    int64_t hits1 = mt_amp_cast_cache_hits();
    mt_tensor *y3 = mt_matmul(x, w);
    assert_int_equal(mt_amp_cast_cache_hits(), hits1);
    for (int i = 0; i < 12; i++) v1[i] *= 2;
    assert_tensor_close(y3, v1, 12, 0, 0); /* exact: doubling commutes with f16 rounding */
    free(v1);
    mt_matmul(x, w);
    assert_int_equal(mt_amp_cast_cache_hits(), hits1 + 1);
    assert_int_equal(mt_amp_cast_cache_size(), 2);
    mt_autocast_end();
    assert_int_equal(mt_amp_cast_cache_size(), 0); /* outermost end empties it */

    /* with grad mode off nothing is cached (no parameter gradient to route) */
    prev = mt_set_grad_enabled(false);
    mt_autocast_begin(MT_F16, MT_AMP_O1);
    mt_matmul(x, w);
    assert_int_equal(mt_amp_cast_cache_size(), 0);
    mt_autocast_end();
    mt_set_grad_enabled(prev);
    assert_no_error();
    mt_scope_end();
}

/* ------------------------------------------------------------------ gradients */

/* Under O1 an FP32 parameter used by a low-precision matmul gets an FP32 gradient, equal to
   the FP32 gradient within low-precision error. */
static void check_grad_dtype(mt_dtype low) {
    mt_manual_seed(7);
    mt_scope_begin();
    mt_tensor *x = randn(MT_F32, MT_SHAPE(5, 4));
    mt_tensor *t = randn(MT_F32, MT_SHAPE(5, 3));
    mt_tensor *w = randn(MT_F32, MT_SHAPE(3, 4));
    mt_tensor *b = randn(MT_F32, MT_SHAPE(3));
    mt_set_requires_grad(w, true);
    mt_set_requires_grad(b, true);
    mt_autocast_begin(low, MT_AMP_O1);
    mt_tensor *y = mt_linear(x, w, b);
    expect_dt(y, low, "linear");
    mt_tensor *h = mt_relu(y);
    mt_tensor *loss = mt_mse_loss(h, t);
    expect_dt(loss, MT_F32, "mse_loss");
    mt_autocast_end();
    assert_int_equal(mt_backward(loss, NULL), 0);
    mt_tensor *gw = mt_grad(w), *gb = mt_grad(b);
    expect_dt(gw, MT_F32, "grad w");
    expect_dt(gb, MT_F32, "grad b");
    double *vw = mt_test_values(gw), *vb = mt_test_values(gb);
    mt_zero_grad(w);
    mt_zero_grad(b);
    /* the FP32 reference */
    mt_tensor *ref = mt_mse_loss(mt_relu(mt_linear(x, w, b)), t);
    assert_int_equal(mt_backward(ref, NULL), 0);
    double tol = low == MT_BF16 ? 0.05 : 0.01;
    assert_tensor_close(mt_grad(w), vw, 12, tol, tol);
    assert_tensor_close(mt_grad(b), vb, 3, tol, tol);
    free(vw);
    free(vb);
    mt_zero_grad(w);
    mt_zero_grad(b);
    assert_no_error();
    mt_scope_end();
}

static void test_grad_dtype_f16(void **state) {
    (void)state;
    check_grad_dtype(MT_F16);
}
static void test_grad_dtype_bf16(void **state) {
    (void)state;
    check_grad_dtype(MT_BF16);
}

/* A hook that sees autocast off during backward, opens a region of its own and leaves it
   open (dropped with the backward's suspension). */
static int hook_sees_autocast_off(mt_tensor *leaf, void *user) {
    (void)leaf;
    *(bool *)user = mt_autocast_enabled();
    mt_autocast_begin(MT_BF16, MT_AMP_O2);
    return 0;
}

/* Backward called inside a region runs each formula in the dtypes its forward chose (torch
   does not autocast the backward): max_all's gradient, made of div and mul, stays FP32 under
   O2 and with both in the white list, the accumulation of two paths too; the region is
   there again afterwards. */
static void test_backward_inside_region(void **state) {
    (void)state;
    mt_scope_begin();
    mt_tensor *x = mt_ones(MT_SHAPE(3), MT_F32, mt_test_device());
    mt_set_requires_grad(x, true);
    bool seen = true;
    assert_true(mt_tensor_register_grad_ready_hook(x, hook_sees_autocast_off, &seen) > 0);
    assert_int_equal(mt_autocast_set_lists((const char *[]){"div", "mul", "add", NULL}, NULL), 0);
    for (int level = MT_AMP_O1; level <= MT_AMP_O2; level++) {
        mt_tensor *loss = mt_add(mt_max_all(x), mt_mul_scalar(mt_sum_all(x), 1.0 / 3));
        mt_autocast_begin(MT_F16, (mt_amp_level)level);
        assert_int_equal(mt_backward(loss, NULL), 0);
        assert_true(mt_autocast_enabled() && mt_autocast_dtype() == MT_F16);
        mt_autocast_end();
        assert_false(seen);
        expect_dt(mt_grad(x), MT_F32, "grad x");
        /* 1/3 + 1/3 in FP32; through FP16 it would be 0.66650390625 */
        float want = 1.0f / 3 + 1.0f / 3;
        assert_tensor_close(mt_grad(x), ((const double[]){want, want, want}), 3, 0, 0);
        mt_zero_grad(x);
    }
    assert_int_equal(mt_autocast_set_lists(NULL, NULL), 0);
    assert_false(mt_autocast_enabled());
    assert_no_error();
    mt_scope_end();
}

/* ------------------------------------------------------------------ statistics */

static void test_stats(void **state) {
    (void)state;
    mt_scope_begin();
    mt_tensor *x = randn(MT_F32, MT_SHAPE(4, 8));
    mt_tensor *w = randn(MT_F32, MT_SHAPE(8, 3));
    mt_tensor *d = randn(MT_F64, MT_SHAPE(2));
    mt_set_requires_grad(w, true);
    mt_amp_stats_reset();
    mt_amp_stats_enable(true);
    mt_autocast_begin(MT_F16, MT_AMP_O1);
    mt_tensor *y = mt_matmul(x, w);
    mt_matmul(x, w);
    mt_exp(y);
    mt_relu(y);
    mt_autocast_begin(MT_BF16, MT_AMP_O1);
    mt_matmul(x, w);
    mt_autocast_end();
    mt_autocast_end();
    mt_exp(d);
    mt_amp_stats_enable(false);
    mt_exp(d); /* not counted */
    assert_int_equal(mt_amp_stats_count("matmul", MT_F16), 2);
    assert_int_equal(mt_amp_stats_count("matmul", MT_BF16), 1);
    assert_int_equal(mt_amp_stats_count("matmul", MT_F32), 0);
    assert_int_equal(mt_amp_stats_count("exp", MT_F32), 1);
    assert_int_equal(mt_amp_stats_count("exp", MT_F64), 1);
    assert_int_equal(mt_amp_stats_count("relu", MT_F16), 1);
    assert_int_equal(mt_amp_stats_count("sigmoid", MT_F32), 0);
    /* casts: x twice to f16 and once to bf16, w once per dtype (cached), y to f32 for exp */
    assert_int_equal(mt_amp_stats_count("cast", MT_F16), 3);
    assert_int_equal(mt_amp_stats_count("cast", MT_BF16), 2);
    assert_int_equal(mt_amp_stats_count("cast", MT_F32), 1);
    assert_no_error();

    FILE *f = tmpfile();
    assert_non_null(f);
    assert_int_equal(mt_amp_stats_print(f), 0);
    rewind(f);
    char line[256];
    int lines = 0;
    size_t width = 0;
    bool saw_matmul = false, saw_header = false;
    while (fgets(line, sizeof line, f)) {
        lines++;
        if (lines == 1) continue; /* title */
        if (strstr(line, "sigmoid")) fail_msg("sigmoid was never called: %s", line);
        if (lines == 2) {
            saw_header = strncmp(line, "op ", 3) == 0 && strstr(line, "f32") &&
                         strstr(line, "f16") && strstr(line, "bf16") && strstr(line, "f64");
            width = strlen(line);
        } else if (strlen(line) != width) {
            fail_msg("row not aligned with the header: \"%s\"", line);
        }
        long long c32, c16, cbf, c64, other;
        char name[64];
        if (sscanf(line, "%63s %lld %lld %lld %lld %lld", name, &c32, &c16, &cbf, &c64, &other) ==
                6 &&
            strcmp(name, "matmul") == 0) {
            saw_matmul = true;
            assert_int_equal(c32, 0);
            assert_int_equal(c16, 2);
            assert_int_equal(cbf, 1);
            assert_int_equal(c64, 0);
        }
    }
    fclose(f);
    assert_true(saw_header);
    assert_true(saw_matmul);
    assert_int_equal(lines, 2 + 4); /* matmul, exp, relu, cast */

    mt_amp_stats_reset();
    assert_int_equal(mt_amp_stats_count("matmul", MT_F16), 0);
    f = tmpfile();
    assert_int_equal(mt_amp_stats_print(f), 0);
    rewind(f);
    int n = 0;
    while (fgets(line, sizeof line, f)) n += strstr(line, "no calls") != NULL;
    fclose(f);
    assert_int_equal(n, 1);

    assert_int_equal(mt_amp_stats_count("matmull", MT_F16), -1);
    assert_error(MT_ERR_INVALID, "unknown op \"matmull\"");
    assert_int_equal(mt_amp_stats_count("matmul", (mt_dtype)42), -1);
    assert_error(MT_ERR_DTYPE, "invalid dtype 42");
    assert_true(mt_amp_stats_print(NULL) < 0);
    assert_error(MT_ERR_NULL, "FILE is NULL");
    mt_scope_end();
}

typedef struct {
    int reps;
} stats_job;

static void *stats_thread(void *arg) {
    stats_job *j = arg;
    mt_tensor *x = mt_ones(MT_SHAPE(4), MT_F32, mt_test_device());
    for (int i = 0; i < j->reps; i++) mt_release(mt_neg(x));
    mt_release(x);
    return NULL;
}

/* Counters are global and atomic: concurrent threads lose no call. */
static void test_stats_threads(void **state) {
    (void)state;
    mt_amp_stats_reset();
    mt_amp_stats_enable(true);
    stats_job j = {2000};
    pthread_t t[4];
    for (int i = 0; i < 4; i++) assert_int_equal(pthread_create(&t[i], NULL, stats_thread, &j), 0);
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    mt_amp_stats_enable(false);
    assert_int_equal(mt_amp_stats_count("neg", MT_F32), 4 * 2000);
    mt_amp_stats_reset();
    assert_no_error();
}

/* ------------------------------------------------------------------ numeric checker */

static void test_numerics_checker(void **state) {
    (void)state;
    mt_scope_begin();
    mt_tensor *x = mt_full(MT_SHAPE(2, 3), MT_F16, mt_test_device(), 100.0);
    mt_tensor *ok = mt_full(MT_SHAPE(2, 3), MT_F16, mt_test_device(), 1.0);
    mt_amp_numerics_reset();
    mt_amp_check_numerics(true);
    mt_exp(ok);
    mt_add(ok, ok);
    assert_false(mt_amp_numerics_failed());
    assert_string_equal(mt_amp_numerics_report(), "");

    mt_tensor *e = mt_exp(x); /* e^100 overflows f16 */
    assert_non_null(e);
    mt_tensor *z = mt_mul_scalar(e, 0.0); /* nan: a later failure, not recorded */
    assert_non_null(z);
    assert_true(mt_amp_numerics_failed());
    assert_string_equal(mt_amp_numerics_report(),
                        "mt_exp: output f16 [2, 3] has inf/nan; inputs: f16 [2, 3]");
    assert_no_error(); /* a diagnostic, never the sticky error */

    mt_amp_numerics_reset();
    assert_false(mt_amp_numerics_failed());
    assert_string_equal(mt_amp_numerics_report(), "");

    /* under autocast exp runs in FP32 where e^20 is finite; the cast back to f16 is what
       overflows */
    mt_tensor *x20 = mt_full(MT_SHAPE(2, 3), MT_F16, mt_test_device(), 20.0);
    mt_autocast_begin(MT_F16, MT_AMP_O1);
    mt_tensor *e32 = mt_exp(x20);
    expect_dt(e32, MT_F32, "exp under autocast");
    assert_false(mt_amp_numerics_failed());
    mt_tensor *b = mt_ones(MT_SHAPE(3), MT_F32, mt_test_device());
    mt_add(mt_cast(e32, MT_F16), b);
    mt_autocast_end();
    assert_true(mt_amp_numerics_failed());
    assert_string_equal(mt_amp_numerics_report(),
                        "mt_cast: output f16 [2, 3] has inf/nan; inputs: f32 [2, 3]");

    /* binary ops list every input */
    mt_amp_numerics_reset();
    mt_tensor *inf = mt_full(MT_SHAPE(3), MT_F32, mt_test_device(), INFINITY);
    mt_add(ok, inf);
    assert_string_equal(mt_amp_numerics_report(),
                        "mt_add: output f32 [2, 3] has inf/nan; inputs: f16 [2, 3], f32 [3]");

    /* the check's own allocation failing (the device flag) is not the op's error: an op that
       returns a tensor leaves no error pending (it was left stuck, and a later GradScaler
       step refused to run) */
    for (int64_t n = 1; n < 12; n++) {
        mt_amp_numerics_reset(); /* a recorded failure stops the checks */
        mt_debug_fail_nth_alloc(n);
        mt_tensor *y = mt_exp(x);
        mt_debug_fail_nth_alloc(0);
        if (y)
            assert_no_error();
        else
            assert_error(MT_ERR_OOM, "mt_exp");
    }

    /* off: nothing is recorded */
    mt_amp_numerics_reset();
    mt_amp_check_numerics(false);
    mt_exp(x);
    assert_false(mt_amp_numerics_failed());
    assert_no_error();
    mt_scope_end();
}

static void *numerics_thread(void *arg) {
    bool *failed_here = arg;
    *failed_here = mt_amp_numerics_failed();
    return NULL;
}

/* The first failure is recorded per thread. */
static void test_numerics_per_thread(void **state) {
    (void)state;
    mt_amp_numerics_reset();
    mt_amp_check_numerics(true);
    mt_tensor *x = mt_full(MT_SHAPE(2), MT_F16, mt_test_device(), 100.0);
    mt_tensor *e = mt_exp(x);
    mt_amp_check_numerics(false);
    assert_true(mt_amp_numerics_failed());
    bool other = true;
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, numerics_thread, &other), 0);
    pthread_join(t, NULL);
    assert_false(other);
    mt_amp_numerics_reset();
    mt_release(e);
    mt_release(x);
    assert_no_error();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        MT_TEST(test_table_matches_ops_def),
        MT_TEST(test_table_o1_f16),
        MT_TEST(test_table_o1_bf16),
        MT_TEST(test_table_o2_f16),
        MT_TEST(test_table_o2_bf16),
        MT_TEST(test_table_outside_region),
        MT_TEST(test_ops_o1_f16),
        MT_TEST(test_ops_o1_bf16),
        MT_TEST(test_ops_o2_f16),
        MT_TEST(test_ops_o2_bf16),
        MT_TEST(test_ops_f64_and_no_region),
        MT_TEST(test_custom_lists),
        MT_TEST(test_nesting),
        MT_TEST(test_region_errors),
        MT_TEST(test_cast_cache_out_of_memory),
        MT_TEST(test_thread_isolation),
        MT_TEST(test_cast_cache),
        MT_TEST(test_grad_dtype_f16),
        MT_TEST(test_grad_dtype_bf16),
        MT_TEST(test_backward_inside_region),
        MT_TEST(test_stats),
        MT_TEST(test_stats_threads),
        MT_TEST(test_numerics_checker),
        MT_TEST(test_numerics_per_thread),
    };
    return MT_RUN_TESTS(tests);
}
