"""The peers of `cargo xtask bench --compare`: the same workloads in PyTorch eager,
torch.compile (inductor, which builds its CPU kernels with the installed gcc) and JAX jit.

The Rust side (benches/src/bin/compare.rs) starts this script with a Python that has
torch (and, for the JAX column, jax) and talks to it one JSON line at a time:

    python peers.py serve SYSTEM THREADS   # SYSTEM: torch (eager and compile) or jax
        {"op": "step", "system": "eager", "workload": "mlp", "runs": 15}
            -> {"step_ms", "first_call_ms"}
        {"op": "train", "system": "eager", "workload": "main-mlp", "steps": 200}
            -> {"samples_per_s", "loss"}
        {"op": "info"} -> {"torch": version, "jax": version or null}
        {"op": "quit"}
    python peers.py memory SYSTEM WORKLOAD THREADS
        -> one line {"peak_rss_delta_bytes"}: how far the first training step raises
           the resident set above the process after setup (a fresh process each time)
    python peers.py accuracy WORKLOAD EPOCHS LR THREADS SEED
        -> the main job's run in PyTorch eager (same model, batch, AdamW and schedule),
           one line {"epoch", "test_accuracy", "samples_per_s"} per epoch: the oracle
           for `aotgrad train`'s accuracy (run by hand, never by the tests)

THREADS threads: the process pins itself to the first THREADS cores, so "1 thread"
is one core for every system (JAX sizes its thread pool when it starts, hence one
process per thread count). Workloads (benches/src/lib.rs and aotgrad-cli's models):
  mlp          4 x (Linear 512->512 + GELU), batch 64, loss sum(model(x)), gradients
  transformer  pre-LN block, fused-QKV 8-head attention, 4x GELU MLP, d 256, seq 128,
               batch 8, loss sum(model(x)), gradients
  main-mlp     784-256-128-10 GELU MLP, batch 128, cross-entropy, AdamW step
  main-cnn     conv 3x3 16 + ReLU + 2x2 max pool, conv 3x3 32 + ReLU + pool, linear
               1568-10, batch 128, cross-entropy, AdamW step
  main-vit     7x7 patches (16 tokens), d 64, 4 heads, 2 pre-LN blocks, mean pool,
               LayerNorm, linear head, batch 128, cross-entropy, AdamW step
AdamW: lr 2e-3, betas (0.9, 0.999), eps 1e-8, weight decay 0.05 (the main job's).
"train" runs the main job's loop on Fashion-MNIST (AOTGRAD_DATA or Debian's
dataset-fashion-mnist): a shuffled batch normalized from the u8 images, the step, the
loss read back. Nothing in the test suite depends on this script.
"""

import gzip
import json
import math
import os
import statistics
import sys
import time

MEAN, STD = 0.2860, 0.3530
LR, BETAS, EPS, WD = 2e-3, (0.9, 0.999), 1e-8, 0.05
BATCH = {"mlp": 64, "transformer": 8, "main-mlp": 128, "main-cnn": 128, "main-vit": 128}


def pin(threads):
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, set(cores[: max(1, threads)]))


def rss(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    return 0


def idx_file(path):
    data = open(path, "rb").read()
    if path.endswith(".gz"):
        data = gzip.decompress(data)
    nd = data[3]
    dims = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(nd)]
    return dims, data[4 + 4 * nd :]


def fashion_mnist(test=False):
    import numpy as np

    d = os.environ.get("AOTGRAD_DATA", "/usr/share/datasets/fashion-mnist")

    def load(name):
        for p in (os.path.join(d, name + ".gz"), os.path.join(d, name)):
            if os.path.exists(p):
                dims, raw = idx_file(p)
                return np.frombuffer(raw, dtype=np.uint8).reshape(dims).copy()
        raise FileNotFoundError(os.path.join(d, name))

    prefix = "t10k" if test else "train"
    x = load(prefix + "-images-idx3-ubyte").reshape(-1, 784)
    y = load(prefix + "-labels-idx1-ubyte").astype(np.int64)
    return x, y


