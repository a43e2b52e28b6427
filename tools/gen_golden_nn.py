"""Golden cases for the nn ops of issue 9 (normalisation and indexing), called by
tools/gen_golden.py. Low-precision normalisation cases follow the MIXED rule
(OpFile.case(mixed=True)): a F16/BF16 activation with FP32 parameters whose values are exact
in both low dtypes, so rounding them would change nothing either way. Dropout has no golden
file: its mask comes from mixtape's Philox stream, not torch's generator (test/test_dropout.c
checks it statistically)."""
import torch
import torch.nn.functional as F

from golden_common import BF16, F16, F32, F64, NAMES, OpFile, gen_for, make


def _param(gen, shape, dt):
    """FP32 (F64 for F64 activations) parameters; for low-precision activations the values
    are BF16-exact (and so F16-exact at these magnitudes)."""
    if dt == F64:
        return make(gen, shape, F64)
    return make(gen, shape, BF16).to(F32)


def layer_norm_cases(files):
    fo = OpFile("layer_norm")
    for dt in (F32, F64, F16, BF16):
        for nd, affine in ((1, True), (2, True), (1, False)):
            name = "nd%d_%s_%s" % (nd, "affine" if affine else "plain", NAMES[dt])
            gen = gen_for("layer_norm_" + name)
            x = make(gen, (2, 3, 5), dt)
            ins = [x]
            if affine:
                shape = (3, 5)[2 - nd:]
                ins += [_param(gen, shape, dt), _param(gen, shape, dt)]

            def fn(t, nd=nd):
                shape = tuple(t[0].shape[-nd:])
                return F.layer_norm(t[0], shape, *(t[1:] or [None, None]), eps=1e-5)
            fo.case(name, fn, ins, params={"normalized_ndim": nd, "eps": 1e-5}, mixed=True)
    # A large mean over a small spread: torch's FP32 kernel loses digits to cancellation
    # here, so the reference is computed in F64 and rounded once.
    gen = gen_for("layer_norm_offset")
    x = (make(gen, (3, 8), F64) * 0.01 + 100.0).to(F32)
    fo.case("offset_f32", lambda t: F.layer_norm(t[0].double(), (8,), eps=1e-5).float(), [x],
            params={"normalized_ndim": 1, "eps": 1e-5}, grads=False)
    # An inf in one row and a NaN in another: those rows are NaN (the variance is inf - inf
    # or NaN), the middle row is untouched, and so are its gradients; the affine parameters'
    # gradients, sums over the rows, are NaN.
    for dt in (F32, F16):
        gen = gen_for("layer_norm_nonfinite_" + NAMES[dt])
        x = make(gen, (3, 5), dt)
        x[0, 2], x[2, 4] = float("inf"), float("nan")
        w, b = _param(gen, (5,), dt), _param(gen, (5,), dt)
        fo.case("nonfinite_" + NAMES[dt],
                lambda t: F.layer_norm(t[0], (5,), t[1], t[2], eps=1e-5), [x, w, b],
                params={"normalized_ndim": 1, "eps": 1e-5}, mixed=True)
    files.append(fo)


def _bn(t, training, relu, residual):
    """t = [x, running_mean, running_var, weight, bias, (residual)]: torch updates the running
    buffers in place (the stored inputs are the values before)."""
    y = F.batch_norm(t[0], t[1], t[2], t[3], t[4], training=training, momentum=0.1, eps=1e-5)
    if residual:
        y = y + t[5]
    return F.relu(y) if relu else y


def batch_norm_cases(files):
    fo, fa, fs = OpFile("batch_norm"), OpFile("batch_norm_act"), OpFile("batch_norm_stats")
    for dt in (F32, F64, F16, BF16):
        for shape in ((4, 3, 2, 3), (6, 3)):
            for training in (True, False):
                name = "%s_%s_%s" % ("x".join(map(str, shape)), "train" if training else "eval",
                                     NAMES[dt])
                gen = gen_for("batch_norm_" + name)
                pdt = F64 if dt == F64 else F32
                x = make(gen, shape, dt)
                rm = make(gen, (3,), pdt)
                rv = (make(gen, (3,), F64, "positive")).to(pdt)
                w, b = _param(gen, (3,), dt), _param(gen, (3,), dt)
                rg = [True, False, False, True, True]
                prm = {"training": int(training), "momentum": 0.1, "eps": 1e-5}
                fo.case(name, lambda t, tr=training: _bn(t, tr, False, False), [x, rm, rv, w, b],
                        rg=rg, params=prm, mixed=True)
                res = make(gen, shape, dt)
                fa.case(name, lambda t, tr=training: _bn(t, tr, True, True),
                        [x, rm, rv, w, b, res], rg=rg + [True], params=prm, mixed=True)
                if training and len(shape) == 4:
                    # the running statistics after one training step: [2, C]
                    fs.case(name, lambda t: (_bn(t, True, False, False),
                                             torch.stack([t[1], t[2]]))[1],
                            [x, rm.clone(), rv.clone(), w, b], rg=[False] * 5, params=prm,
                            grads=False, mixed="fp32 output")
    # NHWC F16 with C a multiple of 4 (channels-last x and residual): on CUDA the training
    # case runs through cuDNN's fused Ex batch norm, the eval one through the own kernels
    for training in (True, False):
        name = "4x8x2x3_nhwc_%s_f16" % ("train" if training else "eval")
        gen = gen_for("batch_norm_act_" + name)
        x, res = make(gen, (4, 8, 2, 3), F16), make(gen, (4, 8, 2, 3), F16)
        rm, rv = make(gen, (8,), F32), make(gen, (8,), F64, "positive").to(F32)
        w, b = _param(gen, (8,), F16), _param(gen, (8,), F16)
        prm = {"training": int(training), "momentum": 0.1, "eps": 1e-5, "channels_last": [0, 5]}
        fa.case(name, lambda t, tr=training: _bn(t, tr, True, True), [x, rm, rv, w, b, res],
                rg=[True, False, False, True, True, True], params=prm, mixed=True)
    _batch_norm_nonfinite(fo, fa, fs)
    gen = gen_for("batch_norm_offset")  # as layer_norm's offset case: an F64 reference
    x = (make(gen, (4, 2, 3), F64) * 0.01 + 100.0).to(F32)
    ins = [x, torch.zeros(2), torch.ones(2), torch.ones(2), torch.zeros(2)]
    fo.case("offset_train_f32",
            lambda t: F.batch_norm(t[0].double(), t[1].double(), t[2].double(), t[3].double(),
                                   t[4].double(), training=True, eps=1e-5).float(), ins,
            params={"training": 1, "momentum": 0.1, "eps": 1e-5}, grads=False)
    files += [fo, fa, fs]


