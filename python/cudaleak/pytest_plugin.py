"""pytest plugin: fail tests that leave CUDA memory allocated.

    pytest --cuda-leaks                      # check every test
    pytest --cuda-leaks --cuda-leaks-warmup
    @pytest.mark.cuda_no_leaks               # check chosen tests
    @pytest.mark.cuda_no_leaks(limit="1 MiB", warmups=2, filter=lambda group: ...)
    pytest --cuda-leaks-framework=torch      # empty PyTorch's cache before each check
    @pytest.mark.cuda_peak_limit("2 GiB")    # fail a test whose CUDA memory peak is over 2 GiB
    pytest --cuda-peak-limit=2GiB            # the same for every test without the marker

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
    group.addoption(
        "--cuda-leaks-framework",
        default=None,
        choices=["torch"],
        help="empty this framework's caching allocator before each check (torch: synchronize, "
        "collect garbage, torch.cuda.empty_cache(); a no-op when torch is not imported)",
    )
    group.addoption(
        "--cuda-peak-limit",
        default=None,
        metavar="SIZE",
        help="fail every test whose CUDA memory peak (from its setup to its teardown, above what was "
        "live when it began) is over SIZE (\"2 GiB\", bytes); @pytest.mark.cuda_peak_limit sets one "
        "test's (needs libcudaleak.so preloaded)",
    )


def pytest_configure(config):
    # --cuda-leaks asks to check every test: without the library nothing
    # would be, and the run would pass silently. A marker alone only
    # warns, per test.
    limit = config.getoption("--cuda-peak-limit")
    if limit is not None:
        try:
            cudaleak.parse_size(limit)
        except (ValueError, OverflowError) as e:
            raise pytest.UsageError("--cuda-peak-limit: %s" % e)
    asked = [f for f, on in (("--cuda-leaks", config.getoption("--cuda-leaks")), ("--cuda-peak-limit", limit is not None)) if on]
    if asked and not cudaleak.available():
        raise pytest.UsageError(
            "cudaleak: " + " and ".join(asked) + (" need" if len(asked) > 1 else " needs") +
            " libcudaleak.so preloaded; run "
            "`cudaleak run -- python -m pytest %s ...` or "
            "`LD_PRELOAD=$(cudaleak lib) python -m pytest %s ...`" % (asked[0], asked[0])
        )
    if limit is not None:
        try:
            cudaleak._peak_api()
        except RuntimeError as e:
            raise pytest.UsageError(str(e))
    config.addinivalue_line(
        "markers",
        "cuda_no_leaks(limit=0, warmups=0, filter=None, framework=None): fail this test if it leaves "
        "CUDA memory allocated, even without --cuda-leaks; limit: bytes (or \"1 MiB\") one stack may "
        "leave; warmups: unchecked runs first; filter(group) -> bool keeps the groups that count; "
        "framework=\"torch\" empties PyTorch's cache before the check",
    )
    config.addinivalue_line(
        "markers",
        "cuda_peak_limit(limit): fail this test if its CUDA memory peak (from its setup to its teardown, "
        "above what was live when it began) is over limit (bytes, or \"2 GiB\")",
    )


class _Check(object):
    def __init__(self, limit, warmups, filter, framework):
        self.limit = limit
        self.warmups = warmups
        self.filter = filter
        self.framework = framework


def _checked(item):
    """How to check this test, or None when it is not checked."""
    marker = item.get_closest_marker("cuda_no_leaks")
    if marker is None and not item.config.getoption("--cuda-leaks"):
        return None
    kwargs = dict(marker.kwargs) if marker else {}
    warmups = int(kwargs.get("warmups", 0))
    if kwargs.get("warmup") or item.config.getoption("--cuda-leaks-warmup"):
        warmups = max(warmups, 1)  # warmup=True: the older spelling of warmups=1
    return _Check(
        limit=cudaleak.parse_size(kwargs.get("limit", 0)),
        warmups=warmups,
        filter=kwargs.get("filter"),
        framework=kwargs.get("framework", item.config.getoption("--cuda-leaks-framework")),
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """The test's body: its leaks, then its peak so far, fail it."""
    __tracebackhide__ = True
    leaks = _leak_checked_call(item)
    next(leaks)
    outcome = yield
    try:
        leaks.send(outcome)
    except StopIteration:
        pass
    _check_peak_after_call(item, outcome)


