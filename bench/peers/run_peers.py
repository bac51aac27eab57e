#!/usr/bin/env python3
"""bench/peers/run_peers.py - pipeline.h and torch.distributed.pipelining side by side.

Runs the same training work (bench/peers/ours.c and bench/peers/torch_pp.py: same layer sizes,
micro-batch size, m, p and schedule) alternating ours, torch, ours, torch ... in one run, and
prints one table: step time (median), pipeline efficiency T_seq/(p*T_pipe) of each against its
own sequential run, host time per action, peak stash per stage, and the ratio ours/theirs.
A second table runs packed variable-length batches (ours) against the same batches padded to
the longest sequence (torch's static shapes), in real tokens per second.

    make bench-peers                      # builds build/peers_ours, runs this with python3
    make bench-peers PYTHON=/path/to/venv/bin/python PEERS_ARGS="--reps 3"
    python3 bench/peers/run_peers.py --ours build/peers_ours [--python PY] [--reps N]
            [--steps N] [--quick] [--gpu --ours-cuda BIN] [--json out.json]

--python is the interpreter that has torch (default: this one). Without torch the table still
prints ours and says why torch's columns are empty. --gpu runs the GPU setting: torch with all
stages in one process on one GPU (see torch_pp.py), ours with --ours-cuda BIN, a binary that takes
ours.c's flags and prints the same RESULT line (the CUDA backend's build of it).
"""
import argparse
import datetime
import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", default="build/peers_ours")
    ap.add_argument("--ours-cuda", default=None)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="1F1B only (p=2, p=4) and the variable-length row")
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--timeout", type=int, default=900)
    return ap.parse_args()


def env1():
    e = dict(os.environ)
    e.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return e


def run_one(cmd, timeout):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env1(), timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "timed out"
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:]), None
    tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
    return None, "exit %d: %s" % (p.returncode, " | ".join(tail))


def flags(c, steps, warmup):
    f = ["--schedule", c["schedule"], "-p", str(c["p"]), "-m", str(c["m"]), "--layers", str(c["layers"]),
         "--in", str(c["in"]), "--hidden", str(c["hidden"]), "--classes", str(c["classes"]),
         "--rows", str(c["rows"]), "--steps", str(steps), "--warmup", str(warmup)]
    if c["schedule"] == "interleaved":
        f += ["-v", "2"]
    if c.get("lengths"):
        f += ["--lengths", c["lengths"]]
    return f


def write_lengths(path, n_steps, n_seqs=64, median=96, sigma=1.0, cap=1024, seed=7):
    rnd = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(n_steps):
            lens = [max(1, min(cap, int(round(rnd.lognormvariate(math.log(median), sigma))))) for _ in range(n_seqs)]
            f.write(" ".join(map(str, lens)) + "\n")


def med(results, key):
    vals = [r[key] for r in results if r is not None and r.get(key) is not None and r[key] >= 0]
    return statistics.median(vals) if vals else None


def fmt(x, spec):
    return "n/a" if x is None else format(x, spec)


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def machine():
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return "%s, %d cores, %s" % (cpu, os.cpu_count() or 0, platform.platform())


