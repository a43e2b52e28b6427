/* Every out-of-memory path of a call, one after another. mt_debug_fail_nth_alloc(n) fails the
   n-th allocation the call makes (tensor storage and kernel scratch on every device, tensor
   headers, tape nodes, the library's own lists and records), and the walk takes n = 1, 2, ...
   until the call makes fewer than n. Each n starts from a fresh copy of the scenario's state,
   and each failure must be clean:
   - the call reports MT_ERR_OOM, with a message that names a function and says "out of
     memory" (or "out of device memory");
   - it changes nothing: the tensors a scenario watches, their gradients, and the optimizer's
     and the scaler's state are the same bit for bit (a snapshot taken with the injection off);
   - it leaks nothing: as many live tensors and bytes as before the call;
   - the same call, retried at once on that state, succeeds, and it and a follow-up call leave
     the state bit for bit as on a twin that never saw a failure (nothing hidden, a flag or a
     counter, was left half-changed).
   A call that recovers from the failure by itself (a cache emptied and the allocation
   retried) must also end like the twin. */
#include <unistd.h>
#include "test_util.h"

/* ---- a scenario's state: what its calls use, and what must not change when one fails */
#define MAX_WATCH 8
typedef struct {
    mt_tensor *watch[MAX_WATCH]; /* values and gradients must survive a failed call */
    int n_watch;
    mt_tensor *x, *x2, *labels, *loss; /* inputs, and a graph's root for the backward scenarios */
    mt_tensor *result;                 /* what the call made */
    mt_optimizer *opt;
    mt_grad_scaler *scaler;
    mt_state *state, *saved; /* a state the call writes into / one it reads from */
    mt_conv2d_layer conv;
    mt_linear_layer linear;
    char path[64]; /* a checkpoint file the call writes or reads ("": none) */
    int kind;      /* a scenario family's variant */
} oom_ctx;

typedef struct {
    const char *name;
    void (*setup)(oom_ctx *c);
    int (*call)(oom_ctx *c);   /* 0, or the failed call's status */
    int (*follow)(oom_ctx *c); /* NULL, or a call that uses what `call` left */
    int kind;
    /* the call frees what it consumes as it goes (a backward without retain_graph frees
       each node's saved tensors once used): a failed one may leave fewer tensors alive, and
       a retry either runs (nothing was spent yet) or reports the spent graph */
    bool consumes;
} scenario;

static void watch(oom_ctx *c, mt_tensor *t) {
    assert_true(c->n_watch < MAX_WATCH);
    c->watch[c->n_watch++] = t;
}

static void ctx_free(oom_ctx *c) {
    for (int i = 0; i < c->n_watch; i++) mt_release(c->watch[i]);
    mt_release(c->x);
    mt_release(c->x2);
    mt_release(c->labels);
    mt_release(c->loss);
    mt_release(c->result);
    mt_optimizer_free(c->opt);
    mt_grad_scaler_free(c->scaler);
    mt_state_free(c->state);
    mt_state_free(c->saved);
    mt_conv2d_layer_free(&c->conv);
    mt_linear_layer_free(&c->linear);
    if (c->path[0]) remove(c->path);
    *c = (oom_ctx){0};
}

/* ---- snapshots: every watched value as bytes, taken with the injection off */
typedef struct {
    unsigned char *bytes;
    size_t len, cap;
} blob;

static void blob_put(blob *b, const void *p, size_t n) {
    if (b->len + n > b->cap) {
        b->cap = (b->len + n) * 2 + 256;
        b->bytes = realloc(b->bytes, b->cap);
        assert_non_null(b->bytes);
    }
    if (n) memcpy(b->bytes + b->len, p, n);
    b->len += n;
}

static void blob_tensor(blob *b, const mt_tensor *t) {
    /* dtype, shape and layout (a failed in-place conversion must not change one) */
    int64_t head[2 + 2 * MT_MAX_DIMS] = {t ? (int64_t)mt_dtype_of(t) : -1, t ? mt_ndim(t) : -1};
    for (int d = 0; t && d < mt_ndim(t); d++) {
        head[2 + d] = mt_dim(t, d);
        head[2 + MT_MAX_DIMS + d] = mt_dim(t, d) > 1 ? mt_strides(t)[d] : 0;
    }
    blob_put(b, head, sizeof head);
    if (!t) return;
    size_t nbytes = (size_t)mt_numel(t) * mt_dtype_size(mt_dtype_of(t));
    unsigned char *buf = malloc(nbytes ? nbytes : 1);
    assert_non_null(buf);
    assert_int_equal(mt_copy_to_host(t, buf, nbytes), 0);
    blob_put(b, buf, nbytes);
    free(buf);
}

static void blob_state(blob *b, mt_state *s) {
    int n = mt_state_count(s);
    blob_put(b, &n, sizeof n);
    for (int i = 0; i < n; i++) {
        const char *name = mt_state_name(s, i);
        blob_put(b, name, strlen(name) + 1);
        mt_tensor *t = mt_state_get(s, name);
        blob_tensor(b, t);
        mt_release(t);
    }
    int m = mt_state_meta_count(s);
    blob_put(b, &m, sizeof m);
    for (int i = 0; i < m; i++) {
        const char *key = mt_state_meta_key(s, i), *value = mt_state_get_meta(s, key);
        blob_put(b, key, strlen(key) + 1);
        blob_put(b, value, strlen(value) + 1);
    }
}

