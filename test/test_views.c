/* Views: values against index loops, shared storage, layouts, gradients and errors. */
#include "test_util.h"

/* A [rows, cols] F64 tensor holding 0, 1, 2, ... */
static mt_tensor *iota(mt_dtype dt, int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = (double)i;
    mt_tensor *t = mt_test_tensor(v, dt, ndim, shape);
    free(v);
    return t;
}

static void assert_strides(const mt_tensor *t, int ndim, const int64_t *strides) {
    assert_int_equal(mt_ndim(t), ndim);
    for (int i = 0; i < ndim; i++) assert_int_equal(mt_strides(t)[i], strides[i]);
}

/* The address of element `elem` of a contiguous base, in its device's memory (compared only:
   views must start at the right element of their base's memory). */
static const char *elem_ptr(const mt_tensor *base, int64_t elem) {
    return (const char *)mt_test_data_addr(base) + elem * (int64_t)mt_dtype_size(mt_dtype_of(base));
}

/* ------------------------------------------------------------------ reshape / view */

static void test_reshape_view_shares_storage(void **state) {
    (void)state;
    mt_tensor *a = iota(MT_F32, MT_SHAPE(2, 3, 4));
    mt_tensor *r = mt_reshape(a, MT_SHAPE(4, -1));
    assert_no_error();
    assert_shape(r, 4, 6);
    assert_strides(r, MT_SHAPE(6, 1));
    assert_ptr_equal(mt_test_data_addr(r), mt_test_data_addr(a));
    double expect[24];
    for (int i = 0; i < 24; i++) expect[i] = i;
    assert_tensor_close(r, expect, 24, 0, 0);
    /* writes through the view are seen by the base (r[1][1] is element 7) */
    mt_tensor *row = mt_narrow(r, 0, 1, 1), *r7 = mt_narrow(row, 1, 1, 1);
    assert_int_equal(mt_fill(r7, 100.0), 0);
    expect[7] = 100;
    assert_tensor_close(a, expect, 24, 0, 0);
    mt_release(r7);
    mt_release(row);

    mt_tensor *v = mt_view(a, MT_SHAPE(-1));
    assert_shape(v, 24);
    assert_ptr_equal(mt_test_data_addr(v), mt_test_data_addr(a));
    mt_tensor *s = mt_reshape(a, MT_SHAPE(2, 1, 3, 1, 4));
    assert_shape(s, 2, 1, 3, 1, 4);
    assert_ptr_equal(mt_test_data_addr(s), mt_test_data_addr(a));
    mt_tensor *f = mt_flatten(a);
    assert_shape(f, 24);
    assert_ptr_equal(mt_test_data_addr(f), mt_test_data_addr(a));
    assert_no_error();
    mt_release(a);
    mt_release(r);
    mt_release(v);
    mt_release(s);
    mt_release(f);
}

static void test_reshape_scalar_and_empty(void **state) {
    (void)state;
    mt_tensor *s = mt_scalar(3.5, MT_F64, mt_test_device());
    mt_tensor *r = mt_reshape(s, MT_SHAPE(1, 1));
    assert_shape(r, 1, 1);
    assert_true(mt_item(r) == 3.5);
    mt_tensor *back = mt_reshape(r, 0, NULL);
    assert_int_equal(mt_ndim(back), 0);
    mt_tensor *f = mt_flatten(s);
    assert_shape(f, 1);
    mt_tensor *e = mt_zeros(MT_SHAPE(0, 3), MT_F32, mt_test_device());
    mt_tensor *e2 = mt_reshape(e, MT_SHAPE(3, 0, 2));
    assert_shape(e2, 3, 0, 2);
    assert_no_error();
    mt_tensor *bad = mt_reshape(e, MT_SHAPE(-1, 0));
    assert_null(bad);
    assert_error(MT_ERR_SHAPE, "cannot infer the -1");
    mt_release(s);
    mt_release(r);
    mt_release(back);
    mt_release(f);
    mt_release(e);
    mt_release(e2);
}

