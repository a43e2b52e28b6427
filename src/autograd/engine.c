/* The backward engine: collects the nodes reachable from the root, counts how many
   gradients each must wait for, then runs them in reverse topological order (Kahn), summing
   gradients in place where a buffer is exclusively ours. Leaf gradients accumulate into
   .grad across calls until zeroed. */
#include <stdlib.h>
#include <string.h>
#include <threads.h>
#include "../amp/autocast.h"
#include "../tensor/backend.h"
#include "hooks.h"
#include "node.h"

/* A growable list that starts in a buffer of its own: the small graphs of a training step
   need no heap. */
#define LIST_INLINE 32
typedef struct {
    mt_node **items;
    size_t len, cap;
    mt_node *inline_items[LIST_INLINE];
} node_list;

static void list_init(node_list *l) {
    l->items = l->inline_items;
    l->len = 0;
    l->cap = LIST_INLINE;
}

static void list_free(node_list *l) {
    if (l->items != l->inline_items) free(l->items);
}

static int list_push(node_list *l, mt_node *n) {
    if (l->len == l->cap) {
        size_t cap = l->cap * 2;
        mt_node **items = l->items == l->inline_items
                              ? mt_heap_alloc(cap * sizeof *items)
                              : mt_heap_realloc(l->items, cap * sizeof *items);
        if (!items) return mt_error_set(MT_ERR_OOM, "mt_backward: out of memory walking the tape");
        if (l->items == l->inline_items) memcpy(items, l->inline_items, sizeof l->inline_items);
        l->items = items;
        l->cap = cap;
    }
    l->items[l->len++] = n;
    return 0;
}

/* True when we hold the only reference to t and its memory, so it may be updated in place
   or adopted as a .grad. Dense channels-last counts as contiguous does (torch's gradient
   layout contract): a clone would keep that layout anyway, so copying it only cost time (two
   copies per channels-last leaf, the most of a channels-last pooling's backward). */
static bool exclusively_owned(const mt_tensor *t) {
    return atomic_load(&t->refcount) == 1 && atomic_load(&t->storage->refcount) == 1 &&
           !t->grad_fn && (mt_is_contiguous(t) || mt_is_channels_last(t));
}

static int mt_backward_status(void) {
    return mt_last_status() != MT_OK ? (int)mt_last_status() : MT_ERR_INTERNAL;
}

/* True when some elements of t share memory (a dim of size > 1 with stride 0). */
static bool has_overlap(const mt_tensor *t) {
    for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] > 1 && t->strides[d] == 0) return true;
    return false;
}

/* acc += g; takes ownership of g. */
static int accumulate(mt_tensor **acc, mt_tensor *g) {
    if (!*acc) {
        *acc = g;
        return 0;
    }
    int rc = 0;
    if (exclusively_owned(*acc) && (*acc)->dtype == g->dtype && mt_same_shape(*acc, g)) {
        rc = mt_backend_get((*acc)->device)->binary(MT_OP_ADD, *acc, *acc, g);
    } else {
        mt_tensor *sum = mt_add(*acc, g);
        if (!sum)
            rc = mt_backward_status();
        else {
            mt_tensor_unref(*acc);
            *acc = sum;
        }
    }
    mt_tensor_unref(g);
    return rc;
}

/* Leaf gradients may be shared between threads that run backward at the same time (torch
   allows it): each leaf's read-modify-write of .grad holds one of a few striped locks, picked
   by the leaf's address, so unrelated leaves rarely wait for each other. */
#define LEAF_LOCKS 64
static mtx_t leaf_locks[LEAF_LOCKS];
static once_flag leaf_locks_once = ONCE_FLAG_INIT;
static void leaf_locks_init(void) {
    for (int i = 0; i < LEAF_LOCKS; i++) mtx_init(&leaf_locks[i], mtx_plain);
}
static mtx_t *leaf_lock(const mt_tensor *leaf) {
    call_once(&leaf_locks_once, leaf_locks_init);
    return &leaf_locks[((uintptr_t)leaf >> 6) % LEAF_LOCKS];
}