static blob snapshot(oom_ctx *c) {
    blob b = {0};
    for (int i = 0; i < c->n_watch; i++) {
        blob_tensor(&b, c->watch[i]);
        mt_tensor *g = mt_grad(c->watch[i]);
        blob_tensor(&b, g);
        mt_release(g);
    }
    blob_tensor(&b, c->result);
    if (c->opt) {
        mt_state *s = mt_state_new();
        assert_int_equal(mt_optimizer_state_save(c->opt, s, ""), 0);
        blob_state(&b, s);
        mt_state_free(s);
    }
    if (c->scaler) {
        mt_grad_scaler_state st;
        assert_int_equal(mt_grad_scaler_state_get(c->scaler, &st), 0);
        blob_put(&b, &st, sizeof st);
    }
    if (c->state) blob_state(&b, c->state);
    FILE *f = c->path[0] ? fopen(c->path, "rb") : NULL;
    for (int ch; f && (ch = fgetc(f)) != EOF;) {
        unsigned char byte = (unsigned char)ch;
        blob_put(&b, &byte, 1);
    }
    if (f) fclose(f);
    assert_no_error();
    return b;
}

static void assert_same(const blob *want, const blob *got, const char *scenario, int64_t n,
                        const char *when) {
    if (want->len != got->len || memcmp(want->bytes, got->bytes, want->len) != 0)
        fail_msg("%s, allocation %lld failed: %s", scenario, (long long)n, when);
}

/* ---- the walk */

/* After a call that failed at its n-th allocation: the rules of a clean failure (see the top
   of the file), then the retry. Returns false when the retry found the graph spent (a
   backward without retain_graph), which ends this n's checks. */
static bool check_failure(const scenario *sc, oom_ctx *c, int64_t n, int rc, bool never_reached,
                          int64_t tensors, int64_t bytes, const blob *before) {
    if (never_reached)
        fail_msg("%s: failed with no allocation failing: %s", sc->name, mt_last_error());
    if (rc != MT_ERR_OOM || mt_last_status() != MT_ERR_OOM)
        fail_msg("%s, allocation %lld failed: status %d (%s), expected MT_ERR_OOM", sc->name,
                 (long long)n, rc, mt_last_error());
    const char *msg = mt_last_error();
    if (strncmp(msg, "mt_", 3) != 0 || !strstr(msg, "out of") || !strstr(msg, "memory"))
        fail_msg("%s, allocation %lld failed: message \"%s\" does not name a function and say "
                 "\"out of (device) memory\"",
                 sc->name, (long long)n, msg);
    mt_clear_error();
    bool freed = sc->consumes && mt_live_tensors() <= tensors && mt_live_bytes() <= bytes;
    if (!freed && (mt_live_tensors() != tensors || mt_live_bytes() != bytes))
        fail_msg("%s, allocation %lld failed: %lld tensors and %lld bytes leaked", sc->name,
                 (long long)n, (long long)(mt_live_tensors() - tensors),
                 (long long)(mt_live_bytes() - bytes));
    blob after = snapshot(c);
    assert_same(before, &after, sc->name, n, "the failed call changed the state");
    free(after.bytes);
    rc = sc->call(c);              /* the retry */
    if (sc->consumes && rc != 0) { /* the graph was spent before the failure */
        if (rc != MT_ERR_STATE || !strstr(mt_last_error(), "retain_graph"))
            fail_msg("%s, allocation %lld failed: the retry on the spent graph gave status %d "
                     "(%s), expected MT_ERR_STATE naming retain_graph",
                     sc->name, (long long)n, rc, mt_last_error());
        mt_clear_error();
        return false;
    }
    if (rc != 0)
        fail_msg("%s, allocation %lld failed: the retry failed too: %s", sc->name, (long long)n,
                 mt_last_error());
    return true;
}

static void walk(const scenario *sc) {
    oom_ctx c = {.kind = sc->kind};
    /* the twin: the call and its follow-up with nothing failing (it also makes whatever a
       device keeps for good at first use, a library handle or a workspace) */
    sc->setup(&c);
    assert_no_error();
    if (sc->call(&c) != 0 || (sc->follow && sc->follow(&c) != 0))
        fail_msg("%s: failed with no allocation failing: %s", sc->name, mt_last_error());
    blob expect = snapshot(&c);
    ctx_free(&c);

    int64_t n = 1, failures = 0;
    for (bool done = false; !done; n++) {
        c = (oom_ctx){.kind = sc->kind};
        sc->setup(&c);
        assert_no_error();
        blob before = snapshot(&c);
        int64_t tensors = mt_live_tensors(), bytes = mt_live_bytes();
        mt_debug_fail_nth_alloc(n);
        int rc = sc->call(&c);
        bool never_reached = mt_debug_fail_nth_alloc(0);
        done = never_reached; /* the call made fewer than n allocations */
        bool compare = true;
        if (rc != 0) {
            failures++;
            compare = check_failure(sc, &c, n, rc, never_reached, tensors, bytes, &before);
        } else if (!never_reached && mt_last_status() != MT_OK) {
            fail_msg("%s, allocation %lld failed: the call succeeded with an error set: %s",
                     sc->name, (long long)n, mt_last_error());
        }
        if (compare) {
            if (sc->follow) assert_int_equal(sc->follow(&c), 0);
            blob got = snapshot(&c);
            assert_same(&expect, &got, sc->name, n,
                        rc == 0 && never_reached
                            ? "a call with no failure differs from the twin"
                            : "after the failure, the state differs from the twin's");
            free(got.bytes);
        }
        free(before.bytes);
        ctx_free(&c);
    }
    free(expect.bytes);
    printf("# %s: %lld allocations, %lld of them failed the call cleanly\n", sc->name,
           (long long)(n - 2), (long long)failures);
}

