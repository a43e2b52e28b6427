/* Device behaviour on the device under test (MT_TEST_DEVICE: "cpu", the default, or "cuda"):
   an AMP training step that never waits for the device, a skipped step that changes nothing,
   a data error found by a kernel (reported at once on the CPU, at the next sync on a device),
   memory that stays flat over training steps, out of memory, and asking for a device that is
   not there.

   Most cases train the same small model: a 2-layer MLP (64 -> 512 -> 10, ReLU) with cross
   entropy under autocast O1 FP16, a GradScaler and Adam with multi_precision, each step
   written as a user writes it: no checks inside, the sticky error checked once after. */
#include "test_util.h"

enum { BATCH = 64, IN = 64, HIDDEN = 512, CLASSES = 10, N_PARAMS = 4 };

/* Sizes: the hidden activations (64 x 512 halves = 64 KiB) and the first layer's gradient and
   Adam moments (512 x 64 floats = 128 KiB) go through the block caches of both allocators (the
   host caches blocks of 64 KiB and more); small enough for the emulated device. Init scale
   1024: no step of this model overflows FP16, so every skipped step is one the test made. */
#define INIT_SCALE 1024.0

/* ------------------------------------------------------------------ held objects */

/* Models and snapshots live in small pools that the teardown empties: a failed assertion
   jumps out of the test before its own cleanup, and the leak check would then report the
   model instead of the failure. */
typedef struct {
    bool in_use;
    mt_device dev;
    mt_linear_layer l1, l2;
    mt_tensor *params[N_PARAMS];
    mt_tensor *x, *labels;
    mt_optimizer *opt;
    mt_grad_scaler *scaler;
} mlp;

typedef struct {
    bool in_use;
    float *v[N_PARAMS];
    int64_t n[N_PARAMS];
} snapshot;

static mlp mlps[2];
static snapshot snaps[4];

static void mlp_free(mlp *m) {
    if (!m->in_use) return;
    mt_optimizer_free(m->opt);
    mt_grad_scaler_free(m->scaler);
    mt_linear_layer_free(&m->l1);
    mt_linear_layer_free(&m->l2);
    mt_release(m->x);
    mt_release(m->labels);
    m->in_use = false;
}

static void snap_free(snapshot *s) {
    if (!s->in_use) return;
    for (int i = 0; i < N_PARAMS; i++) free(s->v[i]);
    s->in_use = false;
}

static int device_teardown(void **state) {
    while (mt_scope_depth() > 0) mt_scope_end(); /* a failed test skipped its scope_end */
    mt_debug_set_alloc_limit(0);
    for (size_t i = 0; i < sizeof mlps / sizeof mlps[0]; i++) mlp_free(&mlps[i]);
    for (size_t i = 0; i < sizeof snaps / sizeof snaps[0]; i++) snap_free(&snaps[i]);
    return mt_test_teardown(state);
}

#define DEVICE_TEST(fn) cmocka_unit_test_setup_teardown(fn, mt_test_setup, device_teardown)

/* ------------------------------------------------------------------ the model */

/* A model with `in` inputs, its data and its optimizer on the device under test; the same
   seed gives bit-identical twins. */
static mlp *mlp_new_in(uint64_t seed, int64_t in) {
    mlp *m = !mlps[0].in_use ? &mlps[0] : &mlps[1];
    assert_false(m->in_use);
    memset(m, 0, sizeof *m);
    m->in_use = true;
    m->dev = mt_test_device();
    mt_manual_seed(seed);
    assert_int_equal(mt_linear_layer_init(&m->l1, in, HIDDEN, true, MT_F32, m->dev), 0);
    assert_int_equal(mt_linear_layer_init(&m->l2, HIDDEN, CLASSES, true, MT_F32, m->dev), 0);
    m->params[0] = m->l1.weight;
    m->params[1] = m->l1.bias;
    m->params[2] = m->l2.weight;
    m->params[3] = m->l2.bias;
    m->x = mt_randn(MT_SHAPE(BATCH, in), MT_F32, m->dev);
    int64_t lab[BATCH];
    for (int i = 0; i < BATCH; i++) lab[i] = (i * 7) % CLASSES;
    m->labels = mt_from_data(lab, MT_I64, MT_SHAPE(BATCH), m->dev);
    m->opt = mt_adam_new(m->params, N_PARAMS,
                         &(mt_adam_opts){.lr = MT_SET(1e-3), .multi_precision = true});
    m->scaler = mt_grad_scaler_new(&(mt_grad_scaler_opts){.init_scale = INIT_SCALE});
    assert_no_error();
    assert_non_null(m->x);
    assert_non_null(m->labels);
    assert_non_null(m->opt);
    assert_non_null(m->scaler);
    return m;
}

static mlp *mlp_new(uint64_t seed) {
    return mlp_new_in(seed, IN);
}

typedef struct {
    bool poison;           /* fill l2.bias's gradient with inf after backward */
    size_t backward_limit; /* non-zero: mt_debug_set_alloc_limit from backward to the end */
} step_opts;