def main():
    a = parse()
    torch_cmd = [a.python, os.path.join(HERE, "torch_pp.py")]
    ok = subprocess.run([a.python, "-c", "import torch, torch.distributed.pipelining; print(torch.__version__)"],
                        capture_output=True, text=True)
    torch_ver = ok.stdout.strip() if ok.returncode == 0 else None
    why_no_torch = None if torch_ver else "torch not importable by %s" % a.python

    mlp = dict(layers=16, **{"in": 64}, hidden=256, classes=16, rows=1024, m=32)
    configs = []
    if a.gpu:
        big = dict(layers=16, **{"in": 1024}, hidden=4096, classes=1024, rows=8192, m=32)
        for sched in ("gpipe", "1f1b", "interleaved"):
            configs.append(dict(big, setting="gpu", schedule=sched, p=4))
    else:
        for p in (2, 4):
            for sched in (("1f1b",) if a.quick else ("gpipe", "1f1b", "interleaved")):
                configs.append(dict(mlp, setting="cpu", schedule=sched, p=p))
    tmpdir = tempfile.mkdtemp(prefix="peers-")
    lpath = os.path.join(tmpdir, "lengths.txt")
    write_lengths(lpath, a.warmup + a.steps)
    varlen = dict(setting="varlen", schedule="1f1b", p=2, m=8, layers=7, hidden=64, classes=8, rows=64,
                  lengths=lpath, **{"in": 16})
    if not a.gpu:
        configs.append(varlen)

    rows = []
    for c in configs:
        ours_r, torch_r, errs = [], [], []
        fl = flags(c, a.steps, a.warmup)
        for rep in range(a.reps):  # A B A B
            if c["setting"] == "gpu":
                if a.ours_cuda:
                    r, e = run_one([a.ours_cuda] + fl, a.timeout)
                else:
                    r, e = None, "no CUDA build of ours given (--ours-cuda)"
            else:
                r, e = run_one([a.ours] + fl, a.timeout)
            ours_r.append(r)
            if e:
                errs.append("ours: " + e)
            if torch_ver:
                tf = fl + (["--device", "cuda"] if c["setting"] == "gpu" else [])
                r, e = run_one(torch_cmd + tf, a.timeout)
                torch_r.append(r)
                if e:
                    errs.append("torch: " + e)
            print("# %s %s p=%d m=%d rep %d done%s" % (c["setting"], c["schedule"], c["p"], c["m"], rep + 1,
                                                       ("  (" + "; ".join(errs[-2:]) + ")") if errs else ""),
                  file=sys.stderr, flush=True)
        rows.append(dict(cfg=c, ours=ours_r, torch=torch_r, errs=errs))

    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print("# pipeline.h vs torch.distributed.pipelining  (%s)" % date)
    print("# machine: %s" % machine())
    ours = ("pipeline_cuda.h, cuBLAS, every stage a stream of one GPU" if a.gpu
            else "%s kernel, threads transport" % kernel_of(rows))
    print("# torch: %s   ours: %s   reps: %d (alternating ours, torch), %d timed steps"
          " after %d warm-up, medians" % (torch_ver or ("n/a: " + why_no_torch), ours, a.reps, a.steps,
                                          a.warmup))
    print("# MLP %d x %d (in %d, %d classes), %d rows per step, 1 thread per stage; torch: gloo, one process per stage"
          % (mlp["layers"], mlp["hidden"], mlp["in"], mlp["classes"], mlp["rows"]) if not a.gpu else
          "# GPU: MLP 16 x 4096, 8192 rows; torch all stages in one process (see torch_pp.py)")
    print()
    hdr = ("%-11s %3s %3s | %9s %9s %6s | %6s %6s %6s %6s | %8s %8s | %8s %8s | %s" %
           ("schedule", "p", "m", "ours_ms", "torch_ms", "ratio", "eff_us", "eff_th", "theory", "ratio",
            "us/act_o", "us/act_t", "stashKB_o", "stashKB_t", "#wrong"))
    print(hdr)
    print("-" * len(hdr))
    fail = 0
    vrow = None
    for R in rows:
        c = R["cfg"]
        if c["setting"] == "varlen":
            vrow = R
            continue
        o, t = R["ours"], R["torch"]
        om, tm = med(o, "t_pipe_ms"), med(t, "t_pipe_ms")
        oe, te = med(o, "efficiency"), med(t, "efficiency")
        oh, th = med(o, "host_us_per_action"), med(t, "host_us_per_action")
        os_ = max((max(r["peak_stash_bytes"]) for r in o if r), default=None)
        ts_ = max((max(r["peak_stash_bytes"]) for r in t if r), default=None)
        wrong = sum(r["wrong"] for r in o if r)
        fail += wrong + sum(1 for r in o if r is None)
        print("%-11s %3d %3d | %9s %9s %6s | %6s %6s %6.3f %6s | %8s %8s | %8s %8s | %d%s" % (
            c["schedule"], c["p"], c["m"], fmt(om, ".2f"), fmt(tm, ".2f"), fmt(ratio(om, tm), ".3f"),
            fmt(oe, ".3f"), fmt(te, ".3f"), c["m"] * (2 if c["schedule"] == "interleaved" else 1) /
            (c["m"] * (2 if c["schedule"] == "interleaved" else 1) + c["p"] - 1), fmt(ratio(oe, te), ".2f"),
            fmt(oh, ".1f"), fmt(th, ".1f"), fmt(os_ / 1024 if os_ is not None else None, ".0f"),
            fmt(ts_ / 1024 if ts_ is not None else None, ".0f"), wrong,
            "  (p > cores)" if c["p"] > (os.cpu_count() or 1) else ""))
        for e in sorted(set(R["errs"])):
            print("    ! " + e)
    if vrow:
        c = vrow["cfg"]
        o, t = vrow["ours"], vrow["torch"]
        ot, tt = med(o, "tokens_per_s"), med(t, "tokens_per_s")
        print()
        print("# variable length: %d steps of 64 sequences, lognormal lengths (median 96, sigma 1, cap 1024), "
              "MLP %d x %d per token (in %d, %d classes), %s p=%d m=%d" % (a.steps, c["layers"], c["hidden"],
                                                                       c["in"], c["classes"], c["schedule"],
                                                                       c["p"], c["m"]))
        print("%-34s %12s %12s %12s %8s" % ("side", "rows/step", "step_ms", "tokens/s", "#wrong"))
        orow = o[0] if o and o[0] else None
        trow = t[0] if t and t[0] else None
        print("%-34s %12s %12s %12s %8s" % ("ours: packed, cu_seqlens", fmt(orow and orow["tokens_per_step"], ".0f"),
                                            fmt(med(o, "t_pipe_ms"), ".2f"), fmt(ot, ".0f"),
                                            sum(r["wrong"] for r in o if r)))
        print("%-34s %12s %12s %12s %8s" % ("torch: padded to %s" % (trow["pad_len"] if trow else "?"),
                                            fmt(trow and trow["rows_per_step"], ".0f"),
                                            fmt(med(t, "t_pipe_ms"), ".2f"), fmt(tt, ".0f"), "-"))
        print("tokens/s ours/torch: %s" % fmt(ratio(ot, tt), ".2f"))
        fail += sum(r["wrong"] for r in o if r) + sum(1 for r in o if r is None)
        for e in sorted(set(vrow["errs"])):
            print("    ! " + e)
    print()
    print("eff = T_seq / (p * T_pipe), each side against its own sequential run; theory = vm/(vm+p-1);")
    print("us/act = step time / actions per rank on a width-1 model (host cost per action);")
    print("stashKB = peak bytes kept from forward to backward on the busiest stage (ours: the stage's stash;")
    print("torch: tensors saved for backward, parameters excluded); #wrong = ours' steps not bit-identical to")
    print("its sequential run. ratio = ours / torch.")
    print("OK" if fail == 0 else "FAILED")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(date=date, machine=machine(), torch=torch_ver, rows=rows), f, indent=1)
    return 1 if fail else 0


def kernel_of(rows):
    for R in rows:
        for r in R["ours"]:
            if r:
                return r.get("kernel", "?")
    return "?"


if __name__ == "__main__":
    sys.exit(main())
