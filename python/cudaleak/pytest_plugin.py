"""pytest plugin: fail tests that leave CUDA memory allocated.

    pytest --cuda-leaks                      # check every test
    pytest --cuda-leaks --cuda-leaks-warmup
    @pytest.mark.cuda_no_leaks               # check chosen tests

The wheel registers it through a pytest11 entry point, so pytest loads it
by itself and it checks nothing unless asked; from a source checkout, add
``-p cudaleak.pytest_plugin``.

The test process must run under libcudaleak.so (``cudaleak run -- pytest
...``); pytest-xdist workers inherit it. Each checked test takes a
checkpoint when its body starts; blocks allocated after it and still live
when the body returns fail the test, with their Python lines. With
warm-up, the body runs once unchecked first, so that one-time
initialization (caches, handles, workspaces) is not reported.
"""

import pytest

import cudaleak


def pytest_addoption(parser):
    group = parser.getgroup("cudaleak", "CUDA memory leaks (cudaleak)")
    group.addoption(
        "--cuda-leaks",
        action="store_true",
        default=False,
        help="fail every test that leaves CUDA memory allocated (needs libcudaleak.so preloaded)",
    )
    group.addoption(
        "--cuda-leaks-warmup",
        action="store_true",
        default=False,
        help="run each checked test body once, unchecked, before the checked run",
    )


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "cuda_no_leaks(warmup=False): fail this test if it leaves CUDA memory allocated, "
        "even without --cuda-leaks",
    )


def _checked(item):
    marker = item.get_closest_marker("cuda_no_leaks")
    if marker is None and not item.config.getoption("--cuda-leaks"):
        return None
    warmup = item.config.getoption("--cuda-leaks-warmup") or bool(marker and marker.kwargs.get("warmup"))
    return warmup


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    warmup = _checked(item)
    if warmup is None:
        yield
        return
    if not cudaleak.available():
        item.warn(pytest.PytestWarning("cudaleak: libcudaleak.so is not preloaded; CUDA leaks are not checked"))
        yield
        return
    if warmup:
        item.runtest()
    cp = cudaleak.checkpoint()
    outcome = yield
    if outcome.excinfo is not None:
        return  # failed anyway; its own error is the one to see
    try:
        cudaleak.check_since(cp, where=item.nodeid)
    except cudaleak.LeakError as leak:
        outcome.force_exception(leak)