static void test_reshape_noncontiguous_copies(void **state) {
    (void)state;
    mt_tensor *a = iota(MT_F32, MT_SHAPE(3, 4));
    mt_tensor *t = mt_transpose(a, 0, 1); /* [4, 3], strides [1, 4] */
    assert_false(mt_is_contiguous(t));
    mt_tensor *r = mt_reshape(t, MT_SHAPE(12));
    assert_no_error();
    assert_true(mt_is_contiguous(r));
    assert_ptr_not_equal(mt_test_data_addr(r), mt_test_data_addr(a));
    double expect[12];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 3; j++) expect[i * 3 + j] = j * 4 + i;
    assert_tensor_close(r, expect, 12, 0, 0);
    /* mt_view refuses the same request */
    assert_null(mt_view(t, MT_SHAPE(12)));
    assert_error(MT_ERR_SHAPE, "cannot be viewed as [12]");
    /* but splitting a transposed dim into pieces is a view */
    mt_tensor *v = mt_view(t, MT_SHAPE(2, 2, 3));
    assert_no_error();
    assert_strides(v, MT_SHAPE(2, 1, 4));
    assert_ptr_equal(mt_test_data_addr(v), mt_test_data_addr(a));
    assert_tensor_close(v, expect, 12, 0, 0);
    mt_release(a);
    mt_release(t);
    mt_release(r);
    mt_release(v);
}

static void test_reshape_strided_view(void **state) {
    (void)state;
    /* rows 0, 2, 4 of a [6, 2, 3]: dims 1 and 2 stay contiguous, so [3, 6] is a view */
    mt_tensor *a = iota(MT_F64, MT_SHAPE(6, 2, 3));
    mt_tensor *s = mt_slice(a, 0, 0, 6, 2);
    mt_tensor *r = mt_view(s, MT_SHAPE(3, 6));
    assert_no_error();
    assert_strides(r, MT_SHAPE(12, 1));
    assert_ptr_equal(mt_test_data_addr(r), mt_test_data_addr(a));
    double expect[18];
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 6; j++) expect[i * 6 + j] = 2 * i * 6 + j;
    assert_tensor_close(r, expect, 18, 0, 0);
    /* merging across the step is not */
    assert_null(mt_view(s, MT_SHAPE(18)));
    assert_error(MT_ERR_SHAPE, "mt_view");
    mt_tensor *c = mt_reshape(s, MT_SHAPE(18));
    assert_tensor_close(c, expect, 18, 0, 0);
    mt_release(a);
    mt_release(s);
    mt_release(r);
    mt_release(c);
}

static void test_reshape_errors(void **state) {
    (void)state;
    mt_tensor *a = iota(MT_F32, MT_SHAPE(2, 3));
    assert_null(mt_reshape(a, MT_SHAPE(-1, -1)));
    assert_error(MT_ERR_INVALID, "only one dimension can be -1");
    assert_null(mt_reshape(a, MT_SHAPE(4, 2)));
    assert_error(MT_ERR_SHAPE, "shape [4, 2] is invalid for input of shape [2, 3]");
    assert_null(mt_reshape(a, MT_SHAPE(4, -1)));
    assert_error(MT_ERR_SHAPE, "mt_reshape: arg 3");
    assert_null(mt_view(a, MT_SHAPE(-2, -3)));
    assert_error(MT_ERR_SHAPE, "invalid size -2");
    assert_null(mt_reshape(a, 9, (const int64_t[]){1, 1, 1, 1, 1, 1, 1, 2, 3}));
    assert_error(MT_ERR_INVALID, "at most 8");
    assert_null(mt_reshape(a, 2, NULL));
    assert_error(MT_ERR_NULL, "shape is NULL");
    mt_release(a);
}

/* ------------------------------------------------------------------ transpose / permute */

