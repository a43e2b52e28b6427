/* Shared test helpers: cmocka with TAP output (meson counts each test), a leak-checking
   fixture built on the live counters, and tensor comparisons. */
#ifndef MT_TEST_UTIL_H
#define MT_TEST_UTIL_H
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <threads.h>
#include <cmocka.h>
#include "mixtape.h"
#include "../src/tensor/tensor_impl.h" /* mt_test_data_addr only: see there */

/* ---- the device under test
   Every test program runs against one device, named by the environment variable
   MT_TEST_DEVICE: "cpu" (the default when unset or empty), "cuda" (cuda:0) or "cuda:N". The
   harness runs each program once per built device (test/meson.build). A device that was asked
   for but is not there ends the program with a TAP "Bail out!": silently testing the CPU
   instead would report a GPU run that never happened. */

/* The parsed device and its name: one per program (each test program is one translation
   unit), filled once by mt_test_device_init and only read afterwards. */
typedef struct {
    mt_device dev;
    char name[32]; /* "cpu", "cuda:0" */
} mt_test_device_info;

static inline mt_test_device_info *mt_test_device_slot(void) {
    static mt_test_device_info info;
    return &info;
}

/* Ends the program with a TAP "Bail out!" line (meson reports the program as failed). */
static inline void mt_test_bail_out(const char *fmt, ...)
    __attribute__((format(printf, 1, 2), noreturn));
