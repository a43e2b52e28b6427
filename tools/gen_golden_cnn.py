"""Golden cases for the convolutional ops of issue 9 (conv2d, max/avg/adaptive pooling,
including max pooling's tie-breaking), called by tools/gen_golden.py. NCHW and NHWC: a
`channels_last` param lists the inputs fed to the op as channels-last copies of their leaves."""
import torch
import torch.nn.functional as F

from golden_common import BF16, F16, F32, F64, NAMES, OpFile, gen_for, make

CL = torch.channels_last


def conv_ops(files):
    """conv2d: NCHW and NHWC (param channels_last: those inputs are fed to the op as
    channels-last copies of their leaves), F32/F64 with gradients, F16/BF16 forward, and
    O1 BF16 autocast with gradients of the FP32 leaves."""
    fo = OpFile("conv2d")
    geoms = {  # x shape, w shape, stride, padding, dilation, groups, bias
        "basic": ((2, 3, 6, 5), (4, 3, 3, 3), (1, 1), (1, 1), (1, 1), 1, True),
        "strided": ((1, 4, 9, 8), (6, 2, 3, 2), (2, 1), (1, 0), (1, 2), 2, True),
        "depthwise": ((2, 4, 7, 7), (4, 1, 3, 3), (2, 2), (1, 1), (1, 1), 4, False),
        "pointwise": ((2, 8, 4, 4), (5, 8, 1, 1), (1, 1), (0, 0), (1, 1), 1, True),
    }
    for gname, (xs, ws, st, pad, dil, grp, bias) in geoms.items():
        params = {"stride": list(st), "padding": list(pad), "dilation": list(dil), "groups": grp}

        def fn(t, st=st, pad=pad, dil=dil, grp=grp, cl=False):
            x = t[0].to(memory_format=CL) if cl else t[0]
            return F.conv2d(x, t[1], t[2] if len(t) > 2 else None, st, pad, dil, grp)

        for dt in (F32, F64, BF16, F16):
            for cl in (False, True):
                if dt == F64 and cl:
                    continue
                name = "%s_%s_%s" % (gname, "nhwc" if cl else "nchw", NAMES[dt])
                g = gen_for("conv2d_" + name)
                ins = [make(g, xs, dt), make(g, ws, dt)] + ([make(g, (ws[0],), dt)] if bias else [])
                pr = dict(params, channels_last=[0]) if cl else params
                fo.case(name, lambda t, fn=fn, cl=cl: fn(t, cl=cl), ins, params=pr)
        for cl in (False, True):
            name = "%s_%s_autocast_bf16" % (gname, "nhwc" if cl else "nchw")
            g = gen_for("conv2d_" + name)
            ins = [make(g, xs, F32), make(g, ws, F32)] + ([make(g, (ws[0],), F32)] if bias else [])
            pr = dict(params, channels_last=[0]) if cl else params
            fo.case(name, lambda t, fn=fn, cl=cl: fn(t, cl=cl), ins, params=pr, autocast=BF16)
    files.append(fo)


