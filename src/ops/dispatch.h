/* The shared path of every op entry point (DESIGN.md section 3): after the op validated its
   arguments, mt_dispatch_inputs applies type promotion and autocast (casting through the
   recorded cast op), the op allocates and runs its kernel and records its node, and
   mt_dispatch_done feeds operator statistics and the numeric checker. */
#ifndef MT_OPS_DISPATCH_H
#define MT_OPS_DISPATCH_H
#include "../amp/autocast.h"
#include "../autograd/node.h"
#include "../tensor/backend.h"

/* Casts the floating entries of in[0..n) to op's compute dtype; non-floating entries and
   NULLs pass through. cast[i] receives a new reference for every non-NULL in[i]. Returns the
   compute dtype, or -1 with the error set (cast[] then holds nothing). */
int mt_dispatch_inputs(mt_op_id op, mt_tensor *const *in, int n, mt_tensor **cast);
void mt_dispatch_release(mt_tensor **cast, int n);
/* mt_dispatch_inputs for an op with one floating input t whose kernel reads any floating
   dtype and accumulates in the compute dtype (reductions, softmax, cross entropy). Casting
   F16/BF16 up to F32, or anything up to F64, is exact, so the kernel reads t as it is: the
   same numbers as casting first, without the extra pass, and *cast is t itself; other casts
   go through mt_dispatch_inputs. Returns the compute dtype, or -1 with the error set. */
int mt_dispatch_upcast_input(mt_op_id op, mt_tensor *t, mt_tensor **cast);
/* The MIXED rule of ops.def (normalisations): in[0] is the activation, and so is every
   in[i] whose bit is set in act_mask (a residual). The activation dtype is the autocast
   decision for in[0]'s dtype (in[0]'s own unless a custom list names the op); other
   activation inputs are cast to it. Every other floating input (weight, bias, running
   statistics) is cast to the accumulation dtype (F64 for an F64 activation, else F32).
   Returns the activation dtype, or -1 with the error set (cast[] then holds nothing). */
int mt_dispatch_mixed(mt_op_id op, mt_tensor *const *in, int n, uint32_t act_mask,
                      mt_tensor **cast);
/* t as a contiguous tensor of dtype dt, through the recorded cast and contiguous ops (t
   itself, retained, when it is one already); NULL passes through. New reference, or NULL
   with the error set. */
mt_tensor *mt_dispatch_dense(mt_tensor *t, mt_dtype dt);
/* mt_dispatch_inputs for an op with one data input that its kernel reads dense (indexing,
   dropout): t in op's compute dtype, contiguous. A new reference, or NULL with the error
   set. */
mt_tensor *mt_dispatch_dense_input(mt_op_id op, mt_tensor *t);
/* The accumulation dtype of a normalisation over activations of dtype dt. */
static inline mt_dtype mt_norm_acc_dtype(mt_dtype dt) {
    return dt == MT_F64 ? MT_F64 : MT_F32;
}
static inline void mt_dispatch_done(mt_op_id op, mt_dtype compute, const mt_tensor *out,
                                    mt_tensor *const *in, int n) {
    if (atomic_load_explicit(&mt_amp_stats_on, memory_order_relaxed))
        mt_amp_stats_record(op, compute);
    if (atomic_load_explicit(&mt_amp_check_on, memory_order_relaxed) && out)
        mt_amp_check_output(op, out, in, n);
}
/* "mt_add" from the op table, for messages. */
const char *mt_op_fullname(mt_op_id op);
/* Status to return from a backward formula after an op inside it returned NULL. */
static inline int mt_backward_failed(void) {
    return mt_last_status() != MT_OK ? (int)mt_last_status() : MT_ERR_INTERNAL;
}
/* Entry paths shared by the public elementwise functions (src/ops/elementwise.c); callable
   for internal ops such as the fused backward kernels and sign. No NULL checks. */
mt_tensor *mt_binary_op_internal(mt_op_id op, mt_tensor *a, mt_tensor *b);
mt_tensor *mt_unary_op_internal(mt_op_id op, mt_tensor *a, double p);
#endif