/* One training step, unchecked inside like user code. Returns the loss (a reference the
   caller releases), or NULL when the forward failed. */
static mt_tensor *amp_step_ex(mlp *m, step_opts o) {
    mt_scope_begin();
    mt_autocast_begin(MT_F16, MT_AMP_O1);
    mt_tensor *h = mt_relu(mt_linear(m->x, m->l1.weight, m->l1.bias));
    mt_tensor *logits = mt_linear(h, m->l2.weight, m->l2.bias);
    mt_tensor *loss = mt_cross_entropy(logits, m->labels);
    mt_autocast_end();
    if (o.backward_limit) mt_debug_set_alloc_limit(o.backward_limit);
    mt_backward(mt_grad_scaler_scale(m->scaler, loss), NULL);
    /* an inf in one gradient, as an FP16 overflow in backward would leave */
    if (o.poison) mt_fill(mt_grad(m->l2.bias), INFINITY);
    mt_grad_scaler_unscale(m->scaler, m->opt);
    mt_grad_scaler_step(m->scaler, m->opt);
    mt_grad_scaler_update(m->scaler);
    mt_optimizer_zero_grad(m->opt);
    if (o.backward_limit) mt_debug_set_alloc_limit(0);
    mt_tensor *kept = loss ? mt_retain(loss) : NULL;
    mt_scope_end();
    return kept;
}

static mt_tensor *amp_step(mlp *m) {
    return amp_step_ex(m, (step_opts){0});
}

/* A clean step whose loss is not needed. */
static void train_step(mlp *m) {
    mt_release(amp_step(m));
}

/* ------------------------------------------------------------------ parameter snapshots */

static const char *const param_names[N_PARAMS] = {"l1.weight", "l1.bias", "l2.weight", "l2.bias"};

/* The parameters' bytes, copied to the host (which waits for the device). */
static snapshot *snap_take(const mlp *m) {
    size_t free_slot = 0;
    while (free_slot + 1 < sizeof snaps / sizeof snaps[0] && snaps[free_slot].in_use) free_slot++;
    snapshot *s = &snaps[free_slot];
    assert_false(s->in_use);
    memset(s, 0, sizeof *s);
    s->in_use = true;
    for (int i = 0; i < N_PARAMS; i++) {
        s->n[i] = mt_numel(m->params[i]);
        s->v[i] = malloc((size_t)s->n[i] * sizeof(float));
        assert_non_null(s->v[i]);
        assert_int_equal(mt_copy_to_host(m->params[i], s->v[i], (size_t)s->n[i] * sizeof(float)),
                         0);
    }
    return s;
}

/* Fails unless the parameters are bit-identical to `want` (bytes compared: -0 is not 0 and
   a NaN matches only the same NaN). */
static void assert_params_equal(const mlp *m, const snapshot *want, const char *when) {
    snapshot *now = snap_take(m);
    for (int i = 0; i < N_PARAMS; i++)
        for (int64_t k = 0; k < want->n[i]; k++)
            if (memcmp(&want->v[i][k], &now->v[i][k], sizeof(float)) != 0)
                fail_msg("%s: %s element %lld is %.9g, expected %.9g (bit-identical)", when,
                         param_names[i], (long long)k, now->v[i][k], want->v[i][k]);
    snap_free(now);
}

/* Every parameter tensor moved away from `before` (the step updated it). */
static void assert_params_moved(const mlp *m, const snapshot *before) {
    snapshot *now = snap_take(m);
    for (int i = 0; i < N_PARAMS; i++) {
        bool moved = false;
        for (int64_t k = 0; k < now->n[i] && !moved; k++) moved = now->v[i][k] != before->v[i][k];
        if (!moved) fail_msg("the step did not update %s", param_names[i]);
    }
    snap_free(now);
}

/* ------------------------------------------------------------------ (a) no host sync */

/* The whole step (forward, scale, backward, unscale, step, update, zero_grad, scope end)
   only queues work: counts, flags and the skip decision stay on the device. CUDA only (see
   main): the CPU never waits for anything, so its count is 0 whatever the step does. */
static void test_amp_step_makes_no_host_sync(void **state) {
    (void)state;
    mlp *m = mlp_new(11);
    /* warm-up: the first step creates the scaler's and Adam's state, library handles and
       allocator blocks; setting up may wait, a step may not */
    train_step(m);
    assert_int_equal(mt_synchronize(m->dev), 0);
    assert_no_error();
    snapshot *before = snap_take(m);

    int64_t n0 = mt_host_sync_count();
    mt_tensor *loss = amp_step(m);
    int64_t n1 = mt_host_sync_count();
    assert_no_error();
    if (n1 != n0)
        fail_msg("one training step on %s waited for the device %lld time(s); expected 0",
                 mt_test_device_name(), (long long)(n1 - n0));

    /* the counter is live (reading the loss waits), and the step really ran */
    double l = mt_item(loss);
    mt_release(loss);
    assert_true(mt_host_sync_count() > n1);
    assert_no_error();
    assert_true(isfinite(l));
    assert_false(mt_grad_scaler_last_step_skipped(m->scaler));
    assert_params_moved(m, before);
}

