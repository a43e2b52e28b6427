/* Device parity: every op of the public API, run on MT_CPU (the tested reference) and on
   MT_CUDA(0) from the same inputs, forward and backward, for every dtype the op takes and for
   four input layouts, and once more (floating dtypes) with +inf, NaN and -inf among the
   values, where both devices must give the same non-finite results (L_NONFINITE: it fails on
   the CPU layer norm's old clamp of a NaN variance to 0, which gave +-inf where the device
   gave NaN). The table `rows` (parity_rows.h) has one row per op variant; each row is one
   test case, which tries all of the row's dtype x layout combinations and reports every one
   that differs (as TAP comments) before failing with the first.

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

#include "parity_rows.h"

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
static unsigned char *download(mt_test_failures *f, const char *ctx, const mt_tensor *t) {
    size_t n = (size_t)mt_numel(t) * mt_dtype_size(mt_dtype_of(t));
    unsigned char *buf = malloc(n ? n : 1);
    if (!buf || mt_copy_to_host(t, buf, n) != 0) {
        mt_test_note(f, "%s: mt_copy_to_host failed: %s", ctx, mt_last_error());
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
static bool compare(mt_test_failures *f, const char *ctx, const char *what, const mt_tensor *ref,
                    const mt_tensor *got, tol_class tol) {
    char dev[16], ib[64];
    device_str(PARITY_DEVICE, dev, sizeof dev);
    mt_dtype dt = mt_dtype_of(ref);
    if (mt_dtype_of(got) != dt) {
        mt_test_note(f, "%s: %s: dtype cpu %s, %s %s", ctx, what, mt_dtype_name(dt), dev,
                     mt_dtype_name(mt_dtype_of(got)));
        return false;
    }
    bool same_shape = mt_ndim(got) == mt_ndim(ref);
    for (int d = 0; same_shape && d < mt_ndim(ref); d++)
        same_shape = mt_dim(got, d) == mt_dim(ref, d);
    if (!same_shape) {
        mt_test_note(f, "%s: %s: shapes differ (ndim cpu %d, %s %d; numel %lld vs %lld)", ctx, what,
                     mt_ndim(ref), dev, mt_ndim(got), (long long)mt_numel(ref),
                     (long long)mt_numel(got));
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
            mt_test_note(f, "%s: %s: element %lld %s is cpu %.9g, %s %.9g (must be bit-identical)",
                         ctx, what, (long long)i, index_str(ref, i, ib, sizeof ib),
                         host_value(a, dt, i), dev, host_value(b, dt, i));
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
                mt_test_note(f, "%s: %s: element %lld %s is cpu %.9g, %s %.9g (|diff| %.3g > %.3g)",
                             ctx, what, (long long)i, index_str(ref, i, ib, sizeof ib), x, dev, y,
                             fabs(x - y), lim);
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
            mt_test_note(
                f,
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

/* L_NONFINITE's values: +inf at element 1, NaN at 3 and -inf at n - 2 (where the input has
   them), so that rows and columns of small inputs see each kind next to finite values. */
static void poison(double *v, int64_t n) {
    if (n >= 2) v[1] = INFINITY;
    if (n >= 4) v[3] = NAN;
    if (n >= 6) v[n - 2] = -INFINITY;
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
    case L_NONFINITE: /* values, not memory: floating inputs of the row's dtype */
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
    case L_SLICED:
        return mt_slice(base, 0, 1, 2 * s->shape[0] + 1, 2);
    default: /* L_NONFINITE: dense */
        return base;
    }
}

/* Input `which` of row r on both devices: leaves base[0] (cpu) and base[1] (other device),
   holding identical bits, and the op's inputs in[0], in[1] viewed through the layout. */
static bool make_input(mt_test_failures *f, const char *ctx, const op_row *r, int which,
                       mt_dtype row_dt, int l, mt_tensor **base, mt_tensor **in) {
    const input_spec *s = &r->in[which];
    mt_dtype dt = s->fixed ? (mt_dtype)(s->fixed - 1) : row_dt;
    int64_t shape[4], n = 1;
    base_shape(s, l, shape);
    for (int d = 0; d < s->ndim; d++) n *= shape[d];
    double *v = malloc((size_t)n * sizeof *v);
    assert_non_null(v);
    for (int64_t k = 0; k < n; k++) v[k] = gen(r, which, s, dt, k);
    if (l == L_NONFINITE && mt_dtype_is_floating(dt) && !s->finite) poison(v, n);
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
        mt_test_note(f, "%s: making input %d failed: %s", ctx, which, mt_last_error());
        mt_clear_error();
        return false;
    }
    return true;
}

/* ------------------------------------------------------------------ one case */

static void run_case_body(mt_test_failures *f, const char *ctx, const op_row *r, mt_dtype dt,
                          int l) {
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
            mt_test_note(f, "%s: forward on %s failed: %s", ctx, d ? dev : "cpu", mt_last_error());
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
            mt_test_note(f, "%s: backward on %s failed: %s", ctx, d ? dev : "cpu", mt_last_error());
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
            mt_test_note(f, "%s: %s: missing on %s", ctx, what, g0 ? dev : "cpu");
        else
            compare(f, ctx, what, g0, g1, gtol);
    }
}

/* One (row, dtype, layout) case in its own scope: every tensor it makes is freed at the end,
   whatever happened, so a failing case leaks nothing into the next one. */
static void run_case(mt_test_failures *f, const op_row *r, mt_dtype dt, int l) {
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
    mt_test_failures f = {0};
    int cases = 0;
    for (int dt = 0; dt < MT_DTYPE_COUNT; dt++) {
        if (!(r->dtypes & BIT(dt))) continue;
        for (int l = 0; l < L_COUNT; l++) {
            if (l == L_NONFINITE && !mt_dtype_is_floating((mt_dtype)dt)) continue;
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
    mt_test_failures f = {0};
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
                mt_test_note(&f, "%s: %s", ctx, mt_last_error());
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
    mt_test_failures f = {.quiet = true};
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
    mt_test_failures f = {.quiet = true};
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