static void test_transpose(void **state) {
    (void)state;
    mt_tensor *a = iota(MT_F32, MT_SHAPE(2, 3, 4));
    mt_tensor *t = mt_transpose(a, -1, 0); /* [4, 3, 2] */
    assert_no_error();
    assert_shape(t, 4, 3, 2);
    assert_strides(t, MT_SHAPE(1, 4, 12));
    assert_ptr_equal(mt_test_data_addr(t), mt_test_data_addr(a));
    double expect[24];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 3; j++)
            for (int k = 0; k < 2; k++) expect[(i * 3 + j) * 2 + k] = k * 12 + j * 4 + i;
    assert_tensor_close(t, expect, 24, 0, 0);
    assert_string_equal(mt_grad_fn_name(t), ""); /* no autograd input */
    /* transposing back gives the base layout */
    mt_tensor *tt = mt_transpose(t, 2, 0);
    assert_true(mt_is_contiguous(tt));
    assert_null(mt_transpose(a, 0, 3));
    assert_error(MT_ERR_INVALID, "mt_transpose: arg 3: dim 3 is out of range for a 3-d tensor");
    assert_null(mt_transpose(a, -4, 0));
    assert_error(MT_ERR_INVALID, "arg 2");
    mt_release(a);
    mt_release(t);
    mt_release(tt);
}

static void test_permute(void **state) {
    (void)state;
    mt_tensor *a = iota(MT_BF16, MT_SHAPE(2, 3, 4));
    mt_tensor *p = mt_permute(a, MT_DIMS(1, -1, 0)); /* [3, 4, 2] */
    assert_no_error();
    assert_int_equal(mt_dtype_of(p), MT_BF16);
    assert_shape(p, 3, 4, 2);
    assert_strides(p, MT_SHAPE(4, 1, 12));
    assert_ptr_equal(mt_test_data_addr(p), mt_test_data_addr(a));
    double expect[24];
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++)
            for (int k = 0; k < 2; k++) expect[(i * 4 + j) * 2 + k] = k * 12 + i * 4 + j;
    assert_tensor_close(p, expect, 24, 0, 0); /* small integers are exact in bf16 */
    assert_null(mt_permute(a, MT_DIMS(0, 1)));
    assert_error(MT_ERR_INVALID, "order has 2 dims but the tensor of shape [2, 3, 4] has 3");
    assert_null(mt_permute(a, MT_DIMS(0, 1, 1)));
    assert_error(MT_ERR_INVALID, "dim 1 appears more than once");
    assert_null(mt_permute(a, MT_DIMS(0, 1, 5)));
    assert_error(MT_ERR_INVALID, "mt_permute: arg 3: dim 5 is out of range");
    mt_release(a);
    mt_release(p);
}

/* ------------------------------------------------------------------ narrow / slice */

static void test_narrow(void **state) {
    (void)state;
    mt_tensor *a = iota(MT_F16, MT_SHAPE(4, 5));
    mt_tensor *n = mt_narrow(a, -1, 1, 3); /* a[:, 1:4] */
    assert_no_error();
    assert_shape(n, 4, 3);
    assert_strides(n, MT_SHAPE(5, 1));
    assert_ptr_equal(mt_test_data_addr(n), elem_ptr(a, 1));
    double expect[12];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 3; j++) expect[i * 3 + j] = i * 5 + j + 1;
    assert_tensor_close(n, expect, 12, 0, 0);
    mt_tensor *m = mt_narrow(a, 0, -2, 2); /* last two rows */
    assert_ptr_equal(mt_test_data_addr(m), elem_ptr(a, 10));
    mt_tensor *z = mt_narrow(a, 0, 4, 0); /* empty at the end is fine */
    assert_shape(z, 0, 5);
    assert_no_error();
    assert_null(mt_narrow(a, 0, 2, 3));
    assert_error(MT_ERR_INVALID,
                 "mt_narrow: arg 4: length 3 from start 2 exceeds dim 0 of shape [4, 5]");
    assert_null(mt_narrow(a, 1, 6, 0));
    assert_error(MT_ERR_INVALID, "start 6 is out of range");
    assert_null(mt_narrow(a, 1, 0, -1));
    assert_error(MT_ERR_INVALID, "length -1");
    assert_null(mt_narrow(a, 2, 0, 1));
    assert_error(MT_ERR_INVALID, "mt_narrow: arg 2: dim 2 is out of range");
    mt_release(a);
    mt_release(n);
    mt_release(m);
    mt_release(z);
}

