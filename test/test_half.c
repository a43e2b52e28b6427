/* FP16 and BF16 storage: round-to-nearest-even on store, range limits, subnormals, NaN, and
   agreement of the vectorised (F16C) converters with the scalar reference in src/math. */
#include "test_util.h"
#include "../src/cpu/cpu.h"
#include "../src/math/half.h"

/* v as dtype dt stores it: an F64 scalar cast (mt_full refuses finite values past the
   dtype's range, as torch; a cast rounds them to inf, as torch's .half()). */
static mt_tensor *stored_tensor(double v, mt_dtype dt) {
    mt_tensor *w = mt_scalar(v, MT_F64, mt_test_device());
    mt_tensor *t = mt_cast(w, dt);
    mt_release(w);
    return t;
}

/* The value a one-element tensor of dtype dt holds after storing v. */
static double stored(double v, mt_dtype dt) {
    mt_tensor *t = stored_tensor(v, dt);
    double r = mt_item(t);
    mt_release(t);
    assert_no_error();
    return r;
}

static uint16_t stored_bits(double v, mt_dtype dt) {
    mt_tensor *t = stored_tensor(v, dt);
    uint16_t h = 0;
    assert_int_equal(mt_copy_to_host(t, &h, sizeof h), 0);
    mt_release(t);
    return h;
}

static void test_f16_small_update_lost(void **state) {
    (void)state;
    /* 1 + 0.0001: the spacing of F16 at 1 is 2^-10 ~ 0.000977, so the update is lost */
    assert_true(stored(1.0001, MT_F16) == 1.0);
    mt_tensor *one = mt_ones(MT_SHAPE(4), MT_F16, mt_test_device());
    mt_tensor *small = mt_full(MT_SHAPE(4), MT_F16, mt_test_device(), 0.0001);
    mt_tensor *s1 = mt_add_scalar(one, 0.0001);
    mt_tensor *s2 = mt_add(one, small);
    assert_no_error();
    assert_int_equal(mt_dtype_of(s1), MT_F16);
    assert_int_equal(mt_dtype_of(s2), MT_F16);
    double ones[4] = {1, 1, 1, 1};
    assert_tensor_close(s1, ones, 4, 0, 0);
    assert_tensor_close(s2, ones, 4, 0, 0);
    /* the same sum in F32 keeps it */
    mt_tensor *f = mt_cast(one, MT_F32), *s3 = mt_add_scalar(f, 0.0001);
    double e = (double)(1.0f + 0.0001f);
    double exp4[4] = {e, e, e, e};
    assert_tensor_close(s3, exp4, 4, 0, 0);
    assert_true(exp4[0] > 1.0);
    mt_release(one);
    mt_release(small);
    mt_release(s1);
    mt_release(s2);
    mt_release(f);
    mt_release(s3);
}

static void test_f16_range(void **state) {
    (void)state;
    assert_true(stored(65504, MT_F16) == 65504);
    assert_int_equal(stored_bits(65504, MT_F16), 0x7bff);
    assert_true(stored(65519, MT_F16) == 65504); /* below the midpoint to 65536 */
    assert_true(stored(65519.99, MT_F16) == 65504);
    assert_true(isinf(stored(65520, MT_F16))); /* the midpoint ties to even: inf */
    assert_true(stored(65520, MT_F16) > 0);
    assert_true(isinf(stored(-65520, MT_F16)) && stored(-65520, MT_F16) < 0);
    assert_true(isinf(stored(1e6, MT_F16)));
    assert_true(isinf(stored(INFINITY, MT_F16)));
    assert_int_equal(stored_bits(INFINITY, MT_F16), 0x7c00);
    assert_int_equal(stored_bits(-INFINITY, MT_F16), 0xfc00);
    /* arithmetic that overflows F16 storage gives inf even though FP32 holds it */
    mt_tensor *big = mt_full(MT_SHAPE(2), MT_F16, mt_test_device(), 60000);
    mt_tensor *twice = mt_add(big, big);
    double inf2[2] = {INFINITY, INFINITY};
    assert_tensor_close(twice, inf2, 2, 0, 0);
    mt_release(big);
    mt_release(twice);
}

