"""PyTorch under cudaleak (scripts/gpu-validate.sh).

    python3 torch_checks.py leak|clean|phases|phases-clean|overhead|nccl|cublas|oom|peak
    torchrun --nproc-per-node 2 torch_checks.py ranks|ranks-clean
        a workload, run under cudaleak; what it knows without cudaleak (what
        it kept, PyTorch's own counters and messages) is its ground truth,
        written as JSON to $GPU_CHECK_TRUTH
    python3 torch_checks.py verify MODE PRESET REPORT_DIR TRUTH_JSON
        the checks of a finished run, outside the preload (no torch needed):
        one CHECK line each (gpu/check_report.py), exit 1 when one failed

Planted lines are marked by a comment (LEAK <name>, OOM request, PEAK
activations, CHURN phase); the checks find them here, so editing this
file keeps them right.
"""

import glob
import json
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import check_report as cr  # noqa: E402
from check_report import GiB, MiB, check, fmt_bytes, marker_line  # noqa: E402

SRC = os.path.abspath(__file__)

torch = None  # imported by the workloads only: the checks run without it
cudaleak = None
KEPT = []
model = None

# PyTorch's caching allocator (c10/cuda/CUDACachingAllocator.cpp): requests
# of 1 to 10 MiB are served from 20 MiB segments (kLargeBuffer); from 10 MiB
# on, a request gets its own segment rounded up to 2 MiB (kRoundLarge).
LARGE_BUFFER = 20 * MiB
ROUND_LARGE = 2 * MiB


def _imports():
    global torch, cudaleak
    import torch as t

    import cudaleak as c

    torch, cudaleak = t, c


def setup():
    global model
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).cuda()
    return torch.optim.SGD(model.parameters(), lr=0.01)


def train_step(opt, keep):
    x = torch.randn(128, 512, device="cuda")
    loss = model(x).square().mean()
    opt.zero_grad(set_to_none=False)
    loss.backward()
    opt.step()
    if keep:
        KEPT.append(x * 2)  # LEAK train_step
    return loss


def nbytes(t):
    return t.numel() * t.element_size()


def leak():
    opt = setup()
    for _ in range(5):
        train_step(opt, keep=True)
    torch.cuda.synchronize()
    sizes = [nbytes(t) for t in KEPT]
    print("kept", len(KEPT), "tensors of", sizes[0], "bytes")
    # At exit, interpreter shutdown frees what module globals hold; a live
    # dump shows the training loop's leak as the job would see it.
    dumped = cudaleak.dump("end of training")
    print("dump written:", dumped)
    cr.write_truth({"kept": len(KEPT), "nbytes": sizes, "dumped": dumped})


def clean():
    opt = setup()
    train_step(opt, keep=False)  # warm-up: parameters, grads, cuBLAS
    torch.cuda.synchronize()
    clean_error = None
    try:
        with cudaleak.no_leaks("clean training steps"):
            for _ in range(5):
                train_step(opt, keep=False)
            torch.cuda.synchronize()
    except cudaleak.LeakError as e:
        clean_error = str(e).splitlines()[0]
    print("clean:", clean_error or "no leak in the checked region")
    leaky = None
    try:
        with cudaleak.no_leaks("leaky training step"):
            train_step(opt, keep=True)
            torch.cuda.synchronize()
    except cudaleak.LeakError as e:
        print("leaky: LeakError")
        print(e)
        leaky = e.report  # cudaleak's figure; the truth is the tensor kept
    cr.write_truth({
        "available": cudaleak.available(),
        "clean_error": clean_error,
        "leaky_report": leaky,
        "kept": 1,
        "kept_nbytes": nbytes(KEPT[-1]),
    })


def dump_and_wait(dumps):
    os.kill(os.getpid(), signal.SIGUSR1)
    d = os.environ["CUDALEAK_DIR"]
    for _ in range(600):
        n = len([f for f in os.listdir(d) if f.endswith(".signal.json") and ".%d." % os.getpid() in f])
        if n >= dumps:
            return
        time.sleep(0.05)
    raise SystemExit("no signal dump")


