/* Indexing ops: embedding, index_select and gather against naive loops (forward and the
   scatter-add gradients with repeated indices), FP64 finite differences, argmax (ties, NaN,
   keepdim), randperm (a permutation, reproducible from the seed) and the range errors. */
#include "test_util.h"

static mt_tensor *i64_tensor(const int64_t *v, int ndim, const int64_t *shape) {
    return mt_from_data(v, MT_I64, ndim, shape, mt_test_device());
}

static mt_tensor *seq(mt_dtype dt, int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    double *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = (double)((i * 7) % 11) - 5.0 + 0.25 * (double)i;
    mt_tensor *t = mt_test_tensor(v, dt, ndim, shape);
    free(v);
    return t;
}

static void test_embedding(void **state) {
    (void)state;
    mt_dtype dts[3] = {MT_F32, MT_BF16, MT_F64};
    for (int k = 0; k < 3; k++) {
        mt_scope_begin();
        mt_tensor *w = seq(dts[k], MT_SHAPE(5, 3));
        mt_set_requires_grad(w, true);
        int64_t idx[6] = {4, 0, 4, 2, 4, 1};
        mt_tensor *y = mt_embedding(w, i64_tensor(idx, MT_SHAPE(2, 3)));
        assert_no_error();
        assert_shape(y, 2, 3, 3);
        assert_int_equal(mt_dtype_of(y), dts[k]);
        double *wv = mt_test_values(w), ref[18], gref[15] = {0};
        for (int i = 0; i < 6; i++)
            for (int j = 0; j < 3; j++) {
                ref[i * 3 + j] = wv[idx[i] * 3 + j];
                gref[idx[i] * 3 + j] += (double)(i * 3 + j);
            }
        assert_tensor_close(y, ref, 18, 0, 0);
        double cot[18];
        for (int i = 0; i < 18; i++) cot[i] = (double)i;
        assert_int_equal(mt_backward(y, mt_test_tensor(cot, dts[k], MT_SHAPE(2, 3, 3))), 0);
        mt_tensor *g = mt_grad(w);
        assert_int_equal(mt_dtype_of(g), dts[k]);
        assert_tensor_close(g, gref, 15, 0, 0); /* small integers: exact in every dtype */
        free(wv);
        mt_scope_end();
    }
}

static void test_index_select(void **state) {
    (void)state;
    mt_scope_begin();
    mt_tensor *x = seq(MT_F32, MT_SHAPE(2, 4, 3));
    mt_set_requires_grad(x, true);
    int64_t idx[5] = {3, 1, 3, 0, 3};
    mt_tensor *y = mt_index_select(x, -2, i64_tensor(idx, MT_SHAPE(5)));
    assert_shape(y, 2, 5, 3);
    double *xv = mt_test_values(x), ref[30], gref[24] = {0};
    for (int a = 0; a < 2; a++)
        for (int j = 0; j < 5; j++)
            for (int c = 0; c < 3; c++) {
                ref[(a * 5 + j) * 3 + c] = xv[(a * 4 + idx[j]) * 3 + c];
                gref[(a * 4 + idx[j]) * 3 + c] += 1;
            }
    assert_tensor_close(y, ref, 30, 0, 0);
    assert_int_equal(mt_backward(mt_sum_all(y), NULL), 0);
    assert_tensor_close(mt_grad(x), gref, 24, 0, 0);
    /* dim 0 and the last dim */
    mt_tensor *y0 = mt_index_select(x, 0, i64_tensor((int64_t[]){1}, MT_SHAPE(1)));
    assert_shape(y0, 1, 4, 3);
    assert_tensor_close(y0, xv + 12, 12, 0, 0);
    mt_tensor *y2 = mt_index_select(x, 2, i64_tensor((int64_t[]){2, 0}, MT_SHAPE(2)));
    double r2[16];
    for (int r = 0; r < 8; r++) {
        r2[r * 2] = xv[r * 3 + 2];
        r2[r * 2 + 1] = xv[r * 3];
    }
    assert_tensor_close(y2, r2, 16, 0, 0);
    free(xv);
    mt_scope_end();
}

