/* The tensor core: creation, random draws, host transfer, accessors, ownership (refcounts,
   scopes, live counters), in-place ops and their interplay with autograd, and
   out-of-memory paths. Printing: test_format.c. */
#include "test_util.h"

static mt_tensor *from_doubles(const double *v, mt_dtype dt, int ndim, const int64_t *shape) {
    return mt_test_tensor(v, dt, ndim, shape);
}

/* ------------------------------------------------------------------ creation */

static void test_filled_creation(void **state) {
    (void)state;
    const mt_dtype dts[] = {MT_F32, MT_F16, MT_BF16, MT_F64, MT_I64, MT_I32, MT_BOOL};
    for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++) {
        mt_dtype dt = dts[k];
        mt_tensor *z = mt_zeros(MT_SHAPE(2, 3), dt, mt_test_device()),
                  *o = mt_ones(MT_SHAPE(2, 3), dt, mt_test_device());
        mt_tensor *f = mt_full(MT_SHAPE(2, 3), dt, mt_test_device(), 5.0),
                  *e = mt_empty(MT_SHAPE(2, 3), dt, mt_test_device());
        assert_no_error();
        assert_shape(z, 2, 3);
        assert_shape(e, 2, 3);
        assert_int_equal(mt_dtype_of(f), dt);
        assert_true(mt_is_contiguous(e));
        assert_int_equal(mt_numel(o), 6);
        double zero[6] = {0}, one[6] = {1, 1, 1, 1, 1, 1}, five[6] = {5, 5, 5, 5, 5, 5};
        assert_tensor_close(z, zero, 6, 0, 0);
        assert_tensor_close(o, one, 6, 0, 0);
        assert_tensor_close(f, dt == MT_BOOL ? one : five, 6, 0, 0);
        mt_tensor *zl = mt_zeros_like(f), *ol = mt_ones_like(f), *el = mt_empty_like(f);
        assert_shape(zl, 2, 3);
        assert_int_equal(mt_dtype_of(ol), dt);
        assert_int_equal(mt_dtype_of(el), dt);
        assert_tensor_close(zl, zero, 6, 0, 0);
        assert_tensor_close(ol, one, 6, 0, 0);
        mt_release(z);
        mt_release(o);
        mt_release(f);
        mt_release(e);
        mt_release(zl);
        mt_release(ol);
        mt_release(el);
    }
    mt_tensor *s = mt_scalar(-2.5, MT_F32, mt_test_device());
    assert_int_equal(mt_ndim(s), 0);
    assert_int_equal(mt_numel(s), 1);
    assert_true(mt_item(s) == -2.5);
    mt_release(s);
    /* bf16 rounds to 8 significant bits: 1 + 2^-9 becomes 1 */
    mt_tensor *b = mt_full(MT_SHAPE(1), MT_BF16, mt_test_device(), 1.0 + 1.0 / 512);
    assert_true(mt_item(b) == 1.0);
    mt_release(b);
    /* an integer tensor takes a value within its range, truncated toward zero, else an
       error (torch: "value cannot be converted ... without overflow"), and changes nothing */
    mt_tensor *i32 = mt_full(MT_SHAPE(2), MT_I32, mt_test_device(), -2147483647.9);
    assert_tensor_close(i32, ((const double[]){-2147483647.0, -2147483647.0}), 2, 0, 0);
    assert_null(mt_full(MT_SHAPE(2), MT_I32, mt_test_device(), 2147483647.5));
    assert_error(MT_ERR_INVALID, "does not fit in i32");
    assert_int_equal(mt_fill(i32, 2.5), 0);
    assert_tensor_close(i32, ((const double[]){2, 2}), 2, 0, 0);
    assert_int_equal(mt_fill(i32, 3e9), MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "mt_fill: arg 2: value 3e+09 does not fit in i32");
    assert_tensor_close(i32, ((const double[]){2, 2}), 2, 0, 0);
    assert_null(mt_full(MT_SHAPE(2), MT_I32, mt_test_device(), 2147483648.0));
    assert_error(MT_ERR_INVALID, "mt_full: arg 5: value 2.14748e+09 does not fit in i32");
    assert_null(mt_scalar(NAN, MT_I64, mt_test_device()));
    assert_error(MT_ERR_INVALID, "mt_scalar: arg 1: value nan does not fit in i64");
    /* a finite value past a floating dtype's largest is refused (torch: "cannot be converted
       to type at::Half without overflow"), even one that would round to it; inf and NaN fill */
    assert_null(mt_full(MT_SHAPE(2), MT_F16, mt_test_device(), 65505.0));
    assert_error(MT_ERR_INVALID, "mt_full: arg 5: value 65505 does not fit in f16");
    assert_null(mt_scalar(-1e39, MT_BF16, mt_test_device()));
    assert_error(MT_ERR_INVALID, "value -1e+39 does not fit in bf16");
    assert_null(mt_scalar(1e300, MT_F32, mt_test_device()));
    assert_error(MT_ERR_INVALID, "does not fit in f32");
    mt_tensor *edge = mt_full(MT_SHAPE(1), MT_F16, mt_test_device(), -65504.0);
    mt_tensor *inf16 = mt_scalar(INFINITY, MT_F16, mt_test_device());
    mt_tensor *big64 = mt_scalar(1e300, MT_F64, mt_test_device());
    assert_no_error();
    assert_true(mt_item(edge) == -65504.0 && isinf(mt_item(inf16)) && mt_item(big64) == 1e300);
    assert_int_equal(mt_fill(edge, 1e6), MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "mt_fill: arg 2: value 1e+06 does not fit in f16");
    assert_true(mt_item(edge) == -65504.0);
    mt_release(edge);
    mt_release(inf16);
    mt_release(big64);
    assert_null(mt_full(MT_SHAPE(1), MT_I64, mt_test_device(), 9223372036854775808.0));
    assert_error(MT_ERR_INVALID, "does not fit in i64");
    mt_tensor *flag = mt_scalar(NAN, MT_BOOL, mt_test_device()); /* any non-zero: true */
    assert_true(mt_item(flag) == 1.0);
    mt_release(flag);
    mt_release(i32);
}

static void test_arange(void **state) {
    (void)state;
    mt_tensor *a = mt_arange(0, 5, 1, MT_F32, mt_test_device());
    assert_shape(a, 5);
    double e[5] = {0, 1, 2, 3, 4};
    assert_tensor_close(a, e, 5, 0, 0);
    mt_tensor *b = mt_arange(1, 2, 0.25, MT_F64, mt_test_device());
    double eb[4] = {1, 1.25, 1.5, 1.75};
    assert_tensor_close(b, eb, 4, 0, 0);
    mt_tensor *c = mt_arange(3, -3, -2, MT_I64, mt_test_device());
    double ec[3] = {3, 1, -1};
    assert_int_equal(mt_dtype_of(c), MT_I64);
    assert_tensor_close(c, ec, 3, 0, 0);
    mt_tensor *empty = mt_arange(2, 2, 1, MT_F32, mt_test_device());
    assert_shape(empty, 0);
    assert_no_error();
    assert_null(mt_arange(0, 1, 0, MT_F32, mt_test_device()));
    assert_error(MT_ERR_INVALID, "mt_arange: start 0, end 1, step 0");
    assert_null(mt_arange(0, 5, -1, MT_F32, mt_test_device()));
    assert_error(MT_ERR_INVALID, "finite range");
    /* a range of more elements than int64 counts (or an overflowing end - start) */
    assert_null(mt_arange(0, 1e20, 1, MT_F32, mt_test_device()));
    assert_error(MT_ERR_SHAPE, "mt_arange: start 0, end 1e+20, step 1 make 1e+20 elements");
    assert_null(mt_arange(-1e308, 1e308, 1, MT_F32, mt_test_device()));
    assert_error(MT_ERR_SHAPE, "make inf elements, too many");
    mt_release(a);
    mt_release(b);
    mt_release(c);
    mt_release(empty);
}

