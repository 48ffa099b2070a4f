"""The reference workloads of shared/WORKLOADS.md in PyTorch, printing the same JSON lines as bench/workloads:
    python3 bench/peers/torch_workloads.py W1 W4 W4r
Run it through bench/compare.sh, which alternates it with frugal and sets the environment WORKLOADS.md asks for."""
import contextlib
import gzip
import json
import os
import resource
import statistics
import struct
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = "/usr/share/datasets/fashion-mnist"


def steps_or(default):
    return max(1, int(os.environ["FRUGAL_BENCH_STEPS"])) if "FRUGAL_BENCH_STEPS" in os.environ else default


def peak_rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def read_idx(path):
    data = gzip.open(path).read()
    ndim = data[3]
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return torch.frombuffer(bytearray(data[4 + 4 * ndim:]), dtype=torch.uint8).reshape(dims)


def fashion(name, cnn):
    torch.manual_seed(int(os.environ.get("FRUGAL_BENCH_SEED", "0")))  # the seed's spread: as bench/workloads
    xtr, ytr = read_idx(f"{ROOT}/train-images-idx3-ubyte.gz"), read_idx(f"{ROOT}/train-labels-idx1-ubyte.gz").long()
    xte, yte = read_idx(f"{ROOT}/t10k-images-idx3-ubyte.gz"), read_idx(f"{ROOT}/t10k-labels-idx1-ubyte.gz").long()
    if cnn:
        model = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 3, padding=1),
                              nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))
        batch = 64
    else:
        model = nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                              nn.Linear(256, 10))
        batch = 128
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    perm = torch.randperm(60000)
    steps = steps_or(60000 // batch)
    times = []
    t0 = time.perf_counter()
    for i in range(steps):
        t = time.perf_counter()
        idx = perm[i * batch:(i + 1) * batch]
        x = xtr[idx].float().div_(255).unsqueeze(1)  # u8 in memory, converted per batch (as frugal's loader)
        loss = F.cross_entropy(model(x), ytr[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append((time.perf_counter() - t) * 1e3)
    epoch_s = time.perf_counter() - t0
    with torch.no_grad():
        correct = sum((model(xte[j:j + 250].float().div(255).unsqueeze(1)).argmax(1) == yte[j:j + 250]).sum().item()
                      for j in range(0, 10000, 250))
    return {"name": name, "median_step_ms": statistics.median(times), "steps": steps, "epoch_s": epoch_s,
            "test_accuracy": correct / 10000, "peak_rss_bytes": peak_rss(), "threads": torch.get_num_threads()}


def deep(name, segments, bf16=False):
    """W4, W4r (segments: checkpoint_sequential), W4b (bf16: the forward and the loss under
    torch.autocast("cpu", dtype=torch.bfloat16), 20 steps, the first 2 not timed, as bench/workloads' W4b)."""
    from torch.utils.checkpoint import checkpoint_sequential
    torch.manual_seed(0)
    layers = []
    for _ in range(32):
        layers += [nn.Linear(1024, 1024), nn.ReLU()]
    net = nn.Sequential(*layers)
    opt = torch.optim.SGD(net.parameters(), lr=1e-3, momentum=0.9)
    x, target = torch.randn(1024, 1024), torch.randn(1024, 1024)
    times, steps = [], steps_or(18 if bf16 else 8)
    for s in range(steps + 2):
        t = time.perf_counter()
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            y = checkpoint_sequential(net, segments, x, use_reentrant=False) if segments else net(x)
            loss = F.mse_loss(y, target)
        loss.backward()
        opt.step()
        if s >= 2:
            times.append((time.perf_counter() - t) * 1e3)
    med = statistics.median(times)
    return {"name": name, "median_step_ms": med, "steps": steps, "gflops": 3 * 2 * 1024**3 * 32 / (med * 1e6),
            "loss": loss.item(), "peak_rss_bytes": peak_rss(), "threads": torch.get_num_threads()}


def gpt():
    """W3: the model of bench/peers/torch_gpt.py (frugal's nn::GPT) on the fortunes corpus as frugal's
    data::TextDataset reads it (files without a '.' in their name, sorted; byte tokens; the first 90% for
    training), random windows of 65 tokens, batch 32, AdamW lr 1e-3."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from torch_gpt import make_gpt  # scaled_dot_product_attention, the faster form here
    root = "/usr/share/games/fortunes"
    files = sorted(f for f in os.listdir(root) if "." not in f and os.path.isfile(os.path.join(root, f)))
    corpus = b"".join(open(os.path.join(root, f), "rb").read() for f in files)
    vocab = sorted(set(corpus))
    lut = torch.zeros(256, dtype=torch.long)
    lut[torch.tensor(vocab)] = torch.arange(len(vocab))
    tokens = lut[torch.frombuffer(bytearray(corpus), dtype=torch.uint8).long()]
    train = tokens[:len(tokens) - int(len(tokens) * 0.1)]
    torch.manual_seed(0)
    model = make_gpt(len(vocab))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    times, steps = [], steps_or(30)
    for s in range(steps + 5):
        t = time.perf_counter()
        starts = torch.randint(0, len(train) - 64, (32,))
        window = train[starts.unsqueeze(1) + torch.arange(65)]
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(window[:, :-1]).reshape(-1, len(vocab)), window[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        value = loss.item()
        if s >= 5:
            times.append((time.perf_counter() - t) * 1e3)
    return {"name": "W3", "median_step_ms": statistics.median(times), "steps": steps, "loss": value,
            "peak_rss_bytes": peak_rss(), "threads": torch.get_num_threads()}


def fortunes():
    """The fortunes corpus as frugal's data::TextDataset reads it: the training tokens and the vocabulary size."""
    root = "/usr/share/games/fortunes"
    files = sorted(f for f in os.listdir(root) if "." not in f and os.path.isfile(os.path.join(root, f)))
    corpus = b"".join(open(os.path.join(root, f), "rb").read() for f in files)
    vocab = sorted(set(corpus))
    lut = torch.zeros(256, dtype=torch.long)
    lut[torch.tensor(vocab)] = torch.arange(len(vocab))
    tokens = lut[torch.frombuffer(bytearray(corpus), dtype=torch.uint8).long()]
    return tokens[:len(tokens) - int(len(tokens) * 0.1)], len(vocab)


class GPTRun:
    """W3's training run one step at a time, the forward and loss under bf16 autocast with bf16=True (W6). Runs
    start from the same weights and draw the same batches (their own generator)."""

    def __init__(self, train, vocab, bf16, segments=0):
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from torch_gpt import make_gpt
        torch.manual_seed(0)
        self.train, self.vocab, self.bf16, self.segments = train, vocab, bf16, segments
        self.model = make_gpt(vocab)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.gen = torch.Generator().manual_seed(0)
        self.loss, self.activation_bytes = 0.0, 0

    def step(self, measure=False):
        """One step; returns its ms. With measure, also counts the bytes autograd keeps for backward: the
        distinct storages saved, parameters excluded (frugal's activation bytes, from its arena)."""
        t = time.perf_counter()
        starts = torch.randint(0, len(self.train) - 64, (32,), generator=self.gen)
        window = self.train[starts.unsqueeze(1) + torch.arange(65)]
        self.opt.zero_grad(set_to_none=True)
        saved, params = {}, {p.untyped_storage().data_ptr() for p in self.model.parameters()}

        def pack(x):
            ptr = x.untyped_storage().data_ptr()
            if ptr not in params:
                saved[ptr] = x.untyped_storage().nbytes()
            return x

        hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x) if measure else contextlib.nullcontext()
        with hooks, torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
            loss = F.cross_entropy(self.forward(window[:, :-1]).reshape(-1, self.vocab), window[:, 1:].reshape(-1))
        loss.backward()
        self.opt.step()
        self.loss = loss.item()
        if measure:
            self.activation_bytes = sum(saved.values())
        return (time.perf_counter() - t) * 1e3


    def forward(self, idx):
        """The model's forward, its blocks through checkpoint_sequential in `segments` segments when set, or
        each block through torch.utils.checkpoint.checkpoint when segments is "each" (checkpoint_sequential
        always runs its last segment plainly)."""
        if not self.segments:
            return self.model(idx)
        from torch.utils.checkpoint import checkpoint, checkpoint_sequential
        m = self.model
        x = m.tok(idx) + m.pos(torch.arange(idx.shape[1]))
        if self.segments == "each":
            for b in m.blocks:
                x = checkpoint(b, x, use_reentrant=False)
        else:
            x = checkpoint_sequential(m.blocks, self.segments, x, use_reentrant=False)
        return m.head(m.ln_f(x))

    def state_bytes(self):
        """The parameters' and the optimizer's state's bytes: what is alive between steps (frugal's too)."""
        tensors = list(self.model.parameters()) + [t for st in self.opt.state.values() for t in st.values()
                                                   if torch.is_tensor(t) and t.dim() > 0]
        return sum(t.untyped_storage().nbytes() for t in tensors)

    def step_peak(self):
        """One step under torch.profiler with profile_memory: the peak of the bytes the CPU allocator handed
        out during the step above what was alive before it (every allocation and free the profiler saw, in
        time order). Not a timed step: profiling slows it."""
        from torch.profiler import ProfilerActivity, profile
        from torch._C._profiler import _EventType
        # The previous step's gradients go first, as frugal's trainer frees them at the end of its step: what
        # is alive before the profiled step is the parameters and the optimizer state, on both sides.
        self.opt.zero_grad(set_to_none=True)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            self.step()
        events, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
        while stack:
            e = stack.pop()
            if e.tag == _EventType.Allocation:
                events.append((e.start_time_ns, e.extra_fields.alloc_size))
            stack.extend(e.children)
        current = peak = 0
        for _, size in sorted(events, key=lambda x: x[0]):
            current += size
            peak = max(peak, current)
        return peak


def gpt_checkpoint():
    """W3c: W3 with its 4 blocks through torch.utils.checkpoint.checkpoint_sequential in 2 segments (Chen's
    sqrt(n)) and in 4, and with each block checkpointed, beside W3 itself, stepped in turn: 30 steps each after
    5 warm-up steps. The step-time ratios and the peaks are what frugal's planned runs compare with
    (bench/compare_budgets.sh). A configuration's peak: the parameters' and optimizer state's bytes plus its
    step's peak above them (torch.profiler's allocation events, one profiled step after the timed ones);
    peak_fraction is that over the plain run's."""
    train, vocab = fortunes()
    runs = {0: GPTRun(train, vocab, False), 2: GPTRun(train, vocab, False, 2), 4: GPTRun(train, vocab, False, 4),
            "each": GPTRun(train, vocab, False, "each")}
    times = {k: [] for k in runs}
    for s in range(35):
        for k, r in runs.items():
            ms = r.step(measure=(s == 0))
            if s >= 5:
                times[k].append(ms)
    med = {k: statistics.median(v) for k, v in times.items()}
    state = runs[0].state_bytes()
    peaks = {k: r.step_peak() for k, r in runs.items()}
    return {"name": "W3c", "median_step_ms": med[0], "sqrt_n_segments_ms": med[2], "per_block_segments_ms": med[4],
            "sqrt_n_ratio": med[2] / med[0], "per_block_ratio": med[4] / med[0],
            "each_block_ms": med["each"], "each_block_ratio": med["each"] / med[0],
            "saved_bytes": {k: r.activation_bytes for k, r in runs.items()}, "losses": {k: r.loss for k, r in runs.items()},
            "state_bytes": state, "step_peak_bytes": peaks,
            "peak_fraction": {k: (state + p) / (state + peaks[0]) for k, p in peaks.items()},
            "threads": torch.get_num_threads()}


def gpt_bf16():
    """W6: W3 under torch.autocast("cpu", dtype=torch.bfloat16) beside W3 itself, stepped alternately: 200 steps
    each by default (5 warm-up; the last warm-up step counts the activation bytes), the loss after the last."""
    train, vocab = fortunes()
    f32, bf16 = GPTRun(train, vocab, False), GPTRun(train, vocab, True)
    f32_ms, bf16_ms, steps = [], [], steps_or(195)
    for s in range(steps + 5):
        a, b = bf16.step(measure=s == 4), f32.step(measure=s == 4)
        if s >= 5:
            bf16_ms.append(a)
            f32_ms.append(b)
    ms, w3_ms = statistics.median(bf16_ms), statistics.median(f32_ms)
    return {"name": "W6", "median_step_ms": ms, "steps": steps, "loss": bf16.loss,
            "activation_bytes": bf16.activation_bytes, "W3_median_step_ms": w3_ms, "W3_loss": f32.loss,
            "W3_activation_bytes": f32.activation_bytes, "step_ms_ratio_to_W3": ms / w3_ms,
            "act_ratio_to_W3": bf16.activation_bytes / f32.activation_bytes, "loss_ratio_to_W3": bf16.loss / f32.loss,
            "peak_rss_bytes": peak_rss(), "threads": torch.get_num_threads()}


def gemm(dtype=torch.float32):
    """W5, and W5b with dtype=torch.bfloat16 (a bf16 result; the GEMM accumulates in f32)."""
    a, b = torch.randn(1024, 1024).to(dtype), torch.randn(1024, 1024).to(dtype)
    times = []
    for i in range(23):
        t = time.perf_counter()
        a @ b
        if i >= 3:
            times.append((time.perf_counter() - t) * 1e3)
    med = statistics.median(times)
    return {"name": "W5b" if dtype == torch.bfloat16 else "W5", "median_ms": med, "gflops": 2 * 1024**3 / (med * 1e6), "threads": torch.get_num_threads()}


def main():
    names = sys.argv[1:] or ["W1", "W2", "W3", "W4", "W4r", "W5", "W6"]
    run = {"W1": lambda: fashion("W1", False), "W2": lambda: fashion("W2", True), "W3": gpt, "W4": lambda: deep("W4", 0),
           "W4r": lambda: deep("W4r", 6), "W4b": lambda: deep("W4b", 0, bf16=True), "W5": gemm, "W5b": lambda: gemm(torch.bfloat16),
           "W6": gpt_bf16, "W3c": gpt_checkpoint}
    for n in names:
        if n not in run:
            sys.exit(f"torch_workloads: unknown workload {n}")
        out = run[n]()
        out["peer"] = "pytorch " + torch.__version__
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
