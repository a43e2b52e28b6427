/* PLACEHOLDER: not implemented yet; replaced by its owner before anything lands. */
#include <math.h>
#include "../tensor/backend.h"
#include "../tensor/backend.h"
#pragma GCC diagnostic ignored "-Wunused-parameter"

mt_optimizer *mt_sgd_new(mt_tensor *const *params, int n, const mt_sgd_opts *o) { return 0; }
mt_optimizer *mt_momentum_new(mt_tensor *const *params, int n, const mt_momentum_opts *o) { return 0; }
mt_optimizer *mt_adam_new(mt_tensor *const *params, int n, const mt_adam_opts *o) { return 0; }
mt_optimizer *mt_adamw_new(mt_tensor *const *params, int n, const mt_adam_opts *o) { return 0; }
int mt_optimizer_step(mt_optimizer *o) { return mt_error_set(MT_ERR_UNSUPPORTED, "mt_optimizer_step: not implemented yet"); }
void mt_optimizer_zero_grad(mt_optimizer *o) {  }
void mt_optimizer_free(mt_optimizer *o) {  }
int mt_optimizer_set_lr(mt_optimizer *o, double lr) { return mt_error_set(MT_ERR_UNSUPPORTED, "mt_optimizer_set_lr: not implemented yet"); }
double mt_optimizer_get_lr(const mt_optimizer *o) { mt_error_set(MT_ERR_UNSUPPORTED, "mt_optimizer_get_lr: not implemented yet"); return NAN; }
mt_tensor *mt_optimizer_master(mt_optimizer *o, int i) { return 0; }