/* Casts to the integer dtypes as torch makes them, the same on every device: I64 to I32
   wraps (two's complement; through a double, 2^53 + 1 would have lost its low bit), strided
   views too, I32 back to I64 sign-extends, BOOL is 0 or 1; and a floating value out of range
   or NaN gives the minimum (x86's integer indefinite, torch's CPU result; a plain C cast is
   undefined there). */
static void test_integer_casts(void **state) {
    (void)state;
    mt_device dev = mt_test_device();
    mt_scope_begin();
    const int64_t big[] = {4294967297LL, -4294967297LL,      2147483648LL,
                           3000000000LL, 9007199254740993LL, -7};
    mt_tensor *i64 = mt_from_data(big, MT_I64, MT_SHAPE(6), dev);
    int32_t got32[6];
    mt_tensor *i32 = mt_cast(i64, MT_I32);
    assert_int_equal(mt_copy_to_host(i32, got32, sizeof got32), 0);
    const int32_t want32[] = {1, -1, INT32_MIN, -1294967296, 1, -7};
    assert_memory_equal(got32, want32, sizeof want32);
    int64_t got64[6];
    assert_int_equal(mt_copy_to_host(mt_cast(i32, MT_I64), got64, sizeof got64), 0);
    const int64_t want_back[] = {1, -1, INT32_MIN, -1294967296, 1, -7};
    assert_memory_equal(got64, want_back, sizeof want_back);
    /* I64 to F32 rounds once (through a double, 2^60 + 2^36 + 1 fell on a tie and went to
       2^60), and to BF16 through that float; bits from torch 1.13 */
    const int64_t wide[] = {(1LL << 60) + (1LL << 36) + 1,
                            (1LL << 60) + (1LL << 52) + (1LL << 36) + 1,
                            -((1LL << 60) + (1LL << 36) + 1), 2147483647, 16777217};
    mt_tensor *w64 = mt_from_data(wide, MT_I64, MT_SHAPE(5), dev);
    uint32_t f32_bits[5];
    assert_int_equal(mt_copy_to_host(mt_cast(w64, MT_F32), f32_bits, sizeof f32_bits), 0);
    const uint32_t want_f32[] = {0x5d800001u, 0x5d808001u, 0xdd800001u, 0x4f000000u, 0x4b800000u};
    assert_memory_equal(f32_bits, want_f32, sizeof want_f32);
    uint16_t bf16_bits[5];
    assert_int_equal(mt_copy_to_host(mt_cast(w64, MT_BF16), bf16_bits, sizeof bf16_bits), 0);
    const uint16_t want_bf16[] = {0x5d80, 0x5d81, 0xdd80, 0x4f00, 0x4b80};
    assert_memory_equal(bf16_bits, want_bf16, sizeof want_bf16);
    /* a strided I64 view ([2, 3] every other element of [2, 6]) to I32, and through BOOL */
    mt_tensor *every_other =
        mt_slice(mt_reshape(mt_cat((mt_tensor *[]){i64, i64}, 2, 0), MT_SHAPE(2, 6)), 1, 0, 6, 2);
    assert_int_equal(mt_copy_to_host(mt_cast(every_other, MT_I32), got32, sizeof got32), 0);
    const int32_t want_view[] = {1, INT32_MIN, 1, 1, INT32_MIN, 1};
    assert_memory_equal(got32, want_view, sizeof want_view);
    assert_int_equal(
        mt_copy_to_host(mt_cast(mt_cast(every_other, MT_BOOL), MT_I64), got64, sizeof got64), 0);
    const int64_t ones[] = {1, 1, 1, 1, 1, 1};
    assert_memory_equal(got64, ones, sizeof ones);
    /* BOOL bytes other than 0 and 1 (mt_from_data copies them as they are) read as true */
    const uint8_t bytes[3] = {0, 2, 255};
    mt_tensor *b = mt_from_data(bytes, MT_BOOL, MT_SHAPE(3), dev);
    assert_int_equal(mt_copy_to_host(mt_cast(b, MT_I32), got32, 3 * sizeof(int32_t)), 0);
    const int32_t want_b[] = {0, 1, 1};
    assert_memory_equal(got32, want_b, sizeof want_b);
    const double floats[] = {1e10, -1e10, NAN, 2147483647.9, -2147483648.9, -3.7};
    mt_tensor *f = mt_test_tensor(floats, MT_F64, MT_SHAPE(6));
    assert_int_equal(mt_copy_to_host(mt_cast(f, MT_I32), got32, sizeof got32), 0);
    const int32_t want_f[] = {INT32_MIN, INT32_MIN, INT32_MIN, INT32_MAX, INT32_MIN, -3};
    assert_memory_equal(got32, want_f, sizeof want_f);
    assert_int_equal(mt_copy_to_host(mt_cast(f, MT_I64), got64, sizeof got64), 0);
    const int64_t want_f64[] = {10000000000LL, -10000000000LL, INT64_MIN,
                                2147483647,    -2147483648LL,  -3};
    assert_memory_equal(got64, want_f64, sizeof want_f64);
    /* a cast converts as the hardware does (above); a fill value must fit (torch) */
    assert_null(mt_full(MT_SHAPE(1), MT_I32, dev, 1e10));
    assert_error(MT_ERR_INVALID, "does not fit in i32");
    assert_no_error();
    mt_scope_end();
}

static void stats(const mt_tensor *t, double *mean, double *var, double *lo, double *hi) {
    int64_t n = mt_numel(t);
    double *v = mt_test_values(t), s = 0, s2 = 0;
    *lo = INFINITY;
    *hi = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        s += v[i];
        *lo = v[i] < *lo ? v[i] : *lo;
        *hi = v[i] > *hi ? v[i] : *hi;
    }
    *mean = s / n;
    for (int64_t i = 0; i < n; i++) s2 += (v[i] - *mean) * (v[i] - *mean);
    *var = s2 / (n - 1);
    free(v);
}

static void test_random_statistics(void **state) {
    (void)state;
    mt_manual_seed(1234);
    const mt_dtype dts[] = {MT_F32, MT_F64, MT_F16, MT_BF16};
    for (size_t k = 0; k < 4; k++) {
        double mean, var, lo, hi;
        mt_tensor *u = mt_rand(MT_SHAPE(200, 500), dts[k], mt_test_device());
        assert_int_equal(mt_dtype_of(u), dts[k]);
        stats(u, &mean, &var, &lo, &hi);
        /* 1e5 draws: the standard error of the mean is 0.0009 */
        assert_true(fabs(mean - 0.5) < 0.005);
        assert_true(fabs(var - 1.0 / 12) < 0.003);
        assert_true(lo >= 0.0);
        /* [0, 1) in every dtype: an F16/BF16 draw has that dtype's digits (24 random bits
           rounded up to 1.0 for 2^-12 of F16 and 2^-9 of BF16 draws) */
        assert_true(hi < 1.0);
        mt_tensor *g = mt_randn(MT_SHAPE(100000), dts[k], mt_test_device());
        stats(g, &mean, &var, &lo, &hi);
        assert_true(fabs(mean) < 0.015);
        assert_true(fabs(var - 1.0) < 0.02);
        assert_true(lo < -3.5 && hi > 3.5); /* tails are present */
        mt_release(u);
        mt_release(g);
    }
    assert_null(mt_randn(MT_SHAPE(2), MT_I64, mt_test_device()));
    assert_error(MT_ERR_DTYPE, "mt_randn: dtype i64 is not a floating dtype");
}