/* ---- setups */
static mt_tensor *random_tensor(int nd, const int64_t *shape, mt_dtype dt, bool param) {
    mt_tensor *r = mt_randn(nd, shape, MT_F32, mt_test_device());
    mt_tensor *t = mt_cast(r, dt);
    mt_release(r);
    assert_non_null(t);
    if (param) mt_set_requires_grad(t, true);
    return t;
}

static mt_tensor *labels_of(int n, int classes) {
    int64_t v[16], shape[1] = {n};
    for (int i = 0; i < n; i++) v[i] = (i * 7 + 3) % classes;
    mt_tensor *t = mt_from_data(v, MT_I64, 1, shape, mt_test_device());
    assert_non_null(t);
    return t;
}

/* an MLP's inputs and parameters: x [6, 5], w1 [8, 5], b1 [8], w2 [3, 8], b2 [3] */
static void setup_mlp(oom_ctx *c) {
    mt_manual_seed(11);
    c->x = random_tensor(2, (int64_t[]){6, 5}, MT_F32, false);
    watch(c, random_tensor(2, (int64_t[]){8, 5}, MT_F32, true));
    watch(c, random_tensor(1, (int64_t[]){8}, MT_F32, true));
    watch(c, random_tensor(2, (int64_t[]){3, 8}, MT_F32, true));
    watch(c, random_tensor(1, (int64_t[]){3}, MT_F32, true));
    c->labels = labels_of(6, 3);
}

/* the MLP's loss, in the caller's scope */
static mt_tensor *mlp_loss(oom_ctx *c) {
    mt_tensor *h = mt_linear_act(c->x, c->watch[0], c->watch[1], MT_ACT_RELU);
    mt_tensor *z = h ? mt_linear(h, c->watch[2], c->watch[3]) : NULL;
    return z ? mt_cross_entropy(z, c->labels) : NULL;
}

/* the status of a forward that returned `out` and a backward from it, all in one scope */
static int backward_of(mt_tensor *out) {
    int rc = out ? mt_backward(out, NULL) : (int)mt_last_status();
    mt_scope_end();
    return rc;
}

static int call_mlp(oom_ctx *c) {
    mt_scope_begin();
    if (c->kind) mt_autocast_begin(c->kind == 1 ? MT_BF16 : MT_F16, MT_AMP_O1);
    mt_tensor *loss = mlp_loss(c);
    if (c->kind) mt_autocast_end();
    return backward_of(loss);
}

/* conv, fused batch norm + residual + ReLU, pooling, channels-last: x [2, 3, 6, 6] */
static void setup_cnn(oom_ctx *c) {
    mt_manual_seed(12);
    mt_tensor *x = random_tensor(4, (int64_t[]){2, 3, 6, 6}, MT_F32, false);
    c->x = mt_to_channels_last(x);
    mt_release(x);
    c->x2 = random_tensor(4, (int64_t[]){2, 4, 6, 6}, MT_F32, false);
    watch(c, random_tensor(4, (int64_t[]){4, 3, 3, 3}, MT_F32, true));
    watch(c, random_tensor(1, (int64_t[]){4}, MT_F32, true));
    watch(c, random_tensor(1, (int64_t[]){4}, MT_F32, true));
    watch(c, random_tensor(1, (int64_t[]){4}, MT_F32, true));
}

static int call_cnn(oom_ctx *c) {
    mt_scope_begin();
    mt_conv2d_opts co = {.padding = {1, 1}};
    mt_pool2d_opts po = {.kernel = {2, 2}};
    mt_tensor *y = mt_conv2d(c->x, c->watch[0], c->watch[1], &co);
    y = y ? mt_batch_norm_act(y, NULL, NULL, c->watch[2], c->watch[3], c->x2, true, 0.1, 1e-5,
                              MT_ACT_RELU)
          : NULL;
    y = y ? mt_max_pool2d(y, &po) : NULL;
    mt_tensor *a = y ? mt_avg_pool2d(y, &po) : NULL;
    y = a ? mt_adaptive_avg_pool2d(y, 1, 1) : NULL;
    y = y ? mt_add(mt_sum_all(y), mt_mean_all(a)) : NULL;
    return backward_of(y);
}