static void test_gather(void **state) {
    (void)state;
    mt_scope_begin();
    mt_tensor *x = seq(MT_F32, MT_SHAPE(3, 4));
    mt_set_requires_grad(x, true);
    /* dim 1, index [3, 2] (fewer columns than x); dim 0, index [2, 4] */
    int64_t i1[6] = {3, 3, 0, 1, 2, 1}, i0[8] = {2, 0, 1, 2, 2, 2, 0, 1};
    mt_tensor *a = mt_gather(x, 1, i64_tensor(i1, MT_SHAPE(3, 2)));
    mt_tensor *b = mt_gather(x, 0, i64_tensor(i0, MT_SHAPE(2, 4)));
    assert_no_error();
    double *xv = mt_test_values(x), ra[6], rb[8], gref[12] = {0};
    for (int r = 0; r < 3; r++)
        for (int c = 0; c < 2; c++) {
            ra[r * 2 + c] = xv[r * 4 + i1[r * 2 + c]];
            gref[r * 4 + i1[r * 2 + c]] += 1;
        }
    for (int r = 0; r < 2; r++)
        for (int c = 0; c < 4; c++) {
            rb[r * 4 + c] = xv[i0[r * 4 + c] * 4 + c];
            gref[i0[r * 4 + c] * 4 + c] += 2;
        }
    assert_tensor_close(a, ra, 6, 0, 0);
    assert_tensor_close(b, rb, 8, 0, 0);
    mt_tensor *l = mt_add(mt_sum_all(a), mt_mul_scalar(mt_sum_all(b), 2.0));
    assert_int_equal(mt_backward(l, NULL), 0);
    assert_tensor_close(mt_grad(x), gref, 12, 0, 0);
    free(xv);
    mt_scope_end();
}

/* Non-contiguous inputs and indices give what their contiguous copies give. */
static void test_index_strided(void **state) {
    (void)state;
    mt_scope_begin();
    mt_tensor *w = seq(MT_F32, MT_SHAPE(5, 3));
    int64_t idx[6] = {0, 1, 2, 3, 4, 0};
    mt_tensor *it = mt_transpose(i64_tensor(idx, MT_SHAPE(2, 3)), 0, 1);
    assert_false(mt_is_contiguous(it));
    double *want = mt_test_values(mt_embedding(w, mt_contiguous(it)));
    assert_tensor_close(mt_embedding(w, it), want, 18, 0, 0);
    free(want);
    mt_tensor *xt = mt_transpose(seq(MT_F32, MT_SHAPE(4, 3)), 0, 1);
    mt_tensor *gi = i64_tensor((int64_t[]){3, 0, 1, 1, 2, 3}, MT_SHAPE(3, 2));
    want = mt_test_values(mt_gather(mt_contiguous(xt), 1, gi));
    assert_tensor_close(mt_gather(xt, 1, gi), want, 6, 0, 0);
    free(want);
    want = mt_test_values(mt_argmax(mt_contiguous(xt), 1, false));
    assert_tensor_close(mt_argmax(xt, 1, false), want, 3, 0, 0);
    free(want);
    mt_scope_end();
}

typedef struct {
    int which, dim;
    mt_tensor *index;
} index_gc;

static mt_tensor *index_fn(mt_tensor *const *in, void *ctx) {
    const index_gc *g = ctx;
    if (g->which == 0) return mt_embedding(in[0], g->index);
    if (g->which == 1) return mt_index_select(in[0], g->dim, g->index);
    return mt_gather(in[0], g->dim, g->index);
}

