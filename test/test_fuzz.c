/* Random calls of the public ops on random operands: every dtype, shapes with sizes 0 and 1,
   views (transposed, sliced with a step, expanded), leaves that require grad, autocast
   regions, and arguments that are often invalid (dims out of range, mismatched shapes, bad
   dtypes, negative sizes). Each call must either return a tensor with no error recorded, or
   NULL with an error recorded whose message starts with the called function's name; a floating
   result that requires grad is then backpropagated under the same rule. A call that fails must
   leave its operands' values as they were (batch norm's running statistics included).
   Nothing may crash (the ASan and UBSan builds run this too), leak (the fixture counts live
   tensors and bytes) or leave an autocast region open. One call in four (and one backward
   in four) has one of its first allocations fail (mt_debug_fail_nth_alloc), under the same
   rules. The generator is seeded, and a failure names the seed, the call and its operands,
   so a case replays exactly. */
#include "test_util.h"

typedef struct {
    uint64_t s;
} fuzz_rng;

static uint64_t rng_next(fuzz_rng *r) { /* xorshift64* */
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 0x2545F4914F6CDD1DULL;
}
static int rng_int(fuzz_rng *r, int lo, int hi) { /* [lo, hi] */
    return lo + (int)(rng_next(r) % (uint64_t)(hi - lo + 1));
}
static bool rng_chance(fuzz_rng *r, int percent) {
    return rng_int(r, 0, 99) < percent;
}

static const mt_dtype all_dtypes[] = {MT_F32, MT_F16, MT_BF16, MT_F64, MT_I64, MT_I32, MT_BOOL};

static mt_dtype rng_dtype(fuzz_rng *r) {
    /* floating dtypes twice as often: most ops need them */
    return rng_chance(r, 70) ? all_dtypes[rng_int(r, 0, 3)] : all_dtypes[rng_int(r, 4, 6)];
}

/* A random operand in the current scope: values in [0, 4) (so integer operands are valid
   indices and labels for small sizes), floating leaves requiring grad now and then, and
   views over them. */
static mt_tensor *rng_tensor(fuzz_rng *r, int max_ndim) {
    static const int64_t sizes[] = {0, 1, 1, 2, 2, 3, 3, 4, 5};
    int64_t shape[MT_MAX_DIMS];
    int nd = rng_int(r, 0, max_ndim);
    for (int d = 0; d < nd; d++) shape[d] = sizes[rng_int(r, 0, 8)];
    mt_dtype dt = rng_dtype(r);
    /* now and then on the CPU while the others are on the device under test: a device mix
       (on a CPU run, the same device) */
    mt_device dev = rng_chance(r, 4) ? MT_CPU : mt_test_device();
    mt_tensor *t = mt_mul_scalar(mt_rand(nd, shape, MT_F32, dev), 4.0);
    if (dt != MT_F32) t = mt_cast(t, dt);
    if (!t) return NULL;
    if (mt_dtype_is_floating(dt) && rng_chance(r, 40)) {
        t = mt_clone(t); /* a leaf of its own */
        mt_set_requires_grad(t, true);
    }
    if (nd >= 2 && rng_chance(r, 15)) t = mt_transpose(t, 0, nd - 1);
    if (nd >= 1 && rng_chance(r, 10)) t = mt_slice(t, nd - 1, 0, shape[nd - 1], 2);
    if (t && nd >= 1 && mt_dim(t, 0) == 1 && rng_chance(r, 20)) {
        memcpy(shape, mt_shape(t), (size_t)nd * sizeof *shape);
        shape[0] = 3;
        t = mt_expand(t, nd, shape);
    }
    return t;
}

/* A float operand of this shape: a leaf requiring grad now and then, and one time in four
   laid out otherwise (channels-last for 4-d, else transposed storage) */
static mt_tensor *rng_shaped(fuzz_rng *r, int nd, const int64_t *shape) {
    mt_dtype dt = all_dtypes[rng_int(r, 0, 3)];
    mt_tensor *t = mt_cast(mt_add_scalar(mt_rand(nd, shape, MT_F32, mt_test_device()), -0.5), dt);
    if (t && rng_chance(r, 40)) {
        t = mt_clone(t);
        mt_set_requires_grad(t, true);
    }
    if (t && nd == 4 && rng_chance(r, 25)) t = mt_to_channels_last(t);
    if (t && nd >= 2 && rng_chance(r, 25))
        t = mt_transpose(mt_contiguous(mt_transpose(t, 0, nd - 1)), 0, nd - 1);
    return t;
}