static void test_f16_subnormals(void **state) {
    (void)state;
    const double tiny = ldexp(1, -24); /* the smallest F16 subnormal */
    assert_true(stored(tiny, MT_F16) == tiny);
    assert_int_equal(stored_bits(tiny, MT_F16), 0x0001);
    assert_true(stored(ldexp(1, -14), MT_F16) == ldexp(1, -14)); /* smallest normal */
    assert_int_equal(stored_bits(ldexp(1, -14), MT_F16), 0x0400);
    assert_true(stored(ldexp(1023, -24), MT_F16) == ldexp(1023, -24)); /* largest subnormal */
    assert_int_equal(stored_bits(ldexp(1023, -24), MT_F16), 0x03ff);
    /* underflow: half the smallest subnormal ties to even (zero), just above rounds up */
    assert_true(stored(ldexp(1, -25), MT_F16) == 0);
    assert_true(stored(ldexp(1, -25) * 1.001, MT_F16) == tiny);
    assert_true(stored(ldexp(1, -26), MT_F16) == 0);
    assert_true(stored(1e-10, MT_F16) == 0);
    /* the sign of an underflowed value survives */
    assert_int_equal(stored_bits(-1e-10, MT_F16), 0x8000);
    assert_true(signbit(stored(-1e-10, MT_F16)));
    /* 1.5 and 2.5 subnormal units tie to the even unit count */
    assert_true(stored(ldexp(3, -25), MT_F16) == ldexp(2, -24));
    assert_true(stored(ldexp(5, -25), MT_F16) == ldexp(2, -24));
    assert_true(stored(ldexp(7, -25), MT_F16) == ldexp(4, -24));
    /* a subnormal F16 read back into FP32 arithmetic is exact */
    mt_tensor *t = mt_full(MT_SHAPE(3), MT_F16, mt_test_device(), tiny);
    mt_tensor *d = mt_mul_scalar(t, 1024);
    double e[3] = {ldexp(1, -14), ldexp(1, -14), ldexp(1, -14)};
    assert_tensor_close(d, e, 3, 0, 0);
    mt_release(t);
    mt_release(d);
}

static void test_f16_ties_to_even(void **state) {
    (void)state;
    /* between 1 and 1 + 2^-10 (mantissa 0 and 1): the midpoint goes to 1 (even) */
    assert_true(stored(1 + ldexp(1, -11), MT_F16) == 1);
    /* between 1 + 2^-10 (odd) and 1 + 2^-9 (even): the midpoint goes up */
    assert_true(stored(1 + ldexp(3, -11), MT_F16) == 1 + ldexp(1, -9));
    /* spacing 2 at 2048 */
    assert_true(stored(2049, MT_F16) == 2048);
    assert_true(stored(2051, MT_F16) == 2052);
    assert_true(stored(2049.01, MT_F16) == 2050);
    assert_true(stored(-2051, MT_F16) == -2052);
    /* a result computed in FP32 rounds once on store: 1024 + 0.5 ties to 1024 */
    mt_tensor *a = mt_full(MT_SHAPE(2), MT_F16, mt_test_device(), 1024);
    mt_tensor *b = mt_add_scalar(a, 0.5), *c = mt_add_scalar(a, 1.5);
    double eb[2] = {1024, 1024}, ec[2] = {1026, 1026};
    assert_tensor_close(b, eb, 2, 0, 0);
    assert_tensor_close(c, ec, 2, 0, 0);
    mt_release(a);
    mt_release(b);
    mt_release(c);
}

