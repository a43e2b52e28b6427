/* Autocast internals used by the op dispatcher (src/ops/dispatch.c). */
#ifndef MT_AMP_AUTOCAST_H
#define MT_AMP_AUTOCAST_H
#include <stdatomic.h>
#include "../tensor/op_table.h"
#include "../tensor/tensor_impl.h"

/* The dtype op computes in, given the widest floating dtype among its inputs (type
   promotion), under the calling thread's autocast state. */
mt_dtype mt_autocast_decide(mt_op_id op, mt_dtype widest);
/* True inside an enabled autocast region on this thread. */
bool mt_autocast_active(void);
/* Autocast off on this thread until mt_autocast_resume(token), whatever regions are open
   (the cast cache stays): a backward runs each formula in the dtypes its forward chose, as
   torch's does, not in those of the region it happens to be called in. */
typedef struct {
    int base, depth, overflow;
} mt_autocast_token;
mt_autocast_token mt_autocast_suspend(void);
void mt_autocast_resume(mt_autocast_token token);
/* t cast to dt through the recorded cast op; inside a region, the cast of an FP32 leaf that
   requires grad is cached until the outermost region ends (src/amp/cast_cache.c). */
mt_tensor *mt_autocast_cast(mt_tensor *t, mt_dtype dt);
void mt_cast_cache_clear(void);
/* Hooks the dispatcher calls after an op ran (src/amp/stats.c); cheap when disabled. The
   switches are atomic because any thread may flip them while others run ops; relaxed loads
   compile to plain loads, so the per-op cost stays one branch each. */
extern atomic_bool mt_amp_stats_on, mt_amp_check_on;
void mt_amp_stats_record(mt_op_id op, mt_dtype compute);
void mt_amp_check_output(mt_op_id op, const mt_tensor *out, mt_tensor *const *inputs, int n);
#endif
