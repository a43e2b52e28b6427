/* Printing tensors: mt_format (values, summaries of large tensors, autograd and device
   annotations, truncation), mt_print and the print options, as torch prints them. */
#include "test_util.h"

/* want as printed for a tensor on the device under test: a CUDA tensor names its device
   before the dtype ("..., device=cuda:0, dtype=f32, ..."), a CPU tensor does not. */
static const char *on_device(const char *want, char *buf, size_t cap) {
    const char *at = strstr(want, ", dtype=");
    if (mt_test_device_is_cpu() || !at) {
        snprintf(buf, cap, "%s", want);
    } else {
        snprintf(buf, cap, "%.*s, device=%s%s", (int)(at - want), want, mt_test_device_name(), at);
    }
    return buf;
}

static void assert_format(const mt_tensor *t, const char *want_on_cpu) {
    char buf[1024], wbuf[1024];
    const char *want = on_device(want_on_cpu, wbuf, sizeof wbuf);
    int n = mt_format(t, buf, sizeof buf);
    assert_no_error();
    if (strcmp(buf, want) != 0) fail_msg("got  \"%s\"\nwant \"%s\"", buf, want);
    assert_int_equal(n, (int)strlen(want));
}

static void test_format_basic(void **state) {
    (void)state;
    const double v[4] = {1, 2, 3, 4};
    const mt_dtype dts[] = {MT_F32, MT_F16, MT_BF16, MT_F64};
    for (int k = 0; k < 4; k++) {
        mt_tensor *t = mt_test_tensor(v, dts[k], MT_SHAPE(2, 2));
        char want[128];
        snprintf(want, sizeof want,
                 "tensor([[1.0000, 2.0000],\n        [3.0000, 4.0000]], dtype=%s, shape=[2, 2])",
                 mt_dtype_name(dts[k]));
        assert_format(t, want);
        mt_release(t);
    }
    mt_tensor *t = mt_test_tensor(v, MT_F32, MT_SHAPE(2, 2)), *tt = mt_transpose(t, 0, 1);
    assert_format(tt,
                  "tensor([[1.0000, 3.0000],\n        [2.0000, 4.0000]], dtype=f32, shape=[2, 2])");
    const double iv[3] = {-3, 0, 12};
    mt_tensor *ti = mt_test_tensor(iv, MT_I32, MT_SHAPE(3));
    assert_format(ti, "tensor([-3,  0, 12], dtype=i32, shape=[3])"); /* one width */
    const int64_t big[2] = {((int64_t)1 << 60) + 1, -1};
    mt_tensor *tl = mt_from_data(big, MT_I64, MT_SHAPE(2), mt_test_device());
    assert_format(tl, "tensor([1152921504606846977,                  -1], dtype=i64, shape=[2])");
    const double bv[3] = {1, 0, 1};
    mt_tensor *tb = mt_test_tensor(bv, MT_BOOL, MT_SHAPE(3, 1));
    assert_format(
        tb, "tensor([[ true],\n        [false],\n        [ true]], dtype=bool, shape=[3, 1])");
    mt_tensor *s = mt_scalar(-0.5, MT_F32, mt_test_device());
    assert_format(s, "tensor(-0.5000, dtype=f32, shape=[])");
    mt_tensor *e = mt_zeros(MT_SHAPE(0, 3), MT_F16, mt_test_device());
    assert_format(e, "tensor([], dtype=f16, shape=[0, 3])");
    const double sv[3] = {1e-5, 1, NAN};
    mt_tensor *sci = mt_test_tensor(sv, MT_F64, MT_SHAPE(3));
    assert_format(sci, "tensor([1.0000e-05, 1.0000e+00,        nan], dtype=f64, shape=[3])");
    /* torch's other two triggers: a ratio above 1000 (0.001 and 100), a magnitude above
       1e8; a ratio of exactly 1000 and 1e8 itself stay fixed-point */
    const double ratio[2] = {0.001, 100}, edge[2] = {0.1, 100}, large[2] = {1, 100000001};
    const double at_1e8[2] = {1e5, 1e8};
    mt_tensor *tr = mt_test_tensor(ratio, MT_F32, MT_SHAPE(2));
    assert_format(tr, "tensor([1.0000e-03, 1.0000e+02], dtype=f32, shape=[2])");
    mt_tensor *te = mt_test_tensor(edge, MT_F32, MT_SHAPE(2));
    assert_format(te, "tensor([  0.1000, 100.0000], dtype=f32, shape=[2])");
    mt_tensor *tlg = mt_test_tensor(large, MT_F64, MT_SHAPE(2));
    assert_format(tlg, "tensor([1.0000e+00, 1.0000e+08], dtype=f64, shape=[2])");
    mt_tensor *t8 = mt_test_tensor(at_1e8, MT_F64, MT_SHAPE(2));
    assert_format(t8, "tensor([   100000.0000, 100000000.0000], dtype=f64, shape=[2])");
    mt_release(tr);
    mt_release(te);
    mt_release(tlg);
    mt_release(t8);
    const double inf[2] = {INFINITY, -INFINITY};
    mt_tensor *ti2 = mt_test_tensor(inf, MT_F32, MT_SHAPE(2));
    assert_format(ti2, "tensor([ inf, -inf], dtype=f32, shape=[2])");
    mt_release(t);
    mt_release(tt);
    mt_release(ti);
    mt_release(tl);
    mt_release(tb);
    mt_release(s);
    mt_release(e);
    mt_release(sci);
    mt_release(ti2);
}