/* Integer indices in [0, bound) of this shape, I64 or I32; now and then all shifted out of
   range by `bound` (an error the op must report) */
static mt_tensor *rng_indices(fuzz_rng *r, int nd, const int64_t *shape, int64_t bound) {
    mt_tensor *u = mt_mul_scalar(mt_rand(nd, shape, MT_F32, mt_test_device()), (double)bound);
    if (rng_chance(r, 10)) u = mt_add_scalar(u, (double)bound);
    return mt_cast(u, rng_chance(r, 80) ? MT_I64 : MT_I32);
}

static int64_t rng_size(fuzz_rng *r) {
    return rng_int(r, 0, 9) == 0 ? 0 : rng_int(r, 1, 4);
}

/* Operands that fit op k (matching shapes, valid indices), so that the ops past their
   argument checks run too; the caller still passes random ones part of the time. */
static void fit_operands(fuzz_rng *r, int k, mt_tensor **a, mt_tensor **b, mt_tensor **c) {
    int64_t n = rng_size(r), m = rng_size(r), q = rng_size(r), ch = rng_int(r, 1, 4);
    int64_t h = rng_int(r, 1, 6), w = rng_int(r, 1, 6);
    switch (k) {
    case 8:
    case 9: { /* matmul: [n, m] @ [m, q], batched or with a vector now and then */
        int64_t sa[3] = {2, n, m}, sb[3] = {2, m, q};
        int kind = rng_int(r, 0, 3);
        if (kind == 0) { /* batched, b broadcast or not */
            *a = rng_shaped(r, 3, sa);
            *b = rng_chance(r, 50) ? rng_shaped(r, 3, sb) : rng_shaped(r, 2, sb + 1);
        } else if (kind == 1) { /* vector operands */
            *a = rng_chance(r, 50) ? rng_shaped(r, 1, sa + 2) : rng_shaped(r, 2, sa + 1);
            *b = rng_shaped(r, 1, sb + 1);
        } else {
            *a = rng_shaped(r, 2, sa + 1);
            *b = rng_shaped(r, 2, sb + 1);
        }
        break;
    }
    case 10: /* linear: x [n, m], w [q, m], b [q] */
        *a = rng_shaped(r, 2, (int64_t[]){n, m});
        *b = rng_shaped(r, 2, (int64_t[]){q, m});
        *c = rng_shaped(r, 1, (int64_t[]){q});
        break;
    case 21: /* mse: same shapes */
        *a = rng_shaped(r, 2, (int64_t[]){n, m});
        *b = rng_shaped(r, 2, (int64_t[]){n, m});
        break;
    case 22: /* cross entropy: logits [n, ch], labels [n] */
        *a = rng_shaped(r, 2, (int64_t[]){n, ch});
        *b = rng_indices(r, 1, (int64_t[]){n}, ch);
        break;
    case 23: /* layer norm over the last dim(s) of [n, m, q] */
        *a = rng_shaped(r, 3, (int64_t[]){n, m, q});
        *b = rng_shaped(r, 1, (int64_t[]){q});
        *c = rng_shaped(r, 1, (int64_t[]){q});
        break;
    case 24:
    case 25: /* batch norm: x [n, ch, h, w] (or [n, ch]), per-channel operands [ch], and for
                the fused op a residual shaped as x */
        *a = rng_chance(r, 70) ? rng_shaped(r, 4, (int64_t[]){n + 1, ch, h, w})
                               : rng_shaped(r, 2, (int64_t[]){n + 1, ch});
        *b = rng_shaped(r, 1, (int64_t[]){ch});
        *c = k == 24 || !*a ? rng_shaped(r, 1, (int64_t[]){ch})
                            : rng_shaped(r, mt_ndim(*a), mt_shape(*a));
        break;
    case 3: /* where: a BOOL condition broadcast against [n, m] operands */
        *b = rng_shaped(r, 2, (int64_t[]){n, m});
        *c = rng_shaped(r, 2, (int64_t[]){n, m});
        *a = mt_gt(rng_shaped(r, 1, (int64_t[]){m}),
                   mt_zeros(1, (int64_t[]){1}, MT_F32, mt_test_device()));
        break;
    case 27: /* embedding: weight [ch, m], indices [n, q] */
        *a = rng_shaped(r, 2, (int64_t[]){ch, m});
        *b = rng_indices(r, 2, (int64_t[]){n, q}, ch);
        break;
    case 28: /* index_select / gather along dim 0 of [ch, m] */
        *a = rng_shaped(r, 2, (int64_t[]){ch, m});
        *b = rng_chance(r, 50) ? rng_indices(r, 1, (int64_t[]){n}, ch)
                               : rng_indices(r, 2, (int64_t[]){n, m}, ch);
        break;
    case 30:
    case 31: { /* conv2d: x [n, ch * g, h, w], w [q * g, ch, kh, kw], b [q * g] */
        int64_t g = rng_int(r, 1, 2), kh = rng_int(r, 1, 3), kw = rng_int(r, 1, 3);
        *a = rng_shaped(r, 4, (int64_t[]){n, ch * g, h + 2, w + 2});
        *b = rng_shaped(r, 4, (int64_t[]){(q + 1) * g, ch, kh, kw});
        *c = rng_shaped(r, 1, (int64_t[]){(q + 1) * g});
        break;
    }
    case 32:
    case 33:
    case 34: /* pooling: x [n, ch, h, w] */
        *a = rng_shaped(r, 4, (int64_t[]){n, ch, h + 2, w + 2});
        break;
    default:
        break;
    }
}

