/* The optimizer struct, shared by src/optim and the GradScaler (src/amp/grad_scaler.c). */
#ifndef MT_OPTIM_OPTIMIZER_IMPL_H
#define MT_OPTIM_OPTIMIZER_IMPL_H
#include "../tensor/backend.h"

struct mt_optimizer {
    mt_optim_kind kind;
    int n;
    mt_tensor **params;  /* strong references, in the order given */
    mt_tensor **masters; /* FP32 masters for F16/BF16 params with multi_precision, else NULL */
    uint64_t *master_versions; /* with masters: each parameter's version when its master was
                                  last made equal to it (mt_optim_masters_synced) */
    mt_tensor **moment1;       /* lazily allocated state (FP32, or F64 for F64 params) */
    mt_tensor **moment2;
    mt_tensor *step_count; /* F32 [n] on the params' device: Adam's step per parameter, the
                              steps that updated it (bias correction, as torch counts) */
    mt_device device;
    double lr, momentum, beta1, beta2, eps, weight_decay;
    bool nesterov, multi_precision;
    mt_tensor **grad_buf; /* scratch (n entries): the borrowed gradients of one step */
};

/* One fused pass over all parameters. found_inf (F32 0-d, may be NULL): the kernel does
   nothing when it is non-zero, with no host read. inv_scale (F32 0-d, may be NULL): the
   gradients are multiplied by it inside the pass (unscale folded into the step). */
int mt_optimizer_step_ex(mt_optimizer *o, const mt_tensor *found_inf, const mt_tensor *inv_scale);
/* Records that every master now matches its parameter (after a step, a load of the
   masters): a parameter whose version moves on otherwise (a checkpoint loaded into it, a
   broadcast from rank 0, any in-place write) gets its master brought up to it
   (mt_optim_masters_follow), as the master would otherwise carry the step on from the old
   values. */
void mt_optim_masters_synced(mt_optimizer *o);
/* Remakes the master of every parameter written since, before a step, a save of the state
   or a read of a master: the elements whose value changed take the parameter's (the others
   keep the master's precision). Allocates temporaries: on failure nothing has changed but
   masters remade to the parameters' values. 0 or an error. */
int mt_optim_masters_follow(mt_optimizer *o);
/* The current gradients (borrowed; NULL entries for params without a gradient). Fills
   grads[0..n) and returns n. */
int mt_optimizer_grads(mt_optimizer *o, mt_tensor **grads);
/* True when two elements of t share memory (an expanded view): such a tensor cannot be
   updated in place element by element. */
bool mt_optim_overlaps(const mt_tensor *t);
/* The check the optimizers and mt_amp_decorate share: params[i] is non-NULL, floating and a
   leaf (leaf_why ends the not-a-leaf message); errors name op. 0 or a negative mt_status. */
int mt_optim_check_param(const char *op, mt_tensor *const *params, int i, const char *leaf_why);
#endif