static void test_nan_stays_nan(void **state) {
    (void)state;
    assert_true(isnan(stored(NAN, MT_F16)));
    assert_true(isnan(stored(-NAN, MT_F16)));
    assert_true(isnan(stored(NAN, MT_BF16)));
    /* NaN through arithmetic and casts between the storage dtypes */
    mt_tensor *n =
        mt_full(MT_SHAPE(9), MT_F16, mt_test_device(), NAN); /* > 8: vector and tail paths */
    mt_tensor *s = mt_add_scalar(n, 1), *f = mt_cast(s, MT_F32), *bf = mt_cast(f, MT_BF16);
    mt_tensor *back = mt_cast(bf, MT_F16);
    double nan9[9];
    for (int i = 0; i < 9; i++) nan9[i] = NAN;
    assert_tensor_close(s, nan9, 9, 0, 0);
    assert_tensor_close(f, nan9, 9, 0, 0);
    assert_tensor_close(bf, nan9, 9, 0, 0);
    assert_tensor_close(back, nan9, 9, 0, 0);
    mt_release(n);
    mt_release(s);
    mt_release(f);
    mt_release(bf);
    mt_release(back);
    /* a NaN whose payload sits only in bits that BF16 drops must not become inf */
    uint32_t snan = 0x7f800001u;
    float fs;
    memcpy(&fs, &snan, sizeof fs);
    assert_true(isnan(mt_bf16_to_f32(mt_f32_to_bf16(fs))));
    assert_true(isnan(mt_f16_to_f32(mt_f32_to_f16(fs))));
}

static void test_bf16_rounding(void **state) {
    (void)state;
    /* BF16 keeps 8 significant bits: spacing 2^-7 at 1 */
    assert_true(stored(1 + ldexp(1, -8), MT_BF16) == 1);                /* tie -> even */
    assert_true(stored(1 + ldexp(3, -8), MT_BF16) == 1 + ldexp(1, -6)); /* tie -> even (up) */
    assert_true(stored(1 + ldexp(1, -8) * 1.01, MT_BF16) == 1 + ldexp(1, -7));
    assert_true(stored(257, MT_BF16) == 256);
    assert_true(stored(259, MT_BF16) == 260);
    assert_true(stored(-259, MT_BF16) == -260);
    assert_true(stored(1.0001, MT_BF16) == 1);
    /* BF16 has FP32's range: 65520 and 1e30 are finite, FLT_MAX rounds up to inf */
    assert_true(stored(65520, MT_BF16) == 65536);
    assert_false(isinf(stored(1e30, MT_BF16)));
    assert_true(isinf(stored(3.4028234663852886e38, MT_BF16)));
    assert_int_equal(stored_bits(1.0, MT_BF16), 0x3f80);
    /* FP32 subnormals keep their top bits */
    assert_true(stored(ldexp(1, -130), MT_BF16) == ldexp(1, -130));
}

/* ---- converters: vector paths against the scalar reference */

static bool same_bits(float a, float b) {
    return memcmp(&a, &b, sizeof a) == 0;
}

static bool same_value(float a, float b) {
    uint32_t ua, ub;
    memcpy(&ua, &a, 4);
    memcpy(&ub, &b, 4);
    return (isnan(a) && isnan(b)) || ua == ub;
}

static void test_f16_to_f32_all_patterns(void **state) {
    (void)state;
    uint16_t *h = malloc(65536 * sizeof *h);
    float *v = malloc(65536 * sizeof *v);
    for (uint32_t i = 0; i < 65536; i++) h[i] = (uint16_t)i;
    mt_cpu_f16_to_f32(h, v, 65536);
    for (uint32_t i = 0; i < 65536; i++) {
        float ref = mt_f16_to_f32((uint16_t)i);
        /* bit for bit, NaN payloads too: vcvtph2ps and the scalar path both quiet a NaN */
        if (!same_bits(v[i], ref)) fail_msg("f16 0x%04x: vector %a, scalar %a", i, v[i], ref);
        /* widening is exact, so converting back gives the same bits (NaN stays NaN) */
        uint16_t back = mt_f32_to_f16(ref);
        if (isnan(ref))
            assert_true((back & 0x7c00) == 0x7c00 && (back & 0x3ff));
        else if (back != i)
            fail_msg("f16 0x%04x round trip gave 0x%04x", i, back);
#ifdef __FLT16_MAX__
        _Float16 c;
        uint16_t bits = (uint16_t)i;
        memcpy(&c, &bits, 2);
        if (!same_value((float)c, ref))
            fail_msg("f16 0x%04x: compiler %a, ours %a", i, (float)c, ref);
#endif
    }
    /* the public path: a tensor of every F16 pattern cast to F32 */
    mt_tensor *t = mt_from_data(h, MT_F16, MT_SHAPE(65536), mt_test_device());
    mt_tensor *f = mt_cast(t, MT_F32);
    assert_no_error();
    assert_int_equal(mt_copy_to_host(f, v, 65536 * sizeof *v), 0);
    for (uint32_t i = 0; i < 65536; i++)
        if (!same_bits(v[i], mt_f16_to_f32((uint16_t)i))) fail_msg("mt_cast f16 0x%04x", i);
    mt_release(t);
    mt_release(f);
    free(h);
    free(v);
}

