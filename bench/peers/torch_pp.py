#!/usr/bin/env python3
"""bench/peers/torch_pp.py - the torch.distributed.pipelining side of the peer comparison.

The same model as bench/peers/ours.c: L dense layers (nn.Linear, Tanh after every one but the
last), a cross-entropy loss, the dense layers split evenly over p*v stages (stage s gets layers
[s*L/S, (s+1)*L/S)), the loss on the last stage. The loss of a micro-batch is divided by m and
scale_grads is off, as ours scales each micro-batch's gradient by 1/m.

CPU (default): one process per rank, gloo, torch.set_num_threads(1) in each. Schedules:
ScheduleGPipe, Schedule1F1B (one stage per rank), ScheduleInterleaved1F1B (v stages per rank,
stage s on rank s % p, as ours).

--device cuda: all stages in ONE process on one GPU (world size 1, v = p*v_local stages on rank
0). NCCL refuses two ranks on one GPU and gloo's send/recv of CUDA tensors is not what a user
would run, so GPipe and 1F1B (one stage per rank) cannot be laid out on one GPU; we run
ScheduleLoopedBFS for "gpipe" and ScheduleInterleaved1F1B for "1f1b" and "interleaved", and say
so in the result ("torch_schedule"). --single-process does the same on the CPU (to test it).

Printed: one line "RESULT {json}" with T_seq (the same micro-batches forward+backward in one
process, no pipelining), T_pipe (median over steps of the slowest rank's step, a barrier before
each step), efficiency T_seq/(p*T_pipe), host time per action (width-1 model: step / actions per
rank), peak bytes of tensors saved for backward per rank (parameters excluded: the analogue of
ours' stash), peak RSS per process, and tokens/s.

--lengths FILE: one line per step of sequence lengths (the same file ours reads). torch's stages
have static shapes, so every sequence is padded to the longest in the whole run, [n_seqs, Lmax,
in], pad targets ignored; tokens/s counts real tokens only.
"""
import argparse
import json
import os
import resource
import socket
import statistics
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--schedule", default="1f1b", choices=["gpipe", "1f1b", "interleaved"])
    ap.add_argument("-p", type=int, default=4)
    ap.add_argument("-v", type=int, default=0)
    ap.add_argument("-m", type=int, default=32)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--in", dest="inp", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--classes", type=int, default=16)
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--lengths", default=None)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--single-process", action="store_true")
    ap.add_argument("--no-overhead", action="store_true")
    a = ap.parse_args()
    if a.v == 0:
        a.v = 2 if a.schedule == "interleaved" else 1
    if a.schedule != "interleaved" and a.v != 1:
        ap.error("gpipe and 1f1b have v = 1")
    if a.p * a.v > a.layers:
        ap.error("p*v must be <= layers")
    return a


def build_layers(L, inp, hidden, classes, seed=1234):
    torch.manual_seed(seed)
    layers = []
    for i in range(L):
        a = inp if i == 0 else hidden
        b = classes if i == L - 1 else hidden
        lin = nn.Linear(a, b)
        layers.append(nn.Sequential(lin, nn.Tanh()) if i < L - 1 else lin)
    return layers


