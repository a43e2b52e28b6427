#!/usr/bin/python3
"""Golden values from PyTorch for every op of include/mixtape.h.

Run with Debian's python3-torch (CI does not need it: the output is committed):

    /usr/bin/python3 tools/gen_golden.py [outdir]      # default: test/golden

Writes one text file per op (test/golden/<op>.txt) and test/golden/INDEX (the op names).
The format is a whitespace-separated token stream, read by test/golden_reader.h:

    case <name>                    starts a case; the lines below belong to it
    source torch|emulated          emulated (low precision only): torch ran the op in FP32 on the
                                   exact low-precision operands and the result (and gradients)
                                   were rounded once, which is mixtape's contract (DESIGN.md
                                   section 4). Used where torch 1.13 has no CPU kernel for the
                                   dtype, or where its kernel is more than 1 ulp from that
                                   (it rounds intermediates: BF16 bmm accumulates in BF16)
    autocast <dtype>               the op runs inside an autocast region (O1) of that dtype
    param <key> <count> <v...>     op arguments (dims, scalars, shapes, ...), decimal/hex
    param transposed <n> <i...>    inputs i are fed to the op as non-contiguous views: the
                                   transpose (last two dims) of a contiguous leaf holding the
                                   transposed values; their gradients are read through it
    target <dtype>                 destination dtype of cast
    input <dtype> <rg> <ndim> <dims...> <values...>     rg 1: requires grad
    output <dtype> <ndim> <dims...> <values...>
    cotangent <dtype> <ndim> <dims...> <values...>     seed of mt_backward
    grad <i> <dtype> <ndim> <dims...> <values...>      gradient of input i
    end

Floating values are C99 hex floats (exact; strtod reads them, and inf/nan), integers and
bools are decimal. Inputs are generated here from a per-case seed and stored, so the C test
runs on exactly the values torch saw; low-precision inputs are exact F16/BF16 values.
"""
import os
import sys

import torch
import torch.nn.functional as F

import gen_golden_cnn
import gen_golden_nn
import gen_golden_nonfinite
from golden_common import BF16, F16, F32, F64, HIGH, LOW, NAMES, OpFile, gen_for, make

# ----------------------------------------------------------------------------- op generators

def binary_ops(files):
    ops = {
        "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
        "pow": torch.pow, "maximum": torch.maximum, "minimum": torch.minimum,
    }
    shapes = {"same": ((3, 4), (3, 4)), "bcast": ((2, 1, 4), (3, 1)), "scalar": ((3, 4), ())}
    for op, f in ops.items():
        fo = OpFile(op)
        kb = "nonzero" if op == "div" else "normal"
        ka = "positive" if op == "pow" else "normal"
        for dt in (F32, F64, F16, BF16):
            for sname, (sa, sb) in shapes.items():
                if dt in LOW and sname == "scalar":
                    continue
                g = gen_for("%s_%s_%s" % (op, sname, NAMES[dt]))
                a, b = make(g, sa, dt, ka), make(g, sb, dt, kb)
                if op == "pow":
                    b = (4.0 * make(g, sb, F64, "unit") - 2.0).to(dt)
                if op in ("maximum", "minimum") and sname == "same":
                    b.view(-1)[::3] = a.view(-1)[::3]  # ties split the gradient
                fo.case("%s_%s" % (sname, NAMES[dt]), lambda x, f=f: f(x[0], x[1]), [a, b])
        for dt in (F32, BF16):  # non-contiguous operands
            g = gen_for("%s_transposed_%s" % (op, NAMES[dt]))
            a, b = make(g, (3, 4), dt, ka), make(g, (3, 4), dt, kb)
            if op == "pow":
                b = (4.0 * make(g, (3, 4), F64, "unit") - 2.0).to(dt)
            fo.case("transposed_" + NAMES[dt], lambda x, f=f: f(x[0], x[1]), [a, b],
                    params={"transposed": [0, 1]})
        if op in ("add", "mul"):  # autocast: promotion of BF16 x F32 to F32, as outside
            g = gen_for(op + "_autocast")
            fo.case("autocast_bf16", lambda x, f=f: f(x[0], x[1]),
                    [make(g, (3, 4), BF16), make(g, (3, 4), F32)], autocast=BF16)
        if op in ("add", "mul", "div", "maximum"):  # type promotion F16 x F32 -> F32
            g = gen_for(op + "_promote")
            a, b = make(g, (3, 4), F16), make(g, (4,), F32, kb)
            fo.case("promote_f16_f32", lambda x, f=f: f(x[0], x[1]), [a, b])
        files.append(fo)


def scalar_ops(files):
    specs = [
        ("add_scalar", [2.5, -0.1], "normal", lambda x, s: x + s),
        ("mul_scalar", [-1.75, 0.3], "normal", lambda x, s: x * s),
        ("pow_scalar", [2.0, 3.0, 0.5, -1.5], "positive", lambda x, s: torch.pow(x, s)),
        ("rsub_scalar", [3.0, -0.7], "normal", lambda x, s: s - x),
        ("rdiv_scalar", [2.0, -0.3], "nonzero", lambda x, s: s / x),
    ]
    for op, scalars, kind, f in specs:
        fo = OpFile(op)
        for dt in (F32, F64, F16, BF16):
            for j, s in enumerate(scalars):
                if dt in LOW and j > 0:
                    continue
                g = gen_for("%s_%d_%s" % (op, j, NAMES[dt]))
                a = make(g, (3, 4), dt, kind)
                fo.case("s%d_%s" % (j, NAMES[dt]), lambda x, s=s, f=f: f(x[0], s), [a],
                        params={"s": s})
        if op == "pow_scalar":  # integer power of negative bases
            g = gen_for("pow_scalar_negbase")
            a = make(g, (3, 4), F64)
            fo.case("negbase_f64", lambda x: torch.pow(x[0], 3.0), [a], params={"s": 3.0})
        files.append(fo)