/* g in the leaf's dtype; takes g. */
static mt_tensor *leaf_dtype(const mt_tensor *leaf, mt_tensor *g) {
    if (g->dtype == leaf->dtype) return g;
    mt_tensor *c = mt_cast(g, leaf->dtype);
    mt_tensor_unref(g);
    return c;
}

static int accumulate_leaf_locked(mt_tensor *leaf, mt_tensor *g);

/* leaf.grad += g under the leaf's lock; takes g. */
static int accumulate_leaf(mt_tensor *leaf, mt_tensor *g) {
    if (!(g = leaf_dtype(leaf, g))) return mt_backward_status();
    mtx_t *lock = leaf_lock(leaf);
    mtx_lock(lock);
    int rc = accumulate_leaf_locked(leaf, g);
    mtx_unlock(lock);
    return rc;
}

/* A failed backward must leave every .grad as it was (a half-applied gradient would be
   stepped by an unchecked training loop), so leaf gradients are summed per leaf while the
   tape runs and added to .grad only once every node succeeded. The table is keyed by the
   leaf's address (open addressing, sized from the number of leaf edges). */
typedef struct {
    mt_tensor *leaf; /* borrowed: the tape's edges hold it for the whole backward */
    mt_tensor *grad; /* owned: this backward's sum for the leaf, in the leaf's dtype */
    /* a leaf whose .grad is a user-set expanded tensor gets a new one, .grad + grad, made
       before anything is applied: `replaces` is that .grad (owned), `sum` the new one */
    mt_tensor *replaces, *sum;
} pending_grad;

typedef struct {
    pending_grad *slots;
    size_t cap; /* a power of two, at least twice the number of leaf edges */
} pending_table;

static int pending_init(pending_table *t, size_t leaf_edges) {
    size_t cap = 16;
    while (cap < 2 * leaf_edges) cap *= 2;
    t->slots = mt_heap_calloc(cap, sizeof *t->slots);
    t->cap = cap;
    return t->slots ? 0 : mt_error_set(MT_ERR_OOM, "mt_backward: out of memory");
}

static pending_grad *pending_slot(pending_table *t, const mt_tensor *leaf) {
    size_t i = (size_t)(((uintptr_t)leaf >> 4) * 0x9E3779B97F4A7C15ull) & (t->cap - 1);
    while (t->slots[i].leaf && t->slots[i].leaf != leaf) i = (i + 1) & (t->cap - 1);
    return &t->slots[i];
}

/* This backward's gradient for leaf += g; takes g. */
static int pending_add(pending_table *t, mt_tensor *leaf, mt_tensor *g) {
    if (!(g = leaf_dtype(leaf, g))) return mt_backward_status();
    pending_grad *p = pending_slot(t, leaf);
    p->leaf = leaf;
    return accumulate(&p->grad, g);
}

/* Makes what committing p could fail on, before anything is applied: a copy of a sum that a
   gradless leaf would adopt but that aliases other memory, or the new .grad of a leaf whose
   .grad is expanded (adding in place would add once per alias). 0, or the failed status. */
static int pending_prepare(pending_grad *p) {
    if (!p->grad) return 0;
    mtx_t *lock = leaf_lock(p->leaf);
    mtx_lock(lock);
    mt_tensor *cur = p->leaf->grad ? mt_tensor_ref(p->leaf->grad) : NULL;
    mtx_unlock(lock);
    if (cur && has_overlap(cur)) {
        p->sum = mt_add(cur, p->grad);
        if (!p->sum) {
            mt_tensor_unref(cur);
            return mt_backward_status();
        }
        p->replaces = cur;
        return 0;
    }
    bool has_grad = cur != NULL;
    mt_tensor_unref(cur);
    if (has_grad) return 0; /* added in place */
    /* adopted: in the leaf's own layout when the leaf is dense (torch's gradient layout
       contract: a channels-last parameter gets a channels-last .grad, whatever layout the
       last node produced), and owning its memory */
    bool layout = !mt_is_dense(p->leaf) || mt_same_strides(p->grad, p->leaf);
    if (layout && exclusively_owned(p->grad)) return 0;
    mt_tensor *c =
        layout ? mt_clone(p->grad)
               : mt_tensor_new_layout_of("mt_backward", p->leaf, p->grad->dtype, p->grad->device);
    if (c && !layout && mt_backend_get(c->device)->copy(c, p->grad) < 0) {
        mt_tensor_unref(c);
        c = NULL;
    }
    if (!c) return mt_backward_status();
    mt_tensor_unref(p->grad);
    p->grad = c;
    return 0;
}