static void test_random_determinism(void **state) {
    (void)state;
    mt_manual_seed(42);
    mt_tensor *a = mt_randn(MT_SHAPE(3, 7), MT_F32, mt_test_device());
    mt_tensor *a2 = mt_randn(MT_SHAPE(3, 7), MT_F32, mt_test_device());
    mt_manual_seed(42);
    mt_tensor *b = mt_randn(MT_SHAPE(3, 7), MT_F32, mt_test_device());
    mt_tensor *b2 = mt_randn(MT_SHAPE(3, 7), MT_F32, mt_test_device());
    mt_manual_seed(43);
    mt_tensor *c = mt_randn(MT_SHAPE(3, 7), MT_F32, mt_test_device());
    float pa[21], pa2[21], pb[21], pb2[21], pc[21];
    assert_int_equal(mt_copy_to_host(a, pa, sizeof pa), 0);
    assert_int_equal(mt_copy_to_host(a2, pa2, sizeof pa2), 0);
    assert_int_equal(mt_copy_to_host(b, pb, sizeof pb), 0);
    assert_int_equal(mt_copy_to_host(b2, pb2, sizeof pb2), 0);
    assert_int_equal(mt_copy_to_host(c, pc, sizeof pc), 0);
    assert_memory_equal(pa, pb, 21 * sizeof(float));
    assert_memory_equal(pa2, pb2, 21 * sizeof(float));
    int same_next = 0, same_seed = 0;
    for (int i = 0; i < 21; i++) {
        same_next += pa[i] == pa2[i];
        same_seed += pa[i] == pc[i];
    }
    assert_true(same_next < 2);
    assert_true(same_seed < 2);
    /* the same draw in another dtype is the same numbers, rounded */
    mt_manual_seed(42);
    mt_tensor *d = mt_randn(MT_SHAPE(3, 7), MT_F64, mt_test_device());
    double *vd = mt_test_values(d);
    for (int i = 0; i < 21; i++) assert_true(fabs(vd[i] - pa[i]) <= 1e-6 * (1 + fabs(pa[i])));
    free(vd);
    mt_release(a);
    mt_release(a2);
    mt_release(b);
    mt_release(b2);
    mt_release(c);
    mt_release(d);
}

/* ------------------------------------------------------------------ host transfer */

static void test_from_data_round_trip(void **state) {
    (void)state;
    const float f[6] = {1.5f, -2.0f, 3.25f, 0.0f, 1e-3f, 65504.0f};
    mt_tensor *t = mt_from_data(f, MT_F32, MT_SHAPE(2, 3), mt_test_device());
    float back[6];
    assert_int_equal(mt_copy_to_host(t, back, sizeof back), 0);
    assert_memory_equal(f, back, sizeof f);
    assert_ptr_not_equal(mt_test_data_addr(t), (const void *)f); /* copied */
    /* a transposed view comes back contiguous in logical order */
    mt_tensor *tt = mt_transpose(t, 0, 1);
    float tb[6];
    assert_int_equal(mt_copy_to_host(tt, tb, sizeof tb), 0);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++) assert_true(tb[i * 2 + j] == f[j * 3 + i]);
    /* host buffers at any alignment, both ways (the strided kernels moved typed elements
       through them: UBSan) */
    unsigned char raw[6 * sizeof(float) + 1];
    assert_int_equal(mt_copy_to_host(tt, raw + 1, sizeof tb), 0);
    assert_memory_equal(raw + 1, tb, sizeof tb);
    mt_tensor *odd = mt_from_data(raw + 1, MT_F32, MT_SHAPE(3, 2), mt_test_device());
    assert_int_equal(mt_copy_to_host(odd, back, sizeof back), 0);
    assert_memory_equal(back, tb, sizeof tb);
    mt_release(odd);
    /* a CPU tensor copied into its own storage (a transposed view of it): read first, then
       written, as torch's copy_ of overlapping memory */
    if (mt_test_device_is_cpu()) {
        const float v8[8] = {0, 1, 2, 3, 4, 5, 6, 7};
        mt_tensor *m = mt_from_data(v8, MT_F32, MT_SHAPE(4, 2), MT_CPU),
                  *mtr = mt_transpose(m, 0, 1);
        assert_int_equal(mt_copy_to_host(mtr, mt_data_ptr(m), 8 * sizeof(float)), 0);
        assert_tensor_close(m, ((const double[]){0, 2, 4, 6, 1, 3, 5, 7}), 8, 0, 0);
        mt_release(mtr);
        mt_release(m);
    }
    const int64_t big[3] = {INT64_MAX, -7, (int64_t)1 << 60};
    mt_tensor *ti = mt_from_data(big, MT_I64, MT_SHAPE(3), mt_test_device());
    int64_t bi[3];
    assert_int_equal(mt_copy_to_host(ti, bi, sizeof bi), 0);
    assert_memory_equal(big, bi, sizeof big);
    const uint8_t bools[2] = {1, 0};
    mt_tensor *tb2 = mt_from_data(bools, MT_BOOL, MT_SHAPE(2), mt_test_device());
    mt_tensor *one = mt_narrow(tb2, 0, 0, 1);
    assert_true(mt_item(one) == 1.0);
    mt_tensor *el = mt_slice(t, 1, 2, 3, 1), *el2 = mt_narrow(el, 0, 1, 1); /* t[1][2] */
    assert_true(mt_item(el2) == (double)65504.0f);
    assert_no_error();

    assert_true(mt_copy_to_host(t, back, sizeof back - 1) == MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "buffer of 23 bytes is smaller than the tensor's 24 bytes");
    assert_true(isnan(mt_item(t)));
    assert_error(MT_ERR_SHAPE, "mt_item: tensor of shape [2, 3] has 6 elements, expected 1");
    assert_null(mt_from_data(NULL, MT_F32, MT_SHAPE(2), mt_test_device()));
    assert_error(MT_ERR_NULL, "mt_from_data: arg 1: src is NULL");
    assert_null(mt_from_data(f, MT_F32, MT_SHAPE(2, -3), mt_test_device()));
    assert_error(MT_ERR_SHAPE, "negative size in shape [2, -3]");
    mt_release(t);
    mt_release(tt);
    mt_release(ti);
    mt_release(tb2);
    mt_release(one);
    mt_release(el);
    mt_release(el2);
}