def unary_ops(files):
    specs = [
        ("neg", "normal", torch.neg),
        ("exp", "normal", torch.exp),
        ("log", "positive", torch.log),
        ("sqrt", "positive", torch.sqrt),
        ("rsqrt", "positive", torch.rsqrt),
        ("abs", "zeros", torch.abs),
        ("relu", "zeros", torch.relu),
        ("gelu", "wide", F.gelu),
        ("gelu_tanh", "wide", lambda x: F.gelu(x, approximate="tanh")),
        ("sigmoid", "wide", torch.sigmoid),
        ("tanh", "wide", torch.tanh),
    ]
    for op, kind, f in specs:
        fo = OpFile(op)
        for dt in (F32, F64, F16, BF16):
            g = gen_for("%s_%s" % (op, NAMES[dt]))
            a = make(g, (3, 5), dt, kind)
            fo.case(NAMES[dt], lambda x, f=f: f(x[0]), [a])
        for dt in (F32, F16):
            g = gen_for("%s_transposed_%s" % (op, NAMES[dt]))
            a = make(g, (2, 3, 4), dt, kind)
            fo.case("transposed_" + NAMES[dt], lambda x, f=f: f(x[0]), [a],
                    params={"transposed": [0]})
        if op in ("exp", "sigmoid", "tanh", "gelu"):  # range edges: overflow, saturation
            a = torch.tensor([-100.0, -20.0, -5.0, 0.0, 5.0, 20.0, 88.0, 100.0])
            for dt in (F32, F16):
                fo.case("edges_" + NAMES[dt], lambda x, f=f: f(x[0]), [a.to(dt)], grads=False)
        files.append(fo)


def compare_ops(files):
    ops = {"eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt,
           "ge": torch.ge}
    for op, f in ops.items():
        fo = OpFile(op)
        for dt in (F32, F64, F16, BF16):
            g = gen_for("%s_%s" % (op, NAMES[dt]))
            a, b = make(g, (3, 4), dt), make(g, (3, 4), dt)
            b.view(-1)[::2] = a.view(-1)[::2]
            fo.case("same_" + NAMES[dt], lambda x, f=f: f(x[0], x[1]), [a, b])
            c = make(g, (4,), dt)
            c[1] = a[0, 1]
            fo.case("bcast_" + NAMES[dt], lambda x, f=f: f(x[0], x[1]), [a, c])
        a = torch.tensor([[1, 2, 3], [4, 5, 6]], dtype=torch.int64)
        b = torch.tensor([3, 2, 6], dtype=torch.int64)
        fo.case("i64", lambda x, f=f: f(x[0], x[1]), [a, b])
        files.append(fo)


def where_op(files):
    fo = OpFile("where")
    for dt in (F32, F64, F16, BF16):
        g = gen_for("where_" + NAMES[dt])
        cond = make(g, (3, 4), F64) > 0
        a, b = make(g, (3, 4), dt), make(g, (4,), dt)
        fo.case(NAMES[dt], lambda x: torch.where(x[0], x[1], x[2]), [cond, a, b])
        c2 = make(g, (3, 1), F64) > 0
        fo.case("bcast_cond_" + NAMES[dt], lambda x: torch.where(x[0], x[1], x[2]), [c2, a, b])
    files.append(fo)


def reduce_ops(files):
    variants = [((1,), False), ((1,), True), ((0, 2), False), ((-1,), False), ((0, -1), True),
                ((0, 1, 2), False)]
    for op in ("sum", "mean", "max"):
        fo = OpFile(op)
        f = {"sum": torch.sum, "mean": torch.mean, "max": torch.amax}[op]
        for dt in (F32, F64, F16, BF16):
            for j, (dims, keep) in enumerate(variants):
                if (dt in LOW and j not in (0, 2)) or (dt == F64 and j in (1, 3)):
                    continue
                g = gen_for("%s_%d_%s" % (op, j, NAMES[dt]))
                a = make(g, (2, 3, 4), dt)
                fo.case("d%s%s_%s" % ("_".join(str(d) for d in dims).replace("-", "m"),
                                      "_keep" if keep else "", NAMES[dt]),
                        lambda x, dims=dims, keep=keep, f=f: f(x[0], dim=dims, keepdim=keep),
                        [a], params={"dims": list(dims), "keepdim": int(keep)})
        for dt in LOW:  # 300 terms: an F16/BF16 accumulator would be far off
            if op == "max":
                continue
            g = gen_for("%s_long_%s" % (op, NAMES[dt]))
            a = make(g, (2, 200), dt, "unit")
            fo.case("long_" + NAMES[dt], lambda x, f=f: f(x[0], dim=(1,), keepdim=False), [a],
                    params={"dims": [1], "keepdim": 0})
        for dt in (F32, F16):
            for dims in ((1,), (2,)):
                g = gen_for("%s_transposed_%d_%s" % (op, dims[0], NAMES[dt]))
                a = make(g, (2, 4, 3), dt)
                fo.case("transposed_d%d_%s" % (dims[0], NAMES[dt]),
                        lambda x, dims=dims, f=f: f(x[0], dim=dims), [a],
                        params={"dims": list(dims), "keepdim": 0, "transposed": [0]})
        if op == "max":  # ties: torch's amax splits the gradient evenly among the maxima
            a = torch.tensor([[1.0, 3.0, 3.0, 0.5], [2.0, -1.0, 2.0, 2.0]], dtype=F64)
            fo.case("ties_f64", lambda x: torch.amax(x[0], dim=(1,)), [a],
                    params={"dims": [1], "keepdim": 0})
        files.append(fo)
        fa = OpFile(op + "_all")
        fall = {"sum": torch.sum, "mean": torch.mean, "max": torch.max}[op]
        for dt in (F32, F64, F16, BF16):
            g = gen_for("%s_all_%s" % (op, NAMES[dt]))
            a = make(g, (3, 4, 5) if dt in HIGH else (2, 150), dt, "normal" if dt in HIGH else "unit")
            fa.case(NAMES[dt], lambda x, f=fall: f(x[0]), [a])
        g = gen_for("%s_all_transposed" % op)
        fa.case("transposed_f32", lambda x, f=fall: f(x[0]), [make(g, (3, 5), F32)],
                params={"transposed": [0]})
        if op == "max":
            a = torch.tensor([[1.0, 3.0], [3.0, 0.5]], dtype=F64)
            fa.case("ties_f64", lambda x: torch.max(x[0]), [a])
        files.append(fa)