/* ------------------------------------------------------------------ (b) skipped step */

/* A step with an inf gradient is skipped: parameters, Adam's moments and its step count stay
   bit-identical, and the scale backs off (1024 -> 512). The moments and the step count are
   not public, so a twin checks them: B never sees the poisoned step; given A's scaler state,
   A and B then take the same clean step, whose update reads m, v and the step count (bias
   correction), so they end bit-identical only if the skip left all three alone. */
static void test_skipped_step_changes_nothing(void **state) {
    (void)state;
    mlp *a = mlp_new(21), *b = mlp_new(21);
    train_step(a);
    train_step(b);
    assert_no_error();
    snapshot *sa = snap_take(a);
    /* the twin argument needs a deterministic backend: check that first */
    assert_params_equal(b, sa, "twin B against A after the same clean step");
    mt_grad_scaler_state st0, st1;
    assert_int_equal(mt_grad_scaler_state_get(a->scaler, &st0), 0);
    assert_true(st0.scale == INIT_SCALE);

    mt_release(amp_step_ex(a, (step_opts){.poison = true}));
    assert_no_error();
    assert_true(mt_grad_scaler_last_step_skipped(a->scaler));
    assert_int_equal(mt_grad_scaler_state_get(a->scaler, &st1), 0);
    if (st1.scale != st0.scale * 0.5 || st1.skipped_steps != st0.skipped_steps + 1)
        fail_msg("after the skipped step: scale %g, %lld skipped; expected %g, %lld", st1.scale,
                 (long long)st1.skipped_steps, st0.scale * 0.5, (long long)st0.skipped_steps + 1);
    assert_params_equal(a, sa, "after the skipped step");

    assert_int_equal(mt_grad_scaler_state_set(b->scaler, &st1), 0);
    train_step(a);
    train_step(b);
    assert_no_error();
    assert_false(mt_grad_scaler_last_step_skipped(a->scaler));
    assert_false(mt_grad_scaler_last_step_skipped(b->scaler));
    snapshot *sb = snap_take(b);
    assert_params_equal(a, sb, "A (which skipped a step) against B (which never saw it)");
    assert_params_moved(a, sa);
}

/* ------------------------------------------------------------------ (c) bad label */

/* Cross entropy's mean over labels {0, 1, 2, 3} of logits v [4, 5], on the host in double. */
static double ce_reference(const float *v) {
    double total = 0;
    for (int r = 0; r < 4; r++) {
        double mx = v[r * 5], s = 0;
        for (int c = 1; c < 5; c++) mx = fmax(mx, v[r * 5 + c]);
        for (int c = 0; c < 5; c++) s += exp(v[r * 5 + c] - mx);
        total += mx + log(s) - v[r * 5 + r];
    }
    return total / 4;
}

/* A label out of range is found while the kernel reads the labels: on the CPU the op fails
   at once; on a device the op only queues work and returns a tensor, and the error (naming
   mt_cross_entropy, the row and the label) comes from the next wait, once. After that the
   library works normally. */
static void test_bad_label_reported_then_recovers(void **state) {
    (void)state;
    mt_device dev = mt_test_device();
    mt_scope_begin();
    mt_manual_seed(31);
    mt_tensor *logits = mt_randn(MT_SHAPE(4, 5), MT_F32, dev);
    mt_tensor *bad = mt_from_data((const int64_t[]){0, 1, 7, 3}, MT_I64, MT_SHAPE(4), dev);
    mt_tensor *good = mt_from_data((const int64_t[]){0, 1, 2, 3}, MT_I64, MT_SHAPE(4), dev);
    assert_no_error();

    assert_deferred_error(mt_cross_entropy(logits, bad), MT_ERR_INVALID, "mt_cross_entropy",
                          "label 7 at row 2");
    /* reported once: the next wait is clean */
    assert_int_equal(mt_synchronize(dev), 0);
    assert_no_error();

    if (dev.type != MT_DEVICE_CPU) {
        /* mt_item is a waiting call too: it fails with the error instead of giving a value */
        mt_tensor *queued = mt_cross_entropy(logits, bad);
        assert_non_null(queued);
        assert_true(isnan(mt_item(queued)));
        assert_error(MT_ERR_INVALID, "label 7 at row 2");
        assert_int_equal(mt_synchronize(dev), 0);
        assert_no_error();
    }

    /* working again: the right value, a gradient, and clean waits */
    mt_set_requires_grad(logits, true);
    mt_tensor *loss = mt_cross_entropy(logits, good);
    assert_int_equal(mt_backward(loss, NULL), 0);
    float v[20];
    assert_int_equal(mt_copy_to_host(logits, v, sizeof v), 0);
    double want = ce_reference(v);
    assert_tensor_close(loss, &want, 1, 1e-6, 1e-5);
    mt_tensor *g = mt_grad(logits);
    assert_non_null(g);
    /* softmax minus one-hot, over 4 rows: each row sums to 0, and its label's entry (the
       diagonal here) is its only negative one */
    double gv[20], sum[4] = {0};
    mt_tensor *g64 = mt_cast(g, MT_F64);
    assert_int_equal(mt_copy_to_host(g64, gv, sizeof gv), 0);
    for (int r = 0; r < 4; r++) {
        for (int c = 0; c < 5; c++) sum[r] += gv[r * 5 + c];
        if (fabs(sum[r]) > 1e-6 || gv[r * 5 + r] >= 0)
            fail_msg("gradient row %d sums to %g, label entry %g", r, sum[r], gv[r * 5 + r]);
    }
    assert_int_equal(mt_synchronize(dev), 0);
    assert_no_error();
    mt_scope_end();
}

