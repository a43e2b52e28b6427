/* What the CUDA backend asks of the CUDA runtime, per op and per AMP training step, on the
   emulated device (built only in emulated builds, whose runtime counts its calls:
   test/cuda_emu/mtemu_cudart_counts.h). On a GPU every runtime call is host time, and a
   cudaMalloc, cudaFree or synchronisation costs far more than a launch, so these counts are
   the part of the host overhead that can be checked without one: after warm-up calls, an
   op or a step allocates and frees no device memory (the caching allocator serves it), never
   waits for the device, copies nothing between host and device, makes no runtime call but
   its memsets and one error check per launch or memset, and (a step, a tiny matmul) asks
   cuBLASLt for no new plan. The counts are printed for the README. */
#include "mtemu_cublaslt_counts.h"
#include "mtemu_cudart_counts.h"
#include "test_util.h"

static mtemu_cudart_counts counts(void) {
    mtemu_cudart_counts c;
    mtemu_cudart_counts_get(&c);
    return c;
}

static mtemu_cudart_counts delta(mtemu_cudart_counts a, mtemu_cudart_counts b) {
    return (mtemu_cudart_counts){b.launches - a.launches, b.runtime_calls - a.runtime_calls,
                                 b.allocs - a.allocs,     b.frees - a.frees,
                                 b.syncs - a.syncs,       b.copies - a.copies,
                                 b.memsets - a.memsets};
}

/* Nothing that waits, allocates, frees or copies; no runtime call but the queued work
   (memsets; launches are not runtime calls here) and one error check (cudaGetLastError)
   after each launch and memset. */
static void assert_lean(const char *what, mtemu_cudart_counts d, int64_t units) {
    printf("# %s: %.1f launches, %.1f memsets, %.1f runtime calls per %s\n", what,
           (double)d.launches / (double)units, (double)d.memsets / (double)units,
           (double)d.runtime_calls / (double)units, units > 1 ? "call" : "step");
    if (d.allocs || d.frees || d.syncs || d.copies)
        fail_msg("%s: %lld allocs, %lld frees, %lld syncs, %lld copies", what, (long long)d.allocs,
                 (long long)d.frees, (long long)d.syncs, (long long)d.copies);
    if (d.runtime_calls > d.launches + 2 * d.memsets)
        fail_msg("%s: %lld runtime calls for %lld launches and %lld memsets", what,
                 (long long)d.runtime_calls, (long long)d.launches, (long long)d.memsets);
}

typedef mt_tensor *(*op_fn)(mt_tensor *a, mt_tensor *b);

static mt_tensor *op_add(mt_tensor *a, mt_tensor *b) {
    return mt_add(a, b);
}
static mt_tensor *op_mul(mt_tensor *a, mt_tensor *b) {
    return mt_mul(a, b);
}
static mt_tensor *op_relu(mt_tensor *a, mt_tensor *b) {
    (void)b;
    return mt_relu(a);
}
static mt_tensor *op_sum(mt_tensor *a, mt_tensor *b) {
    (void)b;
    return mt_sum_all(a);
}
static mt_tensor *op_cast(mt_tensor *a, mt_tensor *b) {
    (void)b;
    return mt_cast(a, MT_F16);
}

#define CALLS 20

/* Tiny ops (8 elements): CALLS calls after one warm-up call. */
static void test_tiny_ops(void **state) {
    (void)state;
    static const struct {
        const char *name;
        op_fn fn;
    } ops[] = {{"add", op_add},
               {"mul", op_mul},
               {"relu", op_relu},
               {"sum_all", op_sum},
               {"cast to F16", op_cast}};
    mt_device dev = mt_test_device();
    mt_tensor *a = mt_full(MT_SHAPE(8), MT_F32, dev, 1.5),
              *b = mt_full(MT_SHAPE(8), MT_F32, dev, 2);
    for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
        mt_release(ops[k].fn(a, b)); /* warm-up: the allocator's cache */
        mtemu_cudart_counts before = counts();
        for (int i = 0; i < CALLS; i++) mt_release(ops[k].fn(a, b));
        mtemu_cudart_counts d = delta(before, counts());
        assert_int_equal(d.launches % CALLS, 0); /* the same launches each call */
        assert_true(d.launches >= CALLS);
        assert_lean(ops[k].name, d, CALLS);
    }
    mt_release(a);
    mt_release(b);
}

/* A tiny plain matmul (8x8 @ 8x8) in F32 and F16: after a warm-up call, each call is one
   cuBLASLt matmul from the cached plan (no descriptor, preference or heuristic: what
   cublasGemmEx would redo on every call) and nothing else but its error checks. */
