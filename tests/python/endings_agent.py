"""Starts tests/c/endings.c's program the ways job launchers do, sends it
the signal that ends it, and prints how each process it started ended, as
its parent sees it: `worker I status N` (the exit status, or 128+N for
signal N). Then it exits 0, so that under `cudaleak run --fail-on-leak`
the gate's verdict is about the reports alone: 23 for a complete report
of a leak, 24 for a report it could not vouch for (tests/endings.rs).

usage: endings_agent.py SHAPE SIGNAL DELAY_MS -- PROGRAM ARGS...

SHAPE, how the workers are started:
  plain        one worker, close_fds=False: it inherits every descriptor.
  close_fds    one worker with subprocess's default, close_fds=True: only
               0, 1 and 2 reach it.
  full         close_fds=True, and a file size limit of 0 (SIGXFSZ
               ignored) standing in for a report directory that filled up
               during the run: no file the worker writes can grow.
  full_keep_fds  the same with close_fds=False.
  nobody       close_fds=True, user=65534 and group=65534 (needs root).
  torchrun:N[:WAY]
               N workers with close_fds=False (WAY, when given, replaces the
               first worker's WAY argument). When one ends, the others get
               SIGTERM, and SIGKILL after a grace period of 5 s, as
               torchrun's agent does.
SIGNAL: `none`, or a signal name (TERM, INT, KILL, SEGV): sent to the
first worker DELAY_MS after it printed "ready".
"""

import os
import resource
import signal
import subprocess
import sys
import time

GRACE_S = 5.0


def status(code):
    return 128 - code if code < 0 else code


def main():
    shape, sig, delay_ms = sys.argv[1], sys.argv[2], float(sys.argv[3])
    assert sys.argv[4] == "--"
    command = sys.argv[5:]
    kw = {"stdout": subprocess.PIPE, "close_fds": True}
    workers = 1
    first_way = None
    if shape == "plain":
        kw["close_fds"] = False
    elif shape == "close_fds":
        pass
    elif shape in ("full", "full_keep_fds"):

        def no_room():
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))

        kw["preexec_fn"] = no_room
        kw["close_fds"] = shape == "full"
    elif shape == "nobody":
        kw["user"] = 65534
        kw["group"] = 65534
        kw["extra_groups"] = []
    elif shape.startswith("torchrun:"):
        parts = shape.split(":")
        workers = int(parts[1])
        first_way = parts[2] if len(parts) > 2 else None
        kw["close_fds"] = False
    else:
        sys.exit(f"unknown shape {shape}")

    procs = []
    for i in range(workers):
        argv = list(command)
        if i == 0 and first_way:
            argv[1] = first_way
        procs.append(subprocess.Popen(argv, **kw))
    # Each worker's first line is "ready" (or nothing, when it ended first).
    for p in procs:
        line = p.stdout.readline().decode(errors="replace").strip()
        if line != "ready":
            print(f"worker {procs.index(p)} said {line!r}", flush=True)
    if sig != "none":
        time.sleep(delay_ms / 1000)
        procs[0].send_signal(getattr(signal, "SIG" + sig))
    if workers > 1:
        # torchrun: the first worker to end ends the others.
        while all(p.poll() is None for p in procs):
            time.sleep(0.01)
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + GRACE_S
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.01)
        for p in procs:
            if p.poll() is None:
                p.kill()
    for i, p in enumerate(procs):
        p.wait()
        rest = p.stdout.read().decode(errors="replace")
        for line in rest.splitlines():
            print(f"worker {i} said {line}", flush=True)
        print(f"worker {i} pid {p.pid}", flush=True)
        print(f"worker {i} status {status(p.returncode)}", flush=True)


main()
