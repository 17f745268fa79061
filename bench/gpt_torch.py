#!/usr/bin/env python3
"""The character-level GPT of ../shared/fixtures/pytorch/README-gpt.md trained in PyTorch (CPU), with nanoGPT's
shakespeare_char CPU recipe: the reference that ddp's GPT training is compared with (tokens/s, peak memory,
validation loss). Not part of the build or the tests, and imported by nothing: run it by hand.

Model: tied head, pre-LN blocks, causal attention as an explicit masked softmax, exact (erf) GELU, LayerNorm with
bias; n_layer 4, n_head 4, n_embd 128, block 64, dropout 0. nanoGPT's init: normal(0, 0.02) for Linear and
Embedding weights, normal(0, 0.02/sqrt(2*n_layer)) for both c_proj weights, zero biases.
Training: batch 12 sequences of 64 tokens per rank, AdamW (betas 0.9/0.99, weight decay 0.1 on parameters with
dim >= 2, 0 on the rest), lr 1e-3 with 100 warm-up iterations then cosine to 1e-4 at 2000, grad clip 1.0. Batches
as nanoGPT's get_batch: torch.randint offsets into the first 90% of the tokens, from a generator seeded with
seed + rank. --world-size 2 runs torch's DistributedDataParallel over gloo on localhost, one process and one
thread per rank; each rank takes its own 12 sequences, so a step processes 12·64·world_size tokens.

Run it with Debian's python3-torch (tools/setup.sh installs it for /usr/bin/python3), from any directory:
  /usr/bin/python3 bench/gpt_torch.py --iters 200 --world-size 2 --bench --eval

usage: gpt_torch.py [--iters N] [--world-size 1|2] [--data PATH] [--bench] [--eval] [--seed S]
  --iters       optimizer steps (default 2000, nanoGPT's max_iters)
  --world-size  1: one process, no DDP; 2: DDP over gloo (default 1)
  --data        the corpus (default third_party/tinyshakespeare/input.txt next to this script)
  --bench       time the steps after 5 warm-up steps; print `torch tokens/s: ...` (all ranks' tokens) and rank
                0's peak RSS (getrusage)
  --eval        at the end, the validation loss over the whole validation split, in consecutive non-overlapping
                blocks of 64 tokens (offsets 0, 64, 128, ... while o + 65 <= n), as ddp's BlockBatcher::eval_offsets
"""
import argparse
import math
import os
import resource
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_DATA = os.path.join(HERE, "..", "third_party", "tinyshakespeare", "input.txt")

# nanoGPT's config/train_shakespeare_char.py with its CPU settings.
N_LAYER, N_HEAD, N_EMBD, BLOCK_SIZE, BATCH_SIZE = 4, 4, 128, 64, 12
LEARNING_RATE, MIN_LR, WARMUP_ITERS, LR_DECAY_ITERS = 1e-3, 1e-4, 100, 2000
BETAS, WEIGHT_DECAY, GRAD_CLIP = (0.9, 0.99), 0.1, 1.0
WARMUP_STEPS = 5  # steps left out of the --bench timing
EVAL_BATCH = 64  # blocks per forward pass of --eval


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(N_EMBD, 3 * N_EMBD)
        self.c_proj = nn.Linear(N_EMBD, N_EMBD)
        # A plain attribute, not a buffer: DDP broadcasts buffers, and gloo has no bool type.
        self.mask = torch.tril(torch.ones(BLOCK_SIZE, BLOCK_SIZE, dtype=torch.bool)).view(1, 1, BLOCK_SIZE, BLOCK_SIZE)

    def forward(self, x):  # x: (B, T, C)
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(N_EMBD, dim=2)
        q, k, v = (z.view(b, t, N_HEAD, c // N_HEAD).transpose(1, 2) for z in (q, k, v))  # (B, H, T, C/H)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // N_HEAD))
        att = att.masked_fill(~self.mask[:, :, :t, :t], float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.c_proj(y)


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc = nn.Linear(N_EMBD, 4 * N_EMBD)
        self.gelu = nn.GELU()  # approximate="none": x·Φ(x), the exact (erf) form
        self.c_proj = nn.Linear(4 * N_EMBD, N_EMBD)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(N_EMBD, eps=1e-5)
        self.attn = CausalSelfAttention()
        self.ln_2 = nn.LayerNorm(N_EMBD, eps=1e-5)
        self.mlp = Mlp()

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Gpt(nn.Module):
    """Parameter names as the fixtures' `params` (wte.weight, h.0.attn.c_attn.weight, ..., ln_f.bias)."""

    def __init__(self, vocab_size):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, N_EMBD)
        self.wpe = nn.Embedding(BLOCK_SIZE, N_EMBD)
        self.h = nn.ModuleList(Block() for _ in range(N_LAYER))
        self.ln_f = nn.LayerNorm(N_EMBD, eps=1e-5)
        for name, p in self.named_parameters():  # nanoGPT's _init_weights, then its c_proj rescale
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * N_LAYER))
            elif name.startswith("ln") or ".ln_" in name:
                pass  # LayerNorm: weight 1, bias 0 (PyTorch's defaults)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)
            else:
                nn.init.normal_(p, mean=0.0, std=0.02)

    def forward(self, idx, targets):  # idx, targets: (B, T) int64
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for block in self.h:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # the tied head, no bias
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def load_corpus(path):
    with open(path, "rb") as f:
        data = f.read()
    if not data:
        sys.exit(f"gpt_torch.py: {path} is empty")
    chars = sorted(set(data))  # bytes, as ddp::data::CharVocab
    table = torch.full((256,), -1, dtype=torch.long)
    table[torch.tensor(chars)] = torch.arange(len(chars))
    ids = table[torch.frombuffer(bytearray(data), dtype=torch.uint8).long()]
    n = len(ids)
    return len(chars), ids[: int(n * 0.9)], ids[int(n * 0.9) :]


