"""The Markdown table of bench/compare.sh: reads its log (lines "<who> <round> <json>", who = "frugal" or
"<peer>:<setting>") and prints, per workload, the medians over rounds, each peer at its better thread setting,
frugal / best peer, the memory ratio, and shared/WORKLOADS.md's target with met or not.
    python3 bench/compare_table.py LOG pytorch libtorch"""
import json
import statistics
import sys

SETTINGS = {"1": "OPENBLAS_NUM_THREADS=1", "default": "default threads",
            "1-spin": "OPENBLAS_NUM_THREADS=1, OpenMP's default waiting", "passive": "OMP_WAIT_POLICY=PASSIVE",
            "spin": "OpenMP's default waiting"}


def time_of(d):
    return d.get("median_step_ms", d.get("median_ms"))


def load(path):
    runs = {}  # name -> who -> [json]
    for line in open(path):
        who, _, js = line.split(" ", 2)
        d = json.loads(js)
        runs.setdefault(d["name"], {}).setdefault(who, []).append(d)
    # frugal's runs under its better setting become its side ("frugal"); its setting is remembered beside.
    for sides in runs.values():
        b = best_setting(sides, "frugal")
        if b is not None:
            sides["frugal"], sides["frugal setting"] = b[1], b[0]
    return runs


def med(ds, key):
    vals = [key(d) for d in ds if key(d) is not None]
    return statistics.median(vals) if vals else None


def mean(ds, key):
    """For accuracies: compare.sh gives each round its own seed, so the rounds' mean is a mean over seeds."""
    vals = [key(d) for d in ds if key(d) is not None]
    return statistics.fmean(vals) if vals else None


def best_setting(sides, peer):
    """The peer's setting with the lower median time: (label, its runs), or None when it did not run."""
    options = [(s, sides[f"{peer}:{s}"]) for s in SETTINGS if f"{peer}:{s}" in sides]
    return min(options, key=lambda o: med(o[1], time_of)) if options else None


def mib(n):
    return f"{n / 2**20:.0f} MiB"


def fmt(x, spec=".3g"):
    return "–" if x is None else format(x, spec)


def met(ok):
    return "**met**" if ok else "not met"


def judge(name, f, runs, best_ratio, rss_ratio, peer_best):
    """The target of WORKLOADS.md for a workload and whether frugal's figures meet it (its current targets:
    met ones are raised there, and raised here with them)."""
    fr = runs[name]["frugal"]
    if name == "W1":
        acc = mean(fr, lambda d: d.get("test_accuracy"))
        py = peer_best.get("pytorch")
        py_acc = mean(py, lambda d: d.get("test_accuracy")) if py else None
        checks = [best_ratio is not None and best_ratio <= 0.4, rss_ratio is not None and rss_ratio <= 0.15]
        if acc is not None and py_acc is not None:
            checks.append(acc >= py_acc - 0.005)
        return "time ≤ 0.4 × best peer; RSS ≤ 0.15 × PyTorch's; accuracy ≥ PyTorch's − 0.5 pt", all(checks)
    limits = {"W2": 0.6, "W3": 0.45, "W5": 1.0}
    if name in limits:
        return f"time ≤ {limits[name]} × best peer", best_ratio is not None and best_ratio <= limits[name]
    if name == "W4":
        text = "time ≤ 0.9 × best peer; GFLOP/s ≥ 0.8 × frugal's W5"
        ok = best_ratio is not None and best_ratio <= 0.9
        if "W5" in runs:
            own = med(fr, lambda d: d.get("gflops")) / med(runs["W5"]["frugal"], lambda d: d.get("gflops"))
            text += f" (is {own:.2f})"
            ok = ok and own >= 0.8
        return text, ok
    if name == "W4r":
        if "W4" not in runs:
            return "≤ 1.35 × W4 time, activations ≤ 0.35 × W4's (run W4 too)", None
        w4 = runs["W4"]["frugal"]
        t = f / med(w4, time_of)
        a = med(fr, lambda d: d.get("activation_bytes")) / med(w4, lambda d: d.get("activation_bytes"))
        return f"time ≤ 1.35 × W4 (is {t:.3f}); activations ≤ 0.35 × W4's (is {a:.3f})", t <= 1.35 and a <= 0.35
    if name == "W4b":
        # W4b's line carries the W4 run it alternated with.
        t = med(fr, lambda d: d.get("step_ms_ratio_to_W4"))
        loss = med(fr, lambda d: d.get("loss_ratio_to_W4"))
        text = (f"time ≤ 0.55 × W4 (is {fmt(t)}) and ≤ 0.8 × best peer; loss within 1% of W4's "
                f"(is {fmt(loss, '.5f')})")
        ok = (t is not None and t <= 0.55 and best_ratio is not None and best_ratio <= 0.8 and loss is not None
              and abs(loss - 1) <= 0.01)
        return text, ok
    if name == "W6":
        # W6's line carries the W3 run it alternated with; otherwise frugal's W3 of this comparison.
        t = med(fr, lambda d: d.get("step_ms_ratio_to_W3"))
        a = med(fr, lambda d: d.get("act_ratio_to_W3"))
        loss = med(fr, lambda d: d.get("loss_ratio_to_W3"))
        if t is None and "W3" in runs:
            t = f / med(runs["W3"]["frugal"], time_of)
        if a is None and "W3" in runs:
            w3_act = med(runs["W3"]["frugal"], lambda d: d.get("activation_bytes"))
            w6_act = med(fr, lambda d: d.get("activation_bytes"))
            a = w6_act / w3_act if w3_act and w6_act else None
        text = f"time ≤ 0.6 × W3 (is {fmt(t)}); activations ≤ 0.55 × W3's (is {fmt(a)})"
        ok = t is not None and a is not None and t <= 0.6 and a <= 0.55
        if loss is not None:
            text += f"; loss within 2% of W3's (is {loss:.4f})"
            ok = ok and abs(loss - 1) <= 0.02
        return text, (ok if t is not None and a is not None else None)
    return "", None


