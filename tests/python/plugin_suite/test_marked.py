"""Only checked through its marker (also without --cuda-leaks)."""

import pytest

import sim

KEPT = []


@pytest.mark.cuda_no_leaks
def test_marked_leak():
    KEPT.append(sim.malloc(777))  # LEAK test_marked_leak