def get_lr(it):  # nanoGPT's train.py
    if it < WARMUP_ITERS:
        return LEARNING_RATE * (it + 1) / (WARMUP_ITERS + 1)
    if it > LR_DECAY_ITERS:
        return MIN_LR
    ratio = (it - WARMUP_ITERS) / (LR_DECAY_ITERS - WARMUP_ITERS)
    return MIN_LR + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (LEARNING_RATE - MIN_LR)


def get_batch(data, gen):  # nanoGPT's get_batch
    ix = torch.randint(len(data) - BLOCK_SIZE, (BATCH_SIZE,), generator=gen)
    x = torch.stack([data[i : i + BLOCK_SIZE] for i in ix])
    y = torch.stack([data[i + 1 : i + 1 + BLOCK_SIZE] for i in ix])
    return x, y


@torch.no_grad()
def val_loss(model, val):
    """Mean cross-entropy over every target of the consecutive non-overlapping blocks covering `val`."""
    model.eval()
    offsets = list(range(0, len(val) - BLOCK_SIZE, BLOCK_SIZE))  # o + T + 1 <= n
    total, count = 0.0, 0
    for i in range(0, len(offsets), EVAL_BATCH):
        chunk = offsets[i : i + EVAL_BATCH]
        x = torch.stack([val[o : o + BLOCK_SIZE] for o in chunk])
        y = torch.stack([val[o + 1 : o + 1 + BLOCK_SIZE] for o in chunk])
        total += model(x, y).item() * y.numel()
        count += y.numel()
    model.train()
    return total / count, len(offsets)


def run(rank, args, port):
    torch.set_num_threads(1)
    world = args.world_size
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    vocab_size, train, val = load_corpus(args.data)
    torch.manual_seed(args.seed)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    model = Gpt(vocab_size)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0.0}],
        lr=LEARNING_RATE,
        betas=BETAS,
    )
    ddp_model = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    gen = torch.Generator().manual_seed(args.seed + rank)
    if rank == 0:
        n_params = sum(p.numel() for p in model.parameters())
        print(
            f"gpt_torch: {n_params / 1e6:.2f}M parameters, vocab {vocab_size}, train {len(train)} / val {len(val)}"
            f" tokens, world size {world}, torch {torch.__version__}",
            flush=True,
        )
    start = None
    for it in range(args.iters):
        if it == WARMUP_STEPS:
            start = time.perf_counter()
        for group in opt.param_groups:
            group["lr"] = get_lr(it)
        x, y = get_batch(train, gen)
        loss = ddp_model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        opt.step()
        if rank == 0 and (it % args.log_interval == 0 or it == args.iters - 1):
            print(f"iter {it}: loss {loss.item():.4f}, grad norm {norm.item():.4f}, lr {get_lr(it):.2e}", flush=True)
    elapsed = time.perf_counter() - start if start is not None else None
    if rank == 0 and args.bench:
        timed = args.iters - WARMUP_STEPS
        tokens = timed * BATCH_SIZE * BLOCK_SIZE * world
        rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
        print(
            f"torch tokens/s: {tokens / elapsed:.0f} (world size {world}, {BATCH_SIZE}x{BLOCK_SIZE} tokens per rank"
            f" per step, {timed} steps timed after {WARMUP_STEPS} warm-up, 1 thread per rank,"
            f" torch {torch.__version__}; peak RSS rank 0: {rss_mib:.1f} MiB)",
            flush=True,
        )
    if rank == 0 and args.eval:
        loss, blocks = val_loss(model, val)
        print(f"val loss: {loss:.4f} ({blocks} blocks of {BLOCK_SIZE}, the whole validation split)", flush=True)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iters", type=int, default=LR_DECAY_ITERS, help="optimizer steps (default %(default)s)")
    p.add_argument("--world-size", type=int, choices=(1, 2), default=1, help="1: no DDP; 2: DDP over gloo")
    p.add_argument("--data", default=DEFAULT_DATA, help="the corpus (default: the vendored tinyshakespeare)")
    p.add_argument("--bench", action="store_true", help="print tokens/s and rank 0's peak RSS")
    p.add_argument("--eval", action="store_true", help="print the loss over the whole validation split")
    p.add_argument("--seed", type=int, default=1337, help="init and batch seed (default %(default)s)")
    p.add_argument("--log-interval", type=int, default=100, help="print the loss every N steps")
    args = p.parse_args()
    if args.iters < 1:
        p.error("--iters must be positive")
    if args.bench and args.iters <= WARMUP_STEPS:
        p.error(f"--bench times the steps after {WARMUP_STEPS} warm-up steps: --iters must be more than that")
    if not os.path.isfile(args.data):
        p.error(f"--data {args.data}: no such file")
    if args.world_size == 1:
        run(0, args, None)
    else:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        mp.spawn(run, args=(args, free_port()), nprocs=args.world_size, join=True)


if __name__ == "__main__":
    main()
