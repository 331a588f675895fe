#!/usr/bin/env python3
"""Time transformer kernels on a CUDA GPU and write them as tandem calibration data.

Usage (set-up and schema: calibration/README.md):

    python3 calibration/collect.py --out calibration/data/<gpu>/ [--dtype bf16] [--quick]

Every kernel is warmed up, then timed with CUDA events over repeated replays of a CUDA graph
of it (its GPU time, as in a busy training step); the CSV records the median and the spread,
and the SM clock and power the GPU held meanwhile. Whole training steps run eagerly. With
more than one visible GPU, all-reduce and all-gather are timed with NCCL across all of them.
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
import threading
import time

try:
    import torch
    import torch.nn.functional as F
    import torch.utils.checkpoint
except ImportError:  # `--help` works without PyTorch; a run says what is missing (main)
    torch = F = None

COLUMNS = [
    "gpu", "sm_clock_mhz", "mem_clock_mhz", "driver", "cuda", "torch", "dtype", "kernel",
    "batch", "m", "n", "k", "elements", "row_len", "group", "median_s", "min_s", "max_s",
    "repeats", "burst", "timing", "sm_clock_run_mhz", "power_run_w", "launches",
]
DTYPE_NAMES = ("bf16", "fp16", "fp32")
# The base class of the model blocks; without PyTorch the module still loads for `--help`.
Module = torch.nn.Module if torch is not None else object


def torch_dtype(name):
    return {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[name]


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


class ClockSampler:
    """The GPU's SM clock and board power, sampled by `nvidia-smi` every 20 ms in the background,
    so each row can record the clock the GPU actually held while it was timed (a sustained load
    may run below the maximum clock that `sm_clock_mhz` records)."""

    def __init__(self):
        self.samples = []  # (monotonic seconds, SM clock MHz, power W)
        try:
            self.process = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                 "-lms", "20", "-i", "0"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            self.process = None
            return
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.process.stdout:
            try:
                clock, power = (float(x) for x in line.split(","))
            except ValueError:
                continue
            self.samples.append((time.monotonic(), clock, power))

    def during(self, start, end):
        """Median SM clock (MHz) and power (W) sampled in [start, end]; empty strings when no
        sample fell in the window (a short row, or no nvidia-smi)."""
        window = [(c, p) for t, c, p in list(self.samples) if start <= t <= end]
        if not window:
            return "", ""
        return (f"{statistics.median(c for c, _ in window):.0f}",
                f"{statistics.median(p for _, p in window):.1f}")

    def stop(self):
        if self.process:
            self.process.terminate()


def graphed(fn, burst):
    """`burst` calls of `fn()` captured once in a CUDA graph, as a function that replays them:
    the GPU then runs them back to back with no host in between, so a small kernel is timed by
    its GPU time rather than by PyTorch's host-side dispatch (8-20 us per call), which a busy
    training step hides behind the kernels ahead of it. A backward pass through autograd is
    captured together with its forward (autograd runs the backward on the stream its forward
    ran on)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(burst):
            fn()
    return graph.replay


def time_cuda(fn, warmup, repeats, burst, graph):
    """Median, min and max seconds per call of `fn()` over `repeats` samples after `warmup`
    calls, and the timing used (`graph` or `eager`). A sample times `burst` calls between two
    CUDA events: with `graph`, one replay of them captured in a CUDA graph (see `graphed`);
    eagerly, launched back to back from the host, so each launch overlaps the previous kernel
    and only kernels shorter than their dispatch time are host-bound; `burst` = 1 eagerly times
    isolated calls, which adds the host's launch latency to every kernel."""
    replay = graphed(fn, burst) if graph else None
    sample = replay or (lambda: [fn() for _ in range(burst)])
    for _ in range(warmup if replay is None else max(1, warmup // burst)):
        sample()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        sample()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3 / burst)
    return statistics.median(times), min(times), max(times), "graph" if replay else "eager"


def l2_flush():
    """A kernel that reads a buffer of twice the GPU's L2 (128 MiB at least) and so leaves none
    of the L2 to the kernel timed after it: `--cold` times each call after one, less the
    flush's own time. Reading, not writing, leaves the L2 clean, so the timed kernel pays no
    write-backs but those of its own results."""
    l2_bytes = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0)
    buffer = torch.ones(max(2 * l2_bytes, 128 << 20), device="cuda", dtype=torch.uint8)
    return lambda: buffer.sum()


def gemm_prelude(dtype):
    """A GEMM (2048 x 2048 outputs over K = 16384: 137 GFLOP, about 0.25 ms on an H100) that,
    replayed back to back with the timed kernel, holds the GPU at its power limit and lowers
    its SM clock, as a training step's GEMMs do to the vector kernels between them, while
    leaving little of its own in the L2 (8 MiB of results; its operands are only read):
    `--after-gemm` times each call after one, less the GEMM's own time."""
    a = torch.randn(2048, 16384, device="cuda", dtype=dtype)
    b = torch.randn(16384, 2048, device="cuda", dtype=dtype)
    return lambda: a @ b