/* Python's len(range(*slice(start, end, step).indices(size))) and first index. */
static void py_slice(int64_t size, int64_t start, int64_t end, int64_t step, int64_t *first,
                     int64_t *len) {
    if (start < 0) start = start + size < 0 ? 0 : start + size;
    if (start > size) start = size;
    if (end < 0) end = end + size < 0 ? 0 : end + size;
    if (end > size) end = size;
    *first = start;
    *len = 0;
    for (int64_t i = start; i < end; i += step) (*len)++;
}

static void test_slice_python_rules(void **state) {
    (void)state;
    mt_tensor *a = iota(MT_F64, MT_SHAPE(3, 7));
    const int64_t cases[][3] = {{0, 7, 1},   {1, 6, 2},   {-3, 7, 1},  {-100, 100, 3},
                                {5, 2, 1},   {-1, -3, 1}, {2, -1, 2},  {7, 9, 1},
                                {-7, -6, 1}, {0, 0, 1},   {3, 100, 10}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t first, len;
        py_slice(7, cases[c][0], cases[c][1], cases[c][2], &first, &len);
        mt_tensor *s = mt_slice(a, 1, cases[c][0], cases[c][1], cases[c][2]);
        assert_no_error();
        assert_shape(s, 3, len);
        double expect[21];
        for (int i = 0; i < 3; i++)
            for (int64_t j = 0; j < len; j++) expect[i * len + j] = i * 7 + first + j * cases[c][2];
        assert_tensor_close(s, expect, 3 * len, 0, 0);
        if (len > 1) assert_int_equal(mt_strides(s)[1], cases[c][2]);
        mt_release(s);
    }
    mt_tensor *rows = mt_slice(a, -2, 1, 3, 1);
    assert_ptr_equal(mt_test_data_addr(rows), elem_ptr(a, 7));
    /* a step larger than the dim: one element, whose stride is never stepped */
    mt_tensor *one = mt_slice(a, 1, 2, 7, INT64_MAX);
    assert_shape(one, 3, 1);
    double col2[3] = {2, 9, 16};
    assert_tensor_close(one, col2, 3, 0, 0);
    mt_release(one);
    /* and its backward, which stepped the stride too */
    mt_tensor *leaf = mt_ones(MT_SHAPE(4, 4), MT_F32, mt_test_device());
    mt_set_requires_grad(leaf, true);
    mt_tensor *row = mt_slice(leaf, 0, 1, 4, INT64_MAX), *total = mt_sum_all(row);
    assert_int_equal(mt_backward(total, NULL), 0);
    double row1[16] = {0, 0, 0, 0, 1, 1, 1, 1};
    mt_tensor *gl = mt_grad(leaf);
    assert_tensor_close(gl, row1, 16, 0, 0);
    mt_release(gl);
    mt_release(total);
    mt_release(row);
    mt_release(leaf);
    assert_null(mt_slice(a, 0, 0, 3, 0));
    assert_error(MT_ERR_INVALID, "mt_slice: arg 5: step must be positive, got 0");
    assert_null(mt_slice(a, 0, 0, 3, -1));
    assert_error(MT_ERR_INVALID, "step must be positive");
    assert_null(mt_slice(a, 2, 0, 3, 1));
    assert_error(MT_ERR_INVALID, "mt_slice: arg 2");
    mt_tensor *s0 = mt_scalar(1, MT_F32, mt_test_device());
    assert_null(mt_slice(s0, 0, 0, 1, 1));
    assert_error(MT_ERR_INVALID, "0-d");
    mt_release(s0);
    mt_release(rows);
    mt_release(a);
}

/* ------------------------------------------------------------------ expand */