static void test_accessors(void **state) {
    (void)state;
    mt_tensor *t = mt_zeros(MT_SHAPE(2, 3, 4), MT_BF16, mt_test_device());
    assert_int_equal(mt_ndim(t), 3);
    assert_int_equal(mt_dim(t, 0), 2);
    assert_int_equal(mt_dim(t, -1), 4);
    assert_int_equal(mt_dim(t, -3), 2);
    assert_int_equal(mt_strides(t)[0], 12);
    assert_int_equal(mt_shape(t)[1], 3);
    assert_int_equal(mt_numel(t), 24);
    assert_true(mt_is_contiguous(t));
    assert_on_test_device(t);
    /* mt_data_ptr hands out host memory only: a device tensor is refused, never a device
       address the host would crash on */
    void *p = mt_data_ptr(t);
    if (mt_test_device_is_cpu()) {
        assert_non_null(p);
        assert_ptr_equal(p, mt_test_data_addr(t)); /* the helper the view tests compare with */
    } else {
        assert_null(p);
        assert_error(MT_ERR_DEVICE, "mt_data_ptr: tensor is on cuda");
    }
    assert_int_equal(mt_dtype_size(MT_BF16), 2);
    assert_string_equal(mt_dtype_name(MT_BF16), "bf16");
    assert_true(mt_dtype_is_floating(MT_F16));
    assert_false(mt_dtype_is_floating(MT_I32));
    assert_no_error();
    assert_int_equal(mt_dim(t, 3), -1);
    assert_error(MT_ERR_INVALID, "mt_dim: arg 2: dim 3 is out of range for a 3-d tensor");
    /* NULL accessors answer without an error */
    assert_int_equal(mt_ndim(NULL), -1);
    assert_int_equal(mt_numel(NULL), -1);
    assert_null(mt_shape(NULL));
    assert_null(mt_data_ptr(NULL));
    assert_false(mt_is_contiguous(NULL));
    assert_int_equal(mt_last_status(), MT_OK);
    mt_release(t);
}

/* ------------------------------------------------------------------ ownership */

static void test_refcounts_and_live_counters(void **state) {
    (void)state;
    int64_t t0 = mt_live_tensors(), b0 = mt_live_bytes();
    mt_tensor *a = mt_zeros(MT_SHAPE(10, 10), MT_F64, mt_test_device());
    assert_int_equal(mt_live_tensors(), t0 + 1);
    assert_true(mt_live_bytes() >= b0 + 800);
    int64_t b1 = mt_live_bytes();
    assert_ptr_equal(mt_retain(a), a);
    mt_release(a);
    assert_int_equal(mt_live_tensors(), t0 + 1); /* one reference left */
    mt_tensor *v = mt_reshape(a, MT_SHAPE(100)); /* a view: header, no new bytes */
    assert_int_equal(mt_live_tensors(), t0 + 2);
    assert_int_equal(mt_live_bytes(), b1);
    mt_release(a);
    assert_int_equal(mt_live_bytes(), b1); /* the view keeps the storage */
    mt_release(v);
    assert_int_equal(mt_live_tensors(), t0);
    assert_int_equal(mt_live_bytes(), b0);
    mt_peak_bytes_reset();
    mt_tensor *big = mt_empty(MT_SHAPE(1000), MT_F32, mt_test_device());
    assert_true(mt_peak_bytes() >= b0 + 4000);
    mt_release(big);
    mt_release(NULL); /* fine */
    assert_null(mt_retain(NULL));
}

static void test_scopes(void **state) {
    (void)state;
    int64_t t0 = mt_live_tensors();
    assert_int_equal(mt_scope_depth(), 0);
    mt_scope_begin();
    mt_tensor *a = mt_ones(MT_SHAPE(4), MT_F32, mt_test_device());
    mt_tensor *b = mt_add(a, a);
    mt_tensor *kept = mt_retain(mt_mul(b, b));
    assert_int_equal(mt_live_tensors(), t0 + 3);
    mt_scope_begin(); /* nested: inner results die first */
    assert_int_equal(mt_scope_depth(), 2);
    mt_tensor *c = mt_add(b, kept);
    assert_non_null(c);
    assert_int_equal(mt_live_tensors(), t0 + 4);
    mt_scope_end();
    assert_int_equal(mt_live_tensors(), t0 + 3);
    /* library-internal results are not tracked: mean_all runs a sum and a scale inside,
       mt_cast of an f16 goes through the copy path; only the returned tensor counts (with
       grad mode off nothing is saved for backward either) */
    bool prev = mt_set_grad_enabled(false);
    mt_tensor *h = mt_cast(a, MT_F16);
    mt_tensor *mh = mt_mean_all(h);
    assert_int_equal(mt_live_tensors(), t0 + 5);
    assert_true(mt_item(mh) == 1.0);
    mt_set_grad_enabled(prev);
    /* a backward creates many temporaries; none lands in the scope but the gradient */
    mt_set_requires_grad(a, true);
    mt_tensor *m = mt_mean_all(mt_mul(a, a));
    assert_int_equal(mt_backward(m, NULL), 0);
    mt_tensor *g = mt_grad(a); /* tracked by the scope too */
    float gv[4]; /* (test_util's value helpers release their temporaries: not inside a scope) */
    assert_int_equal(mt_copy_to_host(g, gv, sizeof gv), 0);
    for (int i = 0; i < 4; i++) assert_true(gv[i] == 0.5f);
    mt_scope_end();
    assert_int_equal(mt_scope_depth(), 0);
    /* `kept` outlives its scope; everything else is gone (a's gradient went with a) */
    assert_int_equal(mt_live_tensors(), t0 + 1);
    double e2[4] = {4, 4, 4, 4};
    assert_tensor_close(kept, e2, 4, 0, 0);
    mt_release(kept);
    assert_int_equal(mt_live_tensors(), t0);
    mt_scope_end(); /* unbalanced end is harmless */
    assert_int_equal(mt_scope_depth(), 0);
}

static void test_scope_keeps_backward_working(void **state) {
    (void)state;
    mt_tensor *x = mt_full(MT_SHAPE(3), MT_F32, mt_test_device(), 2.0);
    mt_set_requires_grad(x, true);
    mt_scope_begin();
    mt_tensor *y = mt_retain(mt_sum_all(mt_mul(mt_exp(x), x)));
    mt_scope_end(); /* intermediates released; the tape holds what backward needs */
    assert_int_equal(mt_backward(y, NULL), 0);
    mt_tensor *g = mt_grad(x);
    double v = exp(2.0) * 3.0, e[3] = {v, v, v}; /* d(x e^x) = e^x (1 + x) */
    assert_tensor_close(g, e, 3, 1e-5, 1e-6);
    mt_release(g);
    mt_release(y);
    mt_release(x);
}

/* ------------------------------------------------------------------ in-place ops */