def softmax_ops(files):
    for op, f in (("softmax", torch.softmax), ("log_softmax", torch.log_softmax)):
        fo = OpFile(op)
        for dt in (F32, F64, F16, BF16):
            for dim in (-1, 1, 0):
                if dt in LOW and dim != -1:
                    continue
                g = gen_for("%s_%d_%s" % (op, dim, NAMES[dt]))
                a = make(g, (2, 3, 4), dt)
                fo.case("dim%s_%s" % (str(dim).replace("-", "m"), NAMES[dt]),
                        lambda x, dim=dim, f=f: f(x[0], dim), [a], params={"dim": dim})
        for dt in (F32, BF16):
            for dim in (-1, -2):
                g = gen_for("%s_transposed_%d_%s" % (op, dim, NAMES[dt]))
                a = make(g, (2, 4, 3), dt)
                fo.case("transposed_dim%s_%s" % (str(dim).replace("-", "m"), NAMES[dt]),
                        lambda x, dim=dim, f=f: f(x[0], dim), [a],
                        params={"dim": dim, "transposed": [0]})
        for dt in (F32, F16):  # large logits: needs the max subtraction
            g = gen_for("%s_large_%s" % (op, NAMES[dt]))
            a = (make(g, (3, 5), F64) * 40.0).to(dt)
            fo.case("large_" + NAMES[dt], lambda x, f=f: f(x[0], -1), [a], params={"dim": -1})
        files.append(fo)


def matmul_op(files):
    fo = OpFile("matmul")
    shapes = {
        "dot": ((4,), (4,)),
        "vecmat": ((4,), (4, 3)),
        "matvec": ((3, 4), (4,)),
        "mm": ((3, 4), (4, 5)),
        "bmm": ((2, 3, 4), (2, 4, 5)),
        "batch_mat": ((2, 3, 4), (4, 5)),
        "mat_batch": ((3, 4), (2, 4, 5)),
        "bcast": ((2, 1, 3, 4), (3, 4, 2)),
        "vec_batch": ((4,), (2, 4, 3)),
        "batch_vec": ((2, 3, 4), (4,)),
    }
    for dt in (F32, F64, F16, BF16):
        for sname, (sa, sb) in shapes.items():
            if dt in LOW and sname not in ("mm", "bmm", "bcast", "matvec"):
                continue
            if dt == F64 and sname not in ("dot", "mm", "bmm", "bcast", "mat_batch"):
                continue
            g = gen_for("matmul_%s_%s" % (sname, NAMES[dt]))
            a, b = make(g, sa, dt), make(g, sb, dt)
            fo.case("%s_%s" % (sname, NAMES[dt]), lambda x: torch.matmul(x[0], x[1]), [a, b])
    for dt in LOW:  # long inner dimension: FP32 accumulation
        g = gen_for("matmul_long_" + NAMES[dt])
        a, b = make(g, (2, 96), dt, "unit"), make(g, (96, 2), dt, "unit")
        fo.case("long_" + NAMES[dt], lambda x: torch.matmul(x[0], x[1]), [a, b])
    tcases = {"mm_ta": ((4, 3), (4, 5), [0]), "mm_tb": ((3, 4), (5, 4), [1]),
              "mm_tab": ((4, 3), (5, 4), [0, 1]), "bmm_tab": ((2, 4, 3), (2, 5, 4), [0, 1]),
              "matvec_ta": ((4, 3), (4,), [0]), "batch_mat_tb": ((2, 3, 4), (5, 4), [1])}
    for dt in (F32, F64, BF16):  # non-contiguous operands (GEMM transpose flags)
        for sname, (sa, sb, tr) in tcases.items():
            if dt != F32 and sname not in ("mm_tab", "bmm_tab"):
                continue
            g = gen_for("matmul_%s_%s" % (sname, NAMES[dt]))
            a, b = make(g, sa, dt), make(g, sb, dt)
            # the stored values are the transposed operands the op sees
            a = a.transpose(-1, -2).contiguous() if 0 in tr else a
            b = b.transpose(-1, -2).contiguous() if 1 in tr else b
            fo.case("%s_%s" % (sname, NAMES[dt]), lambda x: torch.matmul(x[0], x[1]), [a, b],
                    params={"transposed": tr})
    g = gen_for("matmul_autocast_tab")
    a, b = make(g, (3, 4), F32), make(g, (4, 5), F32)
    fo.case("autocast_bf16_mm_tab", lambda x: torch.matmul(x[0], x[1]), [a, b], autocast=BF16,
            params={"transposed": [0, 1]})
    for sname in ("mm", "bmm", "bcast"):  # autocast: F32 inputs, BF16 compute and result
        sa, sb = shapes[sname]
        g = gen_for("matmul_autocast_" + sname)
        a, b = make(g, sa, F32), make(g, sb, F32)
        # The gradient of a broadcast operand sums per-batch products that were each rounded
        # to BF16 (in torch too), and they cancel: not defined to an ulp, so forward only.
        fo.case("autocast_bf16_" + sname, lambda x: torch.matmul(x[0], x[1]), [a, b],
                autocast=BF16, grads=sname != "bcast")
    files.append(fo)


