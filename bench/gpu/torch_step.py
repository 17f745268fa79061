#!/usr/bin/env python3
"""PyTorch's step time for the main job's two networks on one GPU, to set beside `fashion_mnist_cuda --device cuda`
(bench/RESULTS.md, issue 10). Not part of the build or the tests: run it on a GPU machine that has PyTorch.

The same networks as examples/common/models.hpp, AdamW (lr 1e-3, weight decay 0.01), random data already on the
GPU, cross-entropy, loss.item() every step (ddp reads its loss on the host every step too), TF32 off (ddp uses
no tensor-op math). Prints the median of 5 blocks of 100 steps after 50 warm-up steps, in ms per step.
usage: torch_step.py [--deterministic] [--precision fp32|tf32|bf16|fp16] [--cuda-graph]
  --deterministic  cudnn.deterministic, as ddp's algorithms are
  --precision      fp32 (default); tf32 (TF32 matmuls and convolutions); bf16 or fp16: torch.autocast with that
                   dtype (fp16 with torch.cuda.amp.GradScaler), as `fashion_mnist_cuda --precision` is compared with
  --cuda-graph     the whole step (forward, backward, optimizer) captured once in a CUDA graph and replayed; the
                   loss is read every step from the graph's static output
"""
import statistics
import sys
import time

import torch
import torch.nn as nn


def option(flag, default):
    return sys.argv[sys.argv.index(flag) + 1] if flag in sys.argv else default


PRECISION = option("--precision", "fp32")
if PRECISION not in ("fp32", "tf32", "bf16", "fp16"):
    sys.exit(f"torch_step.py: --precision must be one of fp32|tf32|bf16|fp16, got '{PRECISION}'")
CUDA_GRAPH = "--cuda-graph" in sys.argv
AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(PRECISION)

torch.backends.cuda.matmul.allow_tf32 = PRECISION == "tf32"
torch.backends.cudnn.allow_tf32 = PRECISION == "tf32"
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
    # capturable: Adam's step count stays on the GPU, as a graph needs
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, capturable=CUDA_GRAPH)
    x = torch.randn(batch, 1, 28, 28, device=dev)
    y = torch.randint(0, 10, (batch,), device=dev)
    loss_fn = nn.CrossEntropyLoss()
    scaler = torch.cuda.amp.GradScaler() if PRECISION == "fp16" else None

    def step():
        opt.zero_grad(set_to_none=not CUDA_GRAPH)
        with torch.autocast("cuda", dtype=AUTOCAST, enabled=AUTOCAST is not None):
            loss = loss_fn(model(x), y)
        if scaler:  # a GradScaler step reads the overflow flag on the host: it cannot be captured
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        return loss

    if CUDA_GRAPH:
        if scaler:
            sys.exit("torch_step.py: --cuda-graph with --precision fp16: GradScaler's step is not capturable")
        side = torch.cuda.Stream()  # warm-up on a side stream, as PyTorch's whole-network capture recipe does
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(10):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_loss = step()

        def one():
            graph.replay()
            return static_loss.item()
    else:

        def one():
            return step().item()

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
      f"deterministic={torch.backends.cudnn.deterministic}, precision={PRECISION}, cuda_graph={CUDA_GRAPH}")
for name, make in (("cnn", cnn), ("mlp", mlp)):
    for batch in (64, 256):
        print(f"{name} batch {batch}: {step_ms(make, batch):.2f} ms/step")