static void test_inplace_values(void **state) {
    (void)state;
    mt_tensor *a = mt_zeros(MT_SHAPE(2, 3), MT_F32, mt_test_device());
    assert_int_equal(mt_fill(a, 2.5), 0);
    double e1[6] = {2.5, 2.5, 2.5, 2.5, 2.5, 2.5};
    assert_tensor_close(a, e1, 6, 0, 0);
    const double rv[3] = {1, 2, 3};
    mt_tensor *row = from_doubles(rv, MT_F64, MT_SHAPE(3));
    assert_int_equal(mt_add_inplace(a, row), 0); /* broadcast, f64 into f32 */
    double e2[6] = {3.5, 4.5, 5.5, 3.5, 4.5, 5.5};
    assert_tensor_close(a, e2, 6, 0, 0);
    assert_int_equal(mt_mul_scalar_inplace(a, -2), 0);
    double e3[6] = {-7, -9, -11, -7, -9, -11};
    assert_tensor_close(a, e3, 6, 0, 0);
    /* copy: broadcast and convert into an f16 column view */
    mt_tensor *h = mt_zeros(MT_SHAPE(3, 2), MT_F16, mt_test_device());
    mt_tensor *col = mt_narrow(h, 1, 1, 1); /* [3, 1], strided */
    mt_tensor *c0 = mt_scalar(1.0 + 1.0 / 4096, MT_F64, mt_test_device());
    assert_int_equal(mt_copy(col, c0), 0);
    double e4[6] = {0, 1, 0, 1, 0, 1}; /* rounded to f16 */
    assert_tensor_close(h, e4, 6, 0, 0);
    assert_int_equal(mt_zero(h), 0);
    double zero[6] = {0};
    assert_tensor_close(h, zero, 6, 0, 0);
    /* copying a tensor onto its own transpose reads the old values */
    const double sq[4] = {1, 2, 3, 4};
    mt_tensor *s = from_doubles(sq, MT_F32, MT_SHAPE(2, 2)), *st = mt_transpose(s, 0, 1);
    assert_int_equal(mt_copy(s, st), 0);
    double e5[4] = {1, 3, 2, 4};
    assert_tensor_close(s, e5, 4, 0, 0);
    assert_int_equal(mt_add_inplace(s, st), 0); /* s += s^T, both the same memory */
    double e6[4] = {2, 5, 5, 8};
    assert_tensor_close(s, e6, 4, 0, 0);
    /* an int destination */
    mt_tensor *iv = mt_zeros(MT_SHAPE(2), MT_I64, mt_test_device());
    mt_tensor *src = mt_full(MT_SHAPE(2), MT_F32, mt_test_device(), 7.0);
    assert_int_equal(mt_copy(iv, src), 0);
    double e7[2] = {7, 7};
    assert_tensor_close(iv, e7, 2, 0, 0);
    /* a wider source is added in the wider dtype and rounded once (torch's add_): through
       a strided F16 view, the source rounded first would give inf and 1024 */
    mt_tensor *h2 = mt_zeros(MT_SHAPE(2, 2), MT_F16, mt_test_device());
    mt_tensor *h2t = mt_transpose(h2, 0, 1);
    const double before[4] = {-60000, 1024, 0, 0}, add[4] = {70000, 0.5 + 1.0 / 8192, 0, 0};
    mt_tensor *hb = from_doubles(before, MT_F16, MT_SHAPE(2, 2));
    assert_int_equal(mt_copy(h2t, hb), 0);
    mt_tensor *wide = from_doubles(add, MT_F32, MT_SHAPE(2, 2));
    assert_int_equal(mt_add_inplace(h2t, wide), 0);
    assert_tensor_close(h2t, ((const double[]){10000, 1025, 0, 0}), 4, 0, 0);
    mt_tensor *b16 = mt_full(MT_SHAPE(1), MT_BF16, mt_test_device(), 256);
    mt_tensor *f64 = mt_full(MT_SHAPE(1), MT_F64, mt_test_device(), 1 + 1.0 / 512);
    assert_int_equal(mt_add_inplace(b16, f64), 0);
    assert_tensor_close(b16, ((const double[]){258}), 1, 0, 0);
    mt_release(f64);
    mt_release(b16);
    mt_release(wide);
    mt_release(hb);
    mt_release(h2t);
    mt_release(h2);
    assert_no_error();
    mt_release(a);
    mt_release(row);
    mt_release(h);
    mt_release(col);
    mt_release(c0);
    mt_release(s);
    mt_release(st);
    mt_release(iv);
    mt_release(src);
}

static void test_inplace_errors(void **state) {
    (void)state;
    mt_tensor *a = mt_zeros(MT_SHAPE(2, 3), MT_F32, mt_test_device()),
              *b = mt_zeros(MT_SHAPE(4), MT_F32, mt_test_device());
    assert_true(mt_add_inplace(a, b) == MT_ERR_SHAPE);
    assert_error(MT_ERR_SHAPE, "mt_add_inplace: shapes [2, 3] and [4] do not broadcast");
    mt_tensor *wide = mt_zeros(MT_SHAPE(4, 2, 3), MT_F32, mt_test_device());
    assert_true(mt_copy(a, wide) == MT_ERR_SHAPE);
    assert_error(
        MT_ERR_SHAPE,
        "mt_copy: arg 2: shape [4, 2, 3] does not broadcast to the destination shape [2, 3]");
    mt_tensor *r = mt_zeros(MT_SHAPE(1, 3), MT_F32, mt_test_device()),
              *ex = mt_expand(r, MT_SHAPE(2, 3));
    assert_true(mt_add_inplace(ex, a) == MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "elements that share memory");
    assert_true(mt_copy(ex, a) == MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "mt_copy: arg 1");
    mt_tensor *i = mt_zeros(MT_SHAPE(2, 3), MT_I32, mt_test_device());
    assert_true(mt_mul_scalar_inplace(i, 2) == MT_ERR_DTYPE);
    assert_error(MT_ERR_DTYPE, "mt_mul_scalar_inplace: arg 1: dtype i32 is not a floating dtype");
    assert_true(mt_add_inplace(a, i) == MT_ERR_DTYPE);
    assert_error(MT_ERR_DTYPE, "mt_add_inplace: arg 2");
    assert_true(mt_fill(NULL, 1) == MT_ERR_NULL);
    assert_error(MT_ERR_NULL, "mt_fill: arg 1");
    assert_true(mt_copy(a, NULL) == MT_ERR_NULL);
    assert_error(MT_ERR_NULL, "mt_copy: arg 2");
    assert_true(mt_zero(NULL) < 0);
    assert_true(mt_add_inplace(NULL, a) < 0);
    assert_true(mt_mul_scalar_inplace(NULL, 1) < 0);
    mt_clear_error();
    double zero[6] = {0};
    assert_tensor_close(a, zero, 6, 0, 0); /* failed calls changed nothing */
    mt_release(a);
    mt_release(b);
    mt_release(wide);
    mt_release(r);
    mt_release(ex);
    mt_release(i);
}