/* Adds one prepared sum to its leaf's .grad (in place, adopted, or the prepared new .grad).
   Only another thread's backward into the same leaf between prepare and apply can make it
   allocate (and so fail). */
static int pending_apply(pending_grad *p) {
    if (!p->grad) return 0;
    mtx_t *lock = leaf_lock(p->leaf);
    mtx_lock(lock);
    int rc = 0;
    if (p->sum && p->leaf->grad == p->replaces) {
        mt_tensor_unref(p->leaf->grad);
        p->leaf->grad = p->sum;
        p->sum = NULL;
        mt_tensor_unref(p->grad);
    } else {
        rc = accumulate_leaf_locked(p->leaf, p->grad);
    }
    mtx_unlock(lock);
    p->grad = NULL;
    return rc;
}

static int pending_commit_one(pending_grad *p) {
    int rc = pending_prepare(p);
    return rc ? rc : pending_apply(p);
}

/* Adds every pending sum to its leaf's .grad. What can fail happens for all leaves first
   (pending_prepare); then the adds are in place, adoptions or swaps, which cannot fail
   unless another thread's backward into the same leaf races this one. */
static int pending_commit(pending_table *t) {
    for (size_t i = 0; i < t->cap; i++) {
        int rc = pending_prepare(&t->slots[i]);
        if (rc) return rc;
    }
    int rc = 0;
    for (size_t i = 0; i < t->cap; i++) {
        int r = pending_apply(&t->slots[i]);
        if (r < 0 && rc == 0) rc = r;
    }
    return rc;
}

static void pending_free(pending_table *t) {
    for (size_t i = 0; i < t->cap; i++) {
        mt_tensor_unref(t->slots[i].grad);
        mt_tensor_unref(t->slots[i].sum);
        mt_tensor_unref(t->slots[i].replaces);
    }
    free(t->slots);
}

/* leaf.grad += g (g already in the leaf's dtype); takes g. */
static int accumulate_leaf_locked(mt_tensor *leaf, mt_tensor *g) {
    int rc = 0;
    if (!leaf->grad) {
        if (exclusively_owned(g)) {
            leaf->grad = g; /* adopt: no copy */
            return 0;
        }
        leaf->grad = mt_clone(g);
        mt_tensor_unref(g);
        return leaf->grad ? 0 : mt_backward_status();
    }
    if (has_overlap(leaf->grad)) { /* a user-set expanded grad: adding in place would
                                      update shared elements once per alias */
        mt_tensor *sum = mt_add(leaf->grad, g);
        mt_tensor_unref(g);
        if (!sum) return mt_backward_status();
        mt_tensor_unref(leaf->grad);
        leaf->grad = sum;
        return 0;
    }
    rc = mt_backend_get(leaf->device)->binary(MT_OP_ADD, leaf->grad, leaf->grad, g);
    mt_tensor_bump_version(leaf->grad);
    mt_tensor_unref(g);
    return rc;
}

static int check_saved(mt_node *n) {
    if (n->freed && n->has_saved)
        return mt_error_set(MT_ERR_STATE,
                            "mt_backward: the tape through mt_%s was already freed by an earlier "
                            "backward; call mt_backward_ex(..., retain_graph=true) the first time",
                            mt_op_name(n->op));
    for (int s = 0; s < MT_NODE_SAVED; s++) {
        if (n->saved[s] && mt_tensor_version(n->saved[s]) != n->saved_version[s])
            return mt_error_set(
                MT_ERR_STATE,
                "mt_backward: a tensor saved by mt_%s for backward was modified in place "
                "(version %llu, saved at version %llu)",
                mt_op_name(n->op), (unsigned long long)mt_tensor_version(n->saved[s]),
                (unsigned long long)n->saved_version[s]);
    }
    return 0;
}

