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


@pytest.fixture
def burst_in_teardown():
    yield
    burst(8 * MIB)


@pytest.mark.cuda_peak_limit("5 MiB")
def test_over_only_in_its_teardown(burst_in_teardown):
    pass


@pytest.mark.xfail(reason="fails by itself", strict=True)
@pytest.mark.cuda_peak_limit("1 MiB")
def test_that_fails_by_itself_keeps_its_outcome(scratch):
    burst(4 * MIB)
    assert False