def _leak_checked_call(item):
    """The leak check around the test's body: runs up to the body (warm-ups
    first), is sent the body's outcome, and fails it on a leak."""
    __tracebackhide__ = True
    check = _checked(item)
    if check is None:
        yield
        return
    if not cudaleak.available():
        item.warn(pytest.PytestWarning("cudaleak: libcudaleak.so is not preloaded; CUDA leaks are not checked"))
        yield
        return
    for _ in range(check.warmups):
        item.runtest()
    cp = cudaleak.checkpoint()
    outcome = yield
    if outcome.excinfo is not None:
        return  # failed anyway; its own error is the one to see
    try:
        cudaleak.check_since(
            cp,
            where=item.nodeid,
            limit=check.limit,
            filter=check.filter,
            framework=check.framework,
            prefer_file=getattr(item, "path", None) or getattr(item, "fspath", None),
        )
    except cudaleak.LeakError as leak:
        try:
            _raise_at_leak_site(leak.with_traceback(None), item)
        except cudaleak.LeakError as placed:
            outcome.force_exception(placed)


def _raise_at_leak_site(leak, item):
    """Raises `leak` from the user's line that allocated the memory: pytest
    then shows that line as the failing one and cuts away its own, pluggy's
    and this plugin's frames (otherwise the failure begins with _pytest's
    and pluggy's internals). The one frame shown is compiled with the user's file
    name and line, so pytest prints the real source line there."""
    __tracebackhide__ = True
    leaks = leak.report.get("leaks", [])
    prefer = getattr(item, "path", None) or getattr(item, "fspath", None)
    site = cudaleak.first_user_line(leaks[0], prefer) if leaks else None
    file, line = (site or {}).get("file"), (site or {}).get("line")
    if not file or not isinstance(line, int) or line < 1:
        raise leak
    code = compile("raise __cudaleak_error__", file, "exec")
    # Line numbers are relative to the first line: the raise sits at `line`,
    # and pytest shows that one line of the user's file.
    code = code.replace(co_firstlineno=line)
    exec(code, {"__cudaleak_error__": leak, "__name__": "cudaleak_leak_site"})


# ---- peak limits: a test's own peak, from its setup to its teardown ----

_PEAK = "_cudaleak_peak_limit"


def _peak_limit(item):
    """The test's peak limit in bytes, or None when it has none."""
    marker = item.get_closest_marker("cuda_peak_limit")
    if marker is not None:
        limit = marker.args[0] if marker.args else marker.kwargs.get("limit")
        if limit is None:
            raise pytest.UsageError("cudaleak: @pytest.mark.cuda_peak_limit needs a limit, e.g. (\"2 GiB\")")
        return cudaleak.parse_size(limit)
    default = item.config.getoption("--cuda-peak-limit")
    return cudaleak.parse_size(default) if default is not None else None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    limit = _peak_limit(item)
    if limit is not None:
        if not cudaleak.available():
            item.warn(pytest.PytestWarning("cudaleak: libcudaleak.so is not preloaded; the CUDA peak is not checked"))
        else:
            framework = item.config.getoption("--cuda-leaks-framework")
            region = cudaleak.peak_limit(limit, where=item.nodeid, framework=framework)
            region._file = str(getattr(item, "path", None) or getattr(item, "fspath", ""))
            region.begin()
            setattr(item, _PEAK, region)
    yield


def _check_peak_after_call(item, outcome):
    """The peak since the test's setup began, checked when its body ends:
    over the limit, the test itself fails."""
    __tracebackhide__ = True
    region = getattr(item, _PEAK, None)
    if region is None or outcome.excinfo is not None:
        # Failed, skipped or xfailed already: its own outcome is the one to
        # see, and teardown adds nothing to it.
        return
    err = region.error(region.high())
    if err is not None:
        outcome.force_exception(err)
    else:
        region.body_passed = True


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    __tracebackhide__ = True
    outcome = yield
    region = getattr(item, _PEAK, None)
    if region is None:
        return
    delattr(item, _PEAK)
    peak = region.end()
    # Within the limit when its body ended, over it in teardown: the
    # teardown fails (an error of its own comes first).
    if getattr(region, "body_passed", False) and outcome.excinfo is None:
        err = region.error(peak)
        if err is not None:
            outcome.force_exception(err)