typedef struct {
    char what[160]; /* the call and its operands, for the failure message */
    uint64_t seed;
    int step;
} fuzz_case;

static void describe(char *buf, size_t n, const mt_tensor *t) {
    if (!t) {
        snprintf(buf, n, "NULL");
        return;
    }
    int len = snprintf(buf, n, "%s[", mt_dtype_name(mt_dtype_of(t)));
    for (int d = 0; d < mt_ndim(t) && len < (int)n; d++)
        len += snprintf(buf + len, n - (size_t)len, d ? ",%lld" : "%lld", (long long)mt_dim(t, d));
    if (len < (int)n) snprintf(buf + len, n - (size_t)len, "]%s", mt_requires_grad(t) ? "g" : "");
}

/* True when msg starts with one of the names in `op` ("mt_cat/mt_stack", "mt_add
   (broadcast)") followed by a colon: the function that was called names itself first. */
static bool names_the_call(const char *msg, const char *op) {
    char names[128];
    snprintf(names, sizeof names, "%s", op);
    for (char *save = NULL, *t = strtok_r(names, "/ ", &save); t; t = strtok_r(NULL, "/ ", &save)) {
        size_t len = strlen(t);
        if (strncmp(msg, t, len) == 0 && msg[len] == ':') return true;
    }
    return false;
}

/* The rule every call keeps: a result and no error, or NULL and an error whose message starts
   with the name of the function called. */
static void check_outcome(const fuzz_case *c, const char *op, bool failed) {
    mt_status st = mt_last_status();
    if (failed && st == MT_OK)
        fail_msg("seed %llu step %d: %s (%s) returned failure but recorded no error",
                 (unsigned long long)c->seed, c->step, op, c->what);
    if (!failed && st != MT_OK)
        fail_msg("seed %llu step %d: %s (%s) succeeded with an error pending: %s",
                 (unsigned long long)c->seed, c->step, op, c->what, mt_last_error());
    if (failed && !names_the_call(mt_last_error(), op))
        fail_msg("seed %llu step %d: %s (%s): message does not start with the call's name: "
                 "\"%s\"",
                 (unsigned long long)c->seed, c->step, op, c->what, mt_last_error());
    mt_clear_error();
}

#define N_OPS 40

typedef mt_tensor *(*unary_fn)(mt_tensor *);
typedef mt_tensor *(*binary_fn)(mt_tensor *, mt_tensor *);