/* mt_to, mt_clone, mt_contiguous and mt_detach: values, sharing and the device error. */
static void test_to_clone_detach(void **state) {
    (void)state;
    double v[6] = {1, -2, 3.5, 4, -5, 6};
    mt_tensor *a = mt_from_data(v, MT_F64, MT_SHAPE(2, 3), mt_test_device());
    mt_tensor *same = mt_to(a, mt_test_device());
    assert_ptr_equal(same, a); /* same device: a new reference to a */
    mt_release(same);
    mt_tensor *t = mt_transpose(a, 0, 1), *c = mt_clone(t), *k = mt_contiguous(t);
    mt_tensor *d = mt_detach(t);
    double vt[6] = {1, 4, -2, -5, 3.5, 6};
    assert_tensor_close(c, vt, 6, 0, 0);
    assert_tensor_close(k, vt, 6, 0, 0);
    assert_tensor_close(d, vt, 6, 0, 0);
    assert_true(mt_is_contiguous(c) && mt_is_contiguous(k) && !mt_is_contiguous(d));
    assert_ptr_not_equal(mt_test_data_addr(c), mt_test_data_addr(t)); /* copies */
    assert_ptr_equal(mt_test_data_addr(d), mt_test_data_addr(t));     /* shares storage */
    assert_int_equal(mt_fill(d, 0), 0);
    double zero[6] = {0};
    assert_tensor_close(a, zero, 6, 0, 0); /* writes through the detached alias */
    assert_tensor_close(c, vt, 6, 0, 0);   /* the copies kept their values */
    /* Deliberately across devices (hence the literal MT_CPU / MT_CUDA): the other device is
       the host when testing a GPU, cuda:0 when testing the CPU on a GPU machine; without a GPU
       there is none, and asking for cuda:0 is the error. */
    if (!mt_cuda_available()) {
        assert_null(mt_to(a, MT_CUDA(0)));
        assert_int_equal(mt_last_status(), MT_ERR_DEVICE);
        assert_error(MT_ERR_DEVICE, "mt_to");
    } else {
        mt_device other = mt_test_device_is_cpu() ? MT_CUDA(0) : MT_CPU;
        mt_tensor *ct = mt_transpose(c, 0, 1); /* a non-contiguous source */
        mt_tensor *o = mt_to(ct, other), *back = mt_to(o, mt_test_device());
        assert_no_error();
        assert_int_equal(mt_device_of(o).type, other.type);
        assert_on_test_device(back);
        double vc[6] = {1, -2, 3.5, 4, -5, 6};
        assert_tensor_close(o, vc, 6, 0, 0);
        assert_tensor_close(back, vc, 6, 0, 0);
        assert_null(mt_add(o, ct)); /* ops do not move data behind the user's back */
        assert_error(MT_ERR_DEVICE, "mt_add: tensors are on different devices");
        mt_release(back);
        mt_release(o);
        mt_release(ct);
    }
    /* integer tensors can be cloned and moved too */
    mt_tensor *i = mt_arange(0, 4, 1, MT_I64, mt_test_device()), *ic = mt_clone(i);
    assert_int_equal(mt_dtype_of(ic), MT_I64);
    assert_tensor_close(ic, ((const double[]){0, 1, 2, 3}), 4, 0, 0);
    mt_release(ic);
    mt_release(i);
    mt_release(d);
    mt_release(k);
    mt_release(c);
    mt_release(t);
    mt_release(a);
}

/* mt_zero refuses autograd tensors like the other in-place ops, naming itself. */
/* A shape with a 0 size has no elements, but its other sizes still make its strides: when
   they overflow int64 the shape is refused (torch: "Stride calculation overflowed"), from
   creation, reshape and view; when they fit, the empty tensor is made. */
static void test_empty_shape_whose_strides_overflow(void **state) {
    (void)state;
    mt_device dev = mt_test_device();
    assert_null(mt_zeros(MT_SHAPE(0, 1LL << 40, 1LL << 40), MT_F32, dev));
    assert_error(MT_ERR_SHAPE, "mt_zeros: shape [0, 1099511627776, 1099511627776]: its strides");
    assert_null(mt_empty(MT_SHAPE(5, 0, 1LL << 40, 1LL << 30), MT_F16, dev));
    assert_error(MT_ERR_SHAPE, "its strides overflow int64");
    /* the outermost size makes no stride */
    mt_tensor *outer = mt_empty(MT_SHAPE(1LL << 40, 0, 1LL << 40), MT_F16, dev);
    assert_non_null(outer);
    assert_true(mt_strides(outer)[0] == 1LL << 40);
    mt_release(outer);
    mt_tensor *e = mt_zeros(MT_SHAPE(0, 1LL << 31, 1LL << 31), MT_F32, dev);
    assert_non_null(e);
    assert_true(mt_strides(e)[0] == 1LL << 62 && mt_numel(e) == 0);
    assert_null(mt_reshape(e, MT_SHAPE(2, 1LL << 40, 0, 1LL << 40)));
    assert_error(MT_ERR_SHAPE,
                 "mt_reshape: shape [2, 1099511627776, 0, 1099511627776]: its strides");
    assert_null(mt_view(e, MT_SHAPE(0, 1LL << 40, 1LL << 40)));
    assert_error(MT_ERR_SHAPE, "mt_view: shape [0, 1099511627776, 1099511627776]: its strides");
    mt_tensor *r = mt_reshape(e, MT_SHAPE(1LL << 40, 0, 1LL << 20));
    assert_non_null(r);
    assert_true(mt_strides(r)[0] == 1LL << 20 && mt_numel(r) == 0);
    mt_release(r);
    mt_release(e);
}

static void test_zero_errors(void **state) {
    (void)state;
    mt_tensor *w = mt_ones(MT_SHAPE(3), MT_F32, mt_test_device());
    mt_set_requires_grad(w, true);
    assert_int_equal(mt_zero(w), MT_ERR_STATE);
    assert_error(MT_ERR_STATE, "mt_zero: arg 1");
    assert_int_equal(mt_zero(NULL), MT_ERR_NULL);
    assert_error(MT_ERR_NULL, "mt_zero: arg 1");
    assert_int_equal(mt_add_inplace(w, NULL), MT_ERR_NULL);
    assert_error(MT_ERR_NULL, "mt_add_inplace: arg 2");
    assert_int_equal(mt_mul_scalar_inplace(NULL, 2), MT_ERR_NULL);
    assert_error(MT_ERR_NULL, "mt_mul_scalar_inplace: arg 1");
    assert_int_equal(mt_copy(NULL, w), MT_ERR_NULL);
    assert_error(MT_ERR_NULL, "mt_copy: arg 1");
    /* a read-only source is fine: copying from a parameter into a plain tensor */
    mt_tensor *dst = mt_zeros(MT_SHAPE(3), MT_F64, mt_test_device());
    assert_int_equal(mt_copy(dst, w), 0);
    assert_tensor_close(dst, ((const double[]){1, 1, 1}), 3, 0, 0);
    mt_release(dst);
    mt_release(w);
}

/* A view taken before its base required grad: writing it in place with grad mode on would
   change a leaf that requires grad behind autograd's back (torch refuses it, through the
   view's base); a view of a detached alias stays writable. */
static void test_inplace_view_before_requires_grad(void **state) {
    (void)state;
    mt_tensor *x = mt_ones(MT_SHAPE(3), MT_F32, mt_test_device());
    mt_tensor *v = mt_narrow(x, 0, 0, 2);
    mt_tensor *u = mt_unsqueeze(v, 0), *vv = mt_transpose(u, 0, 1);
    mt_set_requires_grad(x, true);
    assert_int_equal(mt_fill(v, 5), MT_ERR_STATE);
    assert_error(MT_ERR_STATE, "mt_fill: arg 1: a view of a leaf tensor that requires grad");
    assert_int_equal(mt_zero(vv), MT_ERR_STATE);
    assert_error(MT_ERR_STATE, "mt_zero: arg 1: a view of a leaf tensor that requires grad");
    double ones[3] = {1, 1, 1};
    assert_tensor_close(x, ones, 3, 0, 0);
    bool prev = mt_set_grad_enabled(false);
    assert_int_equal(mt_fill(v, 5), 0);
    mt_set_grad_enabled(prev);
    double fives[3] = {5, 5, 1};
    assert_tensor_close(x, fives, 3, 0, 0);
    mt_tensor *d = mt_detach(x);
    mt_tensor *dv = mt_narrow(d, 0, 1, 2);
    assert_int_equal(mt_fill(dv, 2), 0);
    double twos[3] = {5, 2, 2};
    assert_tensor_close(x, twos, 3, 0, 0);
    mt_release(dv);
    mt_release(d);
    mt_release(vv);
    mt_release(u);
    mt_release(v);
    mt_release(x);
}