def linear_op(files):
    fo = OpFile("linear")
    shapes = {"2d": (3, 4), "3d": (2, 3, 4), "1d": (4,)}
    for dt in (F32, F64, F16, BF16):
        for sname, xs in shapes.items():
            for bias in (True, False):
                if (dt in LOW or dt == F64) and sname == "1d":
                    continue
                name = "%s_%s_%s" % (sname, "bias" if bias else "nobias", NAMES[dt])
                g = gen_for("linear_" + name)
                x, w = make(g, xs, dt), make(g, (5, 4), dt)
                ins = [x, w] + ([make(g, (5,), dt)] if bias else [])
                fo.case(name, lambda t: F.linear(*t), ins)
    for dt in (F32, BF16):  # W stored as [in, out] and transposed; x non-contiguous
        g = gen_for("linear_transposed_" + NAMES[dt])
        x, w, b = make(g, (3, 4), dt), make(g, (5, 4), dt), make(g, (5,), dt)
        fo.case("transposed_" + NAMES[dt], lambda t: F.linear(*t), [x, w, b],
                params={"transposed": [0, 1]})
    for bias in (True, False):
        g = gen_for("linear_autocast_%d" % bias)
        x, w = make(g, (2, 3, 4), F32), make(g, (5, 4), F32)
        ins = [x, w] + ([make(g, (5,), F32)] if bias else [])
        fo.case("autocast_bf16_%s" % ("bias" if bias else "nobias"), lambda t: F.linear(*t),
                ins, autocast=BF16)
    files.append(fo)


ACTS = {"none": (0, lambda y: y), "relu": (1, F.relu), "gelu": (2, F.gelu),
        "gelu_tanh": (3, lambda y: F.gelu(y, approximate="tanh"))}


def linear_act_op(files):
    """mt_linear_act(x, w, b, act) = act(F.linear(x, w, b)); param act is the mt_activation."""
    fo = OpFile("linear_act")
    shapes = {"2d": (3, 4), "3d": (2, 3, 4), "1d": (4,)}
    for aname, (code, act) in ACTS.items():
        for dt in (F32, F64, F16, BF16):
            for sname, xs in shapes.items():
                for bias in (True, False):
                    if (dt in LOW or dt == F64) and sname == "1d":
                        continue
                    if dt in LOW and not bias:
                        continue
                    name = "%s_%s_%s_%s" % (aname, sname, "bias" if bias else "nobias", NAMES[dt])
                    g = gen_for("linear_act_" + name)
                    x, w = make(g, xs, dt), make(g, (5, 4), dt)
                    ins = [x, w] + ([make(g, (5,), dt)] if bias else [])
                    fo.case(name, lambda t, a=act: a(F.linear(*t)), ins, params={"act": code})
        g = gen_for("linear_act_transposed_" + aname)
        x, w, b = make(g, (3, 4), F32), make(g, (5, 4), F32), make(g, (5,), F32)
        fo.case("transposed_" + aname, lambda t, a=act: a(F.linear(*t)), [x, w, b],
                params={"act": code, "transposed": [0, 1]})
        g = gen_for("linear_act_autocast_" + aname)
        x, w, b = make(g, (2, 3, 4), F32), make(g, (5, 4), F32), make(g, (5,), F32)
        # GELU's input gradient is rounded to BF16 before the GEMMs of the backward (in
        # torch too): not defined to an ulp of FP32-then-round, so forward only
        fo.case("autocast_bf16_" + aname, lambda t, a=act: a(F.linear(*t)), [x, w, b],
                params={"act": code}, autocast=BF16, grads=aname in ("none", "relu"))
    files.append(fo)


def loss_ops(files):
    fo = OpFile("mse_loss")
    for dt in (F32, F64, F16, BF16):
        g = gen_for("mse_" + NAMES[dt])
        p, t = make(g, (3, 4), dt), make(g, (3, 4), dt)
        fo.case(NAMES[dt], lambda x: F.mse_loss(x[0], x[1]), [p, t])
        p, t = make(g, (2, 3, 4), dt), make(g, (2, 3, 4), dt)
        fo.case("3d_" + NAMES[dt], lambda x: F.mse_loss(x[0], x[1]), [p, t])
        if dt in (F32, BF16):
            fo.case("transposed_" + NAMES[dt], lambda x: F.mse_loss(x[0], x[1]), [p, t],
                    params={"transposed": [0]})

    g = gen_for("mse_autocast")  # FP32 op under autocast: low inputs, F32 result
    fo.case("autocast_bf16", lambda x: F.mse_loss(x[0], x[1]),
            [make(g, (3, 4), BF16), make(g, (3, 4), BF16)], autocast=BF16)
    files.append(fo)

    fo = OpFile("cross_entropy")
    g = gen_for("ce_autocast")
    fo.case("autocast_bf16", lambda x: F.cross_entropy(x[0], x[1]),
            [make(g, (4, 5), BF16), torch.tensor([1, 0, 4, 2])], autocast=BF16)
    for dt in (F32, F64, F16, BF16):
        g = gen_for("ce_" + NAMES[dt])
        logits = make(g, (6, 5), dt) * 2
        labels = torch.tensor([0, 4, 2, 2, 1, 3])
        fo.case(NAMES[dt], lambda x: F.cross_entropy(x[0], x[1]), [logits, labels])
        lab2 = torch.tensor([0, -100, 2, 4, -100, 3])
        fo.case("ignore_default_" + NAMES[dt], lambda x: F.cross_entropy(x[0], x[1]),
                [logits, lab2])
        if dt in (F32, BF16):
            fo.case("transposed_" + NAMES[dt], lambda x: F.cross_entropy(x[0], x[1]),
                    [logits, labels], params={"transposed": [0]})
        lab3 = torch.tensor([1, 4, 1, 2, 0, 1])
        fo.case("ignore_1_" + NAMES[dt], lambda x: F.cross_entropy(x[0], x[1], ignore_index=1),
                [logits, lab3], params={"ignore_index": 1})
    files.append(fo)