def stage_module(layers, s, S):
    L = len(layers)
    return nn.Sequential(*layers[s * L // S:(s + 1) * L // S])


def make_loss(m, classes):
    def loss_fn(out, target):
        return F.cross_entropy(out.reshape(-1, classes), target.reshape(-1), ignore_index=-1) / m
    return loss_fn


def make_batches(a, n_total, inp, classes, rows):
    """Returns (list of (x, y)), real tokens per step. Varlen: padded to the run's longest."""
    g = torch.Generator().manual_seed(99)
    if a.lengths:
        with open(a.lengths) as f:
            lines = [[int(t) for t in ln.split()] for ln in f if ln.strip()]
        n_seqs = len(lines[0])
        if any(len(ln) != n_seqs for ln in lines):
            sys.exit("torch side needs the same number of sequences every step (static shapes)")
        if n_seqs % a.m:
            sys.exit("torch side splits the batch dimension: n_seqs must be a multiple of m")
        lmax = max(max(ln) for ln in lines)
        out, real = [], []
        for i in range(n_total):
            lens = lines[i % len(lines)]
            x = torch.zeros(n_seqs, lmax, inp)
            y = torch.full((n_seqs, lmax), -1, dtype=torch.long)
            for j, n in enumerate(lens):
                x[j, :n] = torch.rand(n, inp, generator=g) * 2 - 1
                y[j, :n] = torch.randint(0, classes, (n,), generator=g)
            out.append((x, y))
            real.append(sum(lens))
        return out, real, lmax
    out = []
    for _ in range(n_total):
        x = torch.rand(rows, inp, generator=g) * 2 - 1
        y = torch.randint(0, classes, (rows,), generator=g)
        out.append((x, y))
    return out, [rows] * n_total, 0


class SavedTracker:
    """Peak bytes of tensors autograd saves for backward (each storage counted once, parameters
    excluded): what a stage keeps alive between a micro-batch's forward and its backward."""

    def __init__(self, params):
        self.param_ptrs = {p.untyped_storage().data_ptr() for p in params}
        self.live = {}
        self.cur = 0
        self.peak = 0

    def pack(self, t):
        st = t.untyped_storage()
        key = st.data_ptr()
        if key in self.param_ptrs or t.device.type == "meta":
            return _Held(None, key, t)
        ent = self.live.get(key)
        if ent:
            ent[0] += 1
        else:
            self.live[key] = [1, st.nbytes()]
            self.cur += st.nbytes()
            self.peak = max(self.peak, self.cur)
        return _Held(self, key, t)

    def release(self, key):
        ent = self.live.get(key)
        if ent:
            ent[0] -= 1
            if ent[0] == 0:
                self.cur -= ent[1]
                del self.live[key]

    @staticmethod
    def unpack(h):
        return h.t

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)


class _Held:
    __slots__ = ("tr", "key", "t")

    def __init__(self, tr, key, t):
        self.tr, self.key, self.t = tr, key, t

    def __del__(self):
        if self.tr is not None:
            self.tr.release(self.key)


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def sequential(a, dev, batches):
    """T_seq: every micro-batch forward then backward through the whole model, one process."""
    layers = build_layers(a.layers, a.inp, a.hidden, a.classes)
    model = nn.Sequential(*layers).to(dev)
    loss_fn = make_loss(a.m, a.classes)
    times, losses = [], []
    for x, y in batches:
        x, y = x.to(dev), y.to(dev)
        sync(dev)
        t0 = time.perf_counter()
        tot = 0.0
        for xm, ym in zip(x.chunk(a.m), y.chunk(a.m)):
            loss = loss_fn(model(xm), ym)
            loss.backward()
            tot += loss.detach()
        sync(dev)
        times.append(time.perf_counter() - t0)
        losses.append(float(tot))
    return times, losses


def build_schedule(a, dev, rank, world, layers, loss_fn, single):
    from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe,
                                              ScheduleInterleaved1F1B, ScheduleLoopedBFS)
    S = a.p * a.v
    if single:
        ids = list(range(S))
    else:
        ids = [rank + c * world for c in range(a.v)]
    stages = []
    for s in ids:
        mod = stage_module(layers, s, S).to(dev)
        stages.append(PipelineStage(mod, s, S, dev))
    if single:
        kind = ScheduleLoopedBFS if a.schedule == "gpipe" else ScheduleInterleaved1F1B
        sched = kind(stages, a.m, loss_fn=loss_fn, scale_grads=False)
    elif a.schedule == "interleaved":
        kind = ScheduleInterleaved1F1B
        sched = kind(stages, a.m, loss_fn=loss_fn, scale_grads=False)
    else:
        kind = ScheduleGPipe if a.schedule == "gpipe" else Schedule1F1B
        sched = kind(stages[0], a.m, loss_fn=loss_fn, scale_grads=False)
    return stages, sched, kind.__name__, ids


