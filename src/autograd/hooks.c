/* Gradient-ready hooks (mt_tensor_register_grad_ready_hook): the mechanism data-parallel
   training uses to start a gradient's all-reduce while backward goes on, open to users. */
#include <stdlib.h>
#include "hooks.h"
#include "node.h"

int mt_tensor_register_grad_ready_hook(mt_tensor *leaf, mt_grad_ready_hook fn, void *user) {
    const char *op = "mt_tensor_register_grad_ready_hook";
    if (!leaf) return mt_error_set(MT_ERR_NULL, "%s: arg 1: tensor is NULL", op);
    if (!fn) return mt_error_set(MT_ERR_NULL, "%s: arg 2: hook is NULL", op);
    if (leaf->grad_fn)
        return mt_error_set(MT_ERR_STATE,
                            "%s: arg 1: tensor is not a leaf (made by mt_%s); hooks run on "
                            "leaves, whose gradients are kept",
                            op, mt_op_name(leaf->grad_fn->op));
    if (!leaf->requires_grad)
        return mt_error_set(MT_ERR_STATE,
                            "%s: arg 1: tensor does not require grad; call "
                            "mt_set_requires_grad first",
                            op);
    struct mt_grad_hooks *h = leaf->hooks;
    if (!h) {
        h = mt_heap_calloc(1, sizeof *h);
        if (!h) return mt_error_set(MT_ERR_OOM, "%s: out of memory", op);
        leaf->hooks = h;
    }
    if (h->n == h->cap) {
        int cap = h->cap ? 2 * h->cap : 4;
        mt_grad_hook_entry *items = mt_heap_realloc(h->items, (size_t)cap * sizeof *items);
        if (!items) return mt_error_set(MT_ERR_OOM, "%s: out of memory", op);
        h->items = items;
        h->cap = cap;
    }
    int id = ++h->next_id;
    h->items[h->n++] = (mt_grad_hook_entry){fn, user, id};
    return id;
}

int mt_tensor_remove_grad_ready_hook(mt_tensor *leaf, int handle) {
    const char *op = "mt_tensor_remove_grad_ready_hook";
    if (!leaf) return mt_error_set(MT_ERR_NULL, "%s: arg 1: tensor is NULL", op);
    struct mt_grad_hooks *h = leaf->hooks;
    for (int i = 0; h && i < h->n; i++)
        if (h->items[i].id == handle) {
            for (int j = i + 1; j < h->n; j++) h->items[j - 1] = h->items[j];
            h->n--;
            return 0;
        }
    return mt_error_set(MT_ERR_INVALID, "%s: arg 2: the tensor has no hook with handle %d", op,
                        handle);
}

int mt_grad_hooks_fire(mt_tensor *leaf) {
    struct mt_grad_hooks *h = leaf->hooks;
    for (int i = 0; h && i < h->n; i++) {
        mt_api_outer outer = mt_api_callback_begin();
        int rc = h->items[i].fn(leaf, h->items[i].user);
        mt_api_callback_end(outer);
        if (rc < 0) {
            if (mt_last_status() == MT_OK)
                mt_error_set(rc, "mt_backward: grad-ready hook %d failed with status %d",
                             h->items[i].id, rc);
            return rc;
        }
    }
    return 0;
}

void mt_grad_hooks_free(struct mt_grad_hooks *h) {
    if (!h) return;
    free(h->items);
    free(h);
}