def join_ops(files):
    fo = OpFile("cat")
    specs = [("dim1", [(2, 3), (2, 1), (2, 4)], 1), ("dim0", [(2, 3), (1, 3)], 0),
             ("dimm1", [(2, 2, 3), (2, 2, 2)], -1), ("dim1_3d", [(2, 1, 3), (2, 3, 3)], 1),
             ("single", [(2, 3)], 0)]
    for dt in (F32, F64, F16, BF16):
        for sname, shapes, dim in specs:
            if dt in LOW and sname not in ("dim1", "dimm1"):
                continue
            g = gen_for("cat_%s_%s" % (sname, NAMES[dt]))
            ins = [make(g, s, dt) for s in shapes]
            fo.case("%s_%s" % (sname, NAMES[dt]), lambda x, dim=dim: torch.cat(x, dim), ins,
                    params={"dim": dim})
    for dt in (F32, F16):
        g = gen_for("cat_transposed_" + NAMES[dt])
        ins = [make(g, (2, 3), dt), make(g, (2, 2), dt)]
        fo.case("transposed_" + NAMES[dt], lambda x: torch.cat(x, 1), ins,
                params={"dim": 1, "transposed": [0, 1]})
    g = gen_for("cat_promote")
    fo.case("promote_f16_f32", lambda x: torch.cat(x, 0), [make(g, (1, 3), F16),
                                                           make(g, (2, 3), F32)],
            params={"dim": 0})
    files.append(fo)

    fo = OpFile("stack")
    for dt in (F32, F64, F16, BF16):
        for dim in (0, 1, 2, -1):
            if dt in LOW and dim != 1:
                continue
            g = gen_for("stack_%d_%s" % (dim, NAMES[dt]))
            ins = [make(g, (2, 3), dt) for _ in range(3)]
            fo.case("dim%s_%s" % (str(dim).replace("-", "m"), NAMES[dt]),
                    lambda x, dim=dim: torch.stack(x, dim), ins, params={"dim": dim})
    files.append(fo)


def cast_op(files):
    fo = OpFile("cast")
    # rounding traps: ties to even, F16 overflow and subnormals, BF16 ties, double rounding
    special = torch.tensor([1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11, 65504.0, 65520.0, 70000.0,
                            -1e-6, 6e-8, 2.0 ** -24 * 0.5, 1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8,
                            -3.3e38, 1.0 / 3.0], dtype=F64)
    pairs = [(F32, F64), (F64, F32), (F32, F16), (F32, BF16), (F16, F32), (BF16, F32),
             (F16, BF16), (BF16, F16), (F64, F16), (F64, BF16), (F16, F64)]
    for src, dst in pairs:
        g = gen_for("cast_%s_%s" % (NAMES[src], NAMES[dst]))
        a = make(g, (3, 4), src)
        fo.case("%s_%s" % (NAMES[src], NAMES[dst]), lambda x, dst=dst: x[0].to(dst), [a],
                target=dst, rg=[True])
        if src in (F32, F64) and dst in LOW:
            fo.case("special_%s_%s" % (NAMES[src], NAMES[dst]), lambda x, dst=dst: x[0].to(dst),
                    [special.to(src)], target=dst, grads=False)
    trap = torch.tensor([1.0 + 2.0 ** -11 + 2.0 ** -40, 1.0 + 2.0 ** -8 + 2.0 ** -40], dtype=F64)
    fo.case("double_rounding_f64_f16", lambda x: x[0].to(F16), [trap], target=F16, grads=False)
    ints = torch.tensor([-2.75, -1.5, -0.5, 0.0, 0.25, 1.5, 2.999, 100.5], dtype=F32)
    for dst in (torch.int64, torch.int32, torch.bool):
        fo.case("f32_" + NAMES[dst], lambda x, dst=dst: x[0].to(dst), [ints], target=dst)
    for src in (torch.int64, torch.bool):
        v = torch.tensor([-3, 0, 2, 7]) if src == torch.int64 else torch.tensor([1, 0, 1, 1])
        fo.case(NAMES[src] + "_f32", lambda x: x[0].to(F32), [v.to(src)], target=F32)
    files.append(fo)