static void test_format_summary_and_autograd(void **state) {
    (void)state;
    /* up to the threshold (1000 elements) every entry is shown, wrapped at 80 columns */
    mt_tensor *a = mt_arange(0, 10, 1, MT_I64, mt_test_device());
    assert_format(a, "tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 9], dtype=i64, shape=[10])");
    mt_tensor *b = mt_arange(0, 64, 1, MT_F32, mt_test_device()),
              *m = mt_reshape(b, MT_SHAPE(8, 8));
    mt_tensor *mt = mt_transpose(m, 0, 1);
    char buf[2048];
    mt_format(mt, buf, sizeof buf);
    const char *rows01 = "tensor([[ 0.0000,  8.0000, 16.0000, 24.0000, 32.0000, 40.0000, 48.0000, "
                         "56.0000],\n        [ 1.0000,  9.0000, ";
    if (strncmp(buf, rows01, strlen(rows01)) != 0) fail_msg("got \"%s\"", buf);
    char wbuf[128];
    assert_non_null(
        strstr(buf, on_device("63.0000]], dtype=f32, shape=[8, 8])", wbuf, sizeof wbuf)));
    /* past it, each long dim shows 3 + 3 entries, rows and blocks on their own lines */
    mt_tensor *big = mt_zeros(MT_SHAPE(1000, 1000, 10), MT_BF16, mt_test_device());
    char bigbuf[8192];
    int n = mt_format(big, bigbuf, sizeof bigbuf);
    assert_true(n > 0 && n < (int)sizeof bigbuf); /* 6 x 6 x 6 values shown */
    assert_non_null(strstr(bigbuf, "tensor([[[0.0000, 0.0000, 0.0000,  ..., 0.0000, 0.0000, "
                                   "0.0000],\n         [0.0000,"));
    assert_non_null(strstr(bigbuf, "0.0000]],\n\n        [[0.0000"));
    assert_non_null(strstr(bigbuf, "],\n         ...,\n         ["));
    assert_non_null(strstr(bigbuf, "]],\n\n        ...,\n\n        [["));
    assert_non_null(strstr(bigbuf, "dtype=bf16, shape=[1000, 1000, 10])"));

    const double v[2] = {1, 2};
    mt_tensor *x = mt_test_tensor(v, MT_F32, MT_SHAPE(2));
    mt_set_requires_grad(x, true);
    assert_format(x, "tensor([1.0000, 2.0000], dtype=f32, shape=[2], requires_grad=true)");
    mt_tensor *y = mt_mul(x, x);
    assert_format(y, "tensor([1.0000, 4.0000], dtype=f32, shape=[2], grad_fn=mul)");
    mt_release(a);
    mt_release(b);
    mt_release(m);
    mt_release(mt);
    mt_release(big);
    mt_release(x);
    mt_release(y);
}

/* mt_print_options: precision, threshold, edge items, line width and scientific mode change
   the text as torch.set_printoptions does; bad values are refused and change nothing; NULL
   restores the defaults. */