static void test_expand(void **state) {
    (void)state;
    mt_tensor *a = iota(MT_F32, MT_SHAPE(3, 1));
    mt_tensor *e = mt_expand(a, MT_SHAPE(2, -1, 4)); /* new leading dim, -1 keeps 3 */
    assert_no_error();
    assert_shape(e, 2, 3, 4);
    assert_strides(e, MT_SHAPE(0, 1, 0));
    assert_ptr_equal(mt_test_data_addr(e), mt_test_data_addr(a));
    double expect[24];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++)
            for (int k = 0; k < 4; k++) expect[(i * 3 + j) * 4 + k] = j;
    assert_tensor_close(e, expect, 24, 0, 0);
    /* an expanded view cannot be flattened as a view, but reshape copies it */
    assert_null(mt_view(e, MT_SHAPE(24)));
    assert_error(MT_ERR_SHAPE, "strides [0, 1, 0]");
    mt_tensor *r = mt_reshape(e, MT_SHAPE(24));
    assert_tensor_close(r, expect, 24, 0, 0);
    mt_tensor *z = mt_expand(a, MT_SHAPE(3, 0)); /* size 1 -> 0 is allowed */
    assert_shape(z, 3, 0);
    assert_no_error();

    assert_null(mt_expand(a, MT_SHAPE(4, 4)));
    assert_error(MT_ERR_SHAPE, "cannot expand shape [3, 1] to [4, 4] (dim 0: size 3 is not 1");
    assert_null(mt_expand(a, MT_SHAPE(3)));
    assert_error(MT_ERR_SHAPE, "cannot expand shape [3, 1] to 1 dims");
    assert_null(mt_expand(a, MT_SHAPE(-1, 3, 1)));
    assert_error(MT_ERR_SHAPE, "new leading dim 0");
    assert_null(mt_expand(a, MT_SHAPE(3, -2)));
    assert_error(MT_ERR_SHAPE, "mt_expand: arg 3");
    mt_release(a);
    mt_release(e);
    mt_release(r);
    mt_release(z);
}

/* ------------------------------------------------------------------ squeeze / unsqueeze */

static void test_squeeze_unsqueeze(void **state) {
    (void)state;
    mt_tensor *a = iota(MT_F32, MT_SHAPE(2, 1, 3));
    mt_tensor *s = mt_squeeze(a, -2);
    assert_shape(s, 2, 3);
    assert_strides(s, MT_SHAPE(3, 1));
    assert_ptr_equal(mt_test_data_addr(s), mt_test_data_addr(a));
    mt_tensor *same = mt_squeeze(a, 0); /* size 2: no-op as in torch */
    assert_shape(same, 2, 1, 3);
    mt_tensor *u = mt_unsqueeze(s, -1); /* [2, 3, 1] */
    assert_shape(u, 2, 3, 1);
    assert_strides(u, MT_SHAPE(3, 1, 1));
    mt_tensor *u0 = mt_unsqueeze(s, 0);
    assert_shape(u0, 1, 2, 3);
    assert_strides(u0, MT_SHAPE(6, 3, 1));
    mt_tensor *u1 = mt_unsqueeze(s, 1);
    assert_shape(u1, 2, 1, 3);
    double expect[6] = {0, 1, 2, 3, 4, 5};
    assert_tensor_close(u1, expect, 6, 0, 0);
    mt_tensor *sc = mt_scalar(2, MT_F64, mt_test_device());
    mt_tensor *su = mt_unsqueeze(sc, 0);
    assert_shape(su, 1);
    mt_tensor *ss = mt_squeeze(su, 0);
    assert_int_equal(mt_ndim(ss), 0);
    assert_true(mt_item(ss) == 2);
    assert_no_error();

    assert_null(mt_squeeze(a, 3));
    assert_error(MT_ERR_INVALID, "mt_squeeze: arg 2: dim 3 is out of range for a 3-d tensor");
    assert_null(mt_unsqueeze(a, 4));
    assert_error(MT_ERR_INVALID, "mt_unsqueeze: arg 2: dim 4 is out of range for a new dim of a "
                                 "3-d tensor (expected -4..3)");
    assert_null(mt_unsqueeze(a, -5));
    assert_error(MT_ERR_INVALID, "mt_unsqueeze");
    mt_tensor *big =
        mt_zeros(8, (const int64_t[]){1, 1, 1, 1, 1, 1, 1, 1}, MT_F32, mt_test_device());
    assert_null(mt_unsqueeze(big, 0));
    assert_error(MT_ERR_INVALID, "already has 8 dims");
    mt_release(big);
    mt_release(a);
    mt_release(s);
    mt_release(same);
    mt_release(u);
    mt_release(u0);
    mt_release(u1);
    mt_release(sc);
    mt_release(su);
    mt_release(ss);
}