/* Embedding a batch and its backward read the indices only on the device: no wait, even
   though each index is range-checked. A bad index is reported at the next wait (naming
   mt_embedding, its position and value), its row is zeros, and the library works on. */
static void test_embedding_checks_indices_without_sync(void **state) {
    (void)state;
    mt_device dev = mt_test_device();
    mt_scope_begin();
    mt_manual_seed(5);
    mt_tensor *w = mt_randn(MT_SHAPE(6, 3), MT_F32, dev);
    mt_set_requires_grad(w, true);
    mt_tensor *good = mt_from_data((const int64_t[]){5, 0, 5, 2}, MT_I64, MT_SHAPE(2, 2), dev);
    mt_tensor *bad = mt_from_data((const int64_t[]){1, 6}, MT_I64, MT_SHAPE(2), dev);
    assert_int_equal(mt_synchronize(dev), 0); /* uploads done */

    int64_t n0 = mt_host_sync_count();
    mt_tensor *loss = mt_sum_all(mt_embedding(w, good));
    assert_int_equal(mt_backward(loss, NULL), 0);
    if (mt_host_sync_count() != n0)
        fail_msg("embedding forward and backward on %s waited for the device %lld time(s)",
                 mt_test_device_name(), (long long)(mt_host_sync_count() - n0));
    /* rows 5 (twice), 0 and 2 were used: their gradient is the use count */
    const double counts[6] = {1, 0, 1, 0, 0, 2};
    double want[18];
    for (int i = 0; i < 18; i++) want[i] = counts[i / 3];
    assert_tensor_close(mt_grad(w), want, 18, 0, 0);

    if (dev.type != MT_DEVICE_CPU) {
        mt_tensor *out = mt_embedding(w, bad);
        assert_non_null(out);
        assert_no_error();
        double v[6];
        mt_tensor *o64 = mt_cast(out, MT_F64);
        assert_int_equal(mt_copy_to_host(o64, v, sizeof v), MT_ERR_INVALID);
        assert_error(MT_ERR_INVALID,
                     "mt_embedding: arg 2: index 6 at position 1 is out of range [0, 6)");
        assert_int_equal(mt_copy_to_host(o64, v, sizeof v), 0); /* reported once */
        for (int i = 3; i < 6; i++) assert_true(v[i] == 0.0);
    } else {
        assert_null(mt_embedding(w, bad));
        assert_error(MT_ERR_INVALID, "index 6 at position 1");
    }
    assert_int_equal(mt_synchronize(dev), 0);
    assert_no_error();
    mt_scope_end();
}

/* ------------------------------------------------------------------ (d) memory */

/* Warm-up steps before memory is steady. Adam's moments are created part way through the
   first step, so the blocks in use during the first step differ from every later step's;
   the second step is the first steady one. */
#define WARMUP_STEPS 2

/* Whether dev's allocator keeps freed blocks: under AddressSanitizer the host allocator keeps
   none (a use after free must stay visible), so only a device cache can be non-empty. */
static bool caches(mt_device dev) {
#if defined(__SANITIZE_ADDRESS__)
    return dev.type != MT_DEVICE_CPU;
#else
    (void)dev;
    return true;
#endif
}

static mt_memory_stats stats(mt_device dev) {
    mt_memory_stats s;
    assert_int_equal(mt_memory_stats_get(dev, &s), 0);
    return s;
}

/* After warm-up, training steps reuse the allocator's blocks: live bytes (parameters, Adam
   state, data) do not grow, and neither do live + cached bytes (no memory taken from the
   system per step); the peak is tracked; mt_device_empty_cache gives the cache back. */