/* One random call; returns its result (in the scope) or NULL. */
static mt_tensor *call_op(fuzz_rng *r, int k, mt_tensor *a, mt_tensor *b, mt_tensor *c,
                          const char **name) {
    int d0 = rng_int(r, -4, 4), d1 = rng_int(r, -4, 4);
    int nd = a ? mt_ndim(a) : 0;
    int64_t shape[4];
    for (int i = 0; i < 4; i++) shape[i] = rng_int(r, -1, 4);
    static const unary_fn unary[] = {mt_neg,  mt_exp,  mt_log,       mt_sqrt,    mt_rsqrt, mt_abs,
                                     mt_relu, mt_gelu, mt_gelu_tanh, mt_sigmoid, mt_tanh};
    static const char *const unary_names[] = {"mt_neg",       "mt_exp",     "mt_log",  "mt_sqrt",
                                              "mt_rsqrt",     "mt_abs",     "mt_relu", "mt_gelu",
                                              "mt_gelu_tanh", "mt_sigmoid", "mt_tanh"};
    static const binary_fn binary[] = {mt_add,     mt_sub,     mt_mul, mt_div, mt_pow,
                                       mt_maximum, mt_minimum, mt_eq,  mt_ne,  mt_lt,
                                       mt_le,      mt_gt,      mt_ge};
    static const char *const binary_names[] = {
        "mt_add", "mt_sub", "mt_mul", "mt_div", "mt_pow", "mt_maximum", "mt_minimum",
        "mt_eq",  "mt_ne",  "mt_lt",  "mt_le",  "mt_gt",  "mt_ge"};
    int u = rng_int(r, 0, 10), v = rng_int(r, 0, 12);
    switch (k) {
    case 0:
        *name = unary_names[u];
        return unary[u](a);
    case 1:
        *name = binary_names[v];
        return binary[v](a, b);
    case 2:
        *name = "mt_add_scalar/mt_pow_scalar/mt_rdiv_scalar";
        return rng_chance(r, 50)   ? mt_add_scalar(a, 1.5)
               : rng_chance(r, 50) ? mt_pow_scalar(a, 2)
                                   : mt_rdiv_scalar(a, 1);
    case 3:
        *name = "mt_where";
        return mt_where(a, b, c);
    case 4:
    case 5: {
        *name = "mt_sum/mt_mean/mt_max";
        int dims[2] = {d0, d1}, n = rng_int(r, 0, 2);
        bool keep = rng_chance(r, 50);
        int which = rng_int(r, 0, 2);
        return which == 0   ? mt_sum(a, n, dims, keep)
               : which == 1 ? mt_mean(a, n, dims, keep)
                            : mt_max(a, n, dims, keep);
    }
    case 6:
        *name = "mt_sum_all/mt_mean_all/mt_max_all";
        return rng_chance(r, 33)   ? mt_sum_all(a)
               : rng_chance(r, 50) ? mt_mean_all(a)
                                   : mt_max_all(a);
    case 7:
        *name = "mt_softmax/mt_log_softmax";
        return rng_chance(r, 50) ? mt_softmax(a, d0) : mt_log_softmax(a, d0);
    case 8:
    case 9:
        *name = "mt_matmul";
        return mt_matmul(a, b);
    case 10:
        *name = "mt_linear/mt_linear_act";
        return rng_chance(r, 50) ? mt_linear(a, b, rng_chance(r, 50) ? c : NULL)
                                 : mt_linear_act(a, b, c, (mt_activation)rng_int(r, -1, 4));
    case 11:
        *name = "mt_cast";
        return mt_cast(a, rng_chance(r, 95) ? rng_dtype(r) : (mt_dtype)rng_int(r, -1, 9));
    case 12:
        *name = "mt_to";
        return mt_to(a, rng_chance(r, 50) ? MT_CPU : MT_CUDA(rng_int(r, -1, 2)));
    case 13:
        *name = "mt_clone/mt_contiguous/mt_detach/mt_to_channels_last";
        switch (rng_int(r, 0, 3)) {
        case 0:
            return mt_clone(a);
        case 1:
            return mt_contiguous(a);
        case 2:
            return mt_detach(a);
        default:
            return mt_to_channels_last(a);
        }
    case 14:
        *name = "mt_reshape/mt_view";
        return rng_chance(r, 50) ? mt_reshape(a, rng_int(r, 0, 3), shape)
                                 : mt_view(a, rng_int(r, 0, 3), shape);
    case 15:
        *name = "mt_transpose/mt_permute";
        if (rng_chance(r, 50)) return mt_transpose(a, d0, d1);
        {
            int order[4] = {d0, d1, rng_int(r, -1, 3), rng_int(r, 0, 3)};
            return mt_permute(a, rng_int(r, 0, 4), order);
        }
    case 16:
        *name = "mt_narrow/mt_slice";
        return rng_chance(r, 50)
                   ? mt_narrow(a, d0, rng_int(r, -2, 3), rng_int(r, -1, 3))
                   : mt_slice(a, d0, rng_int(r, -3, 3), rng_int(r, -3, 5), rng_int(r, -1, 3));
    case 17:
        *name = "mt_expand";
        return mt_expand(a, rng_int(r, 0, 4), shape);
    case 18:
        *name = "mt_squeeze/mt_unsqueeze/mt_flatten";
        return rng_chance(r, 33)   ? mt_squeeze(a, d0)
               : rng_chance(r, 50) ? mt_unsqueeze(a, d0)
                                   : mt_flatten(a);
    case 19:
    case 20: {
        *name = "mt_cat/mt_stack";
        mt_tensor *ts[3] = {a, b, c};
        int n = rng_int(r, 0, 3);
        return rng_chance(r, 50) ? mt_cat(ts, n, d0) : mt_stack(ts, n, d0);
    }
    case 21:
        *name = "mt_mse_loss";
        return mt_mse_loss(a, b);
    case 22:
        *name = "mt_cross_entropy";
        return rng_chance(r, 50) ? mt_cross_entropy(a, b)
                                 : mt_cross_entropy_ex(a, b, rng_int(r, -101, 3));
    case 23:
        *name = "mt_layer_norm";
        return mt_layer_norm(a, rng_int(r, -1, 3), rng_chance(r, 50) ? b : NULL,
                             rng_chance(r, 50) ? c : NULL, rng_chance(r, 90) ? 1e-5 : -1.0);
    case 24:
        *name = "mt_batch_norm";
        return mt_batch_norm(a, rng_chance(r, 50) ? b : NULL, rng_chance(r, 50) ? c : NULL,
                             rng_chance(r, 50) ? b : NULL, rng_chance(r, 50) ? c : NULL,
                             rng_chance(r, 50), rng_chance(r, 90) ? 0.1 : 2.0,
                             rng_chance(r, 90) ? 1e-5 : -1.0);
    case 25:
        *name = "mt_batch_norm_act";
        return mt_batch_norm_act(a, NULL, NULL, rng_chance(r, 50) ? b : NULL, NULL,
                                 rng_chance(r, 50) ? c : NULL, true, 0.1, 1e-5,
                                 (mt_activation)rng_int(r, -1, 3));
    case 26:
        *name = "mt_dropout";
        return mt_dropout(a, rng_int(r, -2, 12) / 10.0, rng_chance(r, 70));
    case 27:
        *name = "mt_embedding";
        return mt_embedding(a, b);
    case 28:
        *name = "mt_index_select/mt_gather";
        return rng_chance(r, 50) ? mt_index_select(a, d0, b) : mt_gather(a, d0, b);
    case 29:
        *name = "mt_argmax";
        return mt_argmax(a, d0, rng_chance(r, 50));
    case 30:
    case 31: {
        *name = "mt_conv2d";
        mt_conv2d_opts o = {.stride = {rng_int(r, -1, 2), rng_int(r, 0, 2)},
                            .padding = {rng_int(r, -1, 2), rng_int(r, 0, 2)},
                            .dilation = {rng_int(r, 0, 2), rng_int(r, -1, 2)},
                            .groups = rng_int(r, -1, 3)};
        return mt_conv2d(a, b, rng_chance(r, 50) ? c : NULL, rng_chance(r, 80) ? &o : NULL);
    }
    case 32:
    case 33: {
        *name = "mt_max_pool2d/mt_avg_pool2d";
        mt_pool2d_opts o = {.kernel = {rng_int(r, -1, 3), rng_int(r, 0, 3)},
                            .stride = {rng_int(r, -1, 2), rng_int(r, 0, 2)},
                            .padding = {rng_int(r, -1, 2), rng_int(r, 0, 1)},
                            .ceil_mode = rng_chance(r, 50),
                            .exclude_pad = rng_chance(r, 50)};
        return rng_chance(r, 50) ? mt_max_pool2d(a, rng_chance(r, 95) ? &o : NULL)
                                 : mt_avg_pool2d(a, rng_chance(r, 95) ? &o : NULL);
    }
    case 34:
        *name = "mt_adaptive_avg_pool2d";
        return mt_adaptive_avg_pool2d(a, rng_int(r, -1, 3), rng_int(r, 0, 3));
    case 35:
        *name = "mt_zeros_like/mt_ones_like/mt_empty_like";
        return rng_chance(r, 33)   ? mt_zeros_like(a)
               : rng_chance(r, 50) ? mt_ones_like(a)
                                   : mt_empty_like(a);
    case 36:
        *name = "mt_full/mt_arange";
        return rng_chance(r, 50)
                   ? mt_full(rng_int(r, -1, 4), shape, rng_dtype(r), mt_test_device(), 2.5)
                   : mt_arange(rng_int(r, -3, 3), rng_int(r, -3, 6), rng_int(r, -2, 2),
                               rng_dtype(r), mt_test_device());
    case 37:
        *name = "mt_randperm";
        return mt_randperm(rng_int(r, -2, 6), mt_test_device());
    default:
        (void)nd;
        *name = "mt_add (broadcast)";
        return mt_add(a, b);
    }
}