/* ------------------------------------------------------------------ sharing and NULLs */

static void test_views_share_version_and_outlive_base(void **state) {
    (void)state;
    mt_tensor *a = iota(MT_F32, MT_SHAPE(4, 4));
    mt_tensor *t = mt_transpose(a, 0, 1);
    mt_tensor *s = mt_slice(t, 0, 1, 3, 1);
    mt_release(a); /* the views keep the storage alive */
    mt_tensor *u = mt_unsqueeze(s, 0);
    mt_tensor *e = mt_expand(u, MT_SHAPE(2, 2, 4));
    assert_ptr_equal(mt_test_data_addr(e), mt_test_data_addr(s));
    mt_release(u);
    mt_release(e);
    assert_int_equal(mt_fill(s, 7.0), 0);
    double expect[16];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) expect[i * 4 + j] = (i == 1 || i == 2) ? 7 : j * 4 + i;
    assert_tensor_close(t, expect, 16, 0, 0);
    mt_release(t);
    mt_release(s);
}

/* The version counter lives in the storage: writing through any view of a saved tensor is
   reported at backward. */
static void test_inplace_through_view_detected(void **state) {
    (void)state;
    mt_tensor *x = iota(MT_F64, MT_SHAPE(2, 3));
    mt_set_requires_grad(x, true);
    mt_tensor *y = mt_mul(x, x); /* saves x */
    mt_tensor *d = mt_detach(x);
    mt_tensor *dt = mt_transpose(d, 0, 1);
    mt_tensor *row = mt_narrow(dt, 0, 1, 1); /* x[:, 1] */
    assert_int_equal(mt_fill(row, 5.0), 0);  /* d is history-free: allowed with grad on */
    double *xv = mt_test_values(x);
    assert_true(xv[1] == 5.0); /* x[0][1], seen through the base */
    free(xv);
    mt_tensor *g = mt_ones_like(y);
    assert_true(mt_backward(y, g) < 0);
    assert_error(MT_ERR_STATE, "modified in place");
    assert_null(mt_grad(x));
    mt_release(g);
    mt_release(row);
    mt_release(dt);
    mt_release(d);
    mt_release(y);
    mt_release(x);
}

static void test_scope_tracks_views(void **state) {
    (void)state;
    mt_tensor *a = iota(MT_F32, MT_SHAPE(2, 3));
    int64_t live = mt_live_tensors();
    mt_scope_begin();
    mt_tensor *v = mt_unsqueeze(mt_transpose(mt_reshape(a, MT_SHAPE(3, 2)), 0, 1), 0);
    assert_shape(v, 1, 2, 3);
    assert_int_equal(mt_live_tensors(), live + 3);
    mt_scope_end();
    assert_int_equal(mt_live_tensors(), live);
    mt_release(a);
}

static void test_null_inputs(void **state) {
    (void)state;
    assert_null(mt_reshape(NULL, MT_SHAPE(1)));
    assert_null(mt_view(NULL, MT_SHAPE(1)));
    assert_null(mt_flatten(NULL));
    assert_null(mt_transpose(NULL, 0, 1));
    assert_null(mt_permute(NULL, MT_DIMS(0)));
    assert_null(mt_narrow(NULL, 0, 0, 1));
    assert_null(mt_slice(NULL, 0, 0, 1, 1));
    assert_null(mt_expand(NULL, MT_SHAPE(1)));
    assert_null(mt_squeeze(NULL, 0));
    assert_null(mt_unsqueeze(NULL, 0));
    assert_int_equal(mt_last_status(), MT_OK);
}