/* batch norm's running statistics, updated in place by a forward in training mode */
static void setup_bn(oom_ctx *c) {
    mt_manual_seed(13);
    c->x = random_tensor(4, (int64_t[]){3, 4, 2, 2}, MT_F32, false);
    watch(c, random_tensor(1, (int64_t[]){4}, MT_F32, false)); /* running mean */
    mt_tensor *v = random_tensor(1, (int64_t[]){4}, MT_F32, false);
    watch(c, mt_mul(v, v)); /* running variance */
    mt_release(v);
    watch(c, random_tensor(1, (int64_t[]){4}, MT_F32, true));
}

static int call_bn(oom_ctx *c) {
    c->result = mt_batch_norm(c->x, c->watch[0], c->watch[1], c->watch[2], NULL, true, 0.1, 1e-5);
    return c->result ? 0 : (int)mt_last_status();
}

/* norms, dropout, softmax, embedding and joins: x [4, 6] */
static void setup_misc(oom_ctx *c) {
    mt_manual_seed(14);
    watch(c, random_tensor(2, (int64_t[]){4, 6}, MT_F32, true));
    watch(c, random_tensor(1, (int64_t[]){6}, MT_F32, true));
    watch(c, random_tensor(2, (int64_t[]){10, 6}, MT_F32, true));
    c->labels = labels_of(4, 10);
}

static int call_misc(oom_ctx *c) {
    mt_scope_begin();
    mt_manual_seed(15); /* the dropout mask: the same draw on a retry */
    mt_tensor *x = c->watch[0];
    mt_tensor *y = mt_layer_norm(x, 1, c->watch[1], NULL, 1e-5);
    y = y ? mt_gelu(y) : NULL;
    y = y ? mt_dropout(y, 0.25, true) : NULL;
    y = y ? mt_log_softmax(y, 1) : NULL;
    mt_tensor *e = y ? mt_embedding(c->watch[2], c->labels) : NULL;
    mt_tensor *parts[2] = {y, e ? mt_mul(e, x) : NULL};
    mt_tensor *j = parts[1] ? mt_cat(parts, 2, 0) : NULL;
    j = j ? mt_index_select(j, 0, c->labels) : NULL;
    j = j ? mt_softmax(mt_transpose(j, 0, 1), 0) : NULL;
    return backward_of(j ? mt_sum_all(mt_where(mt_gt(j, mt_mean_all(j)), j, mt_transpose(x, 0, 1)))
                         : NULL);
}

/* a recorded graph, whose backward is the call */
static int call_backward(oom_ctx *c) {
    return mt_backward_ex(c->loss, NULL, c->kind == 1);
}

static void setup_graph(oom_ctx *c) {
    setup_mlp(c);
    mt_scope_begin(); /* the intermediates live on in the graph */
    c->loss = mt_scope_end_keep(mlp_loss(c));
    assert_non_null(c->loss);
}

/* the graph, with gradients the user set to expanded tensors (one value seen through
   stride 0): the backward makes each a new .grad, which must happen before any is applied */
static void setup_graph_expanded_grads(oom_ctx *c) {
    setup_graph(c);
    for (int i = 0; i < c->n_watch; i++) {
        mt_tensor *w = c->watch[i];
        mt_tensor *one = mt_scalar(0.25 * (i + 1), MT_F32, mt_test_device());
        mt_tensor *g = mt_expand(one, mt_ndim(w), mt_shape(w));
        assert_int_equal(mt_set_grad(w, g), 0);
        mt_release(g);
        mt_release(one);
    }
}

/* optimizers over an F16 and an F32 parameter with their gradients; kind: 0-3 SGD,
   momentum (Nesterov), Adam, AdamW, all with FP32 masters; +4: the call is a later step */
static mt_optimizer *make_optimizer(mt_tensor **p, int kind) {
    switch (kind % 4) {
    case 0:
        return mt_sgd_new(p, 2, &(mt_sgd_opts){.weight_decay = 0.1, .multi_precision = true});
    case 1:
        return mt_momentum_new(p, 2,
                               &(mt_momentum_opts){.nesterov = true, .multi_precision = true});
    case 2:
        return mt_adam_new(p, 2, &(mt_adam_opts){.multi_precision = true});
    default:
        return mt_adamw_new(p, 2, &(mt_adam_opts){.multi_precision = true});
    }
}

static void set_random_grads(oom_ctx *c) {
    for (int i = 0; i < 2; i++) {
        mt_tensor *w = c->watch[i];
        mt_tensor *g = random_tensor(mt_ndim(w), mt_shape(w), mt_dtype_of(w), false);
        assert_int_equal(mt_set_grad(w, g), 0);
        mt_release(g);
    }
}

static void setup_params(oom_ctx *c) {
    mt_manual_seed(16);
    watch(c, random_tensor(2, (int64_t[]){5, 7}, MT_F16, true));
    watch(c, random_tensor(1, (int64_t[]){7}, MT_F32, true));
    set_random_grads(c);
}

static void setup_optimizer(oom_ctx *c) {
    setup_params(c);
    c->opt = make_optimizer(c->watch, c->kind);
    assert_non_null(c->opt);
    if (c->kind >= 4) {
        assert_int_equal(mt_optimizer_step(c->opt), 0);
        set_random_grads(c);
    }
}

static int call_step(oom_ctx *c) {
    return mt_optimizer_step(c->opt);
}

