#!/usr/bin/env python3
"""Time transformer kernels on a CUDA GPU and write them as tandem calibration data.

Usage (set-up and schema: calibration/README.md):

    python3 calibration/collect.py --out calibration/data/<gpu>/ [--dtype bf16] [--quick]

Every kernel is warmed up, then timed with CUDA events over repeated runs; the CSV records the
median and the spread. With more than one visible GPU, all-reduce and all-gather are timed
with NCCL across all of them.
"""

import argparse
import csv
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys

import torch
import torch.nn.functional as F

COLUMNS = [
    "gpu", "sm_clock_mhz", "mem_clock_mhz", "driver", "cuda", "torch", "dtype", "kernel",
    "batch", "m", "n", "k", "elements", "row_len", "group", "median_s", "min_s", "max_s",
    "repeats",
]
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def nvidia_smi(query):
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits", "-i", "0"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
        return out.splitlines()[0].strip()
    except (OSError, subprocess.CalledProcessError, IndexError):
        return ""


def environment(dtype):
    return {
        "gpu": torch.cuda.get_device_name(0),
        "sm_clock_mhz": nvidia_smi("clocks.max.sm"),
        "mem_clock_mhz": nvidia_smi("clocks.max.mem"),
        "driver": nvidia_smi("driver_version"),
        "cuda": torch.version.cuda or "",
        "torch": torch.__version__,
        "dtype": dtype,
    }