/* The values of t as doubles in a new host buffer (NULL for NULL or empty t). */
static double *snapshot(mt_tensor *t, int64_t *n) {
    *n = t ? mt_numel(t) : 0;
    if (*n <= 0) return NULL;
    double *v = malloc((size_t)*n * sizeof *v);
    assert_non_null(v);
    assert_int_equal(mt_copy_to_host(mt_cast(mt_detach(t), MT_F64), v, (size_t)*n * sizeof *v), 0);
    return v;
}

/* A failed call changes nothing: its operands (batch norm's running statistics among them)
   hold the values they had before it, bit for bit. */
static void check_unchanged(const fuzz_case *c, const char *op, mt_tensor *t, double *before,
                            int64_t n, char which) {
    if (before) {
        int64_t m;
        double *after = snapshot(t, &m);
        if (m != n || memcmp(before, after, (size_t)n * sizeof *after) != 0)
            fail_msg("seed %llu step %d: %s (%s) failed but changed operand %c",
                     (unsigned long long)c->seed, c->step, op, c->what, which);
        free(after);
    }
    free(before);
}

/* One sequence of calls from one seed, each in its own scope. */
static void fuzz_run(uint64_t seed, int steps) {
    fuzz_rng r = {seed * 0x9E3779B97F4A7C15ULL + 1};
    for (int step = 0; step < steps; step++) {
        mt_scope_begin();
        mt_manual_seed(seed + (uint64_t)step);
        int k = rng_int(&r, 0, N_OPS - 1);
        int maxd = (k >= 30 && k <= 34) || k == 24 || k == 25 ? 4 : 3;
        mt_tensor *a = rng_chance(&r, 3) ? NULL : rng_tensor(&r, maxd);
        mt_tensor *b = rng_tensor(&r, maxd), *c = rng_tensor(&r, maxd);
        if (rng_chance(&r, 60)) fit_operands(&r, k, &a, &b, &c);
        assert_no_error(); /* the operands themselves are valid calls */
        fuzz_case fc = {.seed = seed, .step = step};
        char da[48], db[48], dc[48];
        describe(da, sizeof da, a);
        describe(db, sizeof db, b);
        describe(dc, sizeof dc, c);
        snprintf(fc.what, sizeof fc.what, "%s, %s, %s", da, db, dc);
        int64_t na, nb, nc;
        double *va = snapshot(a, &na), *vb = snapshot(b, &nb), *vc = snapshot(c, &nc);
        bool autocast = rng_chance(&r, 20);
        if (autocast)
            mt_autocast_begin(rng_chance(&r, 50) ? MT_F16 : MT_BF16,
                              rng_chance(&r, 50) ? MT_AMP_O1 : MT_AMP_O2);
        /* one call in four runs out of memory at one of its first allocations (a failure
           the call must report, or recover from, under the same rules) */
        bool inject = rng_chance(&r, 25);
        if (inject) mt_debug_fail_nth_alloc(rng_int(&r, 1, 12));
        const char *name = "?";
        mt_tensor *y = call_op(&r, k, a, b, c, &name);
        bool injected = inject && !mt_debug_fail_nth_alloc(0);
        if (autocast) mt_autocast_end();
        /* a NULL first operand is "NULL in, NULL out" with no error of its own */
        if (a || y) check_outcome(&fc, name, y == NULL);
        mt_clear_error();
        /* a device kernel may have run before the allocation that failed, and found a bad
           index in the data: that error is true, and the next sync reports it */
        if (injected && !y)
            check_outcome(&fc, "mt_synchronize", mt_synchronize(mt_test_device()) != 0);
        if (!y) {
            check_unchanged(&fc, name, a, va, na, 'a');
            check_unchanged(&fc, name, b, vb, nb, 'b');
            check_unchanged(&fc, name, c, vc, nc, 'c');
        } else {
            free(va);
            free(vb);
            free(vc);
        }
        if (y && mt_requires_grad(y) && mt_dtype_is_floating(mt_dtype_of(y))) {
            mt_tensor *root = mt_sum_all(y);
            if (rng_chance(&r, 25)) mt_debug_fail_nth_alloc(rng_int(&r, 1, 12));
            int rc = mt_backward(root, NULL);
            mt_debug_fail_nth_alloc(0);
            check_outcome(&fc, "mt_backward", rc != 0);
        }
        /* an error a device kernel found in the data (a label out of range) is reported
           here, naming its op, under the same rule */
        check_outcome(&fc, "mt_synchronize", mt_synchronize(mt_test_device()) != 0);
        mt_scope_end();
    }
}