/* A float sweep: strided bit patterns over the whole range, plus every F16 rounding
   boundary (the midpoints between neighbouring F16 values and their FP32 neighbours). */
static float *sweep_floats(int64_t *count) {
    int64_t cap = (1 << 20) + 65536 * 3 + 64, n = 0;
    float *x = malloc((size_t)cap * sizeof *x);
    for (uint64_t u = 0; u <= 0xffffffffu && n < (1 << 20); u += 4099) {
        uint32_t b = (uint32_t)u;
        memcpy(&x[n++], &b, 4);
    }
    for (uint32_t h = 0; h < 0x7c00; h++) { /* finite positive F16 and the next one up */
        double lo = mt_f16_to_f32((uint16_t)h), hi = mt_f16_to_f32((uint16_t)(h + 1));
        if (h + 1 == 0x7c00) hi = 65536;    /* the first value past the range */
        float mid = (float)((lo + hi) / 2); /* exact: 12 significant bits */
        float sign = (h & 1) ? -1.0f : 1.0f;
        x[n++] = sign * mid;
        x[n++] = sign * nextafterf(mid, INFINITY);
        x[n++] = sign * nextafterf(mid, 0);
    }
    const float specials[] = {0.0f,     -0.0f,    INFINITY, -INFINITY,     NAN,           65504.0f,
                              65519.0f, 65520.0f, 6e-8f,    5.9604645e-8f, 2.9802322e-8f, 1e-45f};
    for (size_t i = 0; i < sizeof specials / sizeof *specials; i++) x[n++] = specials[i];
    *count = n;
    return x;
}

static void test_f32_to_f16_sweep(void **state) {
    (void)state;
    int64_t n;
    float *x = sweep_floats(&n);
    uint16_t *h = malloc((size_t)n * sizeof *h);
    /* odd offsets and lengths exercise the vector body and the scalar tail */
    mt_cpu_f32_to_f16(x, h, n);
    for (int64_t i = 0; i < n; i++) {
        uint16_t ref = mt_f32_to_f16(x[i]);
        bool nan_ref = (ref & 0x7c00) == 0x7c00 && (ref & 0x3ff);
        /* bit for bit: a NaN is sign | 0x7e00 on every path, as torch */
        if (h[i] != ref) fail_msg("f32 %a: vector 0x%04x, scalar 0x%04x", (double)x[i], h[i], ref);
#ifdef __FLT16_MAX__
        _Float16 c = (_Float16)x[i];
        uint16_t cb;
        memcpy(&cb, &c, 2);
        if (nan_ref ? !isnan((float)c) : cb != ref)
            fail_msg("f32 %a: compiler 0x%04x, ours 0x%04x", (double)x[i], cb, ref);
#endif
    }
    mt_cpu_f32_to_f16(x + 3, h, 13);
    for (int i = 0; i < 13; i++) assert_int_equal(h[i], mt_f32_to_f16(x[3 + i]));
    /* the public path on the device under test: the sweep cast to F16 by mt_cast */
    mt_tensor *t = mt_from_data(x, MT_F32, MT_SHAPE(n), mt_test_device());
    mt_tensor *c = mt_cast(t, MT_F16);
    assert_int_equal(mt_copy_to_host(c, h, (size_t)n * sizeof *h), 0);
    for (int64_t i = 0; i < n; i++) {
        uint16_t ref = mt_f32_to_f16(x[i]);
        if (h[i] != ref)
            fail_msg("mt_cast f32 %a to f16: 0x%04x, expected 0x%04x", (double)x[i], h[i], ref);
    }
    mt_release(c);
    mt_release(t);
    free(x);
    free(h);
}

