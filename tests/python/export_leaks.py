"""Planted leaks for the exports' tests (tests/exports.rs): load_weights
leaks 2 blocks of 5000 bytes, train_step 3 blocks of 1000, through the
simulated runtime (sim.py)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sim import malloc  # noqa: E402

kept = []


def load_weights():
    kept.append(malloc(5000))  # LEAK weights


def train_step():
    kept.append(malloc(1000))  # LEAK step


for _ in range(2):
    load_weights()
for _ in range(3):
    train_step()