# ---- PyTorch ---------------------------------------------------------------------


def torch_models():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Mlp(nn.Module):
        def __init__(self, sizes, last_act):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(a, b) for a, b in zip(sizes, sizes[1:])])
            self.last_act = last_act

        def forward(self, x):
            for i, layer in enumerate(self.layers):
                x = layer(x)
                if self.last_act or i + 1 < len(self.layers):
                    x = F.gelu(x)
            return x

    class Block(nn.Module):
        def __init__(self, d, heads):
            super().__init__()
            self.h = heads
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

    class Cnn(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = nn.Conv2d(1, 16, 3, padding=1)
            self.c2 = nn.Conv2d(16, 32, 3, padding=1)
            self.head = nn.Linear(32 * 49, 10)

        def forward(self, x):
            x = x.view(-1, 1, 28, 28)
            x = F.max_pool2d(F.relu(self.c1(x)), 2)
            x = F.max_pool2d(F.relu(self.c2(x)), 2)
            return self.head(x.flatten(1))

    class Vit(nn.Module):
        def __init__(self, patch=7, d=64, heads=4, blocks=2):
            super().__init__()
            self.g, self.s = 28 // patch, patch
            self.embed = nn.Linear(patch * patch, d)
            self.pos = nn.Parameter(torch.randn(self.g * self.g, d) * 0.02)
            self.blocks = nn.ModuleList([Block(d, heads) for _ in range(blocks)])
            self.norm = nn.LayerNorm(d)
            self.head = nn.Linear(d, 10)

        def forward(self, x):
            g, s = self.g, self.s
            p = x.reshape(-1, g, s, g, s).permute(0, 1, 3, 2, 4).reshape(-1, g * g, s * s)
            h = self.embed(p) + self.pos
            for blk in self.blocks:
                h = blk(h)
            return self.head(self.norm(h.mean(1)))

    return {
        "mlp": lambda: Mlp([512] * 5, True),
        "transformer": lambda: Block(256, 8),
        "main-mlp": lambda: Mlp([784, 256, 128, 10], False),
        "main-cnn": Cnn,
        "main-vit": Vit,
    }


class TorchSide:
    """One workload in PyTorch: eager, or compiled with torch.compile."""

    def __init__(self, workload, compiled):
        import torch
        import torch.nn.functional as F

        torch.manual_seed(0)
        self.torch = torch
        self.model = torch_models()[workload]()
        self.main = workload.startswith("main-")
        b = BATCH[workload]
        if workload == "transformer":
            self.x = torch.randn(b, 128, 256)
        elif self.main:
            self.x = torch.randn(b, 784)
            self.y = torch.randint(0, 10, (b,))
        else:
            self.x = torch.randn(b, 512)
        if self.main:

            def loss(x, y):
                return F.cross_entropy(self.model(x), y)

            # PyTorch's fastest CPU AdamW for the compiled side, its default for eager.
            self.opt = torch.optim.AdamW(
                self.model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, fused=compiled or None
            )
        else:

            def loss(x, y):
                return self.model(x).sum()

            self.opt = None
        self.loss = torch.compile(loss) if compiled else loss

    def step(self, x=None, y=None):
        self.model.zero_grad(set_to_none=True)
        loss = self.loss(self.x if x is None else x, getattr(self, "y", None) if y is None else y)
        loss.backward()
        if self.opt is not None:
            self.opt.step()
        return loss

    def batch(self, images, labels, idx):
        torch = self.torch
        x = (torch.from_numpy(images[idx]).float() / 255.0 - MEAN) / STD
        return x, torch.from_numpy(labels[idx])


# ---- JAX -------------------------------------------------------------------------


def jax_side(workload):
    import jax
    import jax.numpy as jnp

    key = jax.random.PRNGKey(0)

    def linear(key, a, b):
        k1, k2 = jax.random.split(key)
        lim = 1.0 / math.sqrt(a)
        return {"w": jax.random.uniform(k1, (b, a), minval=-lim, maxval=lim), "b": jax.random.uniform(k2, (b,), minval=-lim, maxval=lim)}

    def lin(p, x):
        return x @ p["w"].T + p["b"]

    def gelu(x):
        return jax.nn.gelu(x, approximate=False)

    def ln_init(d):
        return {"g": jnp.ones(d), "b": jnp.zeros(d)}

    def ln(p, x):
        m = x.mean(-1, keepdims=True)
        v = ((x - m) ** 2).mean(-1, keepdims=True)
        return (x - m) / jnp.sqrt(v + 1e-5) * p["g"] + p["b"]

    def block_init(key, d):
        ks = jax.random.split(key, 4)
        return {"ln1": ln_init(d), "qkv": linear(ks[0], d, 3 * d), "out": linear(ks[1], d, d), "ln2": ln_init(d), "fc1": linear(ks[2], d, 4 * d), "fc2": linear(ks[3], 4 * d, d)}

    def block(p, x, heads):
        b, s, d = x.shape
        dh = d // heads
        y = lin(p["qkv"], ln(p["ln1"], x)).reshape(b, s, 3, heads, dh).transpose(2, 0, 3, 1, 4)
        q, k, v = y[0], y[1], y[2]
        att = jax.nn.softmax((q @ k.swapaxes(-2, -1)) * (1.0 / math.sqrt(dh)), axis=-1)
        ctx = (att @ v).swapaxes(1, 2).reshape(b, s, d)
        x = x + lin(p["out"], ctx)
        return x + lin(p["fc2"], gelu(lin(p["fc1"], ln(p["ln2"], x))))

    def conv_init(key, cin, cout):
        k1, k2 = jax.random.split(key)
        lim = 1.0 / math.sqrt(cin * 9)
        return {"w": jax.random.uniform(k1, (cout, cin, 3, 3), minval=-lim, maxval=lim), "b": jax.random.uniform(k2, (cout,), minval=-lim, maxval=lim)}

    def conv(p, x):
        y = jax.lax.conv_general_dilated(x, p["w"], (1, 1), ((1, 1), (1, 1)), dimension_numbers=("NCHW", "OIHW", "NCHW"))
        return y + p["b"][None, :, None, None]

    def pool(x):
        return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")

    ks = jax.random.split(key, 8)
    b = BATCH[workload]
    if workload == "mlp":
        params = [linear(ks[i], 512, 512) for i in range(4)]

        def model(p, x):
            for layer in p:
                x = gelu(lin(layer, x))
            return x

        x = jax.random.normal(ks[5], (b, 512))
    elif workload == "transformer":
        params = block_init(ks[0], 256)

        def model(p, x):
            return block(p, x, 8)

        x = jax.random.normal(ks[5], (b, 128, 256))
    elif workload == "main-mlp":
        params = [linear(ks[0], 784, 256), linear(ks[1], 256, 128), linear(ks[2], 128, 10)]

        def model(p, x):
            return lin(p[2], gelu(lin(p[1], gelu(lin(p[0], x)))))

        x = jax.random.normal(ks[5], (b, 784))
    elif workload == "main-cnn":
        params = {"c1": conv_init(ks[0], 1, 16), "c2": conv_init(ks[1], 16, 32), "head": linear(ks[2], 32 * 49, 10)}

        def model(p, x):
            h = x.reshape(-1, 1, 28, 28)
            h = pool(jax.nn.relu(conv(p["c1"], h)))
            h = pool(jax.nn.relu(conv(p["c2"], h)))
            return lin(p["head"], h.reshape(h.shape[0], -1))

        x = jax.random.normal(ks[5], (b, 784))
    elif workload == "main-vit":
        params = {"embed": linear(ks[0], 49, 64), "pos": jax.random.normal(ks[1], (16, 64)) * 0.02, "blocks": [block_init(ks[2], 64), block_init(ks[3], 64)], "norm": ln_init(64), "head": linear(ks[4], 64, 10)}

        def model(p, x):
            pt = x.reshape(-1, 4, 7, 4, 7).transpose(0, 1, 3, 2, 4).reshape(-1, 16, 49)
            h = lin(p["embed"], pt) + p["pos"]
            for bp in p["blocks"]:
                h = block(bp, h, 4)
            return lin(p["head"], ln(p["norm"], h.mean(1)))

        x = jax.random.normal(ks[5], (b, 784))
    else:
        raise ValueError(f"unknown workload {workload}")

    main = workload.startswith("main-")
    if main:
        y = jax.random.randint(ks[6], (b,), 0, 10)

        def loss_fn(p, x, y):
            logp = jax.nn.log_softmax(model(p, x), axis=-1)
            return -jnp.take_along_axis(logp, y[:, None], axis=1).mean()

        def step(state, x, y):
            p, m, v, t = state
            loss, g = jax.value_and_grad(loss_fn)(p, x, y)
            t = t + 1
            b1, b2 = BETAS
            m = jax.tree_util.tree_map(lambda m, g: b1 * m + (1 - b1) * g, m, g)
            v = jax.tree_util.tree_map(lambda v, g: b2 * v + (1 - b2) * g * g, v, g)
            c1, c2 = 1 / (1 - b1**t), 1 / (1 - b2**t)
            p = jax.tree_util.tree_map(lambda p, m, v: p * (1 - LR * WD) - LR * (m * c1) / (jnp.sqrt(v * c2) + EPS), p, m, v)
            return (p, m, v, t), loss

        def zeros():
            return jax.tree_util.tree_map(jnp.zeros_like, params)

        state = [(params, zeros(), zeros(), jnp.float32(0.0))]
        step = jax.jit(step, donate_argnums=0)

        def run(xb=None, yb=None):
            state[0], loss = step(state[0], x if xb is None else xb, y if yb is None else yb)
            return loss

    else:
        grad = jax.jit(jax.value_and_grad(lambda p, x: model(p, x).sum()))

        def run(xb=None, yb=None):
            loss, g = grad(params, x)
            jax.block_until_ready(g)
            return loss

    def batch(images, labels, idx):
        xb = (jnp.asarray(images[idx], dtype=jnp.float32) / 255.0 - MEAN) / STD
        return xb, jnp.asarray(labels[idx])

    return run, batch, jax.block_until_ready


# ---- the protocol ----------------------------------------------------------------


class Sides:
    def __init__(self):
        self.sides = {}

    def get(self, system, workload):
        key = (system, workload)
        if key not in self.sides:
            if system == "jax":
                run, batch, sync = jax_side(workload)
                self.sides[key] = (run, batch, lambda v: float(sync(v)))
            else:
                t = TorchSide(workload, system == "compile")
                self.sides[key] = (t.step, t.batch, lambda v: float(v.item()))
        return self.sides[key]


def timed(f):
    t = time.perf_counter()
    f()
    return (time.perf_counter() - t) * 1e3


def step_request(sides, req):
    system, workload = req["system"], req["workload"]
    fresh = (system, workload) not in sides.sides
    t0 = time.perf_counter()
    run, _, read = sides.get(system, workload)
    read(run())
    first = (time.perf_counter() - t0) * 1e3
    for _ in range(2):
        read(run())
    times = [timed(lambda: read(run())) for _ in range(int(req["runs"]))]
    return {"step_ms": statistics.median(times), "first_call_ms": first if fresh else None}


DATA = []


def train_request(sides, req):
    import numpy as np

    if not DATA:
        DATA.append(fashion_mnist())
    images, labels = DATA[0]
    run, batch, read = sides.get(req["system"], req["workload"])
    steps = int(req["steps"])
    order = np.random.default_rng(0).permutation(len(labels))
    b = BATCH[req["workload"]]
    # Warm up on the first batches (compilation), then time `steps` steps.
    for s in range(3):
        read(run(*batch(images, labels, order[s * b : (s + 1) * b])))
    t = time.perf_counter()
    loss = 0.0
    for s in range(steps):
        i = (s + 3) % (len(labels) // b)
        loss = read(run(*batch(images, labels, order[i * b : (i + 1) * b])))
    dt = time.perf_counter() - t
    return {"samples_per_s": steps * b / dt, "loss": loss}


def serve(system, threads):
    pin(threads)
    if system == "torch":
        import torch

        torch.set_num_threads(threads)
    sides = Sides()
    for line in sys.stdin:
        req = json.loads(line)
        op = req["op"]
        if op == "quit":
            break
        if op == "info":
            out = {}
            for name in ("torch", "jax"):
                try:
                    out[name] = __import__(name).__version__
                except ImportError:
                    out[name] = None
        elif op == "step":
            out = step_request(sides, req)
        elif op == "train":
            out = train_request(sides, req)
        else:
            out = {"error": f"unknown op {op}"}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()


def memory(system, workload, threads):
    pin(threads)
    if system != "jax":
        import torch

        torch.set_num_threads(threads)
    sides = Sides()
    run, _, read = sides.get(system, workload)
    base = rss("VmRSS:")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    read(run())
    print(json.dumps({"peak_rss_delta_bytes": rss("VmHWM:") - base}))


def accuracy(workload, epochs, lr, threads, seed):
    """The main job's training run in PyTorch eager: the same model, data order policy
    (a seeded shuffle per epoch, drop-last), batch, AdamW hyper-parameters and warm-up
    + cosine schedule as `aotgrad train`; one JSON line per epoch with the test accuracy.
    """
    import numpy as np
    import torch
    import torch.nn.functional as F

    pin(threads)
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    model = torch_models()[workload]()
    images, labels = fashion_mnist()
    timages, tlabels = fashion_mnist(test=True)
    b = BATCH[workload]
    per_epoch = len(labels) // b
    total, warmup = per_epoch * epochs, min(200, per_epoch * epochs)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=BETAS, eps=EPS, weight_decay=WD)

    def lr_at(step):  # aotgrad's WarmupCosine, as a factor of the peak
        if step < warmup:
            return (step + 1) / warmup
        if step >= total or total == warmup:
            return 0.0
        return 0.5 * (1.0 + math.cos(math.pi * (step - warmup) / (total - warmup)))

    def norm(x):
        return (torch.from_numpy(x).float() / 255.0 - MEAN) / STD

    tx, ty = norm(timages), torch.from_numpy(tlabels)
    rng = np.random.default_rng(seed)
    step = 0
    for epoch in range(epochs):
        order = rng.permutation(len(labels))
        t = time.perf_counter()
        model.train()
        for i in range(per_epoch):
            for g in opt.param_groups:
                g["lr"] = lr * lr_at(step)
            idx = order[i * b : (i + 1) * b]
            loss = F.cross_entropy(model(norm(images[idx])), torch.from_numpy(labels[idx]))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
        secs = time.perf_counter() - t
        model.eval()
        with torch.no_grad():
            pred = torch.cat([model(tx[i : i + 1000]).argmax(1) for i in range(0, len(ty), 1000)])
        acc = (pred == ty).float().mean().item() * 100
        print(json.dumps({"epoch": epoch + 1, "test_accuracy": acc, "samples_per_s": per_epoch * b / secs}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        os.environ.setdefault("XLA_FLAGS", "")
        if sys.argv[2] == "jax" and int(sys.argv[3]) == 1:
            os.environ["XLA_FLAGS"] += " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
        serve(sys.argv[2], int(sys.argv[3]))
    elif sys.argv[1] == "memory":
        if sys.argv[2] == "jax" and int(sys.argv[4]) == 1:
            os.environ["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
        memory(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif sys.argv[1] == "accuracy":
        workload, epochs, lr, threads, seed = sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
        accuracy(workload, epochs, lr, threads, seed)
    else:
        sys.exit(
            f"usage: {sys.argv[0]} serve SYSTEM THREADS | memory SYSTEM WORKLOAD THREADS"
            " | accuracy WORKLOAD EPOCHS LR THREADS SEED"
        )