/* Independent BF16 reference: round the value to 8 significant bits in double. */
static float bf16_ref(float f) {
    if (isnan(f) || isinf(f) || f == 0) return f;
    int e;
    frexp(f, &e);                  /* f = m * 2^e, 0.5 <= |m| < 1 */
    if (e < -125) e = -125;        /* FP32 subnormals: fixed spacing 2^-133 */
    double unit = ldexp(1, e - 8); /* spacing of 8-bit significands at this exponent */
    return (float)(nearbyint((double)f / unit) * unit); /* ties to even; 2^128 -> inf */
}

static void test_bf16_sweep(void **state) {
    (void)state;
    int64_t n;
    float *x = sweep_floats(&n);
    uint16_t *h = malloc((size_t)n * sizeof *h);
    float *back = malloc((size_t)n * sizeof *back);
    mt_cpu_f32_to_bf16(x, h, n);
    mt_cpu_bf16_to_f32(h, back, n);
    for (int64_t i = 0; i < n; i++) {
        float ref = bf16_ref(x[i]);
        if (h[i] != mt_f32_to_bf16(x[i])) fail_msg("bf16 vector/scalar differ at %a", (double)x[i]);
        if (!same_value(back[i], ref))
            fail_msg("bf16(%a) = %a, expected %a", (double)x[i], (double)back[i], (double)ref);
    }
    for (uint32_t b = 0; b < 0x7f80; b += 7) { /* midpoints between BF16 neighbours */
        float lo = mt_bf16_to_f32((uint16_t)b), hi = mt_bf16_to_f32((uint16_t)(b + 1));
        float mid = (float)(((double)lo + hi) / 2);
        float probes[3] = {mid, nextafterf(mid, INFINITY), nextafterf(mid, 0)};
        for (int k = 0; k < 3; k++)
            if (!same_value(mt_bf16_to_f32(mt_f32_to_bf16(probes[k])), bf16_ref(probes[k])))
                fail_msg("bf16 rounding of %a", (double)probes[k]);
    }
    /* the public path on the device under test: the sweep cast to BF16 and back by mt_cast */
    mt_tensor *t = mt_from_data(x, MT_F32, MT_SHAPE(n), mt_test_device());
    mt_tensor *c = mt_cast(t, MT_BF16), *b = mt_cast(c, MT_F32);
    assert_int_equal(mt_copy_to_host(b, back, (size_t)n * sizeof *back), 0);
    for (int64_t i = 0; i < n; i++)
        if (!same_value(back[i], bf16_ref(x[i])))
            fail_msg("mt_cast f32 %a to bf16 gave %a, expected %a", (double)x[i], (double)back[i],
                     (double)bf16_ref(x[i]));
    mt_release(b);
    mt_release(c);
    mt_release(t);
    free(x);
    free(h);
    free(back);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        MT_TEST(test_f16_small_update_lost),
        MT_TEST(test_f16_range),
        MT_TEST(test_f16_subnormals),
        MT_TEST(test_f16_ties_to_even),
        MT_TEST(test_nan_stays_nan),
        MT_TEST(test_bf16_rounding),
        MT_TEST(test_f16_to_f32_all_patterns),
        MT_TEST(test_f32_to_f16_sweep),
        MT_TEST(test_bf16_sweep),
    };
    return MT_RUN_TESTS(tests);
}
