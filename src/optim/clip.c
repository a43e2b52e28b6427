/* PLACEHOLDER: not implemented yet; replaced by its owner before anything lands. */
#include <math.h>
#include "../tensor/backend.h"
#include "../tensor/backend.h"
#pragma GCC diagnostic ignored "-Wunused-parameter"

double mt_clip_grad_norm(mt_optimizer *o, double max_norm) { mt_error_set(MT_ERR_UNSUPPORTED, "mt_clip_grad_norm: not implemented yet"); return NAN; }
