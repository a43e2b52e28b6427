/* Tape nodes. A result tensor holds its node (grad_fn) strongly; a node holds the nodes of
   its inputs and the leaves it must deliver gradients to, never its own output, so there are
   no reference cycles. Saved outputs are saved as history-free aliases. */
#ifndef MT_AUTOGRAD_NODE_H
#define MT_AUTOGRAD_NODE_H
#include "../tensor/tensor_impl.h"

typedef struct mt_node mt_node;

/* Computes the gradients of the node's inputs from the gradient of its output. grad_in[i]
   is left NULL for inputs that need no gradient (n->edges[i] empty) or get none; each
   non-NULL entry is a new reference with the shape and dtype of input i. Runs with grad
   mode off; written with ops. Returns 0, or the negative status of the op that failed. */
typedef int (*mt_backward_fn)(mt_node *n, mt_tensor *grad_out, mt_tensor **grad_in);

typedef struct {
    mt_node *fn;     /* strong: the grad_fn of a non-leaf input */
    mt_tensor *leaf; /* strong: a leaf input that requires grad */
} mt_edge;           /* both NULL: the input needs no gradient */

typedef struct {
    int ndim;
    int64_t shape[MT_MAX_DIMS];
    mt_dtype dtype;
} mt_input_meta;

/* Slots for saved tensors; fused normalisation ops need up to six (input, weight, bias,
   statistics, output). Larger per-op state goes in `state`. */
#define MT_NODE_SAVED 8

struct mt_node {
    atomic_int refcount;
    mt_op_id op;
    mt_backward_fn backward;
    bool freed;     /* saved tensors dropped by a backward without retain_graph */
    bool has_saved; /* only nodes that saved tensors refuse a second backward (as torch) */
    /* the output's metadata */
    int out_ndim;
    int64_t out_shape[MT_MAX_DIMS];
    mt_dtype out_dtype;
    mt_device out_device;
    /* what the backward formula needs */
    mt_tensor *saved[MT_NODE_SAVED];
    uint64_t saved_version[MT_NODE_SAVED];
    double scalars[4];
    int64_t ints[MT_MAX_DIMS + 2];
    int n_ints;
    /* per-op state the fixed fields cannot hold (convolution parameters, a chosen
       algorithm, a reserve space); owned by the node, freed with state_free */
    void *state;
    void (*state_free)(void *state);
    /* engine scratch, one backward's: `busy` holds that backward's mark while it runs (0
       when none), so that a backward on another thread reaching the node fails instead of
       sharing deps and grad_acc */
    _Atomic uint64_t busy;
    int deps;
    mt_tensor *grad_acc;
    int n_inputs;
    mt_input_meta *inputs; /* n_inputs entries, after edges in the same block */
    mt_edge edges[];
};

/* grad mode (thread-local) */
bool mt_grad_mode(void);
/* True when grad mode is on and some input requires grad. NULL entries are skipped. */
bool mt_autograd_wanted(mt_tensor *const *inputs, int n);
/* A node for op with the given inputs (edges from their grad_fn or leaf status, input
   metadata recorded). NULL with MT_ERR_OOM. */
mt_node *mt_node_new(mt_op_id op, mt_backward_fn fn, mt_tensor *const *inputs, int n);
/* Saves t (as a history-free alias) in slot, with its current version. */
int mt_node_save(mt_node *n, int slot, const mt_tensor *t);
/* Hands the node an op-specific state block, freed with state_free (may be NULL for plain
   malloc'd blocks: free() is used) when the node dies or its saved data is freed after a
   backward without retain_graph. */
void mt_node_set_state(mt_node *n, void *state, void (*state_free)(void *state));
/* Gives the node a copy of `bytes` bytes at src as its state (op parameters kept for the
   backward); 0, or MT_ERR_OOM naming op. */
int mt_node_copy_state(mt_node *n, const void *src, size_t bytes, const char *op);
/* Frees the state block now (no-op without one). */
void mt_node_free_state(mt_node *n);
/* Makes n the grad_fn of out (out takes the creating reference) and records out's metadata. */
void mt_node_attach(mt_node *n, mt_tensor *out);
/* Releases a reference; frees the node and its references at zero. */
void mt_node_release(mt_node *n);
/* True when input i needs a gradient. */
static inline bool mt_node_needs(const mt_node *n, int i) {
    return n->edges[i].fn != NULL || n->edges[i].leaf != NULL;
}
/* Reduces g (broadcast result) to input i's shape by summing broadcast dims; new ref. */
mt_tensor *mt_grad_reduce_to_input(mt_node *n, int i, mt_tensor *g);
/* Record helper used by op entry points: if autograd is wanted for inputs, creates a node,
   attaches it to out and returns it (borrowed) so the caller can save tensors; else NULL.
   On OOM returns NULL and sets *err. */
mt_node *mt_record(mt_op_id op, mt_backward_fn fn, mt_tensor *const *inputs, int n, mt_tensor *out,
                   int *err);
#endif