/* ------------------------------------------------------------------ gradients */

typedef struct {
    int which;
} view_case;

/* Every view op, applied to a non-contiguous input (the transpose of x) where it applies,
   then multiplied by a fixed weight so each output element has its own gradient. */
static mt_tensor *view_fn(mt_tensor *const *in, void *vctx) {
    const view_case *c = vctx;
    mt_tensor *x = in[0];                  /* [3, 4] */
    mt_tensor *xt = mt_transpose(x, 0, 1); /* [4, 3], non-contiguous */
    switch (c->which) {
    case 0:
        return mt_reshape(xt, MT_SHAPE(2, -1)); /* copy path */
    case 1:
        return mt_reshape(x, MT_SHAPE(6, 2)); /* view path */
    case 2:
        return mt_view(xt, MT_SHAPE(2, 2, 3));
    case 3:
        return mt_flatten(xt);
    case 4:
        return xt;
    case 5:
        return mt_permute(mt_reshape(x, MT_SHAPE(3, 2, 2)), MT_DIMS(2, 0, 1));
    case 6:
        return mt_narrow(xt, 1, 1, 2);
    case 7:
        return mt_slice(xt, 0, -3, 100, 2);
    case 8:
        return mt_expand(mt_unsqueeze(xt, 1), MT_SHAPE(2, 4, 5, 3));
    case 9:
        return mt_squeeze(mt_unsqueeze(xt, 2), 2);
    case 10:
        return mt_unsqueeze(mt_narrow(xt, 0, 0, 3), -1);
    case 11: { /* two overlapping slices of the same input add up */
        mt_tensor *a = mt_slice(x, 1, 0, 3, 1), *b = mt_slice(x, 1, 1, 4, 1);
        return mt_cat((mt_tensor *[]){a, b}, 2, 0);
    }
    default:
        return NULL;
    }
}

static void test_gradcheck_views(void **state) {
    (void)state;
    mt_manual_seed(3);
    mt_tensor *x = mt_randn(MT_SHAPE(3, 4), MT_F64, mt_test_device());
    mt_set_requires_grad(x, true);
    for (int w = 0; w <= 11; w++) {
        view_case c = {w};
        int rc = mt_gradcheck(view_fn, &x, 1, &c, NULL);
        if (rc != 0) fail_msg("view case %d: %s", w, mt_last_error());
    }
    mt_release(x);
}

static void test_grad_fn_names_and_slice_grad_values(void **state) {
    (void)state;
    mt_tensor *x = iota(MT_F32, MT_SHAPE(2, 5));
    mt_set_requires_grad(x, true);
    mt_tensor *t = mt_transpose(x, 0, 1);
    assert_string_equal(mt_grad_fn_name(t), "transpose");
    mt_tensor *r = mt_reshape(t, MT_SHAPE(10)); /* a copy, still recorded as reshape */
    assert_string_equal(mt_grad_fn_name(r), "reshape");
    mt_tensor *s = mt_slice(r, 0, 1, 10, 3); /* elements 1, 4, 7 of x^T flattened */
    assert_string_equal(mt_grad_fn_name(s), "slice");
    mt_tensor *u = mt_unsqueeze(s, 0);
    mt_tensor *e = mt_expand(u, MT_SHAPE(4, 3));
    assert_string_equal(mt_grad_fn_name(e), "expand");
    mt_release(u);
    mt_tensor *g = mt_ones(MT_SHAPE(4, 3), MT_F32, mt_test_device());
    assert_int_equal(mt_backward(e, g), 0);
    mt_tensor *gx = mt_grad(x);
    assert_non_null(gx);
    /* x^T flattened index k = j * 2 + i for x[i][j]; k in {1, 4, 7} get 4 each */
    double expect[10] = {0};
    for (int k = 1; k < 10; k += 3) expect[(k % 2) * 5 + k / 2] = 4;
    assert_tensor_close(gx, expect, 10, 0, 0);
    assert_int_equal(mt_dtype_of(gx), MT_F32);
    mt_release(gx);
    mt_release(g);
    mt_release(e);
    mt_release(s);
    mt_release(r);
    mt_release(t);
    mt_release(x);
}