def pipeline_run(a, dev, rank, world, batches, single, width1=False):
    """Runs the schedule over the batches on this rank; returns per-step times and stats."""
    if width1:
        layers = build_layers(a.layers, 1, 1, 2)
        loss_fn = make_loss(a.m, 2)
    else:
        layers = build_layers(a.layers, a.inp, a.hidden, a.classes)
        loss_fn = make_loss(a.m, a.classes)
    S = a.p * a.v
    stages, sched, kname, ids = build_schedule(a, dev, rank, world, layers, loss_fn, single)
    params = [p for st in stages for p in st.submod.parameters()]
    tracker = SavedTracker(params)
    has_first, has_last = 0 in ids, (S - 1) in ids
    times, losses = [], []
    for x, y in batches:
        x, y = x.to(dev), y.to(dev)
        if world > 1:
            dist.barrier()
        sync(dev)
        t0 = time.perf_counter()
        out_losses = []
        with tracker.hooks():
            if has_first and has_last:
                sched.step(x, target=y, losses=out_losses, return_outputs=False)
            elif has_first:
                sched.step(x)
            elif has_last:
                sched.step(target=y, losses=out_losses, return_outputs=False)
            else:
                sched.step()
        sync(dev)
        times.append(time.perf_counter() - t0)
        losses.append(float(sum(float(t.detach()) for t in out_losses)) if has_last else None)
    return {"times": times, "losses": losses, "peak_saved": tracker.peak, "torch_schedule": kname,
            "actions_per_rank": 2 * a.m * len(ids)}


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def worker(rank, a, port, q):
    torch.set_num_threads(1)
    dev = torch.device("cpu")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=a.p)
    try:
        n_total = a.warmup + a.steps
        batches, _, _ = make_batches(a, n_total, a.inp, a.classes, a.rows)
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        res = pipeline_run(a, dev, rank, a.p, batches, False)
        res["rss_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        res["rss_growth_kb"] = res["rss_kb"] - rss0
        if not a.no_overhead and not a.lengths:
            w1 = [(torch.rand(a.m, 1), torch.randint(0, 2, (a.m,))) for _ in range(a.warmup + 5 * a.steps)]
            res["w1_times"] = pipeline_run(a, dev, rank, a.p, w1, False, width1=True)["times"]
        q.put((rank, res))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main():
    a = parse()
    torch.set_num_threads(1)
    # an index: torch.cuda.set_device refuses a bare "cuda" (torch 2.11, seen on an H200)
    dev = torch.device("cuda", 0) if a.device == "cuda" else torch.device(a.device)
    single = a.single_process or a.device == "cuda"
    n_total = a.warmup + a.steps
    batches, real, lmax = make_batches(a, n_total, a.inp, a.classes, a.rows)
    if dev.type == "cuda":
        # the memory statistics refuse a device before its context exists ("Invalid device
        # argument", torch 2.11 on an H200): select it and allocate once first
        torch.cuda.set_device(dev)
        torch.zeros(1, device=dev)
        torch.cuda.reset_peak_memory_stats(dev)
    t_seq_all, seq_losses = sequential(a, dev, batches)
    t_seq = statistics.median(t_seq_all[a.warmup:])
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)

    if single:
        world = 1
        if not dist.is_initialized():
            dist.init_process_group("gloo" if dev.type == "cpu" else "nccl",
                                    init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
            if dev.type == "cuda":
                torch.cuda.set_device(dev)
        res = pipeline_run(a, dev, 0, 1, batches, True)
        res["rss_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        if not a.no_overhead and not a.lengths:
            w1 = [(torch.rand(a.m, 1), torch.randint(0, 2, (a.m,))) for _ in range(a.warmup + 5 * a.steps)]
            res["w1_times"] = pipeline_run(a, dev, 0, 1, w1, True, width1=True)["times"]
        if dev.type == "cuda":
            res["cuda_peak_bytes"] = torch.cuda.max_memory_allocated(dev)
        dist.destroy_process_group()
        per_rank = [res]
    else:
        ctx = mp.get_context("spawn")
        q = ctx.SimpleQueue()
        mp.start_processes(worker, args=(a, free_port(), q), nprocs=a.p, join=True, start_method="spawn")
        got = {}
        while not q.empty():
            r, res = q.get()
            got[r] = res
        per_rank = [got[r] for r in range(a.p)]
        world = a.p

    worst = [max(pr["times"][i] for pr in per_rank) for i in range(n_total)]
    t_pipe = statistics.median(worst[a.warmup:])
    host = -1.0
    if "w1_times" in per_rank[0]:
        w1w = [max(pr["w1_times"][i] for pr in per_rank) for i in range(len(per_rank[0]["w1_times"]))]
        host = statistics.median(w1w[a.warmup:]) / per_rank[0]["actions_per_rank"] * 1e6
    last = [pr for pr in per_rank if any(x is not None for x in pr["losses"])]
    pipe_losses = last[0]["losses"] if last else []
    # torch's schedule and our sequential loop sum the losses in the same order; allow rounding
    loss_diff = max((abs(x - y) for x, y in zip(pipe_losses, seq_losses)), default=float("nan"))
    tokens = statistics.mean(real[a.warmup:])
    out = {
        "side": "torch", "torch": torch.__version__, "device": a.device, "backend": "gloo" if a.device == "cpu" else "nccl",
        "processes": world, "torch_schedule": per_rank[0]["torch_schedule"], "schedule": a.schedule,
        "p": a.p, "v": a.v, "m": a.m, "layers": a.layers, "in": a.inp, "hidden": a.hidden, "classes": a.classes,
        "varlen": int(bool(a.lengths)), "pad_len": lmax, "tokens_per_step": tokens,
        "rows_per_step": int(batches[0][0].numel() // a.inp),
        "t_seq_ms": 1e3 * t_seq, "t_pipe_ms": 1e3 * t_pipe, "efficiency": t_seq / (a.p * t_pipe),
        "theory": a.v * a.m / (a.v * a.m + a.p - 1), "tokens_per_s": tokens / t_pipe,
        "host_us_per_action": host, "actions_per_rank": per_rank[0]["actions_per_rank"],
        "peak_stash_bytes": [pr["peak_saved"] for pr in per_rank],
        "rss_kb": [pr["rss_kb"] for pr in per_rank],
        "loss_max_abs_diff": loss_diff, "cores": os.cpu_count(),
    }
    if "cuda_peak_bytes" in per_rank[0]:
        out["cuda_peak_bytes"] = per_rank[0]["cuda_peak_bytes"]
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