static int call_new_optimizer(oom_ctx *c) {
    c->opt = make_optimizer(c->watch, c->kind);
    return c->opt ? 0 : (int)mt_last_status();
}

/* the GradScaler over Adam; kind 0: finite gradients, 1: one inf (the step is skipped);
   +2: unscale already done (the call is the step), +4: the step done (the call is update) */
static void setup_scaler(oom_ctx *c) {
    setup_params(c);
    c->opt = make_optimizer(c->watch, 2);
    c->scaler =
        mt_grad_scaler_new(&(mt_grad_scaler_opts){.init_scale = 1024, .growth_interval = 1});
    assert_non_null(c->scaler);
    if (c->kind & 1) { /* an overflow in one gradient element */
        double v[7] = {0.5, -1, 2, INFINITY, 0.25, 1, -2};
        mt_test_set_grad(c->watch[1], v);
    }
    if (c->kind & 2) assert_int_equal(mt_grad_scaler_unscale(c->scaler, c->opt), 0);
    if (c->kind & 4) assert_int_equal(mt_grad_scaler_step(c->scaler, c->opt), 0);
}

static int call_unscale(oom_ctx *c) {
    return mt_grad_scaler_unscale(c->scaler, c->opt);
}
static int call_scaler_step(oom_ctx *c) {
    return mt_grad_scaler_step(c->scaler, c->opt);
}
static int call_update(oom_ctx *c) {
    return mt_grad_scaler_update(c->scaler);
}
static int call_minimize(oom_ctx *c) {
    return mt_grad_scaler_minimize(c->scaler, c->opt);
}
static int call_scale(oom_ctx *c) {
    c->result = mt_grad_scaler_scale(c->scaler, c->watch[1]);
    return c->result ? 0 : (int)mt_last_status();
}
static int call_clip(oom_ctx *c) {
    c->result = mt_clip_grad_norm_async(c->opt, 0.5);
    return c->result ? 0 : (int)mt_last_status();
}
static int call_decorate(oom_ctx *c) {
    return mt_amp_decorate(c->watch, 2, MT_BF16, NULL);
}

/* two 3x3 filters with gradients and a bias, to channels-last */
static void setup_filters(oom_ctx *c) {
    mt_manual_seed(17);
    watch(c, random_tensor(4, (int64_t[]){4, 3, 3, 3}, MT_F32, true));
    watch(c, random_tensor(4, (int64_t[]){2, 3, 3, 3}, MT_BF16, true));
    set_random_grads(c);
    watch(c, random_tensor(1, (int64_t[]){4}, MT_F32, true));
}
static int call_params_to_channels_last(oom_ctx *c) {
    return mt_params_to_channels_last(c->watch, 3);
}

/* checkpoints: the optimizer's and the scaler's state into a state dict, and back */
static void setup_saved(oom_ctx *c) {
    setup_scaler(c);
    assert_int_equal(mt_grad_scaler_minimize(c->scaler, c->opt), 0);
    c->saved = mt_state_new();
    assert_int_equal(mt_optimizer_state_save(c->opt, c->saved, "opt."), 0);
    assert_int_equal(mt_grad_scaler_state_save(c->scaler, c->saved, "scaler."), 0);
    /* a fresh optimizer and scaler to load into */
    mt_optimizer_free(c->opt);
    mt_grad_scaler_free(c->scaler);
    c->opt = make_optimizer(c->watch, 2);
    c->scaler = mt_grad_scaler_new(NULL);
    c->state = mt_state_new();
    assert_non_null(c->state);
}

/* kind 0: the optimizer's state, 1: the scaler's */
static int call_state_save(oom_ctx *c) {
    return c->kind ? mt_grad_scaler_state_save(c->scaler, c->state, "scaler.")
                   : mt_optimizer_state_save(c->opt, c->state, "opt.");
}
static int call_state_load(oom_ctx *c) {
    return c->kind ? mt_grad_scaler_state_load(c->scaler, c->saved, "scaler.")
                   : mt_optimizer_state_load(c->opt, c->saved, "opt.");
}

/* a layer's initialisation (its weights from the generator) */
static void setup_seed(oom_ctx *c) {
    (void)c;
    mt_manual_seed(17);
}
static int call_conv_init(oom_ctx *c) {
    mt_conv2d_layer_free(&c->conv);
    mt_manual_seed(17);
    int rc = mt_conv2d_layer_init(&c->conv, 4, 6, 3, 3, NULL, true, MT_F32, mt_test_device());
    if (rc == 0) {
        watch(c, mt_retain(c->conv.weight));
        watch(c, mt_retain(c->conv.bias));
    }
    return rc;
}

/* a linear layer's parameters into a state dict, and a state dict into parameters */
static void setup_linear(oom_ctx *c) {
    mt_manual_seed(18);
    assert_int_equal(mt_linear_layer_init(&c->linear, 5, 3, true, MT_F32, mt_test_device()), 0);
    c->state = mt_state_new();
    mt_tensor *extra = random_tensor(1, (int64_t[]){2}, MT_F32, false);
    assert_int_equal(mt_state_put(c->state, "fc.weight", extra), 0); /* replaced by the call */
    mt_release(extra);
    watch(c, mt_retain(c->linear.weight));
    watch(c, mt_retain(c->linear.bias));
}
static int call_linear_put(oom_ctx *c) {
    return mt_linear_layer_state_put(&c->linear, c->state, "fc.");
}

