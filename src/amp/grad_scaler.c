/* PLACEHOLDER: not implemented yet; replaced by its owner before anything lands. */
#include <math.h>
#include "../amp/autocast.h"
#include "../tensor/backend.h"
#pragma GCC diagnostic ignored "-Wunused-parameter"

mt_grad_scaler *mt_grad_scaler_new(const mt_grad_scaler_opts *opts) { return 0; }
mt_tensor *mt_grad_scaler_scale(mt_grad_scaler *s, mt_tensor *loss) { return 0; }
int mt_grad_scaler_unscale(mt_grad_scaler *s, mt_optimizer *o) { return mt_error_set(MT_ERR_UNSUPPORTED, "mt_grad_scaler_unscale: not implemented yet"); }
int mt_grad_scaler_step(mt_grad_scaler *s, mt_optimizer *o) { return mt_error_set(MT_ERR_UNSUPPORTED, "mt_grad_scaler_step: not implemented yet"); }
int mt_grad_scaler_update(mt_grad_scaler *s) { return mt_error_set(MT_ERR_UNSUPPORTED, "mt_grad_scaler_update: not implemented yet"); }
int mt_grad_scaler_minimize(mt_grad_scaler *s, mt_optimizer *o) { return mt_error_set(MT_ERR_UNSUPPORTED, "mt_grad_scaler_minimize: not implemented yet"); }
float mt_grad_scaler_get_scale(mt_grad_scaler *s) { mt_error_set(MT_ERR_UNSUPPORTED, "mt_grad_scaler_get_scale: not implemented yet"); return NAN; }
bool mt_grad_scaler_last_step_skipped(mt_grad_scaler *s) { return false; }
int64_t mt_grad_scaler_skipped_steps(mt_grad_scaler *s) { return 0; }
int mt_grad_scaler_state_get(mt_grad_scaler *s, mt_grad_scaler_state *out) { return mt_error_set(MT_ERR_UNSUPPORTED, "mt_grad_scaler_state_get: not implemented yet"); }
int mt_grad_scaler_state_set(mt_grad_scaler *s, const mt_grad_scaler_state *in) { return mt_error_set(MT_ERR_UNSUPPORTED, "mt_grad_scaler_state_set: not implemented yet"); }
void mt_grad_scaler_free(mt_grad_scaler *s) {  }