PHASES, PER_PHASE, PHASE_NUMEL = 3, 20, 1 << 20


def grow_phase():
    for _ in range(PER_PHASE):
        KEPT.append(torch.empty(PHASE_NUMEL, device="cuda"))  # LEAK phase (4 MiB each)


def churn_phase():
    for _ in range(PER_PHASE):
        t = torch.empty(PHASE_NUMEL, device="cuda")  # CHURN phase (freed at once)
        del t


def phases(leaky):
    setup()
    for i in range(PHASES):
        grow_phase() if leaky else churn_phase()
        torch.cuda.synchronize()
        dump_and_wait(i + 1)
    print("phases done")
    cr.write_truth({
        "leaky": leaky,
        "phases": PHASES,
        "per_phase": PER_PHASE,
        "nbytes_each": PHASE_NUMEL * torch.empty(0).element_size(),  # a CPU tensor: the default dtype's size
        "kept": len(KEPT),
    })


def large_step(opt, x):
    loss = model(x).square().mean()
    opt.zero_grad(set_to_none=False)
    loss.backward()
    opt.step()


def overhead():
    """Milliseconds per training step, after a warm-up; $OVERHEAD_STEPS
    steps (default 500). $OVERHEAD_MODEL: `small` (default: the MLP
    512-512-10 on a batch of 128, about 1 ms a step, small tensors: the
    library's worst case) or `large` (8 Linear 4096x4096 layers on a batch
    of 4096: milliseconds of GPU work per allocation, as a real step has)."""
    global model
    steps = int(os.environ.get("OVERHEAD_STEPS", "500"))
    if os.environ.get("OVERHEAD_MODEL", "small") == "large":
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(8)]).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.randn(4096, 4096, device="cuda")

        def one():
            large_step(opt, x)
    else:
        opt = setup()

        def one():
            train_step(opt, keep=False)
    for _ in range(20):
        one()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        one()
    torch.cuda.synchronize()
    print("%.4f ms/step" % ((time.perf_counter() - t0) * 1000 / steps))


def oom():
    """A real out-of-memory error: weights kept, a request of
    1.5 times the free memory. PyTorch frees its cache and retries before
    it raises; the oom report shows what was live before that. Exit 0 when
    the error came, 1 when it did not."""
    opt = setup()
    train_step(opt, keep=False)
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    reserved, allocated = torch.cuda.memory_reserved(), torch.cuda.memory_allocated()
    # Under expandable segments PyTorch reserves address space for about
    # 1.125 times the GPU's memory and refuses a larger request itself,
    # with no driver call; free + 8 GiB stays inside it, so PyTorch maps
    # pages until the driver refuses one.
    expandable = "expandable_segments:true" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "").lower()
    numel = (free + 8 * GiB if expandable else int(free * 1.5)) // 4
    print("free %d of %d bytes before the request; reserved %d allocated %d" % (free, total, reserved, allocated))
    truth = {"free_before": free, "total": total, "reserved_before": reserved, "allocated_before": allocated,
             "nbytes": numel * 4, "raised": False, "message": None}
    try:
        big = torch.empty(numel, device="cuda")  # OOM request
        print("no error: %d bytes" % nbytes(big))
    except torch.cuda.OutOfMemoryError as e:
        print("OutOfMemoryError:", str(e).splitlines()[0])
        truth.update(raised=True, message=str(e))
    cr.write_truth(truth)
    sys.exit(0 if truth["raised"] else 1)