def pool_ops(files):
    """max_pool2d, avg_pool2d, adaptive_avg_pool2d: NCHW and NHWC, F32/F64 with gradients,
    BF16 forward."""
    windows = {  # kernel, stride, padding, ceil_mode, count_include_pad
        "k3s2p1": ((3, 3), (2, 2), (1, 1), False, True),
        "k3s2p1_ceil": ((3, 3), (2, 2), (1, 1), True, True),
        "k3s2p1_ceil_nopad": ((3, 3), (2, 2), (1, 1), True, False),
        "k2": ((2, 2), (2, 2), (0, 0), False, True),
        "k32s12p11_ceil": ((3, 2), (1, 2), (1, 1), True, True),
    }
    for op in ("max_pool2d", "avg_pool2d"):
        fo = OpFile(op)
        for wname, (k, st, pad, ceil, incl) in windows.items():
            if op == "max_pool2d" and not incl:
                continue
            params = {"kernel": list(k), "stride": list(st), "padding": list(pad),
                      "ceil_mode": ceil, "count_include_pad": incl}

            def fn(t, k=k, st=st, pad=pad, ceil=ceil, incl=incl, cl=False, op=op):
                x = t[0].to(memory_format=CL) if cl else t[0]
                if op == "max_pool2d":
                    return F.max_pool2d(x, k, st, pad, ceil_mode=ceil)
                return F.avg_pool2d(x, k, st, pad, ceil_mode=ceil, count_include_pad=incl)

            for dt in (F32, F64, BF16):
                for cl in (False, True):
                    if dt == F64 and cl:
                        continue
                    name = "%s_%s_%s" % (wname, "nhwc" if cl else "nchw", NAMES[dt])
                    g = gen_for(op + "_" + name)
                    pr = dict(params, channels_last=[0]) if cl else params
                    fo.case(name, lambda t, fn=fn, cl=cl: fn(t, cl=cl), [make(g, (2, 3, 7, 8), dt)],
                            params=pr)
        if op == "max_pool2d":
            max_pool_ties(fo)
        files.append(fo)
    fo = OpFile("adaptive_avg_pool2d")
    for size in ((3, 4), (1, 1), (7, 8), (5, 3)):
        for dt in (F32, F64, BF16):
            for cl in (False, True):
                if dt == F64 and cl:
                    continue
                name = "%dx%d_%s_%s" % (size[0], size[1], "nhwc" if cl else "nchw", NAMES[dt])
                g = gen_for("adaptive_avg_pool2d_" + name)
                pr = {"output_size": list(size)}
                if cl:
                    pr["channels_last"] = [0]
                fo.case(name, lambda t, size=size, cl=cl: F.adaptive_avg_pool2d(
                    t[0].to(memory_format=CL) if cl else t[0], size),
                    [make(g, (2, 3, 7, 8), dt)], params=pr)
    files.append(fo)


def max_pool_ties(fo):
    """max_pool2d on inputs full of ties (values in {-2, .., 2}), NaNs and -inf, over
    overlapping, padded and ceil_mode windows: the gradient shows which element of each
    window torch picks (the first maximum in row-major order; the last NaN), so a wrong
    argmax or index scheme fails here."""
    windows = {  # kernel, stride, padding, ceil_mode
        "k3s1p1": ((3, 3), (1, 1), (1, 1), False),
        "k3s2p1_ceil": ((3, 3), (2, 2), (1, 1), True),
        "k32s12p11_ceil": ((3, 2), (1, 2), (1, 1), True),
        "k2s1": ((2, 2), (1, 1), (0, 0), False),
    }
    for wname, (k, st, pad, ceil) in windows.items():
        params = {"kernel": list(k), "stride": list(st), "padding": list(pad),
                  "ceil_mode": ceil, "count_include_pad": True}
        for dt in (F32, F64):
            for cl in (False, True):
                if dt == F64 and cl:
                    continue
                name = "ties_%s_%s_%s" % (wname, "nhwc" if cl else "nchw", NAMES[dt])
                g = gen_for("max_pool2d_" + name)
                n = torch.randn((2, 5, 7, 9), generator=g, dtype=F64)
                u = torch.rand((2, 5, 7, 9), generator=g, dtype=F64)
                v = torch.round(n * 1.2).clamp(-2.0, 2.0)
                v = torch.where(u < 0.04, torch.full_like(v, float("nan")), v)
                v = torch.where((u >= 0.04) & (u < 0.12), torch.full_like(v, -float("inf")), v)
                pr = dict(params, channels_last=[0]) if cl else params
                fo.case(name, lambda t, k=k, st=st, pad=pad, ceil=ceil, cl=cl: F.max_pool2d(
                    t[0].to(memory_format=CL) if cl else t[0], k, st, pad, ceil_mode=ceil),
                    [v.to(dt)], params=pr)