static void test_memory_flat_over_steps(void **state) {
    (void)state;
    mlp *m = mlp_new(41);
    for (int i = 0; i < WARMUP_STEPS; i++) train_step(m);
    assert_no_error();
    mt_memory_stats s0 = stats(m->dev);
    assert_true(s0.live_bytes > 0);
    for (int i = 1; i <= 10; i++) {
        train_step(m);
        assert_no_error();
        mt_memory_stats s = stats(m->dev);
        if (s.live_bytes != s0.live_bytes)
            fail_msg("step %d after warm-up: live bytes %lld, after warm-up %lld", i,
                     (long long)s.live_bytes, (long long)s0.live_bytes);
        if (s.live_bytes + s.cached_bytes != s0.live_bytes + s0.cached_bytes)
            fail_msg("step %d after warm-up: live + cached bytes %lld, after warm-up %lld (the "
                     "allocator took new memory instead of reusing its blocks)",
                     i, (long long)(s.live_bytes + s.cached_bytes),
                     (long long)(s0.live_bytes + s0.cached_bytes));
    }
    /* the reused blocks are really cached, and the peak covers a step's temporaries */
    mt_memory_stats s = stats(m->dev);
    assert_true(s.cached_bytes > 0 || !caches(m->dev));
    mt_memory_peak_reset(m->dev);
    s = stats(m->dev);
    assert_true(s.peak_bytes == s.live_bytes);
    train_step(m);
    s = stats(m->dev);
    if (s.peak_bytes <= s.live_bytes)
        fail_msg("peak %lld after a step is not above live %lld: the step's temporaries were "
                 "not counted",
                 (long long)s.peak_bytes, (long long)s.live_bytes);

    assert_int_equal(mt_device_empty_cache(m->dev), 0);
    mt_memory_stats e = stats(m->dev);
    assert_true(e.cached_bytes == 0);
    assert_true(e.live_bytes == s.live_bytes);
    /* the allocator works, and caches, again afterwards */
    train_step(m);
    assert_no_error();
    e = stats(m->dev);
    assert_true(e.live_bytes == s.live_bytes);
    assert_true(e.cached_bytes > 0 || !caches(m->dev));
}

/* On the emulated device a block the caching allocator hands out again comes back filled
   with 0xFF (NaN), as fresh blocks do, never with the last tensor's values: a kernel that reads
   its output before writing it then fails the same way on every run. */
static void test_reused_block_poisoned(void **state) {
    (void)state;
    mt_device d = mt_test_device();
    const int64_t n = 1000;
    mt_tensor *t = mt_full(1, &n, MT_F32, d, 3.0);
    assert_non_null(t);
    mt_memory_stats before = stats(d);
    mt_release(t);
    assert_true(stats(d).cached_bytes > before.cached_bytes); /* the block went to the cache */
    mt_tensor *u = mt_empty(1, &n, MT_F32, d);
    assert_non_null(u);
    assert_true(stats(d).cached_bytes == before.cached_bytes); /* and came back from it */
    uint32_t bits[1000];
    assert_int_equal(mt_copy_to_host(u, bits, sizeof bits), 0);
    for (int64_t i = 0; i < n; i++)
        if (bits[i] != 0xFFFFFFFFu)
            fail_msg("element %lld of a reused block is 0x%08x, not the 0xFF poison", (long long)i,
                     (unsigned)bits[i]);
    mt_release(u);
}

/* ------------------------------------------------------------------ (e) out of memory */

/* A step that runs out of memory (mt_debug_set_alloc_limit: tensor storage on the host and
   on devices) fails with MT_ERR_OOM, changes no parameter, and the next step after the limit
   is lifted trains normally. Here the forward cannot allocate its activations (64 KiB and
   more, over a 16 KiB limit): the rest of the step sees NULL, and the optimizer finds no
   gradient. */
static void test_oom_in_forward_changes_nothing(void **state) {
    (void)state;
    mlp *m = mlp_new(51);
    train_step(m); /* Adam's and the scaler's state exist: the failure is the step's own */
    assert_no_error();
    snapshot *before = snap_take(m);

    mt_debug_set_alloc_limit(16 << 10);
    mt_tensor *loss = amp_step(m);
    mt_debug_set_alloc_limit(0);
    assert_null(loss);
    assert_error(MT_ERR_OOM, "out of memory");
    assert_int_equal(mt_synchronize(m->dev), 0);
    assert_no_error();
    assert_params_equal(m, before, "after the step that ran out of memory");

    loss = amp_step(m);
    assert_no_error();
    double l = mt_item(loss);
    mt_release(loss);
    assert_true(isfinite(l));
    assert_false(mt_grad_scaler_last_step_skipped(m->scaler));
    assert_params_moved(m, before);
}

/* The same when memory runs out part way through backward, after some gradients were
   written. With 256 inputs the first layer's weight gradient (512 x 256: 256 KiB in FP16) is
   far larger than anything the second layer's backward allocates (at most 128 KiB: the CPU's
   FP32 GEMM panels), so under a 192 KiB limit l2's gradients are written and l1's are not.
   The step's scaler and optimizer calls run anyway (the step is checked once, at the end, as
   the sticky error invites): they must not apply that partial set of gradients. */