def peak():
    """The peak of a training step with large activations: the
    live dump's peak against PyTorch's own max_memory_allocated and
    max_memory_reserved."""
    global model
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(8)]).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    torch.cuda.reset_peak_memory_stats()
    x = torch.randn(8192, 4096, device="cuda")
    loss = model(x).square().mean()  # PEAK activations
    opt.zero_grad(set_to_none=False)
    loss.backward()
    opt.step()
    torch.cuda.synchronize()
    truth = {"max_allocated": torch.cuda.max_memory_allocated(), "max_reserved": torch.cuda.max_memory_reserved()}
    print("torch max_memory_allocated %(max_allocated)d max_memory_reserved %(max_reserved)d" % truth)
    del x, loss
    truth["dumped"] = cudaleak.dump("after the step")
    print("dump written:", truth["dumped"])
    cr.write_truth(truth)


def nccl():
    import torch.distributed as dist

    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29517", rank=0, world_size=1)
    t = torch.ones(1 << 20, device="cuda")
    dist.all_reduce(t)
    torch.cuda.synchronize()
    dist.destroy_process_group()
    print("nccl all_reduce:", t[0].item())


RANK_TENSOR_NUMEL = 1 << 18  # 1 MiB of float32


def ranks(leaky):
    """One rank of `torchrun --nproc-per-node 2` on one GPU (gloo). Rank r
    keeps r + 1 tensors of 1 MiB when leaky and ends with os._exit(0), so
    that no interpreter shutdown frees them: a leak at exit the gate must
    fail. Clean, it keeps none and exits normally. Its truth file is
    $GPU_CHECK_TRUTH.rank<r>."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.cuda.set_device(0)
    kept = []
    for _ in range(rank + 1 if leaky else 0):
        kept.append(torch.ones(RANK_TENSOR_NUMEL, device="cuda"))  # LEAK rank
    scratch = torch.ones(RANK_TENSOR_NUMEL, device="cuda") * 2
    total = torch.tensor([sum(nbytes(t) for t in kept)])
    dist.all_reduce(total)  # on the CPU: gloo
    torch.cuda.synchronize()
    del scratch
    print("rank %d kept %d tensors; all ranks kept %d bytes" % (rank, len(kept), total.item()))
    cr.write_truth({"rank": rank, "pid": os.getpid(), "kept": len(kept), "nbytes": [nbytes(t) for t in kept],
                    "all_ranks_bytes": total.item()},
                   "%s.rank%d" % (os.environ["GPU_CHECK_TRUTH"], rank))
    dist.destroy_process_group()
    if leaky:
        sys.stdout.flush()
        os._exit(0)


def cublas():
    a = torch.randn(1024, 1024, device="cuda")
    b = a @ a
    c = torch.nn.functional.linear(a, a)
    torch.cuda.synchronize()
    del a, b, c
    print("cublas done")


# --- Checks (outside the preload) ---------------------------------------------

PRESET_API = {"no-cache": "cudaMalloc", "async": "cudaMallocAsync", "default": "cudaMalloc", "pytorch": "cudaMallocAsync",
              "expandable": "cuMemCreate"}


def _dump(report_dir, trigger, name, want=None):
    """The report files of a trigger, with a check that they are there."""
    files = cr.report_files(report_dir, trigger)
    ok = len(files) == want if want is not None else len(files) >= 1
    check("%s %s dumps" % (name, trigger), ok, "%d %s report(s) in %s" % (len(files), trigger, os.path.basename(report_dir)),
          "exactly %d" % want if want is not None else "at least 1")
    if not files:
        raise FileNotFoundError("no %s report in %s" % (trigger, report_dir))
    return files


def verify_leak(preset, report_dir, truth, name):
    """preset no-cache (--pytorch-no-cache), async (backend:cudaMallocAsync)
    or expandable (expandable_segments:True)."""
    r = cr.load_report(_dump(report_dir, "api", name)[-1])
    line = marker_line(SRC, "LEAK train_step")
    gs = cr.groups_at(r, line, file=SRC, function="train_step")
    blocks, got = cr.total(gs)
    kept, want = truth["kept"], sum(truth["nbytes"])
    if preset == "expandable":
        # Tensors live in mapped segments (cuMemCreate), attributed to the
        # allocation that grew a segment, not to each tensor: a lower bound.
        phys = sum(g["bytes"] for g in r.get("leaks", []) if g["memory"] == "physical")
        check("%s physical memory" % name, phys >= want,
              "%s in physical (cuMemCreate) groups; kept tensors %s" % (fmt_bytes(phys), fmt_bytes(want)),
              ">= the kept tensors' bytes")
        return
    api = PRESET_API[preset]
    check("%s blocks" % name, blocks == kept,
          "%d block(s) at torch_checks.py line %d (train_step) in %d group(s); kept %d tensors" % (blocks, line, len(gs), kept),
          "exact")
    check("%s bytes" % name, got == want,
          "%d B at line %d; kept tensors numel*element_size %d B" % (got, line, want),
          "exact (one %s of the tensor's bytes each, no rounding)" % api)
    kinds = sorted(set((g["api"], g["memory"]) for g in gs))
    check("%s api" % name, kinds == [(api, "device")], "groups %s" % kinds, "%s device" % api)


def verify_clean(report_dir, truth, name):
    check("%s library loaded" % name, truth["available"], "cudaleak.available() %s" % truth["available"], "True")
    check("%s clean region" % name, truth["clean_error"] is None,
          truth["clean_error"] or "no LeakError", "no LeakError around 5 steps that keep nothing")
    rep = truth["leaky_report"]
    if rep is None:
        check("%s leaky region" % name, False, "no LeakError", "LeakError for the kept tensor")
        return
    blocks, got = cr.total(rep.get("leaks", []))
    check("%s leaky region" % name, (blocks, got) == (truth["kept"], truth["kept_nbytes"]),
          "LeakError with %d block(s) %d B; kept %d tensor of %d B" % (blocks, got, truth["kept"], truth["kept_nbytes"]),
          "exact")
    line = marker_line(SRC, "LEAK train_step")
    at = cr.total(cr.groups_at(rep, line, file=SRC, function="train_step"))
    check("%s leaky line" % name, at == (blocks, got) and blocks > 0,
          "%d of %d block(s) at torch_checks.py line %d (train_step)" % (at[0], blocks, line), "all of them")


def verify_phases(report_dir, truth, name):
    files = _dump(report_dir, "signal", name, truth["phases"])
    per_phase = truth["per_phase"] * truth["nbytes_each"]
    if truth["leaky"]:
        line = marker_line(SRC, "LEAK phase")
        last = []
        for k, f in enumerate(files, 1):
            gs = cr.groups_at(cr.load_report(f), line, file=SRC, function="grow_phase")
            got, kept = cr.total(gs)[1], k * per_phase
            check("%s dump %d" % (name, k), kept <= got <= kept + LARGE_BUFFER,
                  "%s in cache segments at line %d; kept %d x %d B = %s" % (fmt_bytes(got), line, k * truth["per_phase"],
                                                                            truth["nbytes_each"], fmt_bytes(kept)),
                  "kept bytes, up to one 20 MiB segment (kLargeBuffer) more")
            last = gs
        trends = sorted(set(str(g.get("trend")) for g in last))
        check("%s trend" % name, trends == ["growing"], "trend at the last dump %s" % trends, "growing")
    else:
        line = marker_line(SRC, "CHURN phase")
        for k, f in enumerate(files, 1):
            r = cr.load_report(f)
            got = cr.total(cr.groups_at(r, line, file=SRC, function="churn_phase"))[1]
            check("%s dump %d" % (name, k), got <= LARGE_BUFFER,
                  "%s at line %d; kept nothing (tensors of %d B freed at once)" % (fmt_bytes(got), line, truth["nbytes_each"]),
                  "at most one 20 MiB segment (kLargeBuffer), reused")
            if k == len(files):
                growing = [g for g in r.get("leaks", []) if g.get("trend") == "growing"]
                check("%s nothing growing" % name, not growing,
                      "%d group(s) growing at the last dump%s" % (len(growing), "".join(
                          " (%s %d B)" % (g["api"], g["bytes"]) for g in growing[:3])), "0")


def verify_oom(preset, report_dir, truth, name):
    """preset default (caching allocator) or pytorch (`cudaleak run
    --pytorch`: backend:cudaMallocAsync)."""
    first = (truth.get("message") or "").splitlines()[:1]
    check("%s OutOfMemoryError" % name, truth["raised"], first[0] if first else "no error raised",
          "torch.cuda.OutOfMemoryError for %s" % fmt_bytes(truth["nbytes"]))
    r = cr.load_report(_dump(report_dir, "oom", name)[0])
    o = r["oom"]
    req, n = o["requested_bytes"], truth["nbytes"]
    api = PRESET_API[preset]
    check("%s api" % name, o["api"] == api, "oom.api %s" % o["api"], api)
    if preset == "expandable":
        # The failed driver call is one page of the expandable segment
        # (2 MiB in the small pool, 20 MiB in the large), not the tensor.
        check("%s request vs tensor" % name, req in (2 * MiB, LARGE_BUFFER),
              "requested %d B; tensor %d B" % (req, n),
              "one expandable-segment page: 2 MiB or 20 MiB")
    elif preset == "default":
        seg = cr.round_up(n, ROUND_LARGE)
        check("%s request vs tensor" % name, req == seg,
              "requested %d B; tensor %d B rounded up to 2 MiB = %d B" % (req, n, seg),
              "exact (the caching allocator asks the driver for the tensor rounded up to 2 MiB, kRoundLarge)")
    else:
        check("%s request vs tensor" % name, req == n, "requested %d B; tensor %d B" % (req, n),
              "exact (backend:cudaMallocAsync asks for the tensor's bytes)")
    if truth["raised"] and preset == "expandable":
        said, prec, which = cr.parse_oom_request(truth["message"])
        seg = cr.round_up(n, ROUND_LARGE)
        check("%s message vs tensor" % name, said - prec <= seg <= said + prec,
              "message %r = %d B; tensor rounded up to 2 MiB %d B (cudaleak saw the page it failed on)"
              % (which, said, seg), "+-%d B, the message's 2-decimal rounding" % prec)
    elif truth["raised"]:
        said, prec, which = cr.parse_oom_request(truth["message"])
        check("%s request vs message" % name, said - prec <= req <= said + prec,
              "requested %d B; message %r = %d B" % (req, which, said),
              "+-%d B, the message's 2-decimal rounding (request >= stated - rounding)" % prec)
    # Holders: every group live at the failure, suppressed ones too (the
    # default suppressions hide cuBLAS's workspaces, which PyTorch counts).
    groups = r.get("leaks", []) + r.get("suppressed", [])
    if preset == "expandable":
        # What the segments held before the request, plus the pages mapped
        # for it before the driver refused one: about all free memory.
        held = sum(g["bytes"] for g in groups if g.get("pytorch_cache_segment") and g.get("memory") == "physical")
        want, what = truth["reserved_before"] + truth["free_before"], "memory_reserved() + mem_get_info() free"
        tol = GiB
        tol_text = "1 GiB (the driver's own allocations, pages left unmapped)"
    elif preset == "default":
        held = sum(g["bytes"] for g in groups if g.get("pytorch_cache_segment"))
        want, what, tol = truth["reserved_before"], "torch.cuda.memory_reserved()", 2 * MiB
        tol_text = "2 MiB (one small-pool segment)"
    else:
        held = sum(g["bytes"] for g in groups if g["api"] == "cudaMallocAsync")
        want, what = truth["allocated_before"], "torch.cuda.memory_allocated()"
        tol = max(2 * MiB, want // 100)
        tol_text = "max(2 MiB, 1%%) = %d B" % tol
    check("%s holders" % name, cr.within(held, want, tol),
          "live at the failure %s (%s groups, suppressed ones included); %s before the request %s"
          % (fmt_bytes(held), api if preset == "pytorch" else "PyTorch cache segment", what, fmt_bytes(want)),
          tol_text)
    # Free memory: the figure PyTorch's message states, read after the
    # failed call as ours is. Under backend:cudaMallocAsync the driver's
    # pool has grown into nearly all free memory by then, so the figure
    # before the request (mem_get_info) is no ground truth for it.
    free = o.get("device_free_bytes")
    stated = cr.parse_oom_free(truth.get("message") or "") if truth["raised"] else None
    if preset == "expandable":
        # At the refused page the mapped pages hold what was free; PyTorch
        # unmaps them before its message measures.
        want_free = truth["free_before"] - (held - truth["reserved_before"])
        check("%s device free" % name, free is not None and cr.within(free, want_free, 256 * MiB),
              "oom.device_free_bytes %s; free before the request less the pages mapped for it %s"
              % (fmt_bytes(free), fmt_bytes(want_free)), "256 MiB")
    elif stated:
        want_free, prec = stated
        tol = 256 * MiB + prec
        check("%s device free" % name, free is not None and cr.within(free, want_free, tol),
              "oom.device_free_bytes %s; the message's free memory %s (mem_get_info() before the request %s)"
              % (fmt_bytes(free), fmt_bytes(want_free), fmt_bytes(truth["free_before"])),
              "256 MiB (the driver's own allocations, the cache PyTorch freed before retrying) + %d B rounding" % prec)
    else:
        want_free = truth["free_before"]
        check("%s device free" % name, free is not None and cr.within(free, want_free, 256 * MiB),
              "oom.device_free_bytes %s; torch.cuda.mem_get_info() before the request %s"
              % (fmt_bytes(free), fmt_bytes(want_free)),
              "256 MiB (the driver's own allocations)")
    line = marker_line(SRC, "OOM request")
    ok = any(cr.frame_matches(f, "oom", line, SRC) for f in o.get("python_stack") or [])
    check("%s line" % name, ok, "oom.python_stack %s" % " <- ".join(
        "%s:%s" % (f.get("function"), f.get("line")) for f in (o.get("python_stack") or [])[:3]),
          "contains oom at torch_checks.py line %d" % line)


def verify_peak(preset, report_dir, truth, name):
    r = cr.load_report(_dump(report_dir, "api", name)[-1])
    groups = (r.get("peak") or {}).get("groups", [])
    if preset == "default":
        got = sum(g["bytes"] for g in groups if g.get("pytorch_cache_segment"))
        want, what = truth["max_reserved"], "torch.cuda.max_memory_reserved()"
    else:
        got = sum(g["bytes"] for g in groups if g["api"] == "cudaMallocAsync")
        want, what = truth["max_allocated"], "torch.cuda.max_memory_allocated()"
    tol = max(2 * MiB, want // 100)
    check("%s bytes" % name, cr.within(got, want, tol),
          "%s at the peak (%s groups; process peak %s); %s %s"
          % (fmt_bytes(got), "PyTorch cache segment" if preset == "default" else "cudaMallocAsync",
             fmt_bytes(r["totals"]["peak_bytes"]), what, fmt_bytes(want)),
          "max(2 MiB, 1%%) = %d B" % tol)
    line = marker_line(SRC, "PEAK activations")
    gs = cr.groups_at(r, line, file=SRC, function="peak", key="peak")
    check("%s line" % name, len(gs) >= 1,
          "%d peak group(s), %s, at torch_checks.py line %d (the forward pass)" % (len(gs), fmt_bytes(cr.total(gs)[1]), line),
          "at least 1")


def verify_ranks(leaky, report_dir, truth_path, name):
    """`cudaleak run --pytorch --fail-on-leak -- torchrun ... ranks`: one
    exit report per rank and none from torchrun's own process, each rank's
    leaks exactly the tensors it kept at the marked line, the merge's
    per-rank totals, and the gate's exit status (written to
    TRUTH_PATH.status by the script)."""
    truths = sorted((cr.read_truth(p) for p in glob.glob(truth_path + ".rank*")), key=lambda t: t["rank"])
    check("%s truths" % name, [t["rank"] for t in truths] == [0, 1], "ranks %s wrote their truth" % [t["rank"] for t in truths],
          "ranks [0, 1]")
    with open(truth_path + ".status") as f:
        status = int(f.read().strip())
    want = 23 if leaky else 0
    check("%s gate" % name, status == want, "cudaleak run --fail-on-leak exited %d" % status,
          "%d (%s)" % (want, "an exit report has leaks" if leaky else "no leaks"))
    files = cr.report_files(report_dir, "exit")
    reports = [cr.load_report(f) for f in files]
    pids = sorted(r["pid"] for r in reports)
    check("%s exit reports" % name, pids == sorted(t["pid"] for t in truths),
          "%d exit report(s), pids %s, ranks %s" % (len(reports), pids, sorted(str(r.get("rank")) for r in reports)),
          "one per rank, none from torchrun itself: pids %s" % sorted(t["pid"] for t in truths))
    line = marker_line(SRC, "LEAK rank")
    by_pid = {r["pid"]: r for r in reports}
    for t in truths:
        r = by_pid.get(t["pid"])
        if r is None:
            check("%s rank %d" % (name, t["rank"]), False, "no exit report for pid %d" % t["pid"], "one")
            continue
        gs = cr.groups_at(r, line, file=SRC, function="ranks")
        blocks, got = cr.total(gs)
        others = [g for g in r.get("leaks", []) if g not in gs and g.get("memory_kind") != "module"]
        check("%s rank %d" % (name, t["rank"]),
              r.get("rank") == t["rank"] and blocks == t["kept"] and got == sum(t["nbytes"]) and not others,
              "rank field %s; %d block(s) %d B at line %d, %d other group(s) %s" % (
                  r.get("rank"), blocks, got, line, len(others), [(g["api"], g["bytes"]) for g in others[:3]]),
              "rank %d: %d block(s) %d B (the tensors it kept), nothing else" % (t["rank"], t["kept"], sum(t["nbytes"])))
    cli = os.environ.get("CUDALEAK_CLI")
    if cli:
        out = subprocess.run([cli, "merge", report_dir, "--format", "json"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, timeout=60)
        merged = json.loads(out.stdout) if out.returncode == 0 else {}
        rows = sorted((row.get("rank"), row["leaked_bytes"]) for row in merged.get("ranks", []))
        want_rows = sorted((t["rank"], sum(t["nbytes"])) for t in truths)
        check("%s merge" % name, rows == want_rows, "cudaleak merge: (rank, leaked bytes) %s; exit %d" % (rows, out.returncode),
              "%s" % want_rows)


def verify(mode, preset, report_dir, truth_path):
    name = "torch %s %s" % (mode, preset)

    @cr.guarded(name)
    def run():
        truth = None if mode.startswith("ranks") else cr.read_truth(truth_path)
        if mode in ("leak", "oom", "peak"):
            {"leak": verify_leak, "oom": verify_oom, "peak": verify_peak}[mode](preset, report_dir, truth, name)
        elif mode == "clean":
            verify_clean(report_dir, truth, name)
        elif mode in ("phases", "phases-clean"):
            verify_phases(report_dir, truth, name)
        elif mode in ("ranks", "ranks-clean"):
            verify_ranks(mode == "ranks", report_dir, truth_path, name)
        else:
            raise ValueError("no checks for mode %r" % mode)

    run()
    cr.finish()


if __name__ == "__main__":
    if sys.argv[1] == "verify":
        verify(*sys.argv[2:6])
    _imports()
    {
        "leak": leak,
        "clean": clean,
        "phases": lambda: phases(True),
        "phases-clean": lambda: phases(False),
        "overhead": overhead,
        "nccl": nccl,
        "cublas": cublas,
        "oom": oom,
        "peak": peak,
        "ranks": lambda: ranks(True),
        "ranks-clean": lambda: ranks(False),
    }[sys.argv[1]]()
