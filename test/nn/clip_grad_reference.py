#!/usr/bin/env python3
"""Reference values for test/nn/clip_grad_test.cpp ("clip_grad_norm matches PyTorch 1.13's clip_grad_norm_").

Run with Debian's python3-torch (1.13): python3 test/nn/clip_grad_reference.py
Builds the test's three gradients (shapes 4x3, 3, 5; g[k] = sin(0.37 (k + offset)) * 1.5 in float32, offsets
1, 101, 201), calls torch.nn.utils.clip_grad_norm_ for each (norm_type, max_norm) below and prints a Ref line
per case: norm_type, max_norm, the returned total norm, the first element of each gradient after clipping.
ddp does not depend on Python: the printed lines are pasted into the test.
"""
import math

import torch

SHAPES = [(4, 3), (3,), (5,)]


def grads(scale=1.5):
    out = []
    for i, shape in enumerate(SHAPES):
        n = math.prod(shape)
        g = torch.tensor([math.sin(0.37 * (k + 1 + 100 * i)) for k in range(n)], dtype=torch.float64)
        out.append((g.to(torch.float32) * scale).reshape(shape))
    return out


for norm_type, max_norm in [(2.0, 1.0), (1.0, 2.0), (3.0, 0.5), (math.inf, 0.25), (2.0, 100.0)]:
    params = []
    for g in grads():
        p = torch.zeros(g.shape, requires_grad=True)
        p.grad = g.clone()
        params.append(p)
    total = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type)
    first = ", ".join(f"{p.grad.reshape(-1)[0].item():.9g}f" for p in params)
    nt = "kInf" if math.isinf(norm_type) else f"{norm_type}"
    print(f"Ref{{{nt}, {max_norm}, {total.item():.9g}, {{{first}}}}},")
print("torch", torch.__version__)