static void test_print_options(void **state) {
    (void)state;
    mt_print_options o, before;
    mt_print_options_get(&before);
    assert_int_equal(before.precision, 4);
    assert_int_equal(before.threshold, 1000);
    assert_int_equal(before.edgeitems, 3);
    assert_int_equal(before.linewidth, 80);
    assert_int_equal(before.sci_mode, -1);
    mt_tensor *a = mt_arange(0, 10, 1, MT_F32, mt_test_device());
    o = before;
    o.precision = 1;
    o.threshold = 5;
    o.edgeitems = 2;
    assert_int_equal(mt_print_options_set(&o), 0);
    assert_format(a, "tensor([0.0, 1.0,  ..., 8.0, 9.0], dtype=f32, shape=[10])");
    o.edgeitems = 0; /* 0 means 0: only the ellipsis */
    o.precision = 0;
    assert_int_equal(mt_print_options_set(&o), 0);
    assert_format(a, "tensor([ ...], dtype=f32, shape=[10])");
    o = before;
    o.linewidth = 30;
    o.sci_mode = 1;
    o.precision = 2;
    assert_int_equal(mt_print_options_set(&o), 0);
    mt_tensor *three = mt_arange(0, 3, 1, MT_F32, mt_test_device());
    assert_format(three, "tensor([0.00e+00, 1.00e+00,\n        2.00e+00], dtype=f32, shape=[3])");
    o.linewidth = 0;
    assert_int_equal(mt_print_options_set(&o), MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "mt_print_options_set: linewidth 0");
    o.linewidth = 80;
    o.sci_mode = 2;
    assert_int_equal(mt_print_options_set(&o), MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "sci_mode 2");
    /* values of any length in full: fixed-point 1e60 (61 digits and 4 decimals) and 30
       significant decimals (a 64-byte buffer cut them short) */
    o.sci_mode = 0;
    o.precision = 4;
    o.linewidth = 200;
    assert_int_equal(mt_print_options_set(&o), 0);
    mt_tensor *huge = mt_full(MT_SHAPE(2), MT_F64, mt_test_device(), 1e60);
    char big[512];
    snprintf(big, sizeof big, "tensor([%.4f, %.4f], dtype=f64, shape=[2])", 1e60, 1e60);
    assert_format(huge, big);
    o.sci_mode = 1;
    o.precision = 30;
    assert_int_equal(mt_print_options_set(&o), 0);
    mt_tensor *f = mt_scalar(3e38, MT_F32, mt_test_device());
    snprintf(big, sizeof big, "tensor(%.30e, dtype=f32, shape=[])", (double)3e38f);
    assert_format(f, big);
    mt_release(huge);
    mt_release(f);
    o.linewidth = 30;
    o.sci_mode = 1;
    o.precision = 2;
    assert_int_equal(mt_print_options_set(&o), 0);
    mt_print_options_get(&o);
    assert_int_equal(o.linewidth, 30); /* the refused calls changed nothing */
    assert_int_equal(mt_print_options_set(NULL), 0);
    mt_print_options_get(&o);
    assert_memory_equal(&o, &before, sizeof o);
    mt_release(a);
    mt_release(three);
}

static void test_format_truncation_and_print(void **state) {
    (void)state;
    const double v[3] = {1, 2, 3};
    mt_tensor *t = mt_test_tensor(v, MT_F32, MT_SHAPE(3));
    char fbuf[128];
    const char *full =
        on_device("tensor([1.0000, 2.0000, 3.0000], dtype=f32, shape=[3])", fbuf, sizeof fbuf);
    assert_int_equal(mt_format(t, NULL, 0), (int)strlen(full));
    char small[10];
    memset(small, 'x', sizeof small);
    assert_int_equal(mt_format(t, small, sizeof small), (int)strlen(full));
    assert_string_equal(small, "tensor([1"); /* truncated and terminated */
    FILE *f = tmpfile();
    assert_non_null(f);
    assert_int_equal(mt_print(t, f), 0);
    rewind(f);
    char line[256] = {0};
    assert_non_null(fgets(line, sizeof line, f));
    fclose(f);
    char want[256];
    snprintf(want, sizeof want, "%s\n", full);
    assert_string_equal(line, want);

    assert_true(mt_format(NULL, small, sizeof small) < 0);
    assert_string_equal(small, "");
    assert_error(MT_ERR_NULL, "mt_format: arg 1");
    assert_true(mt_print(NULL, stdout) < 0);
    assert_error(MT_ERR_NULL, "mt_print: arg 1");
    assert_true(mt_print(t, NULL) < 0);
    assert_error(MT_ERR_NULL, "mt_print: arg 2");
    assert_true(mt_format(t, NULL, 5) < 0);
    assert_error(MT_ERR_NULL, "buf is NULL");
    mt_release(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        MT_TEST(test_format_basic),
        MT_TEST(test_format_summary_and_autograd),
        MT_TEST(test_print_options),
        MT_TEST(test_format_truncation_and_print),
    };
    return MT_RUN_TESTS(tests);
}
