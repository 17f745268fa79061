#!/usr/bin/env python3
"""PyTorch's step time for the main job's two networks on one GPU, to set beside `fashion_mnist_cuda --device cuda`
(bench/RESULTS.md, issue 10). Not part of the build or the tests: run it on a GPU machine that has PyTorch.

The same networks as examples/common/models.hpp, AdamW (lr 1e-3, weight decay 0.01), random data already on the
GPU, cross-entropy, loss.item() every step (ddp reads its loss on the host every step too), TF32 off (ddp uses
no tensor-op math). Prints the median of 5 blocks of 100 steps after 50 warm-up steps, in ms per step.
usage: torch_step.py [--deterministic]   (cudnn.deterministic, as ddp's algorithms are)
"""
import statistics
import sys
import time

import torch
import torch.nn as nn

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.backends.cudnn.deterministic = "--deterministic" in sys.argv


def cnn():
    return nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Dropout(0.25), nn.Flatten(), nn.Linear(9216, 128), nn.ReLU(), nn.Dropout(0.5),
                         nn.Linear(128, 10))


def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                         nn.Linear(128, 10))


def step_ms(make, batch):
    dev = torch.device("cuda")
    torch.manual_seed(1)
    model = make().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    x = torch.randn(batch, 1, 28, 28, device=dev)
    y = torch.randint(0, 10, (batch,), device=dev)
    loss_fn = nn.CrossEntropyLoss()

    def one():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    for _ in range(50):
        one()
    blocks = []
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(100):
            one()
        torch.cuda.synchronize()
        blocks.append((time.perf_counter() - t0) * 10)  # ms per step
    return statistics.median(blocks)


print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, {torch.cuda.get_device_name(0)}, "
      f"deterministic={torch.backends.cudnn.deterministic}")
for name, make in (("cnn", cnn), ("mlp", mlp)):
    for batch in (64, 256):
        print(f"{name} batch {batch}: {step_ms(make, batch):.2f} ms/step")
