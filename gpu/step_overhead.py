"""The library's cost on a PyTorch training step (scripts/gpu-validate.sh,
section `overhead`): a measurement, not a check.

    python3 step_overhead.py LIBRARY SECONDS [CONFIG...]

Runs `torch_checks.py overhead` (a small MLP's training step, timed over
$OVERHEAD_STEPS steps after a warm-up) in each configuration in turn, round
after round, until SECONDS have passed or $OVERHEAD_ROUNDS rounds (default
5) are done, so that drifts of the machine hit every configuration alike.
Configurations: none, cudaleak (LD_PRELOAD, Python stacks on), and the same
with `-async` (PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync, what
`cudaleak run --pytorch` sets) or `-nocache` (PYTORCH_NO_CUDA_MEMORY_CACHING=1).
Prints each configuration's median and range, and for each cudaleak
configuration the ratio to its baseline within each round: median and
range over the rounds.
"""

import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT = ("none", "cudaleak", "none-async", "cudaleak-async")


def env_of(cfg, library, report_dir):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDALEAK_") and k != "LD_PRELOAD"}
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.pop("PYTORCH_NO_CUDA_MEMORY_CACHING", None)
    if cfg.endswith("-async"):
        env["PYTORCH_CUDA_ALLOC_CONF"] = "backend:cudaMallocAsync"
    if cfg.endswith("-nocache"):
        env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    if cfg.startswith("cudaleak"):
        env.update(LD_PRELOAD=library, CUDALEAK_DIR=report_dir, CUDALEAK_SUMMARY="0")
    return env


def one_run(cfg, library, report_dir, timeout):
    try:
        p = subprocess.run([sys.executable, os.path.join(HERE, "torch_checks.py"), "overhead"],
                           env=env_of(cfg, library, report_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    out = p.stdout.decode().split()
    return float(out[0]) if p.returncode == 0 and out else None


def baseline(cfg):
    return "none" + cfg[len("cudaleak"):]


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    # The script's step limit is 600 s: the summary must come before it.
    library, seconds = argv[0], min(float(argv[1]), 580.0)
    configs = argv[2:] or list(DEFAULT)
    rounds = int(os.environ.get("OVERHEAD_ROUNDS", "5"))
    deadline = time.monotonic() + seconds
    times = {c: [] for c in configs}
    per_round = []
    with tempfile.TemporaryDirectory(prefix="cudaleak-overhead.") as d:
        for r in range(rounds):
            got = {}
            # Each round starts with another configuration, so that none
            # always runs first (a cold machine) or right after another.
            order = configs[r % len(configs):] + configs[:r % len(configs)]
            for c in order:
                left = deadline - time.monotonic()
                if left < 15:
                    break
                t = one_run(c, library, d, min(left, 120))
                if t is not None:
                    got[c] = t
                    times[c].append(t)
            per_round.append(got)
            print("round %d: %s" % (r + 1, "  ".join("%s %.4f" % (c, got[c]) for c in configs if c in got)), flush=True)
            if len(got) < len(configs):
                break
    steps = os.environ.get("OVERHEAD_STEPS", "500")
    print("ms per step (%s model, %s steps a run), median [min, max] over %d round(s):"
          % (os.environ.get("OVERHEAD_MODEL", "small"), steps, len(per_round)))
    for c in configs:
        ts = times[c]
        if ts:
            print("  %-18s %.4f [%.4f, %.4f] (%d runs)" % (c, statistics.median(ts), min(ts), max(ts), len(ts)))
    for c in configs:
        b = baseline(c)
        if not c.startswith("cudaleak") or b not in configs:
            continue
        ratios = [g[c] / g[b] for g in per_round if c in g and b in g]
        if ratios:
            print("  %s / %s within a round: median %+.1f %% [%+.1f %%, %+.1f %%] (%d rounds)"
                  % (c, b, (statistics.median(ratios) - 1) * 100, (min(ratios) - 1) * 100, (max(ratios) - 1) * 100,
                     len(ratios)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
