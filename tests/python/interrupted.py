"""Ctrl-C: a SIGINT that ends the program as an uncaught KeyboardInterrupt,
the usual end of a training run. CPython then re-raises SIGINT with the
default action after finalization, which skips every destructor.
"""

import os
import signal
import time

import sim

KEPT = []


def leak():
    KEPT.append(sim.malloc(4242))  # LEAK interrupted


leak()
os.kill(os.getpid(), signal.SIGINT)
time.sleep(60)