static void test_oom_in_backward_changes_nothing(void **state) {
    (void)state;
    mlp *m = mlp_new_in(52, 256);
    train_step(m);
    assert_no_error();
    snapshot *before = snap_take(m);

    mt_release(amp_step_ex(m, (step_opts){.backward_limit = 192 << 10}));
    assert_error(MT_ERR_OOM, "out of memory");
    assert_int_equal(mt_synchronize(m->dev), 0);
    assert_no_error();
    assert_params_equal(m, before, "after the step whose backward ran out of memory");

    mt_tensor *loss = amp_step(m);
    assert_no_error();
    double l = mt_item(loss);
    mt_release(loss);
    assert_true(isfinite(l));
    assert_params_moved(m, before);
}

/* ------------------------------------------------------------------ (f) missing device */

/* Asking for a CUDA device that is not there is an error naming it, never a crash or a
   silent CPU tensor: cuda:0 when this build or machine has no CUDA device, else an index past
   the last device. Runs on every device under test; it leaves that device working. */
static void test_missing_cuda_device(void **state) {
    (void)state;
    int n = mt_cuda_device_count();
    if (!mt_cuda_available()) assert_int_equal(n, 0);
    int index = !mt_cuda_available() ? 0 : n > 99 ? n : 99;
    char name[32];
    snprintf(name, sizeof name, "cuda:%d", index);
    mt_device gone = MT_CUDA(index);
    mt_scope_begin();

    assert_null(mt_zeros(MT_SHAPE(2, 3), MT_F32, gone));
    assert_error(MT_ERR_DEVICE, name);
    mt_tensor *host = mt_ones(MT_SHAPE(2, 3), MT_F32, MT_CPU);
    assert_null(mt_to(host, gone));
    assert_error(MT_ERR_DEVICE, name);
    assert_int_equal(mt_synchronize(gone), MT_ERR_DEVICE);
    assert_error(MT_ERR_DEVICE, name);
    mt_memory_stats s;
    assert_int_equal(mt_memory_stats_get(gone, &s), MT_ERR_DEVICE);
    assert_error(MT_ERR_DEVICE, name);

    /* the CPU is one device, index 0: another index is refused, not a second host device */
    const mt_device cpus[] = {{MT_DEVICE_CPU, 3}, {MT_DEVICE_CPU, -1}};
    for (int i = 0; i < 2; i++) {
        snprintf(name, sizeof name, "cpu:%d does not exist", cpus[i].index);
        assert_null(mt_ones(MT_SHAPE(2, 3), MT_F32, cpus[i]));
        assert_error(MT_ERR_DEVICE, name);
        assert_null(mt_arange(0, 3, 1, MT_F64, cpus[i]));
        assert_error(MT_ERR_DEVICE, name);
        assert_null(mt_to(host, cpus[i]));
        assert_error(MT_ERR_DEVICE, name);
        assert_int_equal(mt_synchronize(cpus[i]), MT_ERR_DEVICE);
        assert_error(MT_ERR_DEVICE, name);
    }

    mt_tensor *t = mt_to(host, mt_test_device());
    double want[6] = {1, 1, 1, 1, 1, 1};
    assert_tensor_close(t, want, 6, 0, 0);
    mt_scope_end();
}

/* A 0-d CPU tensor meets a CUDA tensor in a binary op, as in torch (x * torch.tensor(0.5)):
   the result is on the CUDA device, the scalar's gradient comes back to the CPU, and a CPU
   tensor with dimensions is still an error. */
static void test_cpu_scalar_with_device_tensor(void **state) {
    (void)state;
    mt_device dev = mt_test_device();
    mt_scope_begin();
    mt_tensor *x = mt_test_tensor((const double[]){1, -2, 3}, MT_F32, MT_SHAPE(3));
    mt_tensor *s = mt_scalar(0.5, MT_F32, MT_CPU);
    mt_set_requires_grad(x, true);
    mt_set_requires_grad(s, true);
    int64_t syncs = mt_host_sync_count();
    mt_tensor *y = mt_mul(x, s), *z = mt_sub(s, x), *gt = mt_gt(x, s);
    assert_int_equal(mt_host_sync_count(), syncs); /* the upload does not wait */
    assert_no_error();
    assert_true(mt_device_of(y).type == dev.type && mt_device_of(z).type == dev.type);
    assert_tensor_close(y, ((const double[]){0.5, -1, 1.5}), 3, 0, 0);
    assert_tensor_close(z, ((const double[]){-0.5, 2.5, -2.5}), 3, 0, 0);
    assert_tensor_close(gt, ((const double[]){1, 0, 1}), 3, 0, 0);
    assert_int_equal(mt_backward(mt_sum_all(mt_add(y, z)), NULL), 0);
    mt_tensor *gs = mt_grad(s);
    assert_true(mt_device_of(gs).type == MT_DEVICE_CPU);
    assert_float_equal(mt_item(gs), (1 - 2 + 3) + 3, 0); /* d/ds of sum(x * s) + sum(s - x) */
    assert_tensor_close(mt_grad(x), ((const double[]){-0.5, -0.5, -0.5}), 3, 0, 0);
    mt_release(gs);
    mt_tensor *v = mt_ones(MT_SHAPE(1), MT_F32, MT_CPU);
    assert_null(mt_mul(x, v));
    assert_error(MT_ERR_DEVICE, "tensors are on different devices (cuda:0 and cpu:0)");
    /* in place too, as torch's add_ (the destination must still be the device tensor) */
    mt_tensor *d = mt_test_tensor((const double[]){1, 2, 3}, MT_F32, MT_SHAPE(3));
    assert_int_equal(mt_add_inplace(d, mt_scalar(5, MT_F32, MT_CPU)), 0);
    assert_tensor_close(d, ((const double[]){6, 7, 8}), 3, 0, 0);
    assert_int_equal(mt_add_inplace(d, v), MT_ERR_DEVICE);
    assert_error(MT_ERR_DEVICE, "mt_add_inplace");
    mt_scope_end();
}