static void test_fuzz_ops(void **state) {
    (void)state;
    /* seeds 1..40, 150 calls each (about 6000 calls, a second even under ASan); MT_FUZZ_SEEDS
       asks for more, for a longer search by hand */
    uint64_t first, last;
    mt_test_seed_range(40, &first, &last);
    for (uint64_t seed = first; seed <= last; seed++) fuzz_run(seed, 150);
}

/* ---- random graphs through autograd: gradients checked by finite differences
   A program of smooth ops over three F64 leaves ([3, 4], [4] and [3, 1]): values used more
   than once, broadcasting, reductions, views, matmul, softmax, concatenation. The choices
   depend only on shapes (never on values), so the program replays exactly under every
   perturbation mt_gradcheck makes; its output is the sum of the last values, so every
   path is in the gradient. */
#define GRAPH_VALUES 12

static bool broadcastable(const mt_tensor *a, const mt_tensor *b) {
    int na = mt_ndim(a), nb = mt_ndim(b);
    for (int i = 1; i <= na && i <= nb; i++) {
        int64_t x = mt_dim(a, na - i), y = mt_dim(b, nb - i);
        if (x != y && x != 1 && y != 1) return false;
    }
    return true;
}

/* value k of the program: an op over earlier values v[0..k) */
static mt_tensor *graph_step(fuzz_rng *r, mt_tensor **v, int k) {
    mt_tensor *a = v[rng_int(r, 0, k - 1)], *b = v[rng_int(r, 0, k - 1)];
    int nd = mt_ndim(a), d = nd ? rng_int(r, 0, nd - 1) : 0;
    switch (rng_int(r, 0, 13)) {
    case 0:
        return mt_tanh(a);
    case 1:
        return mt_sigmoid(a);
    case 2:
        return mt_exp(mt_mul_scalar(a, 0.3));
    case 3:
        return mt_gelu(a);
    case 4: /* sqrt(1 + a^2): smooth everywhere */
        return mt_sqrt(mt_add_scalar(mt_mul(a, a), 1.0));
    case 5:
        return broadcastable(a, b) ? mt_mul(a, b) : mt_pow_scalar(a, 2);
    case 6:
        return broadcastable(a, b) ? mt_sub(a, b) : mt_neg(a);
    case 7: /* a / (1 + b^2) */
        return broadcastable(a, b) ? mt_div(a, mt_add_scalar(mt_mul(b, b), 1.0))
                                   : mt_mul_scalar(a, 0.5);
    case 8:
        return nd ? (rng_chance(r, 50) ? mt_sum(a, 1, &d, rng_chance(r, 50))
                                       : mt_mean(a, 1, &d, rng_chance(r, 50)))
                  : mt_add_scalar(a, 1.0);
    case 9:
        return nd ? (rng_chance(r, 50) ? mt_softmax(a, d) : mt_log_softmax(a, d)) : mt_tanh(a);
    case 10:
        if (nd == 2) return mt_transpose(a, 0, 1);
        return mt_unsqueeze(a, 0);
    case 11: /* a @ b^T when the inner sizes agree, else a slice */
        if (nd == 2 && mt_ndim(b) == 2 && mt_dim(a, 1) == mt_dim(b, 1))
            return mt_matmul(a, mt_transpose(b, 0, 1));
        return nd && mt_dim(a, d) > 1 ? mt_slice(a, d, 0, mt_dim(a, d), 2) : mt_neg(a);
    case 12: /* cat with itself (the value used twice) */
        return nd ? mt_cat((mt_tensor *[]){a, a}, 2, d) : mt_mul(a, a);
    default: /* a broadcast view made contiguous */
        return nd == 2 && mt_dim(a, 0) == 1 ? mt_contiguous(mt_expand(a, MT_SHAPE(3, mt_dim(a, 1))))
                                            : mt_add(a, a);
    }
}