def view_ops(files):
    def py_slice(x, dim, start, end, step):
        idx = [slice(None)] * x.dim()
        idx[dim] = slice(start, end, step)
        return x[tuple(idx)]

    specs = {
        "reshape": [("flat2", (2, 3, 4), {"shape": [4, 6]}, lambda x, p: x.reshape(p["shape"])),
                    ("infer", (2, 3, 4), {"shape": [-1, 2]}, lambda x, p: x.reshape(p["shape"])),
                    ("to1d", (2, 3, 4), {"shape": [24]}, lambda x, p: x.reshape(p["shape"])),
                    ("add_dims", (6,), {"shape": [1, 2, 1, 3]},
                     lambda x, p: x.reshape(p["shape"]))],
        "transpose": [("d0_2", (2, 3, 4), {"d0": 0, "d1": 2},
                       lambda x, p: x.transpose(p["d0"], p["d1"])),
                      ("neg", (2, 3, 4), {"d0": -1, "d1": -2},
                       lambda x, p: x.transpose(p["d0"], p["d1"])),
                      ("2d", (3, 4), {"d0": 0, "d1": 1}, lambda x, p: x.transpose(p["d0"], p["d1"]))],
        "permute": [("201", (2, 3, 4), {"order": [2, 0, 1]}, lambda x, p: x.permute(p["order"])),
                    ("neg", (2, 3, 4), {"order": [-1, 0, -2]}, lambda x, p: x.permute(p["order"]))],
        "narrow": [("d1", (2, 3, 4), {"dim": 1, "start": 1, "length": 2},
                    lambda x, p: x.narrow(p["dim"], p["start"], p["length"])),
                   ("dm1", (2, 3, 4), {"dim": -1, "start": 0, "length": 3},
                    lambda x, p: x.narrow(p["dim"], p["start"], p["length"]))],
        "slice": [("step2", (2, 3, 5), {"dim": 2, "start": 1, "end": 5, "step": 2},
                   lambda x, p: py_slice(x, p["dim"], p["start"], p["end"], p["step"])),
                  ("d0", (3, 4), {"dim": 0, "start": 0, "end": 2, "step": 1},
                   lambda x, p: py_slice(x, p["dim"], p["start"], p["end"], p["step"])),
                  ("negstart_clamp", (3, 5), {"dim": 1, "start": -3, "end": 100, "step": 1},
                   lambda x, p: py_slice(x, p["dim"], p["start"], p["end"], p["step"])),
                  ("step3_dm1", (2, 7), {"dim": -1, "start": 0, "end": 7, "step": 3},
                   lambda x, p: py_slice(x, p["dim"], p["start"], p["end"], p["step"]))],
        "expand": [("bcast", (3, 1), {"shape": [2, 3, 4]}, lambda x, p: x.expand(p["shape"])),
                   ("keep", (3, 1), {"shape": [-1, 4]}, lambda x, p: x.expand(p["shape"])),
                   ("same", (2, 3), {"shape": [2, 3]}, lambda x, p: x.expand(p["shape"]))],
        "squeeze": [("d1", (3, 1, 4), {"dim": 1}, lambda x, p: x.squeeze(p["dim"])),
                    ("dm2", (3, 1, 4), {"dim": -2}, lambda x, p: x.squeeze(p["dim"])),
                    ("not_one", (3, 4), {"dim": 0}, lambda x, p: x.squeeze(p["dim"]))],
        "unsqueeze": [("d0", (3, 4), {"dim": 0}, lambda x, p: x.unsqueeze(p["dim"])),
                      ("d2", (3, 4), {"dim": 2}, lambda x, p: x.unsqueeze(p["dim"])),
                      ("dm1", (3, 4), {"dim": -1}, lambda x, p: x.unsqueeze(p["dim"]))],
    }
    for op, cases in specs.items():
        fo = OpFile(op)
        for dt in (F32, F64, F16):
            for j, (name, shape, params, f) in enumerate(cases):
                if dt == F16 and j > 0:
                    continue
                g = gen_for("%s_%s_%s" % (op, name, NAMES[dt]))
                a = make(g, shape, dt)
                fo.case("%s_%s" % (name, NAMES[dt]), lambda x, p=params, f=f: f(x[0], p), [a],
                        params=params)
        files.append(fo)