def _batch_norm_nonfinite(fo, fa, fs):
    """An inf in channel 1 in training: that channel's outputs and gradients and its running
    variance are NaN, its running mean inf, as torch's; the other channels are untouched.
    NCHW F32 and F16, and the fused op on NHWC F16 with C a multiple of 4 (cuDNN's Ex path on
    CUDA)."""
    rg = [True, False, False, True, True]
    for dt, shape, nhwc in ((F32, (4, 3, 2, 3), False), (F16, (4, 3, 2, 3), False),
                            (F16, (4, 8, 2, 3), True)):
        c = shape[1]
        name = "nonfinite_%s_%strain_%s" % ("x".join(map(str, shape)), "nhwc_" if nhwc else "",
                                            NAMES[dt])
        gen = gen_for("batch_norm_" + name)
        x, res = make(gen, shape, dt), make(gen, shape, dt)
        x[2, 1, 1, 0] = float("inf")
        rm, rv = make(gen, (c,), F32), make(gen, (c,), F64, "positive").to(F32)
        w, b = _param(gen, (c,), dt), _param(gen, (c,), dt)
        prm = {"training": 1, "momentum": 0.1, "eps": 1e-5}
        if nhwc:
            prm["channels_last"] = [0, 5]
        fa.case(name, lambda t: _bn(t, True, True, True), [x, rm, rv, w, b, res],
                rg=rg + [True], params=prm, mixed=True)
        if nhwc:
            continue
        fo.case(name, lambda t: _bn(t, True, False, False), [x, rm, rv, w, b], rg=rg,
                params=prm, mixed=True)
        fs.case(name, lambda t: (_bn(t, True, False, False), torch.stack([t[1], t[2]]))[1],
                [x, rm.clone(), rv.clone(), w, b], rg=[False] * 5, params=prm, grads=False,
                mixed="fp32 output")


def index_cases(files):
    fe = OpFile("embedding")
    for dt in (F32, F64, F16, BF16):
        gen = gen_for("embedding_" + NAMES[dt])
        w = make(gen, (6, 4), dt)
        idx = torch.tensor([[5, 0, 5], [2, 5, 1]])
        fe.case(NAMES[dt], lambda t: F.embedding(t[1], t[0]), [w, idx], rg=[True, False])
    files.append(fe)
    fi = OpFile("index_select")
    for dt in (F32, F64, BF16):
        for dim in (0, 1, -1):
            gen = gen_for("index_select_%d_%s" % (dim, NAMES[dt]))
            x = make(gen, (3, 4, 5), dt)
            n = x.shape[dim]
            idx = torch.tensor([n - 1, 0, n - 1, 1])
            fi.case("dim%s_%s" % (str(dim).replace("-", "m"), NAMES[dt]),
                    lambda t, d=dim: torch.index_select(t[0], d, t[1]), [x, idx],
                    rg=[True, False], params={"dim": dim})
    files.append(fi)
    fg = OpFile("gather")
    for dt in (F32, F64, F16):
        for dim in (0, 1):
            gen = gen_for("gather_%d_%s" % (dim, NAMES[dt]))
            x = make(gen, (3, 4), dt)
            idx = torch.randint(0, x.shape[dim], (2, 3), generator=gen)
            fg.case("dim%d_%s" % (dim, NAMES[dt]),
                    lambda t, d=dim: torch.gather(t[0], d, t[1]), [x, idx], rg=[True, False],
                    params={"dim": dim})
    files.append(fg)
    fm = OpFile("argmax")
    for dt in (F32, F64, F16, BF16):
        gen = gen_for("argmax_" + NAMES[dt])
        x = make(gen, (3, 4, 5), dt)
        x[0, 1, 2] = x[0, 0, 2]  # a tie: the first index wins
        for dim, keep in ((1, False), (-1, True), (0, False)):
            fm.case("dim%s%s_%s" % (str(dim).replace("-", "m"), "_keep" if keep else "",
                                     NAMES[dt]),
                    lambda t, d=dim, k=keep: torch.argmax(t[0], dim=d, keepdim=k), [x],
                    params={"dim": dim, "keepdim": int(keep)})
    files.append(fm)


def nn_ops(files):
    layer_norm_cases(files)
    batch_norm_cases(files)
    index_cases(files)
