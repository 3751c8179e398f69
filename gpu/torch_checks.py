"""PyTorch under cudaleak (scripts/gpu-validate.sh).

    python3 torch_checks.py leak|clean|phases|phases-clean|overhead|nccl|cublas|oom|peak
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

import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import check_report as cr  # noqa: E402
from check_report import MiB, check, fmt_bytes, marker_line  # noqa: E402

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


def overhead():
    opt = setup()
    for _ in range(20):
        train_step(opt, keep=False)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(500):
        train_step(opt, keep=False)
    torch.cuda.synchronize()
    print("%.3f ms/step" % ((time.perf_counter() - t0) * 1000 / 500))


def oom():
    """A real out-of-memory error (issue 21): weights kept, a request of
    1.5 times the free memory. PyTorch frees its cache and retries before
    it raises; the oom report shows what was live before that. Exit 0 when
    the error came, 1 when it did not."""
    opt = setup()
    train_step(opt, keep=False)
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    reserved, allocated = torch.cuda.memory_reserved(), torch.cuda.memory_allocated()
    numel = int(free * 1.5) // 4
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
    """The peak of a training step with large activations (issue 21): the
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


def cublas():
    a = torch.randn(1024, 1024, device="cuda")
    b = a @ a
    c = torch.nn.functional.linear(a, a)
    torch.cuda.synchronize()
    del a, b, c
    print("cublas done")


# --- Checks (outside the preload) ---------------------------------------------

PRESET_API = {"no-cache": "cudaMalloc", "async": "cudaMallocAsync", "default": "cudaMalloc", "pytorch": "cudaMallocAsync"}


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
    if preset == "default":
        seg = cr.round_up(n, ROUND_LARGE)
        check("%s request vs tensor" % name, req == seg,
              "requested %d B; tensor %d B rounded up to 2 MiB = %d B" % (req, n, seg),
              "exact (the caching allocator asks the driver for the tensor rounded up to 2 MiB, kRoundLarge)")
    else:
        check("%s request vs tensor" % name, req == n, "requested %d B; tensor %d B" % (req, n),
              "exact (backend:cudaMallocAsync asks for the tensor's bytes)")
    if truth["raised"]:
        said, prec, which = cr.parse_oom_request(truth["message"])
        check("%s request vs message" % name, said - prec <= req <= said + prec,
              "requested %d B; message %r = %d B" % (req, which, said),
              "+-%d B, the message's 2-decimal rounding (request >= stated - rounding)" % prec)
    if preset == "default":
        held = sum(g["bytes"] for g in r.get("leaks", []) if g.get("pytorch_cache_segment"))
        want, what, tol = truth["reserved_before"], "torch.cuda.memory_reserved()", 2 * MiB
        tol_text = "2 MiB (one small-pool segment)"
    else:
        held = sum(g["bytes"] for g in r.get("leaks", []) if g["api"] == "cudaMallocAsync")
        want, what = truth["allocated_before"], "torch.cuda.memory_allocated()"
        tol = max(2 * MiB, want // 100)
        tol_text = "max(2 MiB, 1%%) = %d B" % tol
    check("%s holders" % name, cr.within(held, want, tol),
          "live at the failure %s (%s groups); %s before the request %s"
          % (fmt_bytes(held), "PyTorch cache segment" if preset == "default" else api, what, fmt_bytes(want)),
          tol_text)
    free, want_free = o.get("device_free_bytes"), truth["free_before"]
    check("%s device free" % name, free is not None and cr.within(free, want_free, 256 * MiB),
          "oom.device_free_bytes %s; torch.cuda.mem_get_info() before the request %s" % (fmt_bytes(free), fmt_bytes(want_free)),
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


def verify(mode, preset, report_dir, truth_path):
    name = "torch %s %s" % (mode, preset)

    @cr.guarded(name)
    def run():
        truth = cr.read_truth(truth_path)
        if mode in ("leak", "oom", "peak"):
            {"leak": verify_leak, "oom": verify_oom, "peak": verify_peak}[mode](preset, report_dir, truth, name)
        elif mode == "clean":
            verify_clean(report_dir, truth, name)
        elif mode in ("phases", "phases-clean"):
            verify_phases(report_dir, truth, name)
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
    }[sys.argv[1]]()