static void free_saved(mt_node *n) {
    for (int s = 0; s < MT_NODE_SAVED; s++) {
        mt_tensor_unref(n->saved[s]);
        n->saved[s] = NULL;
    }
    mt_node_free_state(n);
    n->freed = true;
}

/* Counts one more gradient contribution the hooked leaf of edge i will receive in the
   backward with this mark. */
static void count_hooked_leaf(mt_node *n, int i, uint64_t mark) {
    mt_tensor *leaf = n->edges[i].leaf;
    if (!leaf || !leaf->hooks || !mt_node_needs(n, i)) return;
    if (leaf->hooks->mark != mark) {
        leaf->hooks->mark = mark;
        leaf->hooks->pending = 0;
    }
    leaf->hooks->pending++;
}

/* One contribution to a hooked leaf has arrived. The last one gives the leaf its gradient at
   once and fires its hooks, so that a data-parallel hook starts its all-reduce during the
   backward: a hooked leaf is the one exception to the all-or-nothing rule (its gradient is
   final before the rest of the tape has run). */
static int leaf_contribution_done(pending_table *t, mt_tensor *leaf) {
    if (!leaf->hooks || --leaf->hooks->pending != 0) return 0;
    int rc = pending_commit_one(pending_slot(t, leaf));
    return rc ? rc : mt_grad_hooks_fire(leaf);
}

/* n's first visit by the backward with this mark: claimed (its scratch is this backward's
   until run_backward releases it) and listed in `all`. Torch runs backwards through shared
   nodes from several threads at once, each with its own scratch; here the scratch lives in
   the node, so a second backward reaching a claimed node fails instead of corrupting the
   first one's counts. */
static int visit(mt_node *n, uint64_t mark, node_list *all) {
    uint64_t none = 0;
    if (!atomic_compare_exchange_strong(&n->busy, &none, mark))
        return mt_error_set(MT_ERR_STATE,
                            "mt_backward: the graph reaches a node (the backward of mt_%s) that a "
                            "backward on another thread is running through; run backwards "
                            "through shared parts of a graph one at a time",
                            mt_op_name(n->op));
    n->deps = 0;
    int rc = list_push(all, n);
    if (rc) atomic_store(&n->busy, 0);
    return rc;
}

/* 1. Every node reachable from the root into `all`, each with its number of consumers
   (deps), and how many leaf edges there are (the pending table's size). */
static int collect_graph(mt_node *root_fn, uint64_t mark, node_list *all, size_t *leaf_edges) {
    *leaf_edges = 0;
    int rc = visit(root_fn, mark, all);
    for (size_t i = 0; rc == 0 && i < all->len; i++) {
        mt_node *n = all->items[i];
        for (int e = 0; e < n->n_inputs && rc == 0; e++) {
            *leaf_edges += n->edges[e].leaf != NULL;
            count_hooked_leaf(n, e, mark);
            mt_node *m = n->edges[e].fn;
            if (!m) continue;
            if (atomic_load(&m->busy) != mark) rc = visit(m, mark, all);
            if (rc == 0) m->deps++;
        }
    }
    return rc;
}

/* 2. One node: its backward on the gradient it gathered, whose results go to the leaves'
   pending sums or to the next nodes (which become ready when their last consumer is done). */
static int run_node(mt_node *n, pending_table *pending, node_list *ready, bool retain) {
    mt_tensor *g = n->grad_acc;
    n->grad_acc = NULL;
    int rc = check_saved(n);
    mt_tensor *grad_in_small[8] = {0};
    mt_tensor **grad_in =
        n->n_inputs <= 8 ? grad_in_small : mt_heap_calloc((size_t)n->n_inputs, sizeof *grad_in);
    if (!grad_in) rc = mt_error_set(MT_ERR_OOM, "mt_backward: out of memory");
    if (rc == 0 && g) {
        mt_api_set_backward_op(mt_op_name(n->op));
        rc = n->backward(n, g, grad_in);
        mt_api_set_backward_op(NULL);
        if (rc > 0) rc = MT_ERR_INTERNAL;
    }
    mt_tensor_unref(g);
    for (int i = 0; i < n->n_inputs; i++) {
        mt_tensor *gi = grad_in ? grad_in[i] : NULL;
        if (rc != 0 || !mt_node_needs(n, i)) {
            mt_tensor_unref(gi);
            continue;
        }
        mt_tensor *leaf = n->edges[i].leaf;
        if (leaf && !leaf->requires_grad) {
            /* switched off since the op ran (a parameter frozen mid-graph): no gradient and
               no hooks, as torch's AccumulateGrad skips such a leaf */
            mt_tensor_unref(gi);
        } else if (leaf) {
            if (gi) rc = pending_add(pending, leaf, gi);
            if (rc == 0) rc = leaf_contribution_done(pending, leaf);
        } else {
            mt_node *m = n->edges[i].fn;
            if (gi) rc = accumulate(&m->grad_acc, gi);
            if (--m->deps == 0 && rc == 0) rc = list_push(ready, m);
        }
    }
    if (grad_in && grad_in != grad_in_small) free(grad_in);
    if (!retain && rc == 0) free_saved(n);
    return rc;
}