static void test_inplace_autograd_refusal(void **state) {
    (void)state;
    mt_tensor *w = mt_ones(MT_SHAPE(3), MT_F32, mt_test_device());
    mt_set_requires_grad(w, true);
    assert_true(mt_mul_scalar_inplace(w, 2) == MT_ERR_STATE);
    assert_error(MT_ERR_STATE, "mt_mul_scalar_inplace: arg 1: a leaf tensor that requires grad "
                               "cannot be modified in place");
    assert_true(mt_fill(w, 0) == MT_ERR_STATE);
    assert_error(MT_ERR_STATE, "mt_fill");
    mt_tensor *y = mt_mul(w, w);
    assert_true(mt_add_inplace(y, w) == MT_ERR_STATE);
    assert_error(MT_ERR_STATE, "a tensor made by mt_mul that requires grad");
    mt_tensor *v = mt_narrow(w, 0, 0, 2); /* a view of a parameter has history too */
    assert_true(mt_zero(v) == MT_ERR_STATE);
    assert_error(MT_ERR_STATE, "made by mt_slice");
    double one[3] = {1, 1, 1};
    assert_tensor_close(w, one, 3, 0, 0);
    /* an optimizer-style update under no_grad is allowed */
    bool prev = mt_set_grad_enabled(false);
    assert_int_equal(mt_mul_scalar_inplace(w, 3), 0);
    mt_set_grad_enabled(prev);
    double three[3] = {3, 3, 3};
    assert_tensor_close(w, three, 3, 0, 0);
    /* a view made with grad mode off (and a view of it) shares w's memory without history:
       refused as an in-place target once grad mode is back on, as torch; fine with it off.
       mt_detach's result is a plain tensor: writing it is allowed, as torch */
    prev = mt_set_grad_enabled(false);
    mt_tensor *nv = mt_narrow(w, 0, 0, 2);
    mt_set_grad_enabled(prev);
    mt_tensor *nvv = mt_slice(nv, 0, 0, 2, 2);
    mt_tensor *src = mt_zeros(MT_SHAPE(2), MT_F32, mt_test_device());
    assert_int_equal(mt_fill(nv, 7), MT_ERR_STATE);
    assert_error(MT_ERR_STATE, "mt_fill: arg 1: a view made with grad mode off");
    assert_int_equal(mt_copy(nv, src), MT_ERR_STATE);
    assert_error(MT_ERR_STATE, "mt_copy: arg 1: a view made with grad mode off");
    assert_int_equal(mt_zero(nvv), MT_ERR_STATE);
    assert_error(MT_ERR_STATE, "mt_zero: arg 1: a view made with grad mode off");
    assert_tensor_close(w, three, 3, 0, 0);
    prev = mt_set_grad_enabled(false);
    assert_int_equal(mt_fill(nv, 5), 0);
    mt_set_grad_enabled(prev);
    double five[3] = {5, 5, 3};
    assert_tensor_close(w, five, 3, 0, 0);
    mt_tensor *d = mt_detach(w);
    assert_int_equal(mt_fill(d, 3), 0);
    assert_tensor_close(w, three, 3, 0, 0);
    mt_release(d);
    mt_release(src);
    mt_release(nvv);
    mt_release(nv);
    mt_release(v);
    mt_release(y);
    mt_release(w);
}

static void test_inplace_version_counter(void **state) {
    (void)state;
    const double v[3] = {1, 2, 3};
    mt_tensor *x = from_doubles(v, MT_F32, MT_SHAPE(3));
    mt_set_requires_grad(x, true);
    mt_tensor *c = from_doubles(v, MT_F32, MT_SHAPE(3)); /* a constant, saved by mul */
    mt_tensor *y = mt_mul(x, c);
    mt_tensor *l = mt_sum_all(y);
    assert_int_equal(mt_add_inplace(c, c), 0); /* c needs no grad: allowed, but bumps */
    assert_true(mt_backward(l, NULL) == MT_ERR_STATE);
    assert_error(MT_ERR_STATE, "a tensor saved by mt_mul for backward was modified in place");
    assert_null(mt_grad(x));
    mt_release(l);
    mt_release(y);
    /* recomputing after the change works */
    y = mt_mul(x, c);
    l = mt_sum_all(y);
    assert_int_equal(mt_backward(l, NULL), 0);
    mt_tensor *g = mt_grad(x);
    double e[3] = {2, 4, 6};
    assert_tensor_close(g, e, 3, 0, 0);
    /* changing a tensor the tape did not save is fine */
    mt_tensor *y2 = mt_add(x, c), *l2 = mt_sum_all(y2);
    assert_int_equal(mt_fill(c, 0), 0);
    assert_int_equal(mt_backward(l2, NULL), 0);
    mt_release(g);
    g = mt_grad(x);
    double e2[3] = {3, 5, 7};
    assert_tensor_close(g, e2, 3, 0, 0);
    mt_release(g);
    mt_release(l);
    mt_release(y);
    mt_release(l2);
    mt_release(y2);
    mt_release(c);
    mt_release(x);
}

/* ------------------------------------------------------------------ out of memory */

static void test_out_of_memory(void **state) {
    (void)state;
    int64_t t0 = mt_live_tensors(), b0 = mt_live_bytes();
    assert_null(mt_empty(MT_SHAPE((int64_t)1 << 45), MT_F32, mt_test_device())); /* 128 TiB */
    assert_error(MT_ERR_OOM, "mt_empty: out of memory allocating");
#ifndef __SANITIZE_ADDRESS__ /* ASan aborts on requests over its own 1 TiB ceiling */
    assert_null(mt_empty(MT_SHAPE((int64_t)1 << 40), MT_F32, mt_test_device())); /* 4 TiB */
    assert_error(MT_ERR_OOM, "out of memory");
#endif
    assert_null(mt_zeros(MT_SHAPE((int64_t)1 << 40, (int64_t)1 << 40), MT_F32, mt_test_device()));
    assert_error(MT_ERR_OOM, "is too large to allocate");
    mt_debug_set_alloc_limit(1 << 20);
    assert_null(mt_zeros(MT_SHAPE(1 << 20), MT_F32, mt_test_device()));
    assert_error(MT_ERR_OOM, "mt_zeros: out of memory allocating 4194304 bytes");
    mt_tensor *ok =
        mt_ones(MT_SHAPE(1 << 17), MT_F32, mt_test_device()); /* 512 KiB: under the limit */
    assert_non_null(ok);
    /* an op whose output cannot be allocated fails cleanly, recording nothing */
    mt_set_requires_grad(ok, true);
    mt_tensor *w2 = mt_expand(ok, MT_SHAPE(4, 1 << 17));
    assert_null(mt_mul_scalar(w2, 2.0));
    assert_error(MT_ERR_OOM, "out of memory");
    assert_null(mt_reshape(w2, MT_SHAPE(-1))); /* needs a copy */
    assert_error(MT_ERR_OOM, "mt_reshape");
    mt_tensor *four[4] = {ok, ok, ok, ok};
    assert_null(mt_cat(four, 4, 0));
    assert_error(MT_ERR_OOM, "mt_cat");
    mt_debug_set_alloc_limit(0);
    mt_release(w2);
    mt_release(ok);
    assert_int_equal(mt_live_tensors(), t0);
    assert_int_equal(mt_live_bytes(), b0);
}

