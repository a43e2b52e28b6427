/* Tape nodes: creation, saved tensors, release; grad mode; broadcast gradient reduction. */
#include <stdlib.h>
#include <string.h>
#include "node.h"

static _Thread_local bool grad_disabled; /* zero-initialised: grad mode on */

bool mt_grad_mode(void) {
    return !grad_disabled;
}
bool mt_is_grad_enabled(void) {
    return !grad_disabled;
}

bool mt_set_grad_enabled(bool on) {
    bool prev = !grad_disabled;
    grad_disabled = !on;
    return prev;
}

bool mt_autograd_wanted(mt_tensor *const *inputs, int n) {
    if (grad_disabled) return false;
    for (int i = 0; i < n; i++)
        if (inputs[i] && inputs[i]->requires_grad) return true;
    return false;
}

mt_node *mt_node_new(mt_op_id op, mt_backward_fn fn, mt_tensor *const *inputs, int n) {
    size_t size = sizeof(mt_node) + (size_t)n * (sizeof(mt_edge) + sizeof(mt_input_meta));
    /* malloc + memset rather than calloc, which bypasses glibc's per-thread cache; the asm
       stops GCC from turning the pair back into calloc */
    mt_node *node = mt_heap_alloc(size);
    if (!node) {
        mt_error_set(MT_ERR_OOM, "mt_%s: out of memory recording the autograd tape",
                     mt_op_name(op));
        return NULL;
    }
#if defined(__GNUC__)
    __asm__("" : "+r"(node));
#endif
    memset(node, 0, size);
    atomic_init(&node->refcount, 1);
    node->op = op;
    node->backward = fn;
    node->n_inputs = n;
    node->inputs = (mt_input_meta *)(node->edges + n);
    for (int i = 0; i < n; i++) {
        mt_tensor *t = inputs[i];
        if (!t) continue;
        node->inputs[i].ndim = t->ndim;
        memcpy(node->inputs[i].shape, t->shape, sizeof t->shape);
        node->inputs[i].dtype = t->dtype;
        if (!t->requires_grad) continue;
        if (t->grad_fn) {
            node->edges[i].fn = t->grad_fn;
            atomic_fetch_add_explicit(&t->grad_fn->refcount, 1, memory_order_relaxed);
        } else {
            node->edges[i].leaf = mt_tensor_ref(t);
        }
    }
    return node;
}

int mt_node_save(mt_node *n, int slot, const mt_tensor *t) {
    mt_tensor *alias = mt_tensor_alias(t);
    if (!alias) return MT_ERR_OOM;
    mt_tensor_unref(n->saved[slot]);
    n->saved[slot] = alias;
    n->saved_version[slot] = mt_tensor_version(t);
    n->has_saved = true;
    return 0;
}

void mt_node_set_state(mt_node *n, void *state, void (*state_free)(void *state)) {
    mt_node_free_state(n);
    n->state = state;
    n->state_free = state_free;
    n->has_saved = true;
}

int mt_node_copy_state(mt_node *n, const void *src, size_t bytes, const char *op) {
    void *state = mt_heap_alloc(bytes);
    if (!state) return mt_error_set(MT_ERR_OOM, "%s: out of memory for a tape node", op);
    memcpy(state, src, bytes);
    mt_node_set_state(n, state, NULL);
    return 0;
}

void mt_node_free_state(mt_node *n) {
    if (!n->state) return;
    if (n->state_free)
        n->state_free(n->state);
    else
        free(n->state);
    n->state = NULL;
    n->state_free = NULL;
}

void mt_node_attach(mt_node *n, mt_tensor *out) {
    out->grad_fn = n;
    out->requires_grad = true;
    n->out_ndim = out->ndim;
    memcpy(n->out_shape, out->shape, sizeof out->shape);
    n->out_dtype = out->dtype;
    n->out_device = out->device;
}

mt_node *mt_record(mt_op_id op, mt_backward_fn fn, mt_tensor *const *inputs, int n, mt_tensor *out,
                   int *err) {
    *err = 0;
    if (!mt_autograd_wanted(inputs, n)) return NULL;
    mt_node *node = mt_node_new(op, fn, inputs, n);
    if (!node) {
        *err = MT_ERR_OOM;
        return NULL;
    }
    mt_node_attach(node, out);
    return node;
}

/* Releasing a long chain recursively could overflow the stack: walk it with an explicit
   list of nodes whose count reached zero. */
void mt_node_release(mt_node *n) {
    mt_node **stack = NULL;
    size_t len = 0, cap = 0;
    while (n) {
        if (atomic_fetch_sub_explicit(&n->refcount, 1, memory_order_acq_rel) == 1) {
            for (int s = 0; s < MT_NODE_SAVED; s++) mt_tensor_unref(n->saved[s]);
            mt_node_free_state(n);
            mt_tensor_unref(n->grad_acc);
            for (int i = 0; i < n->n_inputs; i++) {
                mt_tensor_unref(n->edges[i].leaf);
                if (n->edges[i].fn) {
                    if (len == cap) {
                        size_t nc = cap ? cap * 2 : 16;
                        mt_node **ns = mt_heap_realloc(stack, nc * sizeof *ns);
                        if (!ns) { /* fall back to recursion for this edge */
                            mt_node_release(n->edges[i].fn);
                            continue;
                        }
                        stack = ns;
                        cap = nc;
                    }
                    stack[len++] = n->edges[i].fn;
                }
            }
            free(n);
        }
        n = len ? stack[--len] : NULL;
    }
    free(stack);
}

mt_tensor *mt_grad_reduce_to_input(mt_node *n, int i, mt_tensor *g) {
    const mt_input_meta *m = &n->inputs[i];
    int lead = g->ndim - m->ndim;
    int dims[MT_MAX_DIMS], nd = 0;
    for (int d = 0; d < g->ndim; d++)
        if (d < lead || (m->shape[d - lead] == 1 && g->shape[d] != 1)) dims[nd++] = d;
    mt_tensor *r;
    if (nd == 0) {
        r = mt_tensor_ref(g);
    } else {
        mt_tensor *s = mt_sum(g, nd, dims, true);
        if (!s) return NULL;
        r = mt_reshape(s, m->ndim, m->shape);
        mt_tensor_unref(s);
    }
    if (r && r->dtype != m->dtype) {
        mt_tensor *c = mt_cast(r, m->dtype);
        mt_tensor_unref(r);
        r = c;
    }
    return r;
}
