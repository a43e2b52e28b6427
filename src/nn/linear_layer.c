/* PLACEHOLDER: not implemented yet; replaced by its owner before anything lands. */
#include <math.h>
#include "../tensor/backend.h"
#include "../tensor/backend.h"
#pragma GCC diagnostic ignored "-Wunused-parameter"

int mt_linear_layer_init(mt_linear_layer *l, int64_t in, int64_t out, bool bias, mt_dtype dt, mt_device dev) { return mt_error_set(MT_ERR_UNSUPPORTED, "mt_linear_layer_init: not implemented yet"); }
mt_tensor *mt_linear_layer_forward(mt_linear_layer *l, mt_tensor *x) { return 0; }
void mt_linear_layer_free(mt_linear_layer *l) {  }