class Writer:
    def __init__(self, path, env, warmup, repeats, burst, graph, clocks=None, prelude=None,
                 timing="graph"):
        self.file = open(path, "w", newline="")
        self.csv = csv.DictWriter(self.file, fieldnames=COLUMNS)
        self.csv.writeheader()
        self.env = env
        self.warmup = warmup
        self.repeats = repeats
        self.burst = burst
        self.graph = graph
        self.clocks = clocks
        self.prelude = prelude if graph else None
        self.timing = timing

    def time(self, kernel, fn, batch=1, m=0, n=0, k=0, elements=0, row_len=0, group=1,
             dtype=None, timing=None, baseline=None):
        """Times `fn` and writes a row; `timing` = (warmup, repeats, burst) overrides the
        command line's and times eagerly (whole training steps take seconds each and run as
        a user runs them). With `baseline`, the row is the time of `fn` minus the median time
        of `baseline`: a backward pass is timed as its forward and backward together minus the
        forward, since autograd only replays in a CUDA graph when the forward was captured
        with it. Replayed `--cold` (`--after-gemm`), every call of `fn` (and of `baseline`)
        follows an L2 flush (a long GEMM) and the row is less its own time (`baseline` defaults
        to it)."""
        warmup, repeats, burst = timing or (self.warmup, self.repeats, self.burst)
        graph = self.graph and timing is None
        prelude = self.prelude if graph else None
        if prelude:
            fn = (lambda call: lambda: (prelude(), call()))(fn)
            baseline = (lambda call: lambda: (prelude(), call()))(baseline) if baseline else prelude
        start = time.monotonic()
        median_s, min_s, max_s, method = time_cuda(fn, warmup, repeats, burst, graph)
        if baseline:
            base_s = time_cuda(baseline, warmup, repeats, burst, graph)[0]
            median_s, min_s, max_s = median_s - base_s, min_s - base_s, max_s - base_s
        if prelude:
            method = self.timing
            if median_s <= 0:
                print(f"{kernel:>12} elems={elements}: within the {method} prelude's spread, "
                      "no row", file=sys.stderr)
                return
        clock, power = self.clocks.during(start, time.monotonic()) if self.clocks else ("", "")
        # Eager kernel rows: the kernels one call launches (the baseline's left out), which
        # `tandem calibrate` divides the launch costs by.
        launches = ""
        if not graph and timing is None and group == 1:
            def launched(call):
                return sum(calls for _, calls, _ in device_kernels(call))
            count = launched(fn) - (launched(baseline) if baseline else 0)
            launches = count if count >= 1 else ""
        row = dict(self.env)
        if dtype:
            row["dtype"] = dtype
        row.update(kernel=kernel, batch=batch, m=m, n=n, k=k, elements=elements,
                   row_len=row_len, group=group, median_s=f"{median_s:.9e}",
                   min_s=f"{min_s:.9e}", max_s=f"{max_s:.9e}", repeats=repeats,
                   burst=burst, timing=method, sm_clock_run_mhz=clock, power_run_w=power,
                   launches=launches)
        self.csv.writerow(row)
        self.file.flush()
        print(f"{kernel:>12} b={batch} m={m} n={n} k={k} elems={elements} row={row_len}: "
              f"{median_s * 1e6:10.1f} us  {clock or '-'} MHz {power or '-'} W", file=sys.stderr)


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


# Megatron-LM runs of data/reference/published_runs.csv: (hidden, heads, tensor-parallel).
PUBLISHED_SLICES = [(2304, 24, 1), (3072, 32, 2), (4096, 32, 4), (6144, 48, 8), (8192, 64, 8)]