/* ------------------------------------------------------------------ (g) uploads */

/* Uploads from host memory go through pinned staging blocks (on a CUDA device): the source
   may change right after each call, more uploads than there are blocks still arrive intact
   (on the emulated device a block is read only when the queue runs, so reusing one too early
   would show), and the host waits only for uploads beyond the ring. */
static void test_uploads_in_flight(void **state) {
    (void)state;
    mt_device dev = mt_test_device();
    enum { N = 9, LEN = 3000 };
    static float host[LEN];
    mt_tensor *t[N];
    int64_t syncs = mt_host_sync_count();
    for (int k = 0; k < N; k++) {
        for (int i = 0; i < LEN; i++) host[i] = (float)(k * 10000 + i);
        t[k] = mt_from_data(host, MT_F32, MT_SHAPE(LEN), dev);
        assert_non_null(t[k]);
    }
    assert_true(mt_host_sync_count() - syncs <= N - 4); /* four blocks upload without a wait */
    static float back[LEN];
    for (int k = 0; k < N; k++) {
        assert_int_equal(mt_copy_to_host(t[k], back, sizeof back), 0);
        for (int i = 0; i < LEN; i++)
            if (back[i] != (float)(k * 10000 + i))
                fail_msg("upload %d, element %d: %g", k, i, (double)back[i]);
        mt_release(t[k]);
    }
    assert_no_error();
}

/* ------------------------------------------------------------------ (h) peer copies */

/* mt_to between two CUDA devices copies device to device without a host wait, from any
   layout and dtype, keeps stream order on both sides (a later in-place write to the source
   or a reuse of its freed block does not reach the copy), and its backward brings the
   gradient back to the first device. */
static void test_peer_copy(void **state) {
    (void)state;
    mt_device d0 = MT_CUDA(0), d1 = MT_CUDA(1);
    mt_scope_begin();
    mt_manual_seed(9);
    mt_tensor *x = mt_randn(MT_SHAPE(3, 4), MT_F32, d0);
    mt_set_requires_grad(x, true);
    double xv[12];
    mt_tensor *x64 = mt_cast(x, MT_F64);
    assert_int_equal(mt_copy_to_host(x64, xv, sizeof xv), 0);

    int64_t syncs = mt_host_sync_count();
    mt_tensor *y = mt_to(x, d1);
    mt_tensor *yt = mt_to(mt_transpose(x, 0, 1), d1); /* a strided source */
    mt_tensor *yh = mt_to(mt_cast(x, MT_F16), d1);
    mt_tensor *back = mt_to(y, d0);
    assert_int_equal(mt_host_sync_count(), syncs);
    assert_no_error();
    assert_int_equal(mt_device_of(y).index, 1);
    assert_int_equal(mt_device_of(back).index, 0);
    assert_tensor_close(y, xv, 12, 0, 0);
    assert_tensor_close(back, xv, 12, 0, 0);
    double xt[12], xh[12];
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++) xt[j * 3 + i] = xv[i * 4 + j];
    assert_tensor_close(yt, xt, 12, 0, 0);
    for (int i = 0; i < 12; i++) xh[i] = xv[i];
    assert_tensor_close(yh, xh, 12, 1e-3, 1e-3);
    assert_int_equal(mt_dtype_of(yh), MT_F16);

    /* stream order: the source changes right after the copy, and a freed source's block is
       taken by the next allocation on its device */
    mt_tensor *src = mt_ones(MT_SHAPE(1000), MT_F32, d0);
    mt_tensor *dst = mt_to(src, d1);
    assert_int_equal(mt_mul_scalar_inplace(src, 5.0), 0);
    mt_tensor *src2 = mt_ones(MT_SHAPE(1000), MT_F32, d0);
    mt_tensor *dst2 = mt_to(src2, d1);
    mt_release(src2); /* freed now (the scope lets go of it): the next allocation reuses it */
    mt_tensor *other = mt_full(MT_SHAPE(1000), MT_F32, d0, 7.0);
    assert_non_null(other);
    double ones[1000];
    for (int i = 0; i < 1000; i++) ones[i] = 1.0;
    assert_tensor_close(dst, ones, 1000, 0, 0);
    assert_tensor_close(dst2, ones, 1000, 0, 0);

    /* the gradient of a loss on cuda:1 lands on x, on cuda:0 */
    mt_tensor *loss = mt_sum_all(mt_mul(y, y));
    assert_int_equal(mt_backward(loss, NULL), 0);
    mt_tensor *g = mt_grad(x);
    assert_int_equal(mt_device_of(g).index, 0);
    double want[12];
    for (int i = 0; i < 12; i++) want[i] = 2 * xv[i];
    assert_tensor_close(g, want, 12, 1e-6, 1e-6);
    assert_int_equal(mt_synchronize(d0), 0);
    assert_int_equal(mt_synchronize(d1), 0);
    assert_no_error();
    mt_scope_end();
}