static void test_views_low_precision_grad(void **state) {
    (void)state;
    mt_tensor *x = iota(MT_F16, MT_SHAPE(2, 3));
    mt_set_requires_grad(x, true);
    mt_tensor *p = mt_permute(x, MT_DIMS(1, 0));
    mt_tensor *r = mt_reshape(p, MT_SHAPE(6));
    mt_tensor *w = iota(MT_F16, MT_SHAPE(6));
    mt_tensor *y = mt_mul(r, w);
    assert_int_equal(mt_dtype_of(y), MT_F16);
    assert_int_equal(mt_backward(y, w), 0);
    mt_tensor *gx = mt_grad(x);
    assert_int_equal(mt_dtype_of(gx), MT_F16);
    /* d/dx of sum(w * w * r): x[i][j] sits at r[j * 2 + i] */
    double expect[6];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++) expect[i * 3 + j] = (double)(j * 2 + i) * (j * 2 + i);
    assert_tensor_close(gx, expect, 6, 0, 0);
    mt_release(gx);
    mt_release(y);
    mt_release(w);
    mt_release(r);
    mt_release(p);
    mt_release(x);
}

/* Sizes near INT64_MAX: every shape, stride and length computation is overflow-checked, so
   such requests fail with a clear error instead of wrapping into a small (or zero) view. */
static void test_overflow_safe_shapes(void **state) {
    (void)state;
    mt_tensor *t = mt_zeros(MT_SHAPE(10), MT_F32, mt_test_device());
    assert_null(mt_narrow(t, 0, 1, INT64_MAX)); /* start + length overflows */
    assert_error(MT_ERR_INVALID, "exceeds dim 0");
    mt_tensor *s = mt_slice(t, 0, 0, 10, INT64_MAX); /* Python: t[0:10:huge] is one element */
    assert_non_null(s);
    assert_shape(s, 1);
    mt_release(s);
    s = mt_slice(t, 0, 3, INT64_MAX, INT64_MAX - 1);
    assert_non_null(s);
    assert_shape(s, 1);
    mt_release(s);
    mt_tensor *one = mt_zeros(MT_SHAPE(1, 1), MT_F32, mt_test_device());
    assert_null(mt_expand(one, MT_SHAPE((int64_t)1 << 40, (int64_t)1 << 40)));
    assert_error(MT_ERR_SHAPE, "more than 2^63 elements");
    assert_null(mt_reshape(one, MT_SHAPE((int64_t)1 << 62, 4, -1)));
    assert_error(MT_ERR_SHAPE, "more than 2^63 elements");
    assert_null(mt_view(one, MT_SHAPE((int64_t)1 << 62, 4, 4)));
    assert_error(MT_ERR_SHAPE, "more than 2^63 elements");
    mt_release(one);
    mt_release(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        MT_TEST(test_reshape_view_shares_storage),
        MT_TEST(test_reshape_scalar_and_empty),
        MT_TEST(test_reshape_noncontiguous_copies),
        MT_TEST(test_reshape_strided_view),
        MT_TEST(test_reshape_errors),
        MT_TEST(test_transpose),
        MT_TEST(test_permute),
        MT_TEST(test_narrow),
        MT_TEST(test_slice_python_rules),
        MT_TEST(test_expand),
        MT_TEST(test_squeeze_unsqueeze),
        MT_TEST(test_views_share_version_and_outlive_base),
        MT_TEST(test_inplace_through_view_detected),
        MT_TEST(test_scope_tracks_views),
        MT_TEST(test_null_inputs),
        MT_TEST(test_gradcheck_views),
        MT_TEST(test_grad_fn_names_and_slice_grad_values),
        MT_TEST(test_views_low_precision_grad),
        MT_TEST(test_overflow_safe_shapes),
    };
    return MT_RUN_TESTS(tests);
}