typedef struct {
    uint64_t seed;
} graph_ctx;

static mt_tensor *graph_fn(mt_tensor *const *in, void *vctx) {
    const graph_ctx *g = vctx;
    fuzz_rng r = {g->seed * 0x9E3779B97F4A7C15ULL + 7};
    mt_tensor *v[GRAPH_VALUES] = {in[0], in[1], in[2]};
    for (int k = 3; k < GRAPH_VALUES; k++) v[k] = graph_step(&r, v, k);
    mt_tensor *out = mt_sum_all(v[GRAPH_VALUES - 1]);
    for (int k = GRAPH_VALUES - 3; k < GRAPH_VALUES - 1; k++) out = mt_add(out, mt_sum_all(v[k]));
    return out;
}

static void test_fuzz_gradcheck(void **state) {
    (void)state;
    uint64_t first, last;
    mt_test_seed_range(30, &first, &last);
    for (uint64_t seed = first; seed <= last; seed++) {
        mt_scope_begin();
        mt_manual_seed(seed);
        mt_tensor *in[3] = {mt_randn(MT_SHAPE(3, 4), MT_F64, mt_test_device()),
                            mt_randn(MT_SHAPE(4), MT_F64, mt_test_device()),
                            mt_randn(MT_SHAPE(3, 1), MT_F64, mt_test_device())};
        for (int i = 0; i < 3; i++) {
            in[i] = mt_clone(in[i]);
            mt_set_requires_grad(in[i], true);
        }
        graph_ctx g = {seed};
        /* Central differences resolve a derivative only to about |f| * 1e-16 / eps (eps =
           1e-6): a program whose value explodes (exp of a large matmul, a value squared over
           and over; seed 17627 sums to 1.4e45) cannot show the derivative 1 of its small
           terms. The absolute tolerance grows with |f| (1000x that resolution: room for the
           rounding of a dozen ops); for the usual |f| < 100 it stays near the default 1e-5. */
        double f = fabs(mt_item(graph_fn(in, &g)));
        mt_gradcheck_opts opts = {.atol = 1e-5 + 1e-7 * f};
        if (mt_gradcheck(graph_fn, in, 3, &g, &opts) != 0)
            fail_msg("seed %llu: %s", (unsigned long long)seed, mt_last_error());
        mt_scope_end();
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        MT_TEST(test_fuzz_ops),
        MT_TEST(test_fuzz_gradcheck),
    };
    return MT_RUN_TESTS(tests);
}
