"""Tests whose CUDA memory peaks the plugin checks (tests/python.rs)."""

import pytest

import sim

MIB = 1 << 20


def burst(nbytes):
    p = sim.malloc(nbytes)
    sim.free(p)


@pytest.fixture
def scratch():
    # Allocated in setup, freed in teardown: inside the test's window.
    p = sim.malloc(2 * MIB)
    yield
    sim.free(p)


@pytest.mark.cuda_peak_limit("5 MiB")
def test_over_its_limit(scratch):
    burst(4 * MIB)  # with the fixture's 2 MiB: 6 MiB at the peak


@pytest.mark.cuda_peak_limit("16 MiB")
def test_within_its_limit(scratch):
    burst(4 * MIB)


def test_without_a_marker():
    burst(3 * MIB)