static void setup_load_into(oom_ctx *c) {
    setup_params(c);
    c->saved = mt_state_new();
    for (int i = 0; i < 2; i++) {
        mt_tensor *w = c->watch[i];
        mt_tensor *v = random_tensor(mt_ndim(w), mt_shape(w), mt_dtype_of(w), false);
        assert_int_equal(mt_state_put(c->saved, i ? "p.b" : "p.w", v), 0);
        mt_release(v);
    }
}
static int call_load_into(oom_ctx *c) {
    const char *names[2] = {"w", "b"};
    return mt_state_load_into(c->saved, "p.", c->watch, names, 2, true);
}

/* a checkpoint file: written over an older one (which must survive a failed save), and read */
static void setup_file(oom_ctx *c) {
    setup_load_into(c);
    /* the process id in the name: the runs for each device go on side by side */
    snprintf(c->path, sizeof c->path, "test_oom_%ld_%d.safetensors", (long)getpid(), c->kind);
    mt_state *old = mt_state_new();
    assert_int_equal(mt_state_set_meta(old, "version", "old"), 0);
    assert_int_equal(mt_state_save(old, c->path), 0);
    mt_state_free(old);
    if (c->kind == 1) assert_int_equal(mt_state_save(c->saved, c->path), 0);
}
static int call_file(oom_ctx *c) {
    if (c->kind == 0) return mt_state_save(c->saved, c->path);
    c->state = mt_state_load(c->path, mt_test_device());
    return c->state ? 0 : (int)mt_last_status();
}

/* in-place writes into a watched tensor: kind 0 mt_add_inplace (broadcast, F16 into F32),
   1 mt_mul_scalar_inplace, 2 mt_copy (F64 to F32, broadcast), 3 the synchronous clip with
   error_if_nonfinite */
static void setup_inplace(oom_ctx *c) {
    setup_params(c);
    c->x = random_tensor(1, (int64_t[]){7}, c->kind == 2 ? MT_F64 : MT_F16, false);
    if (c->kind == 3) c->opt = make_optimizer(c->watch, 2);
}
static int call_inplace(oom_ctx *c) {
    mt_tensor *w = c->watch[0]; /* F16 [5, 7], a parameter: updated outside autograd */
    bool prev = mt_set_grad_enabled(false);
    int rc = 0;
    if (c->kind == 0) rc = mt_add_inplace(w, c->x);
    if (c->kind == 1) rc = mt_mul_scalar_inplace(w, 0.5);
    if (c->kind == 2) rc = mt_copy(w, c->x);
    mt_set_grad_enabled(prev);
    if (c->kind == 3 && isnan(mt_clip_grad_norm_ex(c->opt, 0.5, true)))
        rc = mt_last_status() ? (int)mt_last_status() : MT_ERR_INTERNAL;
    return rc;
}

/* copies between devices: to the host and back, and to a second CUDA device where there is
   one (the emulated runs with MTEMU_DEVICES=2), in another dtype on the way */
static void setup_devices(oom_ctx *c) {
    mt_manual_seed(20);
    c->x = random_tensor(2, (int64_t[]){3, 5}, MT_F32, false);
}
static int call_devices(oom_ctx *c) {
    mt_device dev = mt_test_device();
    mt_device other =
        dev.type == MT_DEVICE_CUDA && mt_cuda_device_count() > 1 ? MT_CUDA(1 - dev.index) : MT_CPU;
    mt_scope_begin();
    mt_tensor *h = mt_to(mt_transpose(c->x, 0, 1), MT_CPU);
    mt_tensor *o = h ? mt_to(mt_cast(c->x, MT_BF16), other) : NULL;
    mt_tensor *back = o ? mt_to(o, dev) : NULL;
    mt_tensor *r = back ? mt_add(mt_cast(back, MT_F32), mt_transpose(mt_to(h, dev), 0, 1)) : NULL;
    c->result = r ? mt_retain(r) : NULL;
    int rc = r ? 0 : (int)mt_last_status();
    mt_scope_end();
    return rc;
}

/* draws from the global generator, which a failed call must leave where it was (the retry
   then draws what the twin drew): kind 0 mt_dropout, 1 mt_rand, 2 mt_randn, 3 mt_randperm */
static void setup_random(oom_ctx *c) {
    mt_manual_seed(22);
    c->x = random_tensor(2, (int64_t[]){4, 6}, MT_BF16, true);
    mt_manual_seed(23);
}
static int call_random(oom_ctx *c) {
    int64_t shape[2] = {4, 6};
    switch (c->kind) {
    case 0:
        c->result = mt_dropout(c->x, 0.5, true);
        break;
    case 1:
        c->result = mt_rand(2, shape, MT_F16, mt_test_device());
        break;
    case 2:
        c->result = mt_randn(2, shape, MT_F32, mt_test_device());
        break;
    default:
        c->result = mt_randperm(9, mt_test_device());
    }
    return c->result ? 0 : (int)mt_last_status();
}