def time_cuda(fn, warmup, repeats):
    """Median, min and max seconds of `fn()` over `repeats` runs after `warmup` runs."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    return statistics.median(times), min(times), max(times)


class Writer:
    def __init__(self, path, env, warmup, repeats):
        self.file = open(path, "w", newline="")
        self.csv = csv.DictWriter(self.file, fieldnames=COLUMNS)
        self.csv.writeheader()
        self.env = env
        self.warmup = warmup
        self.repeats = repeats

    def time(self, kernel, fn, batch=1, m=0, n=0, k=0, elements=0, row_len=0, group=1):
        median_s, min_s, max_s = time_cuda(fn, self.warmup, self.repeats)
        row = dict(self.env)
        row.update(kernel=kernel, batch=batch, m=m, n=n, k=k, elements=elements,
                   row_len=row_len, group=group, median_s=f"{median_s:.9e}",
                   min_s=f"{min_s:.9e}", max_s=f"{max_s:.9e}", repeats=self.repeats)
        self.csv.writerow(row)
        self.file.flush()
        print(f"{kernel:>12} b={batch} m={m} n={n} k={k} elems={elements} row={row_len}: "
              f"{median_s * 1e6:10.1f} us", file=sys.stderr)


def gemm_shapes(quick):
    """Transformer GEMM shapes: tokens x hidden x hidden-like sweeps from 64 to 32768."""
    sizes = [64, 256, 1024, 4096] if quick else [64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768]
    shapes = []
    for m in sizes:  # tokens (M) against a 12288-wide layer, as in matmul_A100.csv
        shapes.append((m, 12288 if not quick else 4096, 12288 if not quick else 4096))
    for n in sizes:  # 8192 tokens against layers of growing width
        shapes.append((8192 if not quick else 2048, n, n))
    for h in ([1024, 4096] if quick else [1024, 2048, 4096, 8192]):  # QKV, proj, FFN up/down
        tokens = 2048 if quick else 4096
        shapes += [(tokens, 3 * h, h), (tokens, h, h), (tokens, 4 * h, h), (tokens, h, 4 * h)]
    return shapes


def run_kernels(w, dtype, quick):
    dev = "cuda"
    for m, n, k in gemm_shapes(quick):
        if m * k + k * n + m * n > 3 * 2**30:
            continue
        a = torch.randn(m, k, device=dev, dtype=dtype)
        b = torch.randn(k, n, device=dev, dtype=dtype)
        w.time("gemm", lambda: torch.matmul(a, b), m=m, n=n, k=k)
        del a, b

    rows = [4096] if quick else [4096, 16384]
    widths = [128, 1024, 4096] if quick else [32, 128, 512, 1024, 2048, 4096, 8192, 16384]
    for rcount in rows:
        for width in widths:
            x = torch.randn(rcount, width, device=dev, dtype=dtype)
            ln = torch.nn.LayerNorm(width, device=dev, dtype=dtype)
            with torch.no_grad():
                w.time("softmax", lambda: torch.softmax(x, dim=-1),
                       elements=rcount * width, row_len=width)
                w.time("layernorm", lambda: ln(x), elements=rcount * width, row_len=width)
            del x, ln

    counts = [2**20, 2**24] if quick else [2**16, 2**18, 2**20, 2**22, 2**24, 2**26, 2**28]
    for count in counts:
        x = torch.randn(count, device=dev, dtype=dtype)
        g = torch.randn(count, device=dev, dtype=dtype)
        with torch.no_grad():
            w.time("gelu", lambda: F.gelu(x, approximate="tanh"), elements=count, row_len=1)
            w.time("silu", lambda: F.silu(x), elements=count, row_len=1)
            w.time("mul", lambda: x * g, elements=count, row_len=1)
        del x, g

    # Attention core per head group: (b*a) batched QK^T over head dim, softmax, x V.
    for seq, heads, head_dim in ([(1024, 16, 64)] if quick else
                                 [(1024, 16, 64), (2048, 32, 128), (4096, 32, 128)]):
        q = torch.randn(heads, seq, head_dim, device=dev, dtype=dtype)
        kt = torch.randn(heads, head_dim, seq, device=dev, dtype=dtype)
        v = torch.randn(heads, seq, head_dim, device=dev, dtype=dtype)
        s = torch.randn(heads, seq, seq, device=dev, dtype=dtype)
        with torch.no_grad():
            w.time("attention_qk", lambda: torch.bmm(q, kt), batch=heads, m=seq, n=seq, k=head_dim)
            w.time("softmax", lambda: torch.softmax(s, dim=-1),
                   elements=heads * seq * seq, row_len=seq)
            w.time("attention_av", lambda: torch.bmm(s, v), batch=heads, m=seq, n=head_dim, k=seq)
        del q, kt, v, s


class Block(torch.nn.Module):
    """A GPT block as tandem's `gpt` family builds it: pre-LayerNorm, attention with dropout on
    the probabilities, GeLU MLP, dropout before each residual add."""

    def __init__(self, hidden, heads, dtype):
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(hidden)
        self.qkv = torch.nn.Linear(hidden, 3 * hidden)
        self.proj = torch.nn.Linear(hidden, hidden)
        self.ln2 = torch.nn.LayerNorm(hidden)
        self.up = torch.nn.Linear(hidden, 4 * hidden)
        self.down = torch.nn.Linear(4 * hidden, hidden)
        # Megatron-LM's attention and hidden dropout, as tandem's block has them.
        self.drop = torch.nn.Dropout(0.1)
        self.to(device="cuda", dtype=dtype)

    def forward(self, x):
        s, b, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(s, b * self.heads, 3, h // self.heads).unbind(2)
        q, k, v = (t.transpose(0, 1) for t in (q, k, v))
        scores = torch.baddbmm(
            torch.empty(q.shape[0], s, s, device=x.device, dtype=x.dtype),
            q, k.transpose(1, 2), beta=0.0, alpha=(h // self.heads) ** -0.5)
        probs = self.drop(torch.softmax(scores, dim=-1))
        attn = torch.bmm(probs, v).transpose(0, 1).reshape(s, b, h)
        x = x + self.drop(self.proj(attn))
        return x + self.drop(self.down(F.gelu(self.up(self.ln2(x)), approximate="tanh")))


def run_blocks(w, dtype, quick):
    sizes = [(1, 1024, 1024, 16)] if quick else [
        (1, 1024, 1024, 16), (1, 2048, 2048, 16), (1, 2048, 4096, 32), (4, 2048, 4096, 32)]
    for batch, seq, hidden, heads in sizes:
        block = Block(hidden, heads, dtype)
        x = torch.randn(seq, batch, hidden, device="cuda", dtype=dtype, requires_grad=True)
        with torch.no_grad():
            w.time("block_fwd", lambda: block(x), batch=batch, m=seq, n=hidden, k=heads)
        out = block(x)
        grad = torch.randn_like(out)
        w.time("block_bwd", lambda: torch.autograd.grad(out, [x] + list(block.parameters()),
                                                        grad, retain_graph=True),
               batch=batch, m=seq, n=hidden, k=heads)
        del block, x, out, grad


def collective_worker(rank, world, path, env, dtype_name, warmup, repeats, quick):
    import torch.distributed as dist
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl", rank=rank, world_size=world)
    torch.cuda.set_device(rank)
    dtype = DTYPES[dtype_name]
    writer = Writer(path, env, warmup, repeats) if rank == 0 else None
    counts = [2**20, 2**26] if quick else [2**16, 2**18, 2**20, 2**22, 2**24, 2**26, 2**28]
    for count in counts:
        x = torch.randn(count, device="cuda", dtype=dtype)
        out = torch.empty(count * world, device="cuda", dtype=dtype)
        for kernel, fn in [("all_reduce", lambda: dist.all_reduce(x)),
                           ("all_gather", lambda: dist.all_gather_into_tensor(out, x))]:
            # Every rank runs the same timing loop; rank 0 records.
            if writer:
                writer.time(kernel, fn, elements=count, row_len=1, group=world)
            else:
                time_cuda(fn, warmup, repeats)
        dist.barrier()
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="output directory (created)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--quick", action="store_true", help="a small sweep (a few minutes)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("collect.py: no CUDA GPU visible")
    os.makedirs(args.out, exist_ok=True)
    dtype = DTYPES[args.dtype]
    env = environment(args.dtype)
    torch.backends.cuda.matmul.allow_tf32 = False
    meta = dict(env, command=" ".join([sys.executable] + sys.argv), python=platform.python_version(),
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(),
                gpus=torch.cuda.device_count(), warmup=args.warmup, repeats=args.repeats)
    with open(os.path.join(args.out, "environment.json"), "w") as f:
        json.dump(meta, f, indent=2)
    w = Writer(os.path.join(args.out, "kernels.csv"), env, args.warmup, args.repeats)
    run_kernels(w, dtype, args.quick)
    run_blocks(w, dtype, args.quick)
    world = torch.cuda.device_count()
    if world > 1:
        torch.multiprocessing.spawn(
            collective_worker,
            args=(world, os.path.join(args.out, "collectives_kernels.csv"), env, args.dtype,
                  args.warmup, args.repeats, args.quick),
            nprocs=world)
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
