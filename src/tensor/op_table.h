/* The op enum, names, autocast rules and per-op facts, expanded from ops.def. */
#ifndef MT_TENSOR_OP_TABLE_H
#define MT_TENSOR_OP_TABLE_H
#include <stdbool.h>

typedef enum {
#define MT_OP(id, name, rule, saves, fused) MT_OP_##id,
#include "ops.def"
#undef MT_OP
    MT_OP_COUNT
} mt_op_id;

/* "no op", for ops.def's fused_backward column */
enum { MT_OP_NONE = -1 };

typedef enum {
    MT_RULE_NONE,
    MT_RULE_LOWER,
    MT_RULE_FP32,
    MT_RULE_PROMOTE,
    MT_RULE_MIXED,
    MT_RULE_FIXED
} mt_amp_rule;

/* What an elementwise op's tape node keeps for its backward (ops.def's saves column). */
typedef enum {
    MT_SAVES_NOTHING,
    MT_SAVES_INPUT,         /* unary: its input, in slot 0 */
    MT_SAVES_OUTPUT,        /* unary: its output, in slot 0 */
    MT_SAVES_INPUT_OUTPUT,  /* unary: input in slot 0, output in slot 1 */
    MT_SAVES_INPUTS,        /* binary: both inputs, slots 0 and 1 */
    MT_SAVES_INPUTS_OUTPUT, /* binary: both inputs, then the output in slot 2 */
    MT_SAVES_OWN            /* not elementwise: the entry point saves what it needs */
} mt_op_saves;

const char *mt_op_name(mt_op_id op);     /* "add" */
const char *mt_op_api_name(mt_op_id op); /* "mt_add" */
mt_amp_rule mt_op_rule(mt_op_id op);
mt_op_saves mt_op_saved(mt_op_id op);
/* The fused backward kernel op of op, or MT_OP_NONE. */
int mt_op_fused_backward(mt_op_id op);
/* The op whose table name is `name`, or -1. */
int mt_op_lookup(const char *name);
#endif