def copy_ops(files):
    """Copies and views that keep the values (view, flatten, clone, contiguous with gradients;
    detach and same-device to forward only) and the in-place ops, stored as the result of the
    op applied to a fresh copy of input 0 (forward only: mixtape refuses in-place ops on
    tensors that take part in autograd)."""
    fo = OpFile("view")
    for dt in (F32, F64, F16):
        for name, shape, new in (("flat2", (2, 3, 4), [4, 6]), ("infer", (2, 3, 4), [-1, 2]),
                                 ("split", (6,), [2, 1, 3])):
            if dt == F16 and name != "flat2":
                continue
            g = gen_for("view_%s_%s" % (name, NAMES[dt]))
            fo.case("%s_%s" % (name, NAMES[dt]), lambda x, s=new: x[0].view(s),
                    [make(g, shape, dt)], params={"shape": new})
    files.append(fo)

    fo = OpFile("flatten")
    for dt in (F32, F64, F16):
        g = gen_for("flatten_" + NAMES[dt])
        fo.case(NAMES[dt], lambda x: torch.flatten(x[0]), [make(g, (2, 3, 4), dt)])
    for dt in (F32, BF16):  # a non-contiguous input is copied
        g = gen_for("flatten_transposed_" + NAMES[dt])
        fo.case("transposed_" + NAMES[dt], lambda x: torch.flatten(x[0]),
                [make(g, (2, 3, 4), dt)], params={"transposed": [0]})
    g = gen_for("flatten_0d")
    fo.case("0d_f32", lambda x: torch.flatten(x[0]), [make(g, (), F32)])
    files.append(fo)

    for op, f in (("clone", torch.clone), ("contiguous", lambda t: t.contiguous())):
        fo = OpFile(op)
        for dt in (F32, F64, F16, BF16):
            g = gen_for("%s_%s" % (op, NAMES[dt]))
            fo.case(NAMES[dt], lambda x, f=f: f(x[0]), [make(g, (3, 4), dt)])
        for dt in (F32, F64, F16, BF16):
            g = gen_for("%s_transposed_%s" % (op, NAMES[dt]))
            fo.case("transposed_" + NAMES[dt], lambda x, f=f: f(x[0]), [make(g, (2, 3, 4), dt)],
                    params={"transposed": [0]})
        files.append(fo)

    for op, f in (("detach", lambda t: t.detach()), ("to", lambda t: t.to("cpu"))):
        fo = OpFile(op)
        for dt in (F32, F64, F16, BF16):
            g = gen_for("%s_%s" % (op, NAMES[dt]))
            fo.case(NAMES[dt], lambda x, f=f: f(x[0]), [make(g, (3, 4), dt)], grads=False)
        g = gen_for(op + "_transposed_f32")
        fo.case("transposed_f32", lambda x, f=f: f(x[0]), [make(g, (3, 4), F32)],
                params={"transposed": [0]}, grads=False)
        files.append(fo)

    fo = OpFile("fill")
    for dt in (F32, F64, F16, BF16):
        for j, v in enumerate((2.5, 0.1, -1.0 / 3.0)):
            g = gen_for("fill_%d_%s" % (j, NAMES[dt]))
            fo.case("v%d_%s" % (j, NAMES[dt]), lambda x, v=v: x[0].clone().fill_(v),
                    [make(g, (3, 4), dt)], params={"value": v}, grads=False)
    g = gen_for("fill_transposed_f32")
    fo.case("transposed_f32", lambda x: x[0].clone().fill_(-7.25), [make(g, (2, 3, 4), F32)],
            params={"value": -7.25, "transposed": [0]}, grads=False)
    for dt, v in ((F16, float("-inf")), (F32, float("inf")), (F64, float("nan"))):
        g = gen_for("fill_special_" + NAMES[dt])
        fo.case("special_" + NAMES[dt], lambda x, v=v: x[0].clone().fill_(v),
                [make(g, (2, 2), dt)], params={"value": v}, grads=False)
    files.append(fo)

    fo = OpFile("zero")
    for dt in (F32, F64, F16, BF16):
        g = gen_for("zero_" + NAMES[dt])
        fo.case(NAMES[dt], lambda x: x[0].clone().zero_(), [make(g, (3, 4), dt)], grads=False)
    g = gen_for("zero_transposed_f32")
    fo.case("transposed_f32", lambda x: x[0].clone().zero_(), [make(g, (2, 3, 4), F32)],
            params={"transposed": [0]}, grads=False)
    files.append(fo)

    fo = OpFile("copy")  # input 0 is dst, input 1 src
    specs = [("same", (3, 4), F32, (3, 4), F32), ("bcast_row", (3, 4), F32, (4,), F32),
             ("bcast_col", (2, 3, 4), F64, (3, 1), F64), ("scalar", (3, 4), F32, (), F32),
             ("f64_to_f32", (3, 4), F32, (3, 4), F64), ("f32_to_f16", (3, 4), F16, (3, 4), F32),
             ("f32_to_bf16", (3, 4), BF16, (3, 4), F32), ("f16_to_f32", (3, 4), F32, (3, 4), F16),
             ("bf16_to_f16_bcast", (2, 3, 4), F16, (4,), BF16),
             ("f64_to_bf16_bcast", (2, 3), BF16, (2, 1), F64)]
    for name, sd, dd, ss, sdt in specs:
        g = gen_for("copy_" + name)
        fo.case(name, lambda x: x[0].clone().copy_(x[1]), [make(g, sd, dd), make(g, ss, sdt)],
                grads=False)
    g = gen_for("copy_transposed")  # non-contiguous destination and source
    fo.case("transposed_f32", lambda x: x[0].clone().copy_(x[1]),
            [make(g, (2, 3, 4), F32), make(g, (2, 3, 4), F32)],
            params={"transposed": [0, 1]}, grads=False)
    files.append(fo)

    fo = OpFile("add_inplace")
    shapes = {"same": ((3, 4), (3, 4)), "bcast_row": ((3, 4), (4,)),
              "bcast_3d": ((2, 3, 4), (3, 1)), "scalar": ((3, 4), ())}
    for dt in (F32, F64, F16, BF16):
        for sname, (sa, sb) in shapes.items():
            if dt in LOW and sname not in ("same", "bcast_row"):
                continue
            g = gen_for("add_inplace_%s_%s" % (sname, NAMES[dt]))
            fo.case("%s_%s" % (sname, NAMES[dt]), lambda x: x[0].clone().add_(x[1]),
                    [make(g, sa, dt), make(g, sb, dt)], grads=False)
    g = gen_for("add_inplace_transposed")
    fo.case("transposed_f32", lambda x: x[0].clone().add_(x[1]),
            [make(g, (2, 3, 4), F32), make(g, (3, 4), F32)], params={"transposed": [0, 1]},
            grads=False)
    files.append(fo)

    fo = OpFile("mul_scalar_inplace")
    for dt in (F32, F64, F16, BF16):
        for j, s in enumerate((-1.75, 0.3)):
            if dt in LOW and j > 0:
                continue
            g = gen_for("mul_scalar_inplace_%d_%s" % (j, NAMES[dt]))
            fo.case("s%d_%s" % (j, NAMES[dt]), lambda x, s=s: x[0].clone().mul_(s),
                    [make(g, (3, 4), dt)], params={"s": s}, grads=False)
    g = gen_for("mul_scalar_inplace_transposed")
    fo.case("transposed_f32", lambda x: x[0].clone().mul_(2.5), [make(g, (2, 3, 4), F32)],
            params={"s": 2.5, "transposed": [0]}, grads=False)
    files.append(fo)