/* A channels-last tensor moved between devices keeps its values and its layout (torch's
   preserve_format), both ways and between two devices, and its gradient comes back in
   order: the host staging copy was channels-last and uploaded as if NCHW. */
static void test_channels_last_between_devices(void **state) {
    (void)state;
    mt_device dev = mt_test_device();
    mt_scope_begin();
    double v[16];
    for (int i = 0; i < 16; i++) v[i] = i;
    mt_tensor *host = mt_from_data(v, MT_F64, MT_SHAPE(1, 2, 2, 4), MT_CPU);
    mt_tensor *cl = mt_to_channels_last(mt_cast(host, MT_F32));
    mt_tensor *up = mt_to(cl, dev);
    assert_true(mt_is_channels_last(up));
    assert_tensor_close(up, v, 16, 0, 0);
    mt_tensor *into = mt_zeros(MT_SHAPE(1, 2, 2, 4), MT_F32, dev);
    assert_int_equal(mt_copy(into, cl), 0);
    assert_tensor_close(into, v, 16, 0, 0);
    mt_tensor *down = mt_to(mt_to_channels_last(mt_to(host, dev)), MT_CPU);
    assert_true(mt_is_channels_last(down));
    assert_tensor_close(down, v, 16, 0, 0);
    if (mt_cuda_device_count() >= 2) {
        mt_tensor *peer = mt_to(up, MT_CUDA(1));
        assert_true(mt_is_channels_last(peer));
        assert_tensor_close(peer, v, 16, 0, 0);
    }
    /* the gradient through mt_to of a channels-last host tensor: max pooling routes it to
       the largest element of each 2x2 window, as torch */
    mt_tensor *x = mt_to(host, dev);
    mt_set_requires_grad(x, true);
    mt_tensor *y = mt_to_channels_last(mt_to(x, MT_CPU));
    assert_int_equal(
        mt_backward(mt_sum_all(mt_max_pool2d(y, &(mt_pool2d_opts){.kernel = {2, 2}})), NULL), 0);
    assert_tensor_close(
        mt_grad(x), ((const double[]){0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 1, 0, 1}), 16, 0, 0);
    mt_scope_end();
}

/* ------------------------------------------------------------------ main */

#define CUDA_ONLY(fn, why)                                                                         \
    (mt_test_device_is_cpu() ? MT_TEST_SKIPPED(fn, why) : (struct CMUnitTest)DEVICE_TEST(fn))

int main(void) {
    const struct CMUnitTest tests[] = {
        CUDA_ONLY(test_amp_step_makes_no_host_sync,
                  "on the CPU nothing waits for a device: the sync count is always 0"),
        DEVICE_TEST(test_skipped_step_changes_nothing),
        DEVICE_TEST(test_bad_label_reported_then_recovers),
        DEVICE_TEST(test_embedding_checks_indices_without_sync),
        DEVICE_TEST(test_memory_flat_over_steps),
        mt_test_emulated_device() ? (struct CMUnitTest)DEVICE_TEST(test_reused_block_poisoned)
                                  : MT_TEST_SKIPPED(test_reused_block_poisoned,
                                                    "the emulated device's allocator poisoning"),
        DEVICE_TEST(test_oom_in_forward_changes_nothing),
        DEVICE_TEST(test_oom_in_backward_changes_nothing),
        DEVICE_TEST(test_missing_cuda_device),
        CUDA_ONLY(test_cpu_scalar_with_device_tensor,
                  "a CPU scalar with a CUDA tensor: on the CPU every operand is a CPU tensor"),
        DEVICE_TEST(test_uploads_in_flight),
        CUDA_ONLY(test_channels_last_between_devices,
                  "moves between devices: on the CPU there is one device"),
        mt_cuda_device_count() >= 2 && !mt_test_device_is_cpu()
            ? (struct CMUnitTest)DEVICE_TEST(test_peer_copy)
            : MT_TEST_SKIPPED(test_peer_copy,
                              "needs two CUDA devices (the emulated runs set MTEMU_DEVICES=2)"),
    };
    return MT_RUN_TESTS(tests);
}
