/* PLACEHOLDER: not implemented yet; replaced by its owner before anything lands. */
#include <math.h>
#include "../tensor/backend.h"
#include "../tensor/backend.h"
#pragma GCC diagnostic ignored "-Wunused-parameter"

mt_tensor *mt_mse_loss(mt_tensor *pred, mt_tensor *target) { return 0; }
mt_tensor *mt_cross_entropy(mt_tensor *logits, mt_tensor *labels) { return 0; }
mt_tensor *mt_cross_entropy_ex(mt_tensor *logits, mt_tensor *labels, int64_t ignore_index) { return 0; }
