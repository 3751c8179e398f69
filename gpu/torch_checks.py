"""PyTorch under cudaleak (scripts/gpu-validate.sh).

    python3 torch_checks.py leak|clean|phases|phases-clean|overhead|nccl|cublas|oom|peak
"""

import os
import signal
import sys
import time

import torch

import cudaleak

KEPT = []
model = None


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


def leak():
    opt = setup()
    for _ in range(5):
        train_step(opt, keep=True)
    torch.cuda.synchronize()
    print("kept", len(KEPT), "tensors of", KEPT[0].numel() * 4, "bytes")
    # At exit, interpreter shutdown frees what module globals hold; a live
    # dump shows the training loop's leak as the job would see it.
    print("dump written:", cudaleak.dump("end of training"))


def clean():
    opt = setup()
    train_step(opt, keep=False)  # warm-up: parameters, grads, cuBLAS
    torch.cuda.synchronize()
    with cudaleak.no_leaks("clean training steps"):
        for _ in range(5):
            train_step(opt, keep=False)
        torch.cuda.synchronize()
    print("clean: no leak in the checked region")
    try:
        with cudaleak.no_leaks("leaky training step"):
            train_step(opt, keep=True)
            torch.cuda.synchronize()
    except cudaleak.LeakError as e:
        print("leaky: LeakError")
        print(e)


def dump_and_wait(dumps):
    os.kill(os.getpid(), signal.SIGUSR1)
    d = os.environ["CUDALEAK_DIR"]
    for _ in range(600):
        n = len([f for f in os.listdir(d) if f.endswith(".signal.json") and ".%d." % os.getpid() in f])
        if n >= dumps:
            return
        time.sleep(0.05)
    raise SystemExit("no signal dump")


def grow_phase():
    for _ in range(20):
        KEPT.append(torch.empty(1 << 20, device="cuda"))  # LEAK phase (4 MiB each)


def churn_phase():
    for _ in range(20):
        t = torch.empty(1 << 20, device="cuda")
        del t


def phases(leaky):
    setup()
    for i in range(3):
        grow_phase() if leaky else churn_phase()
        torch.cuda.synchronize()
        dump_and_wait(i + 1)
    print("phases done")


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
    it raises; the oom report shows what was live before that."""
    opt = setup()
    train_step(opt, keep=False)
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    print("free %d of %d bytes before the request" % (free, total))
    try:
        big = torch.empty(int(free * 1.5) // 4, device="cuda")  # OOM request
        print("no error: %d bytes" % (big.numel() * 4))
    except torch.cuda.OutOfMemoryError as e:
        print("OutOfMemoryError:", str(e).splitlines()[0])
        sys.exit(1)


def peak():
    """The peak of a training step with large activations (issue 21): the
    exit report's peak against PyTorch's own max_memory_allocated."""
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
    print("torch max_memory_allocated %d max_memory_reserved %d" % (
        torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()))
    del x, loss
    print("dump written:", cudaleak.dump("after the step"))


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


if __name__ == "__main__":
    mode = sys.argv[1]
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
    }[mode]()