def edge_cases(files):
    """Special values (inf, nan, -0, zero divisors, empty masks): forward values only, except
    where the gradient is well defined (cross entropy with every label ignored)."""
    by = {fo.op: fo for fo in files}
    inf, nan = float("inf"), float("nan")

    def t(v, dt=F32):
        return torch.tensor(v, dtype=F64).to(dt)

    def add(op, name, fn, inputs, **kw):
        by[op].case("edge_" + name, fn, inputs, grads=kw.pop("grads", False), **kw)

    bin2 = lambda f: (lambda x: f(x[0], x[1]))
    add("div", "f32", bin2(torch.div), [t([1.0, -1.0, 0.0, inf, nan, 1.0, 3.0]),
                                        t([0.0, 0.0, 0.0, 2.0, 1.0, -0.0, inf])])
    add("pow", "f32", bin2(torch.pow), [t([0.0, -2.0, -2.0, 0.0, inf, 2.0, 1.0, nan]),
                                        t([0.0, 0.5, 3.0, -1.0, -1.0, inf, nan, 0.0])])
    for op, f in (("maximum", torch.maximum), ("minimum", torch.minimum)):
        for dt in (F32, F16):
            add(op, NAMES[dt], bin2(f), [t([nan, 1.0, -inf, 2.0, -0.0], dt),
                                         t([1.0, nan, 3.0, inf, 0.0], dt)])
    for op in ("eq", "ne", "lt", "le", "gt", "ge"):
        f = getattr(torch, op)
        add(op, "nan_inf_f32", bin2(f), [t([nan, nan, 1.0, inf, -inf, -0.0]),
                                         t([nan, 1.0, nan, inf, inf, 0.0])])
    special = [0.0, -0.0, -1.0, inf, -inf, nan, 1e-30, 3.0]
    for op, f in (("neg", torch.neg), ("exp", torch.exp), ("log", torch.log),
                  ("sqrt", torch.sqrt), ("rsqrt", torch.rsqrt), ("abs", torch.abs),
                  ("relu", torch.relu), ("sigmoid", torch.sigmoid), ("tanh", torch.tanh),
                  ("gelu", F.gelu), ("gelu_tanh", lambda x: F.gelu(x, approximate="tanh"))):
        for dt in (F32, F16):
            add(op, "special_" + NAMES[dt], lambda x, f=f: f(x[0]), [t(special, dt)])
    for op, f in (("rdiv_scalar", lambda x: 2.0 / x), ("pow_scalar", lambda x: torch.pow(x, -1.5))):
        s = 2.0 if op == "rdiv_scalar" else -1.5
        add(op, "special_f32", lambda x, f=f: f(x[0]), [t(special)], params={"s": s})
    rows = [[1.0, inf, 2.0], [-inf, 0.0, 1.0], [nan, 0.0, 1.0], [inf, -inf, 0.0]]
    for op, f in (("sum", torch.sum), ("mean", torch.mean), ("max", torch.amax)):
        add(op, "special_f32", lambda x, f=f: f(x[0], dim=(1,)), [t(rows)],
            params={"dims": [1], "keepdim": 0})
    add("max_all", "nan_f32", lambda x: torch.max(x[0]), [t([[1.0, nan], [inf, 2.0]])])
    add("sum_all", "inf_f32", lambda x: torch.sum(x[0]), [t([[1.0, inf], [2.0, 3.0]])])
    add("sum", "overflow_f16", lambda x: torch.sum(x[0], dim=(1,)),
        [t([[60000.0, 60000.0], [65504.0, -65504.0]], F16)], params={"dims": [1], "keepdim": 0})
    add("mean", "no_overflow_f16", lambda x: torch.mean(x[0], dim=(1,)),
        [t([[60000.0, 60000.0, 30000.0], [65504.0, 65504.0, 65504.0]], F16)],
        params={"dims": [1], "keepdim": 0})
    masked = [[-inf, 0.0, 1.0, -inf], [-inf, -inf, -inf, -inf], [5.0, -inf, 5.0, 0.0]]
    for op, f in (("softmax", torch.softmax), ("log_softmax", torch.log_softmax)):
        add(op, "masked_f32", lambda x, f=f: f(x[0], -1), [t(masked)], params={"dim": -1})
    for dt in (F32, F64):
        g = gen_for("ce_all_ignored_" + NAMES[dt])
        add("cross_entropy", "all_ignored_" + NAMES[dt], lambda x: F.cross_entropy(x[0], x[1]),
            [make(g, (3, 4), dt), torch.tensor([-100, -100, -100])], grads=True)
    add("mse_loss", "inf_f32", bin2(F.mse_loss), [t([1.0, inf, 2.0]), t([0.0, 1.0, 2.0])])
    for dst in (F16, BF16):
        add("cast", "special_f32_" + NAMES[dst], lambda x, d=dst: x[0].to(d),
            [t([nan, inf, -inf, -0.0, 1e-45, 3.4e38])], target=dst)


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "test", "golden")
    os.makedirs(outdir, exist_ok=True)
    torch.set_num_threads(1)  # reproducible reductions
    files = []
    for gen in (binary_ops, scalar_ops, unary_ops, compare_ops, where_op, reduce_ops,
                softmax_ops, matmul_op, linear_op, linear_act_op, gen_golden_cnn.conv_ops,
                gen_golden_cnn.pool_ops, loss_ops, join_ops, cast_op, view_ops, copy_ops):
        gen(files)
    edge_cases(files)
    gen_golden_nn.nn_ops(files)
    gen_golden_nonfinite.nonfinite_cases(files)
    total = 0
    for fo in files:
        fo.write(outdir)
        total += fo.cases
    with open(os.path.join(outdir, "INDEX"), "w") as f:
        f.write("# ops with a golden file, generated by tools/gen_golden.py\n")
        f.write("\n".join(fo.op for fo in files) + "\n")
    print("wrote %d ops, %d cases to %s" % (len(files), total, os.path.normpath(outdir)))


if __name__ == "__main__":
    main()