static inline void mt_test_bail_out(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("Bail out! ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
    exit(1);
}

static inline void mt_test_device_init(void) {
    const char *env = getenv("MT_TEST_DEVICE");
    mt_test_device_info *info = mt_test_device_slot();
    info->dev = MT_CPU;
    snprintf(info->name, sizeof info->name, "cpu");
    if (!env || !*env || strcmp(env, "cpu") == 0) return;
    long index = 0;
    if (strcmp(env, "cuda") != 0) {
        /* "cuda:" and decimal digits only: a typo must not fall back to the CPU */
        const char *p = strncmp(env, "cuda:", 5) == 0 ? env + 5 : NULL;
        char *end = NULL;
        if (p && *p >= '0' && *p <= '9') index = strtol(p, &end, 10);
        if (!end || *end || index > 1 << 20)
            mt_test_bail_out("MT_TEST_DEVICE=%s is not one of cpu, cuda, cuda:N", env);
    }
    if (!mt_cuda_available())
        mt_test_bail_out("MT_TEST_DEVICE=%s but no CUDA device is available: mt_cuda_available() "
                         "is false (no GPU or driver, or a build without the CUDA backend)",
                         env);
    int count = mt_cuda_device_count();
    if (index >= count)
        mt_test_bail_out("MT_TEST_DEVICE=%s but the index is out of range: this machine has %d "
                         "CUDA device(s)",
                         env, count);
    info->dev = MT_CUDA((int)index);
    snprintf(info->name, sizeof info->name, "cuda:%d", (int)index);
}

static inline const mt_test_device_info *mt_test_device_get(void) {
    static once_flag once = ONCE_FLAG_INIT; /* test threads may ask first */
    call_once(&once, mt_test_device_init);
    return mt_test_device_slot();
}

/* The device under test. */
static inline mt_device mt_test_device(void) {
    return mt_test_device_get()->dev;
}

/* "cpu" or "cuda:N", for messages. */
static inline const char *mt_test_device_name(void) {
    return mt_test_device_get()->name;
}

static inline bool mt_test_device_is_cpu(void) {
    return mt_test_device().type == MT_DEVICE_CPU;
}

/* Whether the device under test is the emulated CUDA device (meson sets MT_TEST_EMULATED=1 for
   those runs): the tests of its fake libraries' fault injection and counters need it. */
static inline bool mt_test_emulated_device(void) {
    const char *e = getenv("MT_TEST_EMULATED");
    return !mt_test_device_is_cpu() && e && strcmp(e, "1") == 0;
}

/* Where t's first element lives in its device's memory: the address mt_data_ptr gives for a
   host tensor, but for any device. Only to compare (never to dereference), when a test checks
   that a view shares its base's memory at the right offset. Reads the tensor struct, since the
   public API hands out host pointers only. */
static inline const void *mt_test_data_addr(const mt_tensor *t) {
    if (!t) return NULL;
    return mt_tensor_data(t);
}

/* Per-test fixture: every test starts with no error and must end with no new live tensor
   and no new live byte. */
typedef struct {
    int64_t tensors, bytes;
} mt_test_live;

static inline int mt_test_setup(void **state) {
    static _Thread_local mt_test_live live;
    mt_clear_error();
    live.tensors = mt_live_tensors();
    live.bytes = mt_live_bytes();
    *state = &live;
    return 0;
}

static inline int mt_test_teardown(void **state) {
    mt_test_live *live = *state;
    int64_t t = mt_live_tensors(), b = mt_live_bytes();
    if (t != live->tensors || b != live->bytes) {
        fprintf(stderr, "# leak: %lld tensors, %lld bytes still alive\n",
                (long long)(t - live->tensors), (long long)(b - live->bytes));
        return -1; /* cmocka reports a failing teardown as a failed test */
    }
    mt_clear_error();
    return 0;
}

#define MT_TEST(fn) cmocka_unit_test_setup_teardown(fn, mt_test_setup, mt_test_teardown)

#ifdef MT_GOLDEN_DIR
/* Calls fn(name, rule, ctx) for every op of src/tensor/ops.def, read from the source tree,
   and returns how many (-1 when the file cannot be read): tables in tests that must cover
   every op check themselves against it. */
static inline int mt_test_for_each_op(void (*fn)(const char *name, const char *rule, void *ctx),
                                      void *ctx) {
    FILE *f = fopen(MT_GOLDEN_DIR "/../../src/tensor/ops.def", "r");
    if (!f) return -1;
    char line[256];
    int seen = 0;
    while (fgets(line, sizeof line, f)) {
        char id[64], name[64], rule[32];
        if (sscanf(line, "MT_OP(%63[^,], %63[^,], %31[^,)]", id, name, rule) != 3) continue;
        fn(name, rule, ctx);
        seen++;
    }
    fclose(f);
    return seen;
}
#endif

/* cmocka 1.1.5 (Debian 12) prints a test that calls skip() as "not ok N # SKIP name", which
   meson's TAP parser counts as a failure. A case that cannot run on this device is therefore
   registered as a test that does nothing, named with the TAP directive itself
   ("ok N - name # SKIP why"): reported skipped, never passed. */
static inline void mt_test_not_run(void **state) {
    (void)state;
}
#define MT_TEST_SKIPPED(fn, why)                                                                   \
    ((struct CMUnitTest){.name = #fn " # SKIP " why, .test_func = mt_test_not_run})
/* Runs fn on the CPU; on other devices reports it skipped with the reason (for ops whose
   kernels exist only on the CPU so far: say which issue brings the rest). */
#define MT_TEST_CPU_ONLY(fn, why)                                                                  \
    (mt_test_device_is_cpu() ? (struct CMUnitTest)MT_TEST(fn) : MT_TEST_SKIPPED(fn, why))

/* Names the device under test once, as a TAP comment, before the plan (and bails out there
   when the requested device is missing, before any test runs). */
static inline void mt_test_announce_device(void) {
    printf("# device: %s\n", mt_test_device_name());
    fflush(stdout);
}

/* MT_TEST_FILTER=pattern runs only the cases whose names match (cmocka's * and ? wildcards):
   the ThreadSanitizer run of tools/run_tests.sh takes the "*thread*" cases of a program. */
static inline void mt_test_apply_filter(void) {
    const char *f = getenv("MT_TEST_FILTER");
    if (f && *f) cmocka_set_test_filter(f);
}

#define MT_RUN_TESTS(tests)                                                                        \
    (mt_test_announce_device(), mt_test_apply_filter(), cmocka_set_message_output(CM_OUTPUT_TAP),  \
     cmocka_run_group_tests(tests, NULL, NULL))

/* Fails the test with the library's message when an error is pending. */
#define assert_no_error()                                                                          \
    do {                                                                                           \
        if (mt_last_status() != MT_OK) fail_msg("mixtape error: %s", mt_last_error());             \
    } while (0)

/* Asserts the pending error has this status and its message contains `needle`, then
   clears it. */
#define assert_error(status, needle)                                                               \
    do {                                                                                           \
        assert_int_equal(mt_last_status(), (status));                                              \
        if (!strstr(mt_last_error(), (needle)))                                                    \
            fail_msg("error \"%s\" does not mention \"%s\"", mt_last_error(), (needle));           \
        mt_clear_error();                                                                          \
    } while (0)

/* A call that failed out of memory: MT_ERR_OOM naming fn (cleared), and as many live tensors
   and bytes as before it. */
#define assert_oom_left_nothing(fn, tensors, bytes)                                                \
    do {                                                                                           \
        assert_error(MT_ERR_OOM, (fn));                                                            \
        assert_int_equal(mt_live_tensors(), (tensors));                                            \
        assert_int_equal(mt_live_bytes(), (bytes));                                                \
    } while (0)

/* Checks an error that only a kernel can see in the data (a cross-entropy label out of range).
   The CPU finds it in the op itself, which returns NULL with the error. A device finds it
   while running the queued kernel, so the op returns a tensor with no error, and the next
   synchronisation (mt_synchronize here) fails with it. Either way the error must have this
   status and mention both op and needle; on the CPU only the first way is right (its
   contract: reported by the op). Takes the op's result (released here, unless a scope owns
   it) and clears the error. */
static inline void mt_test_assert_deferred_error(mt_tensor *result, mt_status status,
                                                 const char *op, const char *needle,
                                                 const char *file, int line) {
    if (result) {
        mt_device dev = mt_device_of(result);
        bool host = dev.type == MT_DEVICE_CPU;
        mt_status early = mt_last_status();
        int rc = host ? MT_OK : mt_synchronize(dev);
        if (mt_scope_depth() == 0) mt_release(result);
        if (host)
            fail_msg("%s:%d: %s returned a tensor: the CPU reports a bad value in the data from "
                     "the op itself (expected \"%s\")",
                     file, line, op, needle);
        if (early != MT_OK)
            fail_msg("%s:%d: %s returned a tensor and also an error (%s)", file, line, op,
                     mt_last_error());
        if (rc != (int)status)
            fail_msg("%s:%d: mt_synchronize after %s returned %d (%s), expected %s (\"%s\")", file,
                     line, op, rc, mt_last_error(), mt_status_name(status), needle);
    }
    if (mt_last_status() != status)
        fail_msg("%s:%d: %s, expected %s (\"%s\")", file, line,
                 mt_last_status() ? mt_last_error() : "no error", mt_status_name(status), needle);
    if (!strstr(mt_last_error(), op) || !strstr(mt_last_error(), needle))
        fail_msg("%s:%d: error \"%s\" does not mention \"%s\" and \"%s\"", file, line,
                 mt_last_error(), op, needle);
    mt_clear_error();
}
#define assert_deferred_error(result, status, op, needle)                                          \
    mt_test_assert_deferred_error((result), (status), (op), (needle), __FILE__, __LINE__)

/* Asserts that t lives on the device under test (where the library was asked to put it, or
   where its inputs are). */
static inline void mt_test_assert_on_device(const mt_tensor *t, const char *file, int line) {
    if (!t) fail_msg("%s:%d: tensor is NULL (%s)", file, line, mt_last_error());
    mt_device d = mt_device_of(t), want = mt_test_device();
    if (d.type != want.type || d.index != want.index)
        fail_msg("%s:%d: tensor on device type %d index %d, expected %s", file, line, d.type,
                 d.index, mt_test_device_name());
}
#define assert_on_test_device(t) mt_test_assert_on_device((t), __FILE__, __LINE__)

/* Releases a temporary made by the test: op results belong to the innermost scope when one
   is open (the scope releases them), and to the caller only when none is. */
static inline void mt_test_drop(mt_tensor *t) {
    if (mt_scope_depth() == 0) mt_release(t);
}

/* The tensor's values as a malloc'd double array (any dtype, any layout). */
static inline double *mt_test_values(const mt_tensor *t) {
    int64_t n = mt_numel(t);
    mt_tensor *tmp = mt_cast((mt_tensor *)t, MT_F64);
    double *v = calloc((size_t)(n ? n : 1), sizeof *v);
    if (tmp && v) mt_copy_to_host(tmp, v, (size_t)n * sizeof *v);
    mt_test_drop(tmp);
    return v;
}

/* A tensor of dtype dt from doubles, on the device under test; owned like any op result (by
   the open scope, if any). */
static inline mt_tensor *mt_test_tensor(const double *v, mt_dtype dt, int ndim,
                                        const int64_t *shape) {
    mt_tensor *d = mt_from_data(v, MT_F64, ndim, shape, mt_test_device());
    mt_tensor *t = mt_cast(d, dt);
    mt_test_drop(d);
    return t;
}

/* A parameter (requires_grad) of dtype dt from doubles, on the device under test. */
static inline mt_tensor *mt_test_param(const double *v, mt_dtype dt, int ndim,
                                       const int64_t *shape) {
    mt_tensor *t = mt_test_tensor(v, dt, ndim, shape);
    mt_set_requires_grad(t, true);
    return t;
}

/* Sets p's gradient from doubles (stored in p's dtype and shape). */
static inline void mt_test_set_grad(mt_tensor *p, const double *v) {
    mt_tensor *g = mt_test_tensor(v, mt_dtype_of(p), mt_ndim(p), mt_shape(p));
    assert_int_equal(mt_set_grad(p, g), 0);
    mt_release(g);
}

/* x rounded to dt's storage through the library's own conversion. A reference value, so it is
   computed on the host (MT_CPU), independently of the device under test; test_half checks the
   host conversion against src/math bit for bit. */
static inline double mt_test_round_to(double x, mt_dtype dt) {
    mt_tensor *t = mt_scalar(x, dt, MT_CPU);
    double v = mt_item(t);
    mt_release(t);
    return v;
}

/* The element count of a shape. */
static inline int64_t mt_test_numel(int nd, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= shape[i];
    return n;
}

/* A reproducible draw in [lo, hi) from *state (a 64-bit LCG: tests need the same numbers on
   every machine, not good randomness). */
static inline double mt_test_urand(uint64_t *state, double lo, double hi) {
    *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
    return lo + (hi - lo) * (double)(*state >> 11) * 0x1.0p-53;
}

/* The differences a comparison found (test_parity, test_train_parity): each is printed at
   once as a TAP comment, up to a limit, and the first is kept for the test's failure
   message. */
typedef struct {
    int count;
    bool quiet; /* a harness self-test expects differences: print nothing */
    char first[512];
} mt_test_failures;

static inline void mt_test_note(mt_test_failures *f, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static inline void mt_test_note(mt_test_failures *f, const char *fmt, ...) {
    enum { SHOW_MAX = 12 };
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (f->count == 0) snprintf(f->first, sizeof f->first, "%s", msg);
    if (!f->quiet && f->count < SHOW_MAX) printf("# %s\n", msg);
    if (!f->quiet && f->count == SHOW_MAX) printf("# (more differences not shown)\n");
    f->count++;
}

/* The seeds a seeded search runs, [*first, *last]: MT_FUZZ_SEEDS when set (a longer search by
   hand: "N" for 1..N, "A-B" for A..B, so that a search can go on where an earlier one
   stopped), else 1..suite. test_fuzz and test_train_parity read it. */
static inline void mt_test_seed_range(uint64_t suite, uint64_t *first, uint64_t *last) {
    const char *env = getenv("MT_FUZZ_SEEDS");
    unsigned long long a = 0, b = 0;
    *first = 1;
    *last = suite;
    if (!env) return;
    if (sscanf(env, "%llu-%llu", &a, &b) == 2 && a >= 1 && b >= a) {
        *first = a;
        *last = b;
    } else if (sscanf(env, "%llu", &a) == 1 && a >= 1) {
        *last = a;
    }
}

/* A tensor of dtype dt on the device under test with values offset + [-1, 1) from *state. */
static inline mt_tensor *mt_test_uniform(uint64_t *state, mt_dtype dt, int nd, const int64_t *shape,
                                         double offset) {
    int64_t n = mt_test_numel(nd, shape);
    double *x = malloc((size_t)(n ? n : 1) * sizeof *x);
    for (int64_t i = 0; i < n; i++) x[i] = offset + mt_test_urand(state, -1, 1);
    mt_tensor *t = mt_test_tensor(x, dt, nd, shape);
    free(x);
    return t;
}

/* Asserts |t - expect| <= atol + rtol * |expect| elementwise (NaN matches NaN, inf matches
   inf of the same sign). */
static inline void mt_test_assert_close(const mt_tensor *t, const double *expect, int64_t n,
                                        double atol, double rtol, const char *file, int line) {
    if (!t) fail_msg("%s:%d: tensor is NULL (%s)", file, line, mt_last_error());
    if (mt_numel(t) != n)
        fail_msg("%s:%d: %lld elements, expected %lld", file, line, (long long)mt_numel(t),
                 (long long)n);
    double *v = mt_test_values(t);
    int64_t bad = -1;
    double got = 0, want = 0;
    for (int64_t i = 0; i < n && bad < 0; i++) {
        double a = v[i], e = expect[i];
        bool ok =
            (isnan(a) && isnan(e)) || (isinf(e) && a == e) || fabs(a - e) <= atol + rtol * fabs(e);
        if (!ok) {
            bad = i;
            got = a;
            want = e;
        }
    }
    free(v);
    if (bad >= 0)
        fail_msg("%s:%d: element %lld is %.9g, expected %.9g", file, line, (long long)bad, got,
                 want);
}
#define assert_tensor_close(t, expect, n, atol, rtol)                                              \
    mt_test_assert_close((t), (expect), (n), (atol), (rtol), __FILE__, __LINE__)

static inline void mt_test_assert_shape(const mt_tensor *t, int ndim, const int64_t *shape,
                                        const char *file, int line) {
    if (!t) fail_msg("%s:%d: tensor is NULL (%s)", file, line, mt_last_error());
    if (mt_ndim(t) != ndim) fail_msg("%s:%d: ndim %d, expected %d", file, line, mt_ndim(t), ndim);
    for (int i = 0; i < ndim; i++)
        if (mt_dim(t, i) != shape[i])
            fail_msg("%s:%d: dim %d is %lld, expected %lld", file, line, i, (long long)mt_dim(t, i),
                     (long long)shape[i]);
}
#define assert_shape(t, ...) mt_test_assert_shape((t), MT_SHAPE(__VA_ARGS__), __FILE__, __LINE__)
#endif
