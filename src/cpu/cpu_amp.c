/* PLACEHOLDER: not implemented yet; replaced by its owner before anything lands. */
#include <math.h>
#include "cpu.h"

#pragma GCC diagnostic ignored "-Wunused-parameter"

int mt_cpu_unscale(mt_tensor *const *grads, int n, const mt_tensor *inv_scale, mt_tensor *found_inf) { return mt_error_set(MT_ERR_UNSUPPORTED, "mt_cpu_unscale: not implemented yet"); }
int mt_cpu_scale_update(const mt_scale_update_args *a) { return mt_error_set(MT_ERR_UNSUPPORTED, "mt_cpu_scale_update: not implemented yet"); }
int mt_cpu_sq_norm(mt_tensor *const *ts, int n, mt_tensor *out) { return mt_error_set(MT_ERR_UNSUPPORTED, "mt_cpu_sq_norm: not implemented yet"); }