static void test_null_inputs(void **state) {
    (void)state;
    mt_tensor *a = mt_ones(MT_SHAPE(2), MT_F32, mt_test_device());
    assert_null(mt_add(NULL, a));
    assert_null(mt_mul(a, NULL));
    assert_null(mt_exp(NULL));
    assert_null(mt_sum_all(NULL));
    assert_null(mt_cast(NULL, MT_F16));
    assert_null(mt_clone(NULL));
    assert_null(mt_contiguous(NULL));
    assert_null(mt_detach(NULL));
    assert_null(mt_zeros_like(NULL));
    assert_null(mt_reshape(NULL, MT_SHAPE(2)));
    assert_null(mt_transpose(NULL, 0, 1));
    assert_null(mt_grad(NULL));
    assert_true(isnan(mt_item(NULL)));
    mt_set_requires_grad(NULL, true);
    assert_int_equal(mt_last_status(), MT_OK);
    /* the first error sticks through a chain of NULLs */
    mt_tensor *bad = mt_reshape(a, MT_SHAPE(3));
    mt_tensor *r = mt_exp(mt_add(bad, a));
    assert_null(r);
    assert_error(MT_ERR_SHAPE, "mt_reshape");
    mt_release(a);
}

/* The host block cache: freed large blocks are kept (not counted as live), mt_empty_cache gives
   them back, and allocation works the same afterwards. Under ASan the cache is off. This is
   about host memory itself, hence MT_CPU; test_device_memory_stats covers the device under
   test. */
static void test_empty_cache(void **state) {
    (void)state;
    mt_tensor *t = mt_zeros(MT_SHAPE(1024, 256), MT_F32, MT_CPU); /* 1 MiB */
    int64_t live = mt_live_bytes();
    mt_release(t);
    assert_true(mt_live_bytes() <= live - 1024 * 256 * 4);
    assert_true(mt_cached_bytes() >= 0 && mt_cached_bytes() <= ((int64_t)512 << 20));
    mt_empty_cache();
    assert_int_equal(mt_cached_bytes(), 0);
    t = mt_ones(MT_SHAPE(1024, 256), MT_F32, MT_CPU);
    assert_non_null(t);
    mt_tensor *s = mt_sum_all(t);
    assert_true(mt_item(s) == 262144.0);
    mt_release(s);
    mt_release(t);
    assert_no_error();
}

/* One device's figures (mt_memory_stats_get): a tensor's bytes are live while it is, count
   in the peak, and mt_device_empty_cache leaves no cached block behind. */
static void test_device_memory_stats(void **state) {
    (void)state;
    const int64_t mib = 1 << 20;
    mt_device dev = mt_test_device();
    mt_memory_stats before, during, after;
    assert_int_equal(mt_memory_stats_get(dev, &before), 0);
    mt_memory_peak_reset(dev);
    mt_tensor *t = mt_zeros(MT_SHAPE(mib / 4), MT_F32, dev);
    assert_int_equal(mt_memory_stats_get(dev, &during), 0);
    assert_true(during.live_bytes >= before.live_bytes + mib);
    assert_true(during.peak_bytes >= during.live_bytes);
    mt_release(t);
    assert_int_equal(mt_device_empty_cache(dev), 0);
    assert_int_equal(mt_memory_stats_get(dev, &after), 0);
    assert_true(after.live_bytes <= during.live_bytes - mib);
    assert_int_equal(after.cached_bytes, 0);
    assert_true(after.peak_bytes >= before.live_bytes + mib); /* the peak remembers */
    assert_int_equal(mt_memory_stats_get(dev, NULL), MT_ERR_NULL);
    assert_error(MT_ERR_NULL, "mt_memory_stats_get: arg 2");
}

/* mt_scope_end_keep: the inner scope's other results are freed at once, the kept one moves
   to the enclosing scope (freed at its end), or to the caller when no scope is open. */
static void test_scope_end_keep(void **state) {
    (void)state;
    int64_t before = mt_live_tensors();
    mt_scope_begin();
    mt_scope_begin();
    mt_tensor *a = mt_ones(MT_SHAPE(4), MT_F32, mt_test_device());
    mt_tensor *b = mt_mul_scalar(a, 3.0);
    mt_tensor *k = mt_scope_end_keep(b);
    assert_ptr_equal(k, b);
    assert_int_equal(mt_live_tensors(), before + 1); /* a is gone, b lives on */
    assert_int_equal(mt_scope_depth(), 1);
    assert_tensor_close(k, ((const double[]){3, 3, 3, 3}), 4, 0, 0);
    mt_scope_end(); /* the outer scope now owns it */
    assert_int_equal(mt_live_tensors(), before);
    /* with no scope left, the caller owns it */
    mt_scope_begin();
    mt_tensor *c = mt_zeros(MT_SHAPE(2), MT_F32, mt_test_device());
    mt_tensor *kept = mt_scope_end_keep(c);
    assert_int_equal(mt_scope_depth(), 0);
    assert_int_equal(mt_live_tensors(), before + 1);
    mt_release(kept);
    mt_scope_begin();
    assert_null(mt_scope_end_keep(NULL)); /* NULL is fine: a plain mt_scope_end */
    assert_int_equal(mt_scope_depth(), 0);
    assert_int_equal(mt_live_tensors(), before);
    assert_no_error();
}

/* The default thread count is OMP_NUM_THREADS where it is set (meson runs this program with
   2, and once more as test_num_threads_env with 3); mt_set_num_threads sets it, and n <= 0
   means every core (at least one). */
static void test_num_threads_default(void **state) {
    (void)state;
    const char *env = getenv("OMP_NUM_THREADS");
    int first = mt_get_num_threads();
    if (env && atoi(env) > 0) assert_int_equal(first, atoi(env));
    assert_true(first >= 1);
    mt_set_num_threads(5);
    assert_int_equal(mt_get_num_threads(), 5);
    mt_set_num_threads(0);
    assert_true(mt_get_num_threads() >= 1);
    /* a team libgomp cannot allocate ends the process: the count is capped */
    mt_set_num_threads(1 << 30);
    assert_true(mt_get_num_threads() >= 1 && mt_get_num_threads() <= 1024);
    mt_set_num_threads(first);
    assert_int_equal(mt_get_num_threads(), first);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        MT_TEST(test_filled_creation),
        MT_TEST(test_arange),
        MT_TEST(test_inplace_view_before_requires_grad),
        MT_TEST(test_integer_casts),
        MT_TEST(test_random_statistics),
        MT_TEST(test_random_determinism),
        MT_TEST(test_from_data_round_trip),
        MT_TEST(test_accessors),
        MT_TEST(test_refcounts_and_live_counters),
        MT_TEST(test_scopes),
        MT_TEST(test_scope_keeps_backward_working),
        MT_TEST(test_inplace_values),
        MT_TEST(test_inplace_errors),
        MT_TEST(test_inplace_autograd_refusal),
        MT_TEST(test_to_clone_detach),
        MT_TEST(test_zero_errors),
        MT_TEST(test_empty_shape_whose_strides_overflow),
        MT_TEST(test_inplace_version_counter),
        MT_TEST(test_out_of_memory),
        MT_TEST(test_null_inputs),
        MT_TEST(test_empty_cache),
        MT_TEST(test_device_memory_stats),
        MT_TEST(test_scope_end_keep),
        MT_TEST(test_num_threads_default),
    };
    return MT_RUN_TESTS(tests);
}
