/* Reductions and softmax: forward against reference loops (several dims, keepdim, negative
   dims, transposed and expanded inputs, every floating dtype), accuracy of large and
   low-precision sums, gradients by finite differences in F64, and error paths. */
#include "test_util.h"

/* ---------------------------------------------------------------- reference helpers */

/* Reference reduction of a contiguous double array of `shape` over mask; op 0 sum, 1 mean,
   2 max. Writes the keepdim-ordered (= non-keepdim-ordered) results into out. */
static void ref_reduce(int op, const double *x, int nd, const int64_t *shape, uint32_t mask,
                       double *out, int64_t *nout) {
    int64_t K = 1, R = 1;
    for (int d = 0; d < nd; d++) {
        if (mask & (1u << d))
            R *= shape[d];
        else
            K *= shape[d];
    }
    for (int64_t k = 0; k < K; k++) out[k] = op == 2 ? -INFINITY : 0.0;
    int64_t numel = K * R;
    for (int64_t i = 0; i < numel; i++) {
        int64_t rem = i, k = 0, kmul = 1;
        for (int d = nd - 1; d >= 0; d--) {
            int64_t idx = rem % shape[d];
            rem /= shape[d];
            if (!(mask & (1u << d))) {
                k += idx * kmul;
                kmul *= shape[d];
            }
        }
        if (op == 2)
            out[k] = x[i] > out[k] ? x[i] : out[k];
        else
            out[k] += x[i];
    }
    if (op == 1)
        for (int64_t k = 0; k < K; k++) out[k] /= (double)R;
    *nout = K;
}

static double *iota_values(int64_t n, double scale) {
    double *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = scale * (double)((i * 7919) % 101 - 50) / 8.0;
    return v;
}

/* ---------------------------------------------------------------- sum */

static void test_sum_dims_keepdim(void **state) {
    (void)state;
    int64_t shape[3] = {3, 4, 5};
    double *x = iota_values(60, 1.0);
    mt_tensor *t = mt_test_tensor(x, MT_F32, 3, shape);
    double ref[60];
    int64_t n;
    /* dims {0, 2} */
    mt_tensor *s = mt_sum(t, MT_DIMS(0, 2), false);
    assert_no_error();
    assert_shape(s, 4);
    ref_reduce(0, x, 3, shape, 0x5, ref, &n);
    assert_tensor_close(s, ref, n, 1e-5, 1e-6);
    mt_release(s);
    s = mt_sum(t, MT_DIMS(-1, 0), true);
    assert_shape(s, 1, 4, 1);
    assert_tensor_close(s, ref, n, 1e-5, 1e-6);
    mt_release(s);
    /* each single dim */
    for (int d = 0; d < 3; d++) {
        s = mt_sum(t, 1, (const int[]){d}, false);
        ref_reduce(0, x, 3, shape, 1u << d, ref, &n);
        assert_tensor_close(s, ref, n, 1e-5, 1e-6);
        mt_release(s);
    }
    /* all */
    s = mt_sum_all(t);
    assert_int_equal(mt_ndim(s), 0);
    ref_reduce(0, x, 3, shape, 0x7, ref, &n);
    assert_tensor_close(s, ref, 1, 1e-5, 1e-6);
    mt_release(s);
    s = mt_sum(t, 0, NULL, true);
    assert_shape(s, 1, 1, 1);
    mt_release(s);
    mt_release(t);
    free(x);
}

static void test_sum_large_accuracy(void **state) {
    (void)state;
    /* 2^24 + a few: a plain FP32 running sum of ones stalls at 16777216 */
    int64_t n = (1 << 24) + 1000;
    mt_tensor *t = mt_ones(MT_SHAPE(n), MT_F32, MT_CPU);
    mt_tensor *s = mt_sum_all(t);
    assert_no_error();
    assert_true(mt_item(s) == (double)(float)n);
    mt_release(s);
    mt_release(t);
}

static void test_sum_backward_expands(void **state) {
    (void)state;
    double x[6] = {1, 2, 3, 4, 5, 6};
    mt_tensor *t = mt_test_tensor(x, MT_F32, MT_SHAPE(2, 3));
    mt_set_requires_grad(t, true);
    mt_tensor *s = mt_sum(t, MT_DIMS(1), false);
    mt_tensor *w = mt_test_tensor((const double[]){2, 3}, MT_F32, MT_SHAPE(2));
    mt_tensor *p = mt_mul(s, w);
    mt_tensor *m = mt_mean_all(p);
    assert_int_equal(mt_backward(m, NULL), 0);
    mt_tensor *g = mt_grad(t);
    assert_tensor_close(g, ((const double[]){1, 1, 1, 1.5, 1.5, 1.5}), 6, 1e-6, 0);
    assert_tensor_close(m, ((const double[]){(6 * 2 + 15 * 3) / 2.0}), 1, 1e-5, 0);
    mt_release(g);
    mt_release(m);
    mt_release(p);
    mt_release(w);
    mt_release(s);
    mt_release(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        MT_TEST(test_sum_dims_keepdim),
        MT_TEST(test_sum_large_accuracy),
        MT_TEST(test_sum_backward_expands),
    };
    return MT_RUN_TESTS(tests);
}
