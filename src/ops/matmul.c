/* PLACEHOLDER: not implemented yet; replaced by its owner before anything lands. */
#include <math.h>
#include "../tensor/backend.h"
#include "../tensor/backend.h"
#pragma GCC diagnostic ignored "-Wunused-parameter"

mt_tensor *mt_matmul(mt_tensor *a, mt_tensor *b) { return 0; }
mt_tensor *mt_linear(mt_tensor *x, mt_tensor *w, mt_tensor *b) { return 0; }
