/* cat and stack: values against index loops, dtype promotion, gradients and errors. */
#include "test_util.h"

/* A tensor of dtype dt holding base, base + 1, ... */
static mt_tensor *iota_from(double base, mt_dtype dt, int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = base + (double)i;
    mt_tensor *t = mt_test_tensor(v, dt, ndim, shape);
    free(v);
    return t;
}

static void release_all(mt_tensor **ts, int n) {
    for (int i = 0; i < n; i++) mt_release(ts[i]);
}

/* ------------------------------------------------------------------ values */

static void test_cat_values(void **state) {
    (void)state;
    mt_tensor *in[3] = {iota_from(0, MT_F32, MT_SHAPE(2, 3)),
                        iota_from(100, MT_F32, MT_SHAPE(2, 1)),
                        iota_from(200, MT_F32, MT_SHAPE(2, 2))};
    mt_tensor *c = mt_cat(in, 3, -1);
    assert_no_error();
    assert_shape(c, 2, 6);
    assert_true(mt_is_contiguous(c));
    const int64_t w[3] = {3, 1, 2};
    const double base[3] = {0, 100, 200};
    double expect[12];
    for (int i = 0; i < 2; i++) {
        int col = 0;
        for (int k = 0; k < 3; k++)
            for (int j = 0; j < w[k]; j++) expect[i * 6 + col++] = base[k] + i * w[k] + j;
    }
    assert_tensor_close(c, expect, 12, 0, 0);

    /* along dim 0, with a transposed (non-contiguous) input and an empty one */
    mt_tensor *a = iota_from(0, MT_F32, MT_SHAPE(3, 2));
    mt_tensor *at = mt_transpose(a, 0, 1); /* [2, 3] */
    mt_tensor *e = mt_zeros(MT_SHAPE(0, 3), MT_F32, mt_test_device());
    mt_tensor *in2[3] = {at, e, in[0]};
    mt_tensor *c0 = mt_cat(in2, 3, 0);
    assert_shape(c0, 4, 3);
    double expect0[12];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++) {
            expect0[i * 3 + j] = j * 2 + i;
            expect0[6 + i * 3 + j] = i * 3 + j;
        }
    assert_tensor_close(c0, expect0, 12, 0, 0);
    /* one input: a copy, not an alias */
    mt_tensor *c1 = mt_cat(in, 1, 0);
    assert_ptr_not_equal(mt_test_data_addr(c1), mt_test_data_addr(in[0]));
    assert_tensor_close(c1, expect0 + 6, 6, 0, 0);
    assert_no_error();
    release_all(in, 3);
    mt_release(c);
    mt_release(a);
    mt_release(at);
    mt_release(e);
    mt_release(c0);
    mt_release(c1);
}

static void test_stack_values(void **state) {
    (void)state;
    mt_tensor *in[3] = {iota_from(0, MT_F64, MT_SHAPE(2, 3)), iota_from(10, MT_F64, MT_SHAPE(2, 3)),
                        iota_from(20, MT_F64, MT_SHAPE(2, 3))};
    for (int dim = -3; dim <= 2; dim++) {
        int d = dim < 0 ? dim + 3 : dim;
        mt_tensor *s = mt_stack(in, 3, dim);
        assert_no_error();
        int64_t shape[3], k = 0;
        for (int q = 0; q < 3; q++) shape[q] = q == d ? 3 : (k++ == 0 ? 2 : 3);
        mt_test_assert_shape(s, 3, shape, __FILE__, __LINE__);
        double expect[18];
        int64_t idx[3];
        for (idx[0] = 0; idx[0] < shape[0]; idx[0]++)
            for (idx[1] = 0; idx[1] < shape[1]; idx[1]++)
                for (idx[2] = 0; idx[2] < shape[2]; idx[2]++) {
                    int64_t src = idx[d], rest[2], r = 0;
                    for (int q = 0; q < 3; q++)
                        if (q != d) rest[r++] = idx[q];
                    expect[(idx[0] * shape[1] + idx[1]) * shape[2] + idx[2]] =
                        10.0 * src + rest[0] * 3 + rest[1];
                }
        assert_tensor_close(s, expect, 18, 0, 0);
        mt_release(s);
    }
    /* 0-d tensors stack into a vector */
    mt_tensor *sc[2] = {mt_scalar(1.5, MT_F32, mt_test_device()),
                        mt_scalar(-2, MT_F32, mt_test_device())};
    mt_tensor *v = mt_stack(sc, 2, 0);
    assert_shape(v, 2);
    double ev[2] = {1.5, -2};
    assert_tensor_close(v, ev, 2, 0, 0);
    release_all(sc, 2);
    mt_release(v);
    release_all(in, 3);
}