/* The ops that change what they cannot take back (batch norm's running statistics, the
   generator), called in a scope whose list of results is full: 64 results, the first size
   of a fresh thread's list, so the list must grow for the op's result, and that must happen
   before the change. Run on a thread of their own (a fresh list each time); the thread's
   error comes back to the walk's thread. kind 0: batch norm, 1: dropout, 2: randn,
   3: randperm. */
typedef struct {
    oom_ctx *c;
    int rc;
    char msg[512];
} full_scope_job;

static mt_tensor *side_effect_op(oom_ctx *c) {
    int64_t shape[2] = {4, 6};
    switch (c->kind) {
    case 0:
        return mt_batch_norm(c->x, c->watch[0], c->watch[1], NULL, NULL, true, 0.1, 1e-5);
    case 1:
        return mt_dropout(c->x2, 0.5, true);
    case 2:
        return mt_randn(2, shape, MT_F32, mt_test_device());
    default:
        return mt_randperm(9, mt_test_device());
    }
}

static int full_scope_thread(void *arg) {
    full_scope_job *j = arg;
    mt_scope_begin();
    int rc = 0;
    for (int i = 0; i < 64 && rc == 0; i++)
        if (!mt_scalar(i, MT_F32, MT_CPU)) rc = mt_last_status();
    mt_tensor *y = rc == 0 ? side_effect_op(j->c) : NULL;
    if (rc == 0 && !y) rc = mt_last_status();
    if (y) j->c->result = mt_retain(y);
    mt_scope_end();
    j->rc = rc;
    snprintf(j->msg, sizeof j->msg, "%s", mt_last_error());
    mt_clear_error();
    return 0;
}

static void setup_full_scope(oom_ctx *c) {
    setup_bn(c); /* x, running mean and variance (watched) */
    c->x2 = random_tensor(2, (int64_t[]){4, 6}, MT_F16, true);
    mt_manual_seed(24);
}

static int call_full_scope(oom_ctx *c) {
    full_scope_job j = {.c = c};
    thrd_t t;
    assert_int_equal(thrd_create(&t, full_scope_thread, &j), thrd_success);
    assert_int_equal(thrd_join(t, NULL), thrd_success);
    if (j.rc) mt_error_set((mt_status)j.rc, "%s", j.msg); /* the thread's error, verbatim */
    return j.rc;
}

/* every layer kind made and run once (a failure frees what the call made) */
typedef struct {
    mt_linear_layer fc;
    mt_batch_norm2d_layer bn;
    mt_layer_norm_layer ln;
    mt_embedding_layer emb;
    mt_dropout_layer drop;
} layers;

static void layers_free(layers *l) {
    mt_linear_layer_free(&l->fc);
    mt_batch_norm2d_layer_free(&l->bn);
    mt_layer_norm_layer_free(&l->ln);
    mt_embedding_layer_free(&l->emb);
}

static int layers_run(oom_ctx *c, layers *l) {
    mt_device dev = mt_test_device();
    int64_t ln_shape[1] = {4};
    int rc = mt_linear_layer_init(&l->fc, 4, 3, true, MT_F32, dev);
    if (!rc) rc = mt_batch_norm2d_layer_init(&l->bn, 2, MT_F32, dev);
    if (!rc) rc = mt_layer_norm_layer_init(&l->ln, 1, ln_shape, true, MT_F32, dev);
    if (!rc) rc = mt_embedding_layer_init(&l->emb, 5, 4, MT_F32, dev);
    if (!rc) rc = mt_dropout_layer_init(&l->drop, 0.5);
    if (rc) return rc;
    mt_scope_begin();
    mt_tensor *e = mt_embedding_layer_forward(&l->emb, c->labels); /* [4, 4] */
    mt_tensor *h = mt_layer_norm_layer_forward(&l->ln, e);         /* [4, 4] */
    h = mt_dropout_layer_forward(&l->drop, h);                     /* [4, 4] */
    mt_tensor *y = mt_linear_layer_forward(&l->fc, h);             /* [4, 3] */
    mt_tensor *img =
        y ? mt_reshape(mt_contiguous(mt_narrow(y, 1, 0, 2)), 4, (int64_t[]){1, 2, 2, 2}) : NULL;
    mt_tensor *b = img ? mt_batch_norm2d_layer_forward(&l->bn, img) : NULL;
    return backward_of(b ? mt_sum_all(b) : NULL);
}

static void setup_layers(oom_ctx *c) {
    c->labels = labels_of(4, 5);
}

static int call_layers(oom_ctx *c) {
    mt_manual_seed(19);
    layers l = {0};
    int rc = layers_run(c, &l);
    if (rc == 0) { /* the results: every parameter, its gradient, the running statistics */
        watch(c, mt_retain(l.fc.weight));
        watch(c, mt_retain(l.emb.weight));
        watch(c, mt_retain(l.ln.weight));
        watch(c, mt_retain(l.bn.weight));
        watch(c, mt_retain(l.bn.running_mean));
        watch(c, mt_retain(l.bn.running_var));
    }
    layers_free(&l);
    return rc;
}

