"""PyTorch versions of the bench workloads, driven by `cargo xtask bench --compare`.

The Rust side (benches/src/bin/compare.rs) starts this script once with a Python that
has torch, then sends one JSON request per line on stdin and reads one JSON answer per
line from stdout, alternating with its own measurements so both run under the same
machine load. Requests:

    {"op": "step", "workload": "mlp", "threads": 1, "runs": 15}
        -> {"first_call_ms", "step_ms", "eager_forward_ms", "saved_bytes", "peak_rss_delta_bytes"}
    {"op": "info"} -> {"torch": version, "jax": version or null}
    {"op": "quit"}

The workloads match benches/src/lib.rs: the MLP is 4 x (Linear 512->512 + GELU),
batch 64; the transformer block is pre-LN, fused-QKV 8-head self-attention, a 4x GELU
MLP and residuals, d_model 256, seq 128, batch 8. Loss: sum(model(x)).
Nothing in the test suite depends on this script.
"""

import json
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(512, 512) for _ in range(4)])

    def forward(self, x):
        for layer in self.layers:
            x = F.gelu(layer(x))
        return x


class Block(nn.Module):
    def __init__(self, d=256, heads=8):
        super().__init__()
        self.d, self.h = d, heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        b, s, d = x.shape
        h, dh = self.h, d // self.h
        y = self.qkv(self.ln1(x)).reshape(b, s, 3, h, dh).permute(2, 0, 3, 1, 4)
        q, k, v = y[0], y[1], y[2]
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(dh))
        ctx = scores.softmax(-1) @ v
        x = x + self.out(ctx.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def workload(name):
    torch.manual_seed(0)
    if name == "mlp":
        return Mlp(), torch.randn(64, 512)
    if name == "transformer":
        return Block(), torch.randn(8, 128, 256)
    raise ValueError(f"unknown workload {name}")


def peak_rss_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def reset_peak_rss():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def rss_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def step(model, x):
    model.zero_grad(set_to_none=True)
    model(x).sum().backward()


def saved_bytes(model, x):
    """Bytes of the distinct tensors autograd saves for backward, parameters and the
    input excluded (activation bytes, as aotgrad's partition report counts them)."""
    held = {p.data_ptr() for p in model.parameters()} | {x.data_ptr()}
    seen = {}

    def pack(t):
        if t.data_ptr() not in held:
            seen[(t.data_ptr(), t.untyped_storage().nbytes())] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(x).sum()
    del loss
    return sum(seen.values())


def measure(req):
    torch.set_num_threads(int(req["threads"]))
    model, x = workload(req["workload"])
    runs = int(req["runs"])
    # The first step from a cold start: its time, and how far it raises the resident
    # set above where it started (later steps reuse memory the first one obtained).
    base = rss_bytes()
    ok = reset_peak_rss()
    t = time.perf_counter()
    step(model, x)
    first = (time.perf_counter() - t) * 1e3
    peak = peak_rss_bytes() - base if ok else None
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        step(model, x)
        times.append((time.perf_counter() - t) * 1e3)
    fw = []
    with torch.no_grad():
        for _ in range(runs):
            t = time.perf_counter()
            model(x).sum()
            fw.append((time.perf_counter() - t) * 1e3)
    return {
        "first_call_ms": first,
        "step_ms": statistics.median(times),
        "eager_forward_ms": statistics.median(fw),
        "saved_bytes": saved_bytes(model, x),
        "peak_rss_delta_bytes": peak,
    }


def main():
    for line in sys.stdin:
        req = json.loads(line)
        if req["op"] == "quit":
            break
        if req["op"] == "info":
            try:
                import jax  # noqa: F401

                jax_version = jax.__version__
            except ImportError:
                jax_version = None
            out = {"torch": torch.__version__, "jax": jax_version}
        else:
            out = measure(req)
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