static void test_tiny_matmul(void **state) {
    (void)state;
    static const mt_dtype dts[] = {MT_F32, MT_F16};
    mt_device dev = mt_test_device();
    for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++) {
        mt_tensor *a = mt_full(MT_SHAPE(8, 8), dts[k], dev, 0.5),
                  *b = mt_full(MT_SHAPE(8, 8), dts[k], dev, 0.25);
        mt_release(mt_matmul(a, b)); /* warm-up: the plan and the allocator's cache */
        mtemu_cudart_counts before = counts();
        mtemu_cublaslt_counts lt0, lt1;
        mtemu_cublaslt_counts_get(&lt0);
        for (int i = 0; i < CALLS; i++) mt_release(mt_matmul(a, b));
        mtemu_cublaslt_counts_get(&lt1);
        assert_no_error();
        char what[32];
        snprintf(what, sizeof what, "matmul 8x8 %s", mt_dtype_name(dts[k]));
        assert_lean(what, delta(before, counts()), CALLS);
        assert_int_equal(lt1.matmuls - lt0.matmuls, CALLS);
        assert_int_equal(lt1.heuristics - lt0.heuristics, 0);
        assert_int_equal(lt1.creates - lt0.creates, 0);
        assert_int_equal(lt1.sets - lt0.sets, 0); /* no bias: no pointer to set */
        mt_release(a);
        mt_release(b);
    }
}

/* One AMP training step of a 2-layer MLP (O1 FP16, GradScaler, SGD with momentum): forward,
   backward, unscale + inf check, step, scale update, zero_grad. */
static void step(mt_tensor *const *p, mt_tensor *x, mt_tensor *y, mt_optimizer *o,
                 mt_grad_scaler *s) {
    mt_scope_begin();
    mt_optimizer_zero_grad(o);
    mt_autocast_begin(MT_F16, MT_AMP_O1);
    mt_tensor *h = mt_relu(mt_linear(x, p[0], p[1]));
    mt_tensor *loss = mt_mse_loss(mt_linear(h, p[2], p[3]), y);
    mt_autocast_end();
    assert_int_equal(mt_backward(mt_grad_scaler_scale(s, loss), NULL), 0);
    assert_int_equal(mt_grad_scaler_step(s, o), 0);
    assert_int_equal(mt_grad_scaler_update(s), 0);
    mt_scope_end();
}

static void test_training_step(void **state) {
    (void)state;
    uint64_t rng = 7;
    mt_tensor *p[4] = {mt_test_uniform(&rng, MT_F32, MT_SHAPE(32, 16), 0.0),
                       mt_test_uniform(&rng, MT_F32, MT_SHAPE(32), 0.0),
                       mt_test_uniform(&rng, MT_F32, MT_SHAPE(4, 32), 0.0),
                       mt_test_uniform(&rng, MT_F32, MT_SHAPE(4), 0.0)};
    for (int k = 0; k < 4; k++) mt_set_requires_grad(p[k], true);
    mt_tensor *x = mt_test_uniform(&rng, MT_F32, MT_SHAPE(8, 16), 0.0),
              *y = mt_test_uniform(&rng, MT_F32, MT_SHAPE(8, 4), 0.0);
    mt_optimizer *o = mt_momentum_new(p, 4, &(mt_momentum_opts){.lr = MT_SET(0.1)});
    mt_grad_scaler *s = mt_grad_scaler_new(NULL);
    assert_non_null(o);
    assert_non_null(s);
    for (int i = 0; i < 2; i++) step(p, x, y, o, s);
    mtemu_cudart_counts before = counts();
    mtemu_cublaslt_counts lt0, lt1;
    mtemu_cublaslt_counts_get(&lt0);
    step(p, x, y, o, s);
    mtemu_cublaslt_counts_get(&lt1);
    mtemu_cudart_counts d = delta(before, counts());
    assert_true(d.launches > 0);
    assert_lean("AMP O1 training step", d, 1);
    /* the fused linears' cuBLASLt plans are cached: matmuls, no heuristic or descriptor */
    printf("# AMP O1 training step: %lld cuBLASLt matmuls, %lld heuristic queries\n",
           (long long)(lt1.matmuls - lt0.matmuls), (long long)(lt1.heuristics - lt0.heuristics));
    assert_int_equal(lt1.heuristics - lt0.heuristics, 0);
    assert_int_equal(lt1.creates - lt0.creates, 0);
    mt_grad_scaler_free(s);
    mt_optimizer_free(o);
    for (int k = 0; k < 4; k++) mt_release(p[k]);
    mt_release(x);
    mt_release(y);
}

int main(void) {
    if (mt_test_device().type != MT_DEVICE_CUDA) {
        printf("1..0 # SKIP the counts are the emulated device's (MT_TEST_DEVICE=cuda)\n");
        return 0;
    }
    const struct CMUnitTest tests[] = {
        MT_TEST(test_tiny_ops),
        MT_TEST(test_tiny_matmul),
        MT_TEST(test_training_step),
    };
    return MT_RUN_TESTS(tests);
}
