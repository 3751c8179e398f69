"""A small suite for the pytest plugin's own tests: one test leaks."""

import pytest

import sim

KEPT = []
_WORKSPACE = {}


def workspace():
    """One-time initialization, as libraries do: allocated on first use."""
    if "ws" not in _WORKSPACE:
        _WORKSPACE["ws"] = sim.malloc(1 << 20)
    return _WORKSPACE["ws"]


def test_frees_what_it_allocates():
    p = sim.malloc(100)
    sim.free(p)


def test_leaks():
    KEPT.append(sim.malloc(4096))  # LEAK test_leaks


def test_uses_no_cuda():
    assert 1 + 1 == 2


def test_one_time_workspace():
    assert workspace()


@pytest.mark.cuda_no_leaks
def test_marked_and_clean():
    sim.free(sim.malloc(64))