def linear_gemms(tokens, hidden, tp):
    """(m, n, k) of the forward, input-gradient and weight-gradient GEMMs of one tensor-parallel
    GPT block's linears (QKV, projection, FFN up, FFN down) on one device."""
    linears = [(hidden, 3 * hidden // tp), (hidden // tp, hidden),
               (hidden, 4 * hidden // tp), (4 * hidden // tp, hidden)]
    out = []
    for fan_in, fan_out in linears:
        out += [(tokens, fan_out, fan_in), (tokens, fan_in, fan_out), (fan_out, fan_in, tokens)]
    return out


def run_gemm_layouts(w, dtype, quick):
    """Every GEMM of the published runs' block slices in the three layouts a training step uses:
    `gemm` (A·B), `gemm_nt` (A·Bᵀ, nn.Linear forward) and `gemm_tn` (Aᵀ·B, weight gradient)."""
    dev = "cuda"
    slices = PUBLISHED_SLICES[:2] if quick else PUBLISHED_SLICES
    shapes = sorted({s for hidden, _, tp in slices for tokens in ([2048] if quick else [2048, 8192])
                     for s in linear_gemms(tokens, hidden, tp)})
    for m, n, k in shapes:
        a = torch.randn(m, k, device=dev, dtype=dtype)
        b = torch.randn(k, n, device=dev, dtype=dtype)
        at = a.t().contiguous()
        bt = b.t().contiguous()
        w.time("gemm", lambda: torch.matmul(a, b), m=m, n=n, k=k)
        w.time("gemm_nt", lambda: torch.matmul(a, bt.t()), m=m, n=n, k=k)
        w.time("gemm_tn", lambda: torch.matmul(at.t(), b), m=m, n=n, k=k)
        del a, b, at, bt


def run_gemms(w, dtype, quick):
    dev = "cuda"
    for m, n, k in gemm_shapes(quick):
        if m * k + k * n + m * n > 3 * 2**30:
            continue
        a = torch.randn(m, k, device=dev, dtype=dtype)
        b = torch.randn(k, n, device=dev, dtype=dtype)
        w.time("gemm", lambda: torch.matmul(a, b), m=m, n=n, k=k)
        del a, b


def time_softmax(w, x, dy, shape):
    """Softmax over the last dimension of `x` and its backward kernel as autograd runs it
    (`_softmax_backward_data`: PyTorch multiplies dy by y over the whole tensor, then reduces
    each row)."""
    y = torch.softmax(x, dim=-1)
    w.time("softmax", lambda: torch.softmax(x, dim=-1), **shape)
    w.time("softmax_bwd", lambda: torch.ops.aten._softmax_backward_data(dy, y, -1, x.dtype),
           **shape)
    del y


def run_vector(w, dtype, quick):
    dev = "cuda"
    rows = [4096] if quick else [4096, 16384]
    widths = [128, 1024, 4096] if quick else [32, 128, 512, 1024, 2048, 4096, 8192, 16384]
    for rcount in rows:
        for width in widths:
            x = torch.randn(rcount, width, device=dev, dtype=dtype)
            dy = torch.randn_like(x)
            ln = torch.nn.LayerNorm(width, device=dev, dtype=dtype)
            shape = dict(elements=rcount * width, row_len=width)
            with torch.no_grad():
                time_softmax(w, x, dy, shape)
                w.time("layernorm", lambda: ln(x), **shape)
                # The input-gradient kernel alone, as autograd runs it; the weight gradients
                # are column sums of their own.
                _, mean, rstd = torch.ops.aten.native_layer_norm(x, [width], ln.weight,
                                                                 ln.bias, 1e-5)
                w.time("layernorm_bwd", lambda: torch.ops.aten.native_layer_norm_backward(
                    dy, x, [width], mean, rstd, ln.weight, ln.bias, [True, False, False]),
                       **shape)
            del x, dy, ln, mean, rstd

    counts = [2**20, 2**24] if quick else [2**16, 2**18, 2**20, 2**22, 2**24, 2**26, 2**28]
    for count in counts:
        x = torch.randn(count, device=dev, dtype=dtype)
        g = torch.randn(count, device=dev, dtype=dtype)
        shape = dict(elements=count, row_len=1)
        with torch.no_grad():
            w.time("gelu", lambda: F.gelu(x, approximate="tanh"), **shape)
            w.time("gelu_bwd", lambda: torch.ops.aten.gelu_backward(g, x, approximate="tanh"),
                   **shape)
            w.time("silu", lambda: F.silu(x), **shape)
            w.time("mul", lambda: x * g, **shape)
            # The residual adds (and their gradients' sums in the backward).
            w.time("add", lambda: x + g, **shape)
            # Training-mode dropout draws its random numbers and writes the byte keep-mask
            # besides the output; its backward scales the gradient by that mask.
            w.time("dropout", lambda: F.dropout(x, 0.1, training=True), **shape)
        # The backward kernel itself, as autograd runs it: through torch.autograd.grad each call
        # also pays ~80 us of Python autograd dispatch, which hides the kernel below 2^26.
        _, mask = torch.ops.aten.native_dropout(x, 0.1, True)
        w.time("dropout_bwd", lambda: torch.ops.aten.native_dropout_backward(g, mask, 1 / 0.9),
               **shape)
        del x, g, mask


def run_attention(w, dtype, quick):
    dev = "cuda"
    # Attention core per head group: (b*a) batched QK^T over head dim, softmax, x V.
    for seq, heads, head_dim in ([(1024, 16, 64)] if quick else
                                 [(1024, 16, 64), (2048, 32, 128), (4096, 32, 128)]):
        q = torch.randn(heads, seq, head_dim, device=dev, dtype=dtype)
        kt = torch.randn(heads, head_dim, seq, device=dev, dtype=dtype)
        v = torch.randn(heads, seq, head_dim, device=dev, dtype=dtype)
        s = torch.randn(heads, seq, seq, device=dev, dtype=dtype)
        ds = torch.randn_like(s)
        with torch.no_grad():
            w.time("attention_qk", lambda: torch.bmm(q, kt), batch=heads, m=seq, n=seq, k=head_dim)
            time_softmax(w, s, ds, dict(elements=heads * seq * seq, row_len=seq))
            w.time("attention_av", lambda: torch.bmm(s, v), batch=heads, m=seq, n=head_dim, k=seq)
        del q, kt, v, s, ds


def run_casts(w, dtype, quick):
    """Mixed precision's casts (dtype is the narrow side): up to fp32 (`cast`: the logits before
    the loss, gradients to the main copy) and back down (`cast_bwd`: the main weights), from
    a bias-sized tensor to a whole layer's weights."""
    for count in ([2**12, 2**20, 2**24] if quick else [2**e for e in range(12, 29, 2)]):
        x = torch.randn(count, device="cuda", dtype=dtype)
        x32 = x.float()
        shape = dict(elements=count, row_len=1)
        with torch.no_grad():
            w.time("cast", lambda: x.float(), **shape)
            w.time("cast_bwd", lambda: x32.to(dtype), **shape)
        del x, x32


def run_column_sums(w, dtype, quick):
    """The backward's column sums, which every biased linear and LayerNorm runs: a bias
    gradient sums the output gradient over the tokens (`column_sum`: elements = tokens x width,
    row_len = width); a LayerNorm's weight and bias gradients read the output gradient and the
    saved input (`layernorm_wgrad`: elements counts both, 2 x tokens x width, as tandem's
    block does)."""
    for tokens in ([2048] if quick else [2048, 8192, 32768]):
        for width in ([1024] if quick else [1024, 2304, 4096, 9216]):
            dy = torch.randn(tokens, width, device="cuda", dtype=dtype)
            x = torch.randn_like(dy)
            ln = torch.nn.LayerNorm(width, device="cuda", dtype=dtype)
            with torch.no_grad():
                w.time("column_sum", lambda: dy.sum(0), elements=tokens * width, row_len=width)
                _, mean, rstd = torch.ops.aten.native_layer_norm(x, [width], ln.weight,
                                                                 ln.bias, 1e-5)
                w.time("layernorm_wgrad", lambda: torch.ops.aten.native_layer_norm_backward(
                    dy, x, [width], mean, rstd, ln.weight, ln.bias, [False, True, True]),
                       elements=2 * tokens * width, row_len=width)
            del dy, x, ln, mean, rstd


def copy_shapes(quick):
    """(batch x heads, sequence, head dim) of the attention tensors the layout copies move."""
    if quick:
        return [(16, 1024, 64)]
    return [(16, 1024, 64), (32, 2048, 128), (24, 2048, 96), (96, 2048, 96), (384, 2048, 96),
            (64, 4096, 128), (32, 8192, 128)]


def run_copies(w, dtype, quick):
    """The layout copies a GPT block's autograd runs (batch = batch x heads, m = sequence,
    n = head dim): `copy`, the attention context from head-major back to token-major rows before
    the projection (a strided transpose), and `stack`, the backward of splitting the fused QKV
    output, which stacks the three head-major gradients into token-major rows."""
    for heads, seq, head_dim in copy_shapes(quick):
        ctx = torch.randn(heads, seq, head_dim, device="cuda", dtype=dtype)
        grads = [torch.randn_like(ctx) for _ in range(3)]
        shape = dict(batch=heads, m=seq, n=head_dim, elements=heads * seq * head_dim, row_len=1)
        with torch.no_grad():
            w.time("copy", lambda: ctx.transpose(0, 1).contiguous(), **shape)
            w.time("stack", lambda: torch.stack([g.transpose(0, 1) for g in grads], dim=2),
                   **dict(shape, elements=3 * heads * seq * head_dim))
        del ctx, grads


def causal_softmax_kernels():
    """Triton kernels standing in for Megatron-LM's fused causal softmax
    (`scaled_upper_triang_masked_softmax`): one pass per row that scales, masks the keys after
    the query and normalises, reading the row up to the diagonal and writing all of it; the
    backward reads the output and its gradient up to the diagonal. None without Triton."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def forward(x_ptr, y_ptr, seq, scale, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        keep = cols <= row % seq
        base = row.to(tl.int64) * seq
        x = tl.load(x_ptr + base + cols, mask=keep, other=-float("inf")).to(tl.float32)
        e = tl.exp(x * scale - tl.max(x * scale, 0))
        y = e / tl.sum(e, 0)
        tl.store(y_ptr + base + cols, y.to(y_ptr.dtype.element_ty), mask=cols < seq)

    @triton.jit
    def backward(dy_ptr, y_ptr, dx_ptr, seq, scale, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        keep = cols <= row % seq
        base = row.to(tl.int64) * seq
        y = tl.load(y_ptr + base + cols, mask=keep, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + base + cols, mask=keep, other=0.0).to(tl.float32)
        dx = y * (dy - tl.sum(y * dy, 0)) * scale
        tl.store(dx_ptr + base + cols, dx.to(dx_ptr.dtype.element_ty), mask=cols < seq)

    def launch(kernel, seq, *tensors):
        block = triton.next_power_of_2(seq)
        kernel[(tensors[0].numel() // seq,)](*tensors, seq, 0.125, BLOCK=block,
                                             num_warps=max(4, min(32, block // 256)))

    return (lambda x, y: launch(forward, x.shape[-1], x, y),
            lambda dy, y, dx: launch(backward, dy.shape[-1], dy, y, dx))


def run_softmax_rows(w, dtype, quick):
    """Softmax over attention scores (batch x heads, sequence, sequence) at row lengths 512-8192
    and two sizes, forward and backward: PyTorch's (`softmax`, `softmax_bwd`) and a fused causal
    one (`softmax_causal`, `softmax_causal_bwd`, see causal_softmax_kernels), checked against
    PyTorch's masked softmax before it is timed."""
    causal = causal_softmax_kernels()
    if causal is None:
        print("softmax_causal: Triton is not installed, skipped", file=sys.stderr)
    for seq in ([1024] if quick else [512, 1024, 2048, 4096, 8192]):
        for total in ([2**24] if quick else [2**27, 2**29]):
            x = torch.randn(total // seq**2, seq, seq, device="cuda", dtype=dtype)
            dy = torch.randn_like(x)
            shape = dict(elements=x.numel(), row_len=seq)
            with torch.no_grad():
                time_softmax(w, x, dy, shape)
                if causal is None:
                    continue
                forward, backward = causal
                y, dx = torch.empty_like(x), torch.empty_like(x)
                forward(x, y)
                mask = torch.ones(seq, seq, device="cuda", dtype=torch.bool).triu(1)
                want = torch.softmax((x[:1].float() * 0.125).masked_fill(mask, float("-inf")), -1)
                error = (y[:1].float() - want).abs().max().item()
                if error > 1e-2:
                    sys.exit(f"softmax_causal at row length {seq}: off PyTorch's by {error}")
                w.time("softmax_causal", lambda: forward(x, y), **shape)
                w.time("softmax_causal_bwd", lambda: backward(dy, y, dx), **shape)
                del y, dx, mask, want
            del x, dy


def run_flash_attention(w, dtype, quick):
    """Fused attention as PyTorch's `scaled_dot_product_attention` runs it on its flash backend
    (FlashAttention-2), causal (`attention_flash_causal`) or not (`attention_flash`), forward
    and backward (`_bwd`: forward and backward together less the forward), at sequences
    1024-8192 and head dimensions 64 and 128: batch = query heads (samples x heads), m =
    sequence, n = head dimension, k = 0 (as many key/value heads)."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        print("attention_flash: torch.nn.attention (PyTorch 2.3+) is missing, skipped",
              file=sys.stderr)
        return
    probe = torch.randn(1, 8, 128, 64, device="cuda", dtype=dtype)
    try:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION), torch.no_grad():
            F.scaled_dot_product_attention(probe, probe, probe, is_causal=True)
    except RuntimeError as error:
        print(f"attention_flash: no flash backend here ({error}), skipped", file=sys.stderr)
        return
    del probe
    for seq in ([2048] if quick else [1024, 2048, 4096, 8192]):
        for dim in ([128] if quick else [64, 128]):
            heads = max(8, 2**27 // seq**2)
            q, k, v = (torch.randn(1, heads, seq, dim, device="cuda", dtype=dtype,
                                   requires_grad=True) for _ in range(3))
            dy = torch.randn(1, heads, seq, dim, device="cuda", dtype=dtype)
            shape = dict(batch=heads, m=seq, n=dim)
            for causal in (False, True):
                name = "attention_flash_causal" if causal else "attention_flash"

                def forward():
                    with sdpa_kernel(SDPBackend.FLASH_ATTENTION), torch.no_grad():
                        F.scaled_dot_product_attention(q, k, v, is_causal=causal)

                def forward_and_backward():
                    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                        y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                        torch.autograd.grad(y, (q, k, v), dy)

                w.time(name, forward, **shape)
                w.time(name + "_bwd", forward_and_backward, baseline=forward, **shape)
            del q, k, v, dy


def run_loss(w, dtype, quick):
    """Softmax cross-entropy over the vocabulary (the language-model head's loss), forward and
    its gradient, for whole and 8-way vocabulary-parallel logits."""
    shapes = [(2048, 51200)] if quick else [(2048, 51200), (4096, 51200), (8192, 51200),
                                            (8192, 25600), (8192, 12800), (8192, 6400),
                                            (32768, 6400)]
    for tokens, vocab in shapes:
        logits = torch.randn(tokens, vocab, device="cuda", dtype=dtype, requires_grad=True)
        target = torch.randint(vocab, (tokens,), device="cuda")
        shape = dict(elements=tokens * vocab, row_len=vocab)

        def forward():
            with torch.no_grad():
                F.cross_entropy(logits, target)

        w.time("cross_entropy", forward, **shape)
        w.time("cross_entropy_bwd",
               lambda: torch.autograd.grad(F.cross_entropy(logits, target), logits),
               baseline=forward, **shape)
        del logits, target


def run_embedding(w, dtype, quick):
    """The token embedding of a GPT with a 51200-word vocabulary (m = tokens, n = hidden,
    k = vocabulary): its gather (`embedding`) and its backward (`embedding_bwd`), which adds
    the tokens' gradient rows into the table's: one kernel over the features up to 3072 tokens,
    else a sort of the token ids, a segment scan and a scatter. PyTorch zero-fills the whole
    table's gradient first, a fill the profiles count as `other`; the row is the backward less
    that fill (timed as its baseline)."""
    vocab = 51200
    for hidden in ([2048] if quick else [2304, 4096, 8192]):
        table = torch.randn(vocab, hidden, device="cuda", dtype=dtype)
        for tokens in ([2048] if quick else [2048, 4096, 8192, 16384, 32768]):
            ids = torch.randint(vocab, (tokens,), device="cuda")
            grad = torch.randn(tokens, hidden, device="cuda", dtype=dtype)
            shape = dict(m=tokens, n=hidden, k=vocab, elements=tokens * hidden, row_len=hidden)
            with torch.no_grad():
                w.time("embedding", lambda: F.embedding(ids, table), **shape)
                w.time("embedding_bwd", lambda: torch.ops.aten.embedding_dense_backward(
                    grad, ids, vocab, -1, False),
                       baseline=lambda: torch.zeros(vocab, hidden, device="cuda", dtype=dtype),
                       **shape)
            del ids, grad
        del table


def run_optimizer(w, dtype, quick):
    """One fused Adam step over fp32 parameters (mixed-precision training keeps fp32 main
    weights): weights, gradients and both moments in, weights and moments out."""
    for count in ([2**22, 2**26] if quick else [2**e for e in range(20, 29)]):
        param = torch.zeros(count, device="cuda", dtype=torch.float32, requires_grad=True)
        param.grad = torch.randn_like(param)
        # capturable: the step counter lives on the GPU, so the step can be graph-captured.
        optimizer = torch.optim.Adam([param], lr=1e-6, fused=True, capturable=True)
        w.time("adam", optimizer.step, elements=count, row_len=1, dtype="fp32")
        del param, optimizer


class Block(Module):
    """A GPT block as tandem's `gpt` family builds it: pre-LayerNorm, attention with dropout on
    the probabilities, GeLU MLP, dropout before each residual add. With `tp` > 1 it is one
    device's slice of a Megatron-LM tensor-parallel block (heads and FFN split `tp` ways,
    column- then row-parallel linears) without the all-reduces, which one GPU cannot time."""

    def __init__(self, hidden, heads, dtype, tp=1):
        super().__init__()
        self.heads = heads // tp
        self.head_dim = hidden // heads
        self.ln1 = torch.nn.LayerNorm(hidden)
        self.qkv = torch.nn.Linear(hidden, 3 * hidden // tp)
        self.proj = torch.nn.Linear(hidden // tp, hidden)
        self.ln2 = torch.nn.LayerNorm(hidden)
        self.up = torch.nn.Linear(hidden, 4 * hidden // tp)
        self.down = torch.nn.Linear(4 * hidden // tp, hidden)
        # Megatron-LM's attention and hidden dropout, as tandem's block has them.
        self.drop = torch.nn.Dropout(0.1)
        self.to(device="cuda", dtype=dtype)

    def forward(self, x):
        s, b, _ = x.shape
        d = self.head_dim
        q, k, v = self.qkv(self.ln1(x)).view(s, b * self.heads, 3, d).unbind(2)
        q, k, v = (t.transpose(0, 1) for t in (q, k, v))
        scores = torch.baddbmm(
            torch.empty(q.shape[0], s, s, device=x.device, dtype=x.dtype),
            q, k.transpose(1, 2), beta=0.0, alpha=d ** -0.5)
        probs = self.drop(torch.softmax(scores, dim=-1))
        attn = torch.bmm(probs, v).transpose(0, 1).reshape(s, b, self.heads * d)
        x = x + self.drop(self.proj(attn))
        return x + self.drop(self.down(F.gelu(self.up(self.ln2(x)), approximate="tanh")))


def time_block(w, dtype, batch, seq, hidden, heads, tp, profile):
    block = Block(hidden, heads, dtype, tp)
    x = torch.randn(seq, batch, hidden, device="cuda", dtype=dtype, requires_grad=True)

    inputs = [x] + list(block.parameters())
    grad = torch.randn_like(x)

    def forward():
        with torch.no_grad():
            block(x)

    shape = dict(batch=batch, m=seq, n=hidden, k=heads, group=tp)
    w.time("block_fwd", forward, **shape)
    w.time("block_bwd", lambda: torch.autograd.grad(block(x), inputs, grad), baseline=forward,
           **shape)
    if profile:
        out = block(x)
        profile.record("block_fwd", forward, shape)
        profile.record("block_bwd",
                       lambda: torch.autograd.grad(out, inputs, grad, retain_graph=True), shape)
        del out
    del block, x, inputs, grad


def run_blocks(w, dtype, quick, profile):
    sizes = [(1, 1024, 1024, 16)] if quick else [
        (1, 1024, 1024, 16), (1, 2048, 2048, 16), (1, 2048, 4096, 32), (4, 2048, 4096, 32)]
    for batch, seq, hidden, heads in sizes:
        time_block(w, dtype, batch, seq, hidden, heads, 1, profile)


def run_tp_blocks(w, dtype, quick, profile):
    """One device's slice of each published run's block (group = tensor-parallel degree)."""
    slices = PUBLISHED_SLICES[:2] if quick else PUBLISHED_SLICES
    for hidden, heads, tp in slices:
        for batch in ([1] if quick else [1, 4]):
            time_block(w, dtype, batch, 2048, hidden, heads, tp, profile)


class GPT(Module):
    """A GPT as tandem's `gpt` template builds it: token and learned position embeddings with
    dropout, `layers` blocks, a final LayerNorm and a language-model head tied to the token
    embedding; the loss is a softmax cross-entropy over fp32 logits. Under full recompute each
    block keeps only its input and reruns its forward in the backward pass."""

    def __init__(self, layers, hidden, heads, vocab, seq, dtype, recompute):
        super().__init__()
        self.tokens = torch.nn.Embedding(vocab, hidden)
        self.positions = torch.nn.Embedding(seq, hidden)
        self.drop = torch.nn.Dropout(0.1)
        self.blocks = torch.nn.ModuleList(Block(hidden, heads, dtype) for _ in range(layers))
        self.norm = torch.nn.LayerNorm(hidden)
        self.recompute = recompute
        self.to(device="cuda", dtype=dtype)

    def forward(self, tokens, targets):
        x = self.drop(self.tokens(tokens) + self.positions.weight[:, None, :])
        for block in self.blocks:
            if self.recompute == "full":
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        logits = F.linear(self.norm(x), self.tokens.weight)
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def time_step(w, dtype, layers, hidden, heads, batch, recompute, profile, seq=2048, vocab=51200):
    """One training iteration on one GPU, as each GPU of a data-parallel run does it: forward,
    loss, backward and a mixed-precision Adam step (fp32 main weights and moments, gradients
    copied up, weights copied back), for one micro-batch of `batch` sequences."""
    model = GPT(layers, hidden, heads, vocab, seq, dtype, recompute)
    params = list(model.parameters())
    main = [p.detach().float().requires_grad_() for p in params]
    for m in main:
        m.grad = torch.zeros_like(m)
    optimizer = torch.optim.Adam(main, lr=1e-6, fused=True)
    tokens = torch.randint(vocab, (seq, batch), device="cuda")
    targets = torch.randint(vocab, (seq, batch), device="cuda")

    def step():
        for p in params:
            p.grad = None
        model(tokens, targets).backward()
        for p, m in zip(params, main):
            m.grad.copy_(p.grad)
        optimizer.step()
        with torch.no_grad():
            for p, m in zip(params, main):
                p.copy_(m)

    kernel = f"train_step_{recompute}"
    shape = dict(batch=batch, m=seq, n=hidden, k=heads, elements=vocab, row_len=1, group=layers)
    w.time(kernel, step, timing=(2, 5, 1), **shape)
    if profile:
        profile.record(kernel, step, shape, warmup=1)
    del model, params, main, optimizer, tokens, targets
    torch.cuda.empty_cache()


def time_steps(w, dtype, profile, cases):
    """Times each (layers, hidden, heads, micro-batch, recompute, sequence) iteration; a case
    that does not fit the GPU's memory is skipped with a message."""
    for layers, hidden, heads, batch, recompute, seq in cases:
        try:
            time_step(w, dtype, layers, hidden, heads, batch, recompute, profile, seq)
        except torch.cuda.OutOfMemoryError:
            print(f"train_step_{recompute} {layers} x {hidden} b={batch} s={seq}: out of GPU "
                  "memory, skipped", file=sys.stderr)
            torch.cuda.empty_cache()


def run_steps(w, dtype, quick, profile):
    """Whole training iterations (group = layers, elements = vocabulary): GPT-1.7B at
    micro-batch 16 under full recompute is exactly each GPU's share of the first run of
    data/reference/published_runs.csv (t = p = 1) without its gradient all-reduce (about
    60 GB: a smaller GPU skips it)."""
    cases = [(2, 1024, 16, 1, "full", 2048), (2, 1024, 16, 1, "none", 2048)] if quick else [
        (24, 2304, 24, 16, "full", 2048), (24, 2304, 24, 4, "full", 2048),
        (24, 2304, 24, 1, "none", 2048), (24, 2304, 24, 2, "none", 2048),
        (8, 4096, 32, 4, "full", 2048)]
    time_steps(w, dtype, profile, cases)


def run_step_shapes(w, dtype, quick, profile):
    """More iterations for validation, never for fitting: micro-batch 1-8, sequence 1024-8192,
    hidden 2048-8192, with and without recompute (GPT-1.7B at micro-batch 4 without recompute
    needs about 90 GB: a smaller GPU skips it)."""
    cases = [(2, 1024, 16, 2, "full", 1024)] if quick else [
        (24, 2304, 24, 8, "full", 2048), (24, 2304, 24, 1, "full", 2048),
        (24, 2304, 24, 4, "none", 2048), (24, 2048, 16, 8, "full", 1024),
        (16, 2048, 16, 2, "full", 4096), (8, 4096, 32, 1, "none", 2048),
        (8, 4096, 32, 1, "full", 8192), (2, 8192, 64, 4, "full", 2048),
        (12, 3072, 24, 4, "none", 2048)]
    time_steps(w, dtype, profile, cases)


def device_kernels(fn):
    """The GPU operations (kernels, memsets, copies) of one call of `fn` by name, as
    torch.profiler records them: (name, launches, seconds in all)."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kernels = []
    for event in prof.key_averages():
        total_us = getattr(event, "self_device_time_total", None)
        if total_us is None:
            total_us = event.self_cuda_time_total
        if total_us > 0:
            kernels.append((event.key, event.count, total_us * 1e-6))
    return kernels


class Profile:
    """Per-kernel CUDA time of one run of a block or training step (torch.profiler), for finding
    which kernels a prediction misses. Columns: the shape columns of kernels.csv, `pass` (the
    kernel column of the timed row), the CUDA kernel `name`, its `calls` and `total_s`."""

    COLUMNS = ["gpu", "dtype", "pass", "batch", "m", "n", "k", "elements", "group", "name",
               "calls", "total_s"]

    def __init__(self, path, env, warmup):
        self.file = open(path, "w", newline="")
        self.csv = csv.DictWriter(self.file, fieldnames=self.COLUMNS)
        self.csv.writeheader()
        self.env = env
        self.warmup = warmup

    def record(self, kernel, fn, shape, warmup=None):
        for _ in range(self.warmup if warmup is None else warmup):
            fn()
        for name, calls, total_s in device_kernels(fn):
            row = {"gpu": self.env["gpu"], "dtype": self.env["dtype"], "pass": kernel}
            row.update({c: shape[c] for c in self.COLUMNS if c in shape}, name=name,
                       calls=calls, total_s=f"{total_s:.9e}")
            self.csv.writerow(row)
        self.file.flush()


def collective_worker(rank, world, path, env, dtype_name, warmup, repeats, burst, quick):
    import torch.distributed as dist
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl", rank=rank, world_size=world)
    torch.cuda.set_device(rank)
    dtype = torch_dtype(dtype_name)
    writer = Writer(path, env, warmup, repeats, burst, graph=False) if rank == 0 else None
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
                time_cuda(fn, warmup, repeats, burst, graph=False)
        dist.barrier()
    time_overlap(world, writer, dtype, warmup, repeats, burst, quick)
    dist.destroy_process_group()


def time_overlap(world, writer, dtype, warmup, repeats, burst, quick):
    """A backward pass's GEMMs with its gradient all-reduce launched on a side stream, as
    PyTorch DDP overlaps them: rows overlap_gemms (batch GEMMs of m x n x k one after another),
    overlap_all_reduce (elements across group GPUs) and overlap_both (the two launched
    together). `tandem calibrate` fits the fraction of the all-reduce the GEMMs hide,
    efficiency.comm_overlap, from the three."""
    import torch.distributed as dist
    n = 4096 if quick else 8192
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    side = torch.cuda.Stream()
    for gemms, count in ([(8, 2**24)] if quick else [(8, 2**26), (16, 2**27)]):
        grads = torch.randn(count, device="cuda", dtype=dtype)

        def compute(gemms=gemms):
            for _ in range(gemms):
                torch.mm(a, b)

        def communicate(grads=grads):
            dist.all_reduce(grads)

        def both(compute=compute, communicate=communicate):
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                communicate()
            compute()
            torch.cuda.current_stream().wait_stream(side)

        shape = dict(batch=gemms, m=n, n=n, k=n, elements=count, row_len=1, group=world)
        for kernel, fn in [("overlap_gemms", compute), ("overlap_all_reduce", communicate),
                           ("overlap_both", both)]:
            # Every rank runs the same loop (the all-reduce needs them all); rank 0 records.
            if writer:
                writer.time(kernel, fn, **shape)
            else:
                time_cuda(fn, warmup, repeats, burst, graph=False)
            dist.barrier()


SECTIONS = {
    "gemm": run_gemms,
    "vector": run_vector,
    "attention": run_attention,
    "flash_attention": run_flash_attention,
    "casts": run_casts,
    "copies": run_copies,
    "column_sums": run_column_sums,
    "softmax_rows": run_softmax_rows,
    "blocks": run_blocks,
    "gemm_layouts": run_gemm_layouts,
    "tp_blocks": run_tp_blocks,
    "loss": run_loss,
    "embedding": run_embedding,
    "optimizer": run_optimizer,
    "steps": run_steps,
    "step_shapes": run_step_shapes,
    "collectives": None,  # NCCL workers, spawned below when more than one GPU is visible
}


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="output directory (created)")
    parser.add_argument("--dtype", choices=sorted(DTYPE_NAMES), default="bf16")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=30, help="timed samples per kernel")
    parser.add_argument("--burst", type=int, default=10,
                        help="back-to-back calls per sample (default 10; 1 = isolated calls)")
    parser.add_argument("--eager", action="store_true",
                        help="launch every timed call from the host instead of replaying a CUDA "
                             "graph of them (small kernels then time PyTorch's dispatch)")
    parser.add_argument("--cold", action="store_true",
                        help="replay every call after a read of twice the L2, less that read's "
                             "own time, so operands come from HBM as a training step's large "
                             "tensors do (rows `timing` = cold; not with --eager)")
    parser.add_argument("--after-gemm", action="store_true",
                        help="replay every call after a long GEMM (see gemm_prelude), less its "
                             "own time: the kernel at the clock a training step's GEMMs leave "
                             "(rows `timing` = after_gemm; not with --eager or --cold)")
    parser.add_argument("--quick", action="store_true", help="a small sweep (a few minutes)")
    parser.add_argument("--only", default=",".join(SECTIONS),
                        help=f"comma-separated sections to time (default all: {','.join(SECTIONS)})")
    parser.add_argument("--file", default="kernels.csv",
                        help="output CSV name, ending in kernels.csv (default kernels.csv); the "
                             "environment goes to the same name ending in environment.json")
    parser.add_argument("--profile", action="store_true",
                        help="also write the per-kernel CUDA time of every block and training "
                             "step to <file stem>profile.csv")
    args = parser.parse_args()
    sections = [x.strip() for x in args.only.split(",") if x.strip()]
    unknown = [x for x in sections if x not in SECTIONS]
    if unknown or not sections:
        sys.exit(f"collect.py: --only: unknown sections {unknown}; choose from {list(SECTIONS)}")
    if (args.cold or args.after_gemm) and args.eager:
        sys.exit("collect.py: --cold and --after-gemm replay CUDA graphs; not with --eager")
    if args.cold and args.after_gemm:
        sys.exit("collect.py: choose one of --cold and --after-gemm")
    if not args.file.endswith("kernels.csv") or os.sep in args.file:
        sys.exit("collect.py: --file must be a file name ending in kernels.csv")
    stem = args.file[: -len("kernels.csv")]
    if torch is None:
        sys.exit("collect.py: PyTorch is not installed; install a CUDA build with "
                 "`pip install torch` (calibration/README.md)")
    if not torch.cuda.is_available():
        sys.exit("collect.py: no CUDA GPU visible (torch.cuda.is_available() is False)")
    os.makedirs(args.out, exist_ok=True)
    dtype = torch_dtype(args.dtype)
    env = environment(args.dtype)
    torch.backends.cuda.matmul.allow_tf32 = False
    timing = ("eager" if args.eager else "cold" if args.cold
              else "after_gemm" if args.after_gemm else "graph")
    preludes = {"cold": l2_flush, "after_gemm": lambda: gemm_prelude(dtype)}
    meta = dict(env, command=" ".join([sys.executable] + sys.argv), python=platform.python_version(),
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(),
                gpus=torch.cuda.device_count(), warmup=args.warmup, repeats=args.repeats,
                burst=args.burst, timing=timing)
    with open(os.path.join(args.out, stem + "environment.json"), "w") as f:
        json.dump(meta, f, indent=2)
    clocks = ClockSampler()
    w = Writer(os.path.join(args.out, args.file), env, args.warmup, args.repeats, args.burst,
               not args.eager, clocks, preludes[timing]() if timing in preludes else None,
               timing)
    profile = (Profile(os.path.join(args.out, stem + "profile.csv"), env, args.warmup)
               if args.profile else None)
    for section in sections:
        if section in ("blocks", "tp_blocks", "steps", "step_shapes"):
            SECTIONS[section](w, dtype, args.quick, profile)
        elif section != "collectives":
            SECTIONS[section](w, dtype, args.quick)
    world = torch.cuda.device_count()
    if world > 1 and "collectives" in sections:
        torch.multiprocessing.spawn(
            collective_worker,
            args=(world, os.path.join(args.out, "collectives_kernels.csv"), env, args.dtype,
                  args.warmup, args.repeats, args.burst, args.quick),
            nprocs=world)
    clocks.stop()
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