static void test_many_inputs(void **state) {
    (void)state;
    enum { N = 13 };
    mt_tensor *in[N];
    for (int i = 0; i < N; i++) {
        in[i] = iota_from(i * 10, MT_F32, MT_SHAPE(1, 2));
        mt_set_requires_grad(in[i], true);
    }
    mt_tensor *c = mt_cat(in, N, 0);
    assert_shape(c, N, 2);
    assert_string_equal(mt_grad_fn_name(c), "cat");
    /* weight each row by its index so every input gets a distinct gradient */
    mt_tensor *w = iota_from(0, MT_F32, MT_SHAPE(N, 2));
    mt_tensor *y = mt_mul(c, w);
    assert_int_equal(mt_backward(y, w), 0); /* grad of input i = w[i]^2 */
    for (int i = 0; i < N; i++) {
        mt_tensor *g = mt_grad(in[i]);
        double e[2] = {(2.0 * i) * (2.0 * i), (2.0 * i + 1) * (2.0 * i + 1)};
        assert_tensor_close(g, e, 2, 0, 0);
        mt_release(g);
    }
    mt_tensor *s = mt_stack(in, N, 1);
    assert_shape(s, 1, N, 2);
    double expect[2 * N];
    for (int i = 0; i < N; i++) {
        expect[2 * i] = i * 10;
        expect[2 * i + 1] = i * 10 + 1;
    }
    assert_tensor_close(s, expect, 2 * N, 0, 0);
    mt_release(s);
    mt_release(y);
    mt_release(w);
    mt_release(c);
    release_all(in, N);
}

/* ------------------------------------------------------------------ dtypes */

static void test_promotion(void **state) {
    (void)state;
    const struct {
        mt_dtype a, b, want;
    } cases[] = {
        {MT_F16, MT_F16, MT_F16},   {MT_BF16, MT_BF16, MT_BF16}, {MT_F16, MT_BF16, MT_F32},
        {MT_F16, MT_F32, MT_F32},   {MT_BF16, MT_F64, MT_F64},   {MT_F32, MT_F64, MT_F64},
        {MT_I64, MT_I64, MT_I64},   {MT_I64, MT_F16, MT_F16},    {MT_BOOL, MT_BOOL, MT_BOOL},
        {MT_I32, MT_BF16, MT_BF16},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        mt_tensor *in[2] = {iota_from(0, cases[k].a, MT_SHAPE(2)),
                            iota_from(1, cases[k].b, MT_SHAPE(2))};
        for (int stack = 0; stack < 2; stack++) {
            mt_tensor *c = stack ? mt_stack(in, 2, 0) : mt_cat(in, 2, 0);
            assert_no_error();
            if (mt_dtype_of(c) != cases[k].want)
                fail_msg("%s(%s, %s) gave %s, expected %s", stack ? "stack" : "cat",
                         mt_dtype_name(cases[k].a), mt_dtype_name(cases[k].b),
                         mt_dtype_name(mt_dtype_of(c)), mt_dtype_name(cases[k].want));
            double e[4] = {0, 1, 1, 2};
            if (cases[k].want == MT_BOOL) e[0] = 0, e[1] = 1, e[2] = 1, e[3] = 1;
            assert_tensor_close(c, e, 4, 0, 0);
            mt_release(c);
        }
        release_all(in, 2);
    }
    /* low-precision storage rounds: 1 + 2^-11 is half an f16 step above 1 */
    double v[2] = {1.0 + 1.0 / 2048, 3.0};
    mt_tensor *f = mt_test_tensor(v, MT_F64, MT_SHAPE(2)),
              *h = mt_test_tensor(v, MT_F16, MT_SHAPE(2));
    mt_tensor *in[2] = {h, h};
    mt_tensor *c = mt_cat(in, 2, 0);
    double e[4] = {1.0, 3.0, 1.0, 3.0};
    assert_tensor_close(c, e, 4, 0, 0);
    mt_tensor *in2[2] = {h, f}; /* f16 with f64: exact f64 values survive */
    mt_tensor *c2 = mt_cat(in2, 2, 0);
    double e2[4] = {1.0, 3.0, 1.0 + 1.0 / 2048, 3.0};
    assert_int_equal(mt_dtype_of(c2), MT_F64);
    assert_tensor_close(c2, e2, 4, 0, 0);
    mt_release(f);
    mt_release(h);
    mt_release(c);
    mt_release(c2);
}

