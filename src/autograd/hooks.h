/* Gradient-ready hooks of leaf tensors: the list, and the per-backward count of gradient
   contributions still to come that the engine keeps (src/autograd/engine.c). */
#ifndef MT_AUTOGRAD_HOOKS_H
#define MT_AUTOGRAD_HOOKS_H
#include "../tensor/tensor_impl.h"

typedef struct {
    mt_grad_ready_hook fn;
    void *user;
    int id;
} mt_grad_hook_entry;

struct mt_grad_hooks {
    mt_grad_hook_entry *items;
    int n, cap, next_id;
    /* engine scratch for the current backward: its visit mark, contributions pending */
    uint64_t mark;
    int pending;
};

/* Runs the leaf's hooks in order; the first negative return stops and is returned. */
int mt_grad_hooks_fire(mt_tensor *leaf);
#endif