# The least fraction of the machine's ceiling (fma-peak.sh: f32 FMA, or bf16 dot for the bf16 workloads) a
# workload's GFLOP/s should reach, judged where bench/workloads was given the ceiling ("ceiling_fraction").
CEILING_TARGETS = {"W4": 0.90, "W5": 0.90, "W5b": 0.85}


def judge_ceiling(name, runs, text, ok):
    """judge()'s target and verdict with the ceiling's, where the workload has one and its runs knew it."""
    frac = med(runs[name]["frugal"], lambda d: d.get("ceiling_fraction"))
    if name not in CEILING_TARGETS or frac is None:
        return text, ok
    part = f"≥ {CEILING_TARGETS[name]} of the ceiling (is {frac:.3f})"
    reached = frac >= CEILING_TARGETS[name]
    return (f"{text}; {part}" if text else part), (reached if ok is None else ok and reached)


def main():
    runs = load(sys.argv[1])
    peers = sys.argv[2:]
    head = ["workload", "frugal ms"] + [f"{p} ms (setting)" for p in peers] + [
        "frugal ÷ best peer", "RSS frugal ÷ PyTorch", "quality frugal / PyTorch", "target", "met"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for name, sides in runs.items():
        if "frugal" not in sides:
            continue
        f = med(sides["frugal"], time_of)
        cells, peer_best, best = [], {}, None
        for p in peers:
            b = best_setting(sides, p)
            if b is None:
                cells.append("–")
                continue
            peer_best[p] = b[1]
            t = med(b[1], time_of)
            cells.append(f"{t:.3f} ({SETTINGS[b[0]]})")
            best = t if best is None else min(best, t)
        ratio = f / best if best else None
        rss_f = max(d.get("peak_rss_bytes", 0) for d in sides["frugal"])
        py = peer_best.get("pytorch")
        rss_p = max(d.get("peak_rss_bytes", 0) for d in py) if py else 0
        rss_ratio = rss_f / rss_p if rss_p and rss_f else None
        rss = f"{fmt(rss_ratio, '.2f')} ({mib(rss_f)} / {mib(rss_p)})" if rss_ratio else "–"
        q = next((k for k in ("test_accuracy", "loss", "gflops") if k in sides["frugal"][0]), None)
        qual = ""
        if q:
            agg, how = (mean, f"mean of {len(sides['frugal'])} seeds") if q == "test_accuracy" else (med, "median")
            qf = agg(sides["frugal"], lambda d: d.get(q))
            qp = agg(py, lambda d: d.get(q)) if py else None
            qual = f"{qf:.4g} / {fmt(qp, '.4g')} ({q}, {how})"
        target, ok = judge_ceiling(name, runs, *judge(name, f, runs, ratio, rss_ratio, peer_best))
        setting = sides.get("frugal setting")
        row = [name, f"{f:.3f}" + (f" ({SETTINGS[setting]})" if setting else "")] + cells + [fmt(ratio, ".3f"), rss, qual, target,
                                            "–" if ok is None else met(ok)]
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