static int run_backward(mt_tensor *root, mt_tensor *seed, bool retain) {
    if (!root->grad_fn) {
        int rc = accumulate_leaf(root, mt_tensor_ref(seed));
        return rc == 0 && root->hooks ? mt_grad_hooks_fire(root) : rc;
    }
    static atomic_uint_fast64_t visit_counter;
    uint64_t mark = atomic_fetch_add(&visit_counter, 1) + 1;
    node_list all, ready;
    list_init(&all);
    list_init(&ready);
    size_t leaf_edges = 0;
    int rc = collect_graph(root->grad_fn, mark, &all, &leaf_edges);
    pending_table pending = {0};
    if (rc == 0) rc = pending_init(&pending, leaf_edges);
    /* 2. Kahn's order from the root */
    if (rc == 0) {
        root->grad_fn->grad_acc = mt_tensor_ref(seed);
        rc = list_push(&ready, root->grad_fn);
    }
    while (rc == 0 && ready.len) rc = run_node(ready.items[--ready.len], &pending, &ready, retain);
    /* 3. every node succeeded: the leaves get their gradients; on error they keep theirs */
    if (rc == 0) rc = pending_commit(&pending);
    if (pending.slots) pending_free(&pending);
    /* on error, drop partial sums; the nodes are free for the next backward */
    for (size_t i = 0; i < all.len; i++) {
        mt_tensor_unref(all.items[i]->grad_acc);
        all.items[i]->grad_acc = NULL;
        atomic_store(&all.items[i]->busy, 0);
    }
    list_free(&all);
    list_free(&ready);
    return rc;
}

int mt_backward_ex(mt_tensor *root, mt_tensor *grad, bool retain_graph) {
    if (!root) return mt_error_set(MT_ERR_NULL, "mt_backward: arg 1: root is NULL");
    if (!root->requires_grad)
        return mt_error_set(MT_ERR_STATE,
                            "mt_backward: arg 1: tensor does not require grad and has no grad_fn");
    char b1[MT_SHAPE_BUF], b2[MT_SHAPE_BUF];
    mt_tensor *seed;
    mt_api_enter_at("mt_backward"); /* the name its messages use, whichever form was called */
    if (grad) {
        if (!mt_same_shape(grad, root)) {
            mt_error_set(MT_ERR_SHAPE,
                         "mt_backward: arg 2: grad of shape %s does not match root shape %s",
                         mt_shape_str(grad, b1, sizeof b1), mt_shape_str(root, b2, sizeof b2));
            return mt_api_exit_status(MT_ERR_SHAPE);
        }
        if (grad->device.type != root->device.type || grad->device.index != root->device.index) {
            mt_error_set(MT_ERR_DEVICE, "mt_backward: arg 2: grad is on %s:%d, the root on %s:%d",
                         grad->device.type == MT_DEVICE_CUDA ? "cuda" : "cpu", grad->device.index,
                         root->device.type == MT_DEVICE_CUDA ? "cuda" : "cpu", root->device.index);
            return mt_api_exit_status(MT_ERR_DEVICE);
        }
        seed = grad->dtype == root->dtype ? mt_tensor_ref(grad) : mt_cast(grad, root->dtype);
    } else {
        if (root->numel != 1) {
            mt_error_set(MT_ERR_SHAPE,
                         "mt_backward: arg 2: grad can be NULL only for a one-element root, "
                         "root has shape %s; pass a gradient",
                         mt_shape_str(root, b1, sizeof b1));
            return mt_api_exit_status(MT_ERR_SHAPE);
        }
        seed = mt_ones_like(root);
    }
    if (!seed) return mt_api_exit_status(mt_last_status());
    bool prev = mt_set_grad_enabled(false);
    mt_autocast_token autocast = mt_autocast_suspend(); /* the forward chose the dtypes */
    /* a hook may release the root (and with it the tape) while the backward runs */
    mt_tensor_ref(root);
    int rc = run_backward(root, seed, retain_graph);
    mt_tensor_unref(root);
    mt_autocast_resume(autocast);
    mt_set_grad_enabled(prev);
    mt_tensor_unref(seed);
    return mt_api_exit_status(rc);
}