static void test_index_gradcheck(void **state) {
    (void)state;
    mt_scope_begin();
    mt_manual_seed(5);
    mt_tensor *x = mt_randn(MT_SHAPE(4, 3), MT_F64, mt_test_device());
    mt_set_requires_grad(x, true);
    index_gc cases[3] = {
        {0, 0, i64_tensor((int64_t[]){1, 3, 1, 0, 1}, MT_SHAPE(5))},
        {1, 1, i64_tensor((int64_t[]){2, 2, 0}, MT_SHAPE(3))},
        {2, 0, i64_tensor((int64_t[]){3, 3, 1, 0, 3, 2}, MT_SHAPE(2, 3))},
    };
    for (int i = 0; i < 3; i++)
        if (mt_gradcheck(index_fn, &x, 1, &cases[i], NULL))
            fail_msg("case %d: %s", i, mt_last_error());
    mt_scope_end();
}

static void test_argmax(void **state) {
    (void)state;
    mt_scope_begin();
    double v[12] = {1, 5, 5, 0, 2, NAN, 3, NAN, -1, -1, -1, -2};
    mt_dtype dts[3] = {MT_F32, MT_F16, MT_F64};
    for (int k = 0; k < 3; k++) {
        mt_tensor *x = mt_test_tensor(v, dts[k], MT_SHAPE(3, 4));
        mt_tensor *a = mt_argmax(x, 1, false), *b = mt_argmax(x, 0, true);
        assert_int_equal(mt_dtype_of(a), MT_I64);
        assert_shape(a, 3);
        assert_shape(b, 1, 4);
        double ra[3] = {1, 1, 0}, rb[4] = {1, 1, 0, 1};
        assert_tensor_close(a, ra, 3, 0, 0);
        assert_tensor_close(b, rb, 4, 0, 0);
    }
    mt_tensor *xi = mt_from_data((int64_t[]){3, 9, 9, 1}, MT_I64, MT_SHAPE(4), mt_test_device());
    double ri = 1;
    assert_tensor_close(mt_argmax(xi, 0, false), &ri, 1, 0, 0);
    /* I64 values that one double cannot tell apart (2^53 and 2^53 + 1), along both dims */
    const int64_t big[6] = {1LL << 53, (1LL << 53) + 1, -5, INT64_MAX, INT64_MAX - 1, 0};
    mt_tensor *xb = mt_from_data(big, MT_I64, MT_SHAPE(2, 3), mt_test_device());
    double rb0[3] = {1, 1, 1}, rb1[2] = {1, 0};
    assert_tensor_close(mt_argmax(xb, 0, false), rb0, 3, 0, 0);
    assert_tensor_close(mt_argmax(xb, 1, false), rb1, 2, 0, 0);
    assert_null(mt_argmax(xi, 1, false));
    assert_error(MT_ERR_INVALID, "mt_argmax");
    mt_scope_end();
}

static void test_randperm(void **state) {
    (void)state;
    mt_scope_begin();
    mt_manual_seed(11);
    mt_tensor *p = mt_randperm(1000, mt_test_device());
    assert_int_equal(mt_dtype_of(p), MT_I64);
    double *v = mt_test_values(p);
    bool seen[1000] = {0};
    int fixed = 0;
    for (int i = 0; i < 1000; i++) {
        assert_true(v[i] >= 0 && v[i] < 1000 && !seen[(int)v[i]]);
        seen[(int)v[i]] = true;
        fixed += v[i] == i;
    }
    assert_true(fixed < 10); /* a shuffle, not the identity (expected 1 fixed point) */
    mt_manual_seed(11);
    assert_tensor_close(mt_randperm(1000, mt_test_device()), v, 1000, 0, 0);
    assert_int_equal(mt_numel(mt_randperm(0, mt_test_device())), 0);
    assert_null(mt_randperm(-1, mt_test_device()));
    assert_error(MT_ERR_INVALID, "mt_randperm: arg 1: n -1 must be >= 0");
    free(v);
    mt_scope_end();
}