static void test_mixed_dtype_gradients(void **state) {
    (void)state;
    mt_tensor *a = iota_from(0, MT_F16, MT_SHAPE(2, 2)), *b = iota_from(4, MT_F32, MT_SHAPE(2, 2));
    mt_tensor *k = iota_from(8, MT_BF16, MT_SHAPE(2, 2)); /* takes no gradient */
    mt_set_requires_grad(a, true);
    mt_set_requires_grad(b, true);
    mt_tensor *in[3] = {a, b, k};
    mt_tensor *s = mt_stack(in, 3, 1); /* [2, 3, 2] f32 */
    assert_int_equal(mt_dtype_of(s), MT_F32);
    mt_tensor *g = iota_from(1, MT_F32, MT_SHAPE(2, 3, 2));
    assert_int_equal(mt_backward(s, g), 0);
    mt_tensor *ga = mt_grad(a), *gb = mt_grad(b);
    assert_int_equal(mt_dtype_of(ga), MT_F16);
    assert_int_equal(mt_dtype_of(gb), MT_F32);
    assert_null(mt_grad(k));
    /* g[i][j][l] = 1 + i * 6 + j * 2 + l; input j gets g[:, j, :] */
    double ea[4], eb[4];
    for (int i = 0; i < 2; i++)
        for (int l = 0; l < 2; l++) {
            ea[i * 2 + l] = 1 + i * 6 + 0 * 2 + l;
            eb[i * 2 + l] = 1 + i * 6 + 1 * 2 + l;
        }
    assert_tensor_close(ga, ea, 4, 0, 0);
    assert_tensor_close(gb, eb, 4, 0, 0);
    mt_release(ga);
    mt_release(gb);
    mt_release(g);
    mt_release(s);
    mt_release(a);
    mt_release(b);
    mt_release(k);
}

static void test_autocast_promotes(void **state) {
    (void)state;
    mt_tensor *a = iota_from(0, MT_F32, MT_SHAPE(2)), *b = iota_from(2, MT_F16, MT_SHAPE(2));
    mt_tensor *in[2] = {a, b};
    mt_autocast_begin(MT_F16, MT_AMP_O1);
    mt_tensor *c = mt_cat(in, 2, 0);
    mt_autocast_end();
    assert_no_error();
    assert_int_equal(mt_dtype_of(c), MT_F32); /* PROMOTE: the widest input */
    double e[4] = {0, 1, 2, 3};
    assert_tensor_close(c, e, 4, 0, 0);
    mt_release(c);
    mt_release(a);
    mt_release(b);
}

/* ------------------------------------------------------------------ gradcheck */

typedef struct {
    bool stack;
    int dim;
} join_case;