static const scenario scenarios[] = {
    {"mlp forward and backward", setup_mlp, call_mlp, NULL, 0, false},
    {"mlp under autocast BF16", setup_mlp, call_mlp, NULL, 1, false},
    {"mlp under autocast F16", setup_mlp, call_mlp, NULL, 2, false},
    {"conv, fused batch norm, pooling", setup_cnn, call_cnn, NULL, 0, false},
    {"batch norm running statistics", setup_bn, call_bn, NULL, 0, false},
    {"layer norm, dropout, embedding, joins", setup_misc, call_misc, NULL, 0, false},
    {"backward of a recorded graph", setup_graph, call_backward, NULL, 0, true},
    {"backward keeping the graph", setup_graph, call_backward, call_backward, 1, false},
    {"backward onto expanded gradients", setup_graph_expanded_grads, call_backward, call_backward,
     1, false},
    {"SGD first step", setup_optimizer, call_step, call_step, 0, false},
    {"momentum first step", setup_optimizer, call_step, call_step, 1, false},
    {"Adam first step", setup_optimizer, call_step, call_step, 2, false},
    {"AdamW first step", setup_optimizer, call_step, call_step, 3, false},
    {"momentum later step", setup_optimizer, call_step, call_step, 5, false},
    {"AdamW later step", setup_optimizer, call_step, call_step, 7, false},
    {"optimizer with masters", setup_params, call_new_optimizer, call_step, 3, false},
    {"scaler scale", setup_scaler, call_scale, NULL, 0, false},
    {"scaler unscale", setup_scaler, call_unscale, call_minimize, 0, false},
    {"scaler unscale, inf", setup_scaler, call_unscale, call_minimize, 1, false},
    {"scaler step", setup_scaler, call_scaler_step, call_update, 2, false},
    {"scaler step, inf", setup_scaler, call_scaler_step, call_update, 3, false},
    {"scaler update", setup_scaler, call_update, NULL, 6, false},
    {"scaler minimize", setup_scaler, call_minimize, call_minimize, 0, false},
    {"scaler minimize, inf", setup_scaler, call_minimize, call_minimize, 1, false},
    {"clip gradient norm", setup_optimizer, call_clip, call_step, 2, false},
    {"clip gradient norm, synchronous", setup_inplace, call_inplace, NULL, 3, false},
    {"add in place", setup_inplace, call_inplace, NULL, 0, false},
    {"multiply by a scalar in place", setup_inplace, call_inplace, NULL, 1, false},
    {"copy in place", setup_inplace, call_inplace, NULL, 2, false},
    {"amp decorate", setup_params, call_decorate, NULL, 0, false},
    {"params to channels-last", setup_filters, call_params_to_channels_last, NULL, 0, false},
    {"optimizer state save", setup_saved, call_state_save, NULL, 0, false},
    {"scaler state save", setup_saved, call_state_save, NULL, 1, false},
    {"optimizer state load", setup_saved, call_state_load, call_minimize, 0, false},
    {"scaler state load", setup_saved, call_state_load, call_minimize, 1, false},
    {"conv2d layer init", setup_seed, call_conv_init, NULL, 0, false},
    {"linear layer state put", setup_linear, call_linear_put, NULL, 0, false},
    {"every layer made, run forward and backward", setup_layers, call_layers, NULL, 0, false},
    {"copies between devices", setup_devices, call_devices, NULL, 0, false},
    {"dropout", setup_random, call_random, NULL, 0, false},
    {"rand", setup_random, call_random, NULL, 1, false},
    {"randn", setup_random, call_random, NULL, 2, false},
    {"randperm", setup_random, call_random, NULL, 3, false},
    {"batch norm into a full scope", setup_full_scope, call_full_scope, NULL, 0, false},
    {"dropout into a full scope", setup_full_scope, call_full_scope, NULL, 1, false},
    {"randn into a full scope", setup_full_scope, call_full_scope, NULL, 2, false},
    {"randperm into a full scope", setup_full_scope, call_full_scope, NULL, 3, false},
    {"state load into parameters", setup_load_into, call_load_into, NULL, 0, false},
    {"state save to a file", setup_file, call_file, NULL, 0, false},
    {"state load from a file", setup_file, call_file, NULL, 1, false},
};

static void test_oom_walk(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof scenarios / sizeof *scenarios; i++) walk(&scenarios[i]);
}

/* The injection itself: the n-th request fails once, a request never reached stays pending
   and is reported so, and 0 cancels. */
static void test_fail_nth_alloc(void **state) {
    (void)state;
    int64_t shape[1] = {4};
    assert_false(mt_debug_fail_nth_alloc(2));
    mt_tensor *a = mt_zeros(1, shape, MT_F32, mt_test_device()); /* header and storage */
    assert_null(a);
    assert_error(MT_ERR_OOM, "out of memory");
    assert_false(mt_debug_fail_nth_alloc(1000000));
    a = mt_zeros(1, shape, MT_F32, mt_test_device());
    assert_non_null(a);
    assert_true(mt_debug_fail_nth_alloc(0));
    assert_false(mt_debug_fail_nth_alloc(0));
    mt_release(a);
}

int main(void) {
    mt_test_device_init();
    const struct CMUnitTest tests[] = {
        MT_TEST(test_fail_nth_alloc),
        MT_TEST(test_oom_walk),
    };
    return MT_RUN_TESTS(tests);
}