static void test_index_errors(void **state) {
    (void)state;
    mt_scope_begin();
    mt_tensor *w = mt_zeros(MT_SHAPE(5, 3), MT_F32, mt_test_device());
    /* out-of-range indices: found by the op on the CPU, by the kernel on a device (reported
       at the next synchronisation, with the same words) */
    assert_deferred_error(mt_embedding(w, i64_tensor((int64_t[]){1, 7, 2}, MT_SHAPE(3))),
                          MT_ERR_INVALID, "mt_embedding",
                          "arg 2: index 7 at position 1 is out of range [0, 5) (weight has 5 rows");
    assert_deferred_error(mt_embedding(w, i64_tensor((int64_t[]){-1}, MT_SHAPE(1))), MT_ERR_INVALID,
                          "mt_embedding", "index -1 at position 0");
    assert_null(mt_embedding(w, mt_zeros(MT_SHAPE(2), MT_I32, mt_test_device())));
    assert_error(MT_ERR_DTYPE, "mt_embedding: arg 2: indices must be i64, got i32");
    assert_null(mt_embedding(mt_zeros(MT_SHAPE(5), MT_F32, mt_test_device()),
                             i64_tensor((int64_t[]){1}, MT_SHAPE(1))));
    assert_error(MT_ERR_SHAPE, "weight must be [num_embeddings, dim]");
    assert_deferred_error(mt_index_select(w, 1, i64_tensor((int64_t[]){0, 3}, MT_SHAPE(2))),
                          MT_ERR_INVALID, "mt_index_select",
                          "arg 3: index 3 at position 1 is out of range [0, 3) (dim 1 has size 3");
    assert_deferred_error(mt_index_select(w, -2, i64_tensor((int64_t[]){5}, MT_SHAPE(1))),
                          MT_ERR_INVALID, "mt_index_select", "(dim 0 has size 5");
    /* an empty result still has its indices checked (the CUDA kernel had nothing to do) */
    mt_tensor *none = mt_zeros(MT_SHAPE(2, 0), MT_F32, mt_test_device());
    assert_deferred_error(mt_index_select(none, 0, i64_tensor((int64_t[]){1, 5}, MT_SHAPE(2))),
                          MT_ERR_INVALID, "mt_index_select", "index 5 at position 1");
    assert_deferred_error(mt_embedding(none, i64_tensor((int64_t[]){1, 5}, MT_SHAPE(2))),
                          MT_ERR_INVALID, "mt_embedding", "index 5 at position 1");
    assert_null(mt_index_select(w, 2, i64_tensor((int64_t[]){0}, MT_SHAPE(1))));
    assert_error(MT_ERR_INVALID, "mt_index_select");
    assert_deferred_error(mt_gather(w, 0, i64_tensor((int64_t[]){0, 9}, MT_SHAPE(1, 2))),
                          MT_ERR_INVALID, "mt_gather", "arg 3: index 9 at position 1");
    assert_null(mt_gather(w, 0, i64_tensor((int64_t[]){0, 1}, MT_SHAPE(2))));
    assert_error(MT_ERR_SHAPE, "mt_gather: arg 3: index shape [2]");
    assert_null(mt_gather(w, 0, i64_tensor((int64_t[]){0, 0, 0, 0}, MT_SHAPE(1, 4))));
    assert_error(MT_ERR_SHAPE, "no larger size outside dim 0");
    assert_null(mt_index_select(mt_scalar(2.0, MT_F32, mt_test_device()), 0,
                                i64_tensor((int64_t[]){0, 0}, MT_SHAPE(2))));
    assert_error(MT_ERR_SHAPE, "input must have at least 1 dim");
    assert_null(mt_embedding(NULL, NULL));
    assert_int_equal(mt_last_status(), MT_OK);
    mt_scope_end();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        MT_TEST(test_embedding),     MT_TEST(test_index_select),    MT_TEST(test_gather),
        MT_TEST(test_index_strided), MT_TEST(test_index_gradcheck), MT_TEST(test_argmax),
        MT_TEST(test_randperm),      MT_TEST(test_index_errors),
    };
    return MT_RUN_TESTS(tests);
}