static mt_tensor *join_fn(mt_tensor *const *in, void *vctx) {
    const join_case *c = vctx;
    /* a transposed input exercises strided gradient windows */
    mt_tensor *t1 = mt_transpose(in[1], 0, 1);
    mt_tensor *list[3] = {in[0], t1, in[2]};
    mt_tensor *r = c->stack ? mt_stack(list, 3, c->dim) : mt_cat(list, 3, c->dim);
    return mt_mul(r, r); /* non-linear so each element's gradient differs */
}

static void test_gradcheck_join(void **state) {
    (void)state;
    mt_manual_seed(11);
    const join_case cases[] = {{false, 0}, {false, 1}, {false, -1},
                               {true, 0},  {true, 1},  {true, -1}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        bool cat1 = !cases[k].stack && (cases[k].dim == 1 || cases[k].dim == -1);
        bool cat0 = !cases[k].stack && cases[k].dim == 0;
        /* shapes: stack needs [3, 2] everywhere; cat along 0 varies rows, along 1 columns */
        int64_t s0[2] = {cat0 ? 1 : 3, cat1 ? 4 : 2};
        int64_t s2[2] = {cat0 ? 2 : 3, cat1 ? 1 : 2};
        mt_tensor *in[3] = {mt_randn(2, s0, MT_F64, mt_test_device()),
                            mt_randn(MT_SHAPE(2, 3), MT_F64, mt_test_device()),
                            mt_randn(2, s2, MT_F64, mt_test_device())};
        mt_set_requires_grad(in[0], true);
        mt_set_requires_grad(in[1], true); /* in[2] takes no gradient */
        int rc = mt_gradcheck(join_fn, in, 3, (void *)&cases[k], NULL);
        if (rc) fail_msg("case %zu: %s", k, mt_last_error());
        release_all(in, 3);
    }
}

/* ------------------------------------------------------------------ errors */

static void test_errors(void **state) {
    (void)state;
    mt_tensor *a = iota_from(0, MT_F32, MT_SHAPE(2, 3)), *b = iota_from(0, MT_F32, MT_SHAPE(2, 4));
    mt_tensor *c3 = iota_from(0, MT_F32, MT_SHAPE(2, 3, 1));
    mt_tensor *ab[2] = {a, b};
    assert_null(mt_cat(ab, 2, 0));
    assert_error(MT_ERR_SHAPE,
                 "mt_cat: arg 1: tensor 1 has shape [2, 4] but tensor 0 has shape [2, 3] "
                 "(sizes must match except in dim 0)");
    mt_tensor *ok = mt_cat(ab, 2, 1);
    assert_shape(ok, 2, 7);
    mt_release(ok);
    assert_null(mt_stack(ab, 2, 0));
    assert_error(MT_ERR_SHAPE,
                 "mt_stack: arg 1: tensor 1 has shape [2, 4] but tensor 0 has shape [2, 3] "
                 "(all shapes must be equal)");
    mt_tensor *ac[2] = {a, c3};
    assert_null(mt_cat(ac, 2, 0));
    assert_error(MT_ERR_SHAPE, "tensor 1 has shape [2, 3, 1]");
    assert_null(mt_cat(ab, 2, 2));
    assert_error(MT_ERR_INVALID, "mt_cat: arg 3: dim 2 is out of range for a 2-d tensor");
    assert_null(mt_stack(ab, 2, -4));
    assert_error(
        MT_ERR_INVALID,
        "mt_stack: arg 3: dim -4 is out of range for a new dim of a 2-d tensor (expected -3..2)");
    assert_null(mt_cat(ab, 0, 0));
    assert_error(MT_ERR_INVALID, "mt_cat: arg 2: needs at least one tensor, got 0");
    assert_null(mt_stack(NULL, 2, 0));
    assert_error(MT_ERR_INVALID, "mt_stack: arg 2");
    mt_tensor *s = mt_scalar(1, MT_F32, mt_test_device());
    mt_tensor *ss[2] = {s, s};
    assert_null(mt_cat(ss, 2, 0));
    assert_error(MT_ERR_SHAPE, "0-d");
    mt_tensor *i32 = iota_from(0, MT_I32, MT_SHAPE(2, 3)),
              *i64 = iota_from(0, MT_I64, MT_SHAPE(2, 3));
    mt_tensor *ii[2] = {i32, i64};
    assert_null(mt_cat(ii, 2, 0));
    assert_error(MT_ERR_DTYPE, "mt_cat: arg 1: tensor 1 has dtype i64 but tensor 0 has i32");
    mt_tensor *big =
        mt_zeros(8, (const int64_t[]){1, 1, 1, 1, 1, 1, 1, 1}, MT_F32, mt_test_device());
    mt_tensor *bb[1] = {big};
    assert_null(mt_stack(bb, 1, 0));
    assert_error(MT_ERR_SHAPE, "would exceed 8");
    /* a NULL entry (an earlier failure) propagates without a new error */
    mt_tensor *an[2] = {a, NULL};
    assert_null(mt_cat(an, 2, 0));
    assert_null(mt_stack(an, 2, 0));
    assert_int_equal(mt_last_status(), MT_OK);
    mt_release(a);
    mt_release(b);
    mt_release(c3);
    mt_release(s);
    mt_release(i32);
    mt_release(i64);
    mt_release(big);
}