int mt_backward(mt_tensor *root, mt_tensor *grad) {
    mt_api_enter(); /* errors inside read "mt_backward: ..." */
    return mt_api_exit_status(mt_backward_ex(root, grad, false));
}

void mt_set_requires_grad(mt_tensor *t, bool on) {
    if (!t) return;
    if (t->grad_fn) {
        if (!on)
            mt_error_set(MT_ERR_STATE,
                         "mt_set_requires_grad: tensor is not a leaf (made by mt_%s); "
                         "use mt_detach",
                         mt_op_name(t->grad_fn->op));
        return;
    }
    if (on && !mt_dtype_is_floating(t->dtype)) {
        mt_error_set(MT_ERR_DTYPE,
                     "mt_set_requires_grad: only floating tensors can require grad, got %s",
                     mt_dtype_name(t->dtype));
        return;
    }
    t->requires_grad = on;
}

bool mt_requires_grad(const mt_tensor *t) {
    return t && t->requires_grad;
}
bool mt_is_leaf(const mt_tensor *t) {
    return t && !t->grad_fn;
}

mt_tensor *mt_grad(mt_tensor *t) {
    if (!t || !t->grad) return NULL;
    mt_api_enter();
    return mt_api_exit(mt_tensor_ref(t->grad));
}

int mt_set_grad(mt_tensor *t, mt_tensor *grad) {
    if (!t) return mt_error_set(MT_ERR_NULL, "mt_set_grad: arg 1: tensor is NULL");
    if (grad && (grad->device.type != t->device.type || grad->device.index != t->device.index))
        return mt_error_set(
            MT_ERR_DEVICE, "mt_set_grad: arg 2: grad is on %s:%d, the tensor on %s:%d",
            grad->device.type == MT_DEVICE_CUDA ? "cuda" : "cpu", grad->device.index,
            t->device.type == MT_DEVICE_CUDA ? "cuda" : "cpu", t->device.index);
    if (grad && (!mt_same_shape(grad, t) || grad->dtype != t->dtype)) {
        char b1[MT_SHAPE_BUF], b2[MT_SHAPE_BUF];
        return mt_error_set(MT_ERR_SHAPE,
                            "mt_set_grad: arg 2: grad %s %s does not match tensor %s %s",
                            mt_dtype_name(grad->dtype), mt_shape_str(grad, b1, sizeof b1),
                            mt_dtype_name(t->dtype), mt_shape_str(t, b2, sizeof b2));
    }
    /* t's gradient holding t (directly or through its own gradient) would be a reference
       cycle that never frees either */
    for (const mt_tensor *g = grad; g; g = g->grad)
        if (g == t)
            return mt_error_set(MT_ERR_INVALID,
                                "mt_set_grad: arg 2: the gradient is the tensor itself, or holds "
                                "it as its own gradient (a reference cycle)");
    mt_tensor_unref(t->grad);
    t->grad = mt_tensor_ref(grad);
    return 0;
}

void mt_zero_grad(mt_tensor *t) {
    if (!t) return;
    mt_tensor_unref(t->grad);
    t->grad = NULL;
}

const char *mt_grad_fn_name(const mt_tensor *t) {
    return t && t->grad_fn ? mt_op_name(t->grad_fn->op) : "";
}