static void test_scope_and_version(void **state) {
    (void)state;
    mt_tensor *a = iota_from(0, MT_F32, MT_SHAPE(2));
    int64_t live = mt_live_tensors();
    mt_scope_begin();
    mt_tensor *in[2] = {a, a};
    mt_tensor *c = mt_cat(in, 2, 0);
    assert_int_equal(mt_live_tensors(), live + 1);
    /* the result owns fresh memory: writing it leaves the input alone (values read with
       mt_copy_to_host: test_util's helpers release temporaries, not for use in a scope) */
    assert_int_equal(mt_fill(c, 9), 0);
    float av[2], cv[4];
    assert_int_equal(mt_copy_to_host(a, av, sizeof av), 0);
    assert_int_equal(mt_copy_to_host(c, cv, sizeof cv), 0);
    assert_true(av[0] == 0 && av[1] == 1 && cv[0] == 9 && cv[3] == 9);
    mt_scope_end();
    assert_int_equal(mt_live_tensors(), live);
    mt_release(a);
}

/* Four expanded views of 2^62 elements: the joined size does not fit in int64, which is an
   error, not a wrapped (tiny) output that the copies would overrun. */
static void test_cat_size_overflow(void **state) {
    (void)state;
    mt_tensor *z = mt_zeros(MT_SHAPE(1), MT_F32, mt_test_device());
    mt_tensor *e = mt_expand(z, MT_SHAPE((int64_t)1 << 62));
    assert_non_null(e);
    mt_tensor *four[] = {e, e, e, e};
    assert_null(mt_cat(four, 4, 0));
    assert_error(MT_ERR_SHAPE, "add up to more than 2^63");
    /* two views of 2^61 fit the index type but not any memory: out of memory, cleanly */
    mt_tensor *h = mt_expand(z, MT_SHAPE((int64_t)1 << 61));
    mt_tensor *two[] = {h, h};
    assert_null(mt_cat(two, 2, 0));
    assert_error(MT_ERR_OOM, "too large to allocate");
    mt_release(h);
    mt_release(e);
    mt_release(z);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        MT_TEST(test_cat_values),
        MT_TEST(test_stack_values),
        MT_TEST(test_many_inputs),
        MT_TEST(test_promotion),
        MT_TEST(test_mixed_dtype_gradients),
        MT_TEST(test_autocast_promotes),
        MT_TEST(test_gradcheck_join),
        MT_TEST(test_errors),
        MT_TEST(test_scope_and_version),
        MT_TEST(test_cat_size_overflow),
    };
    return MT_RUN_TESTS(tests);
}
