"""cuda_no_leaks(limit=, warmups=, filter=, framework=), as pytest-memray's
limit_leaks: two tests fail (over the limit; a framework cache without
framework="torch")."""

import pytest

import sim
import torch

KEPT = []
RUNS = {"warm": 0}
WORKSPACE = {}


@pytest.mark.cuda_no_leaks(limit="1 MiB")
def test_under_the_limit():
    KEPT.append(sim.malloc(4096))


@pytest.mark.cuda_no_leaks(limit="1 KiB")
def test_over_the_limit():
    KEPT.append(sim.malloc(4096))  # LEAK over the limit


@pytest.mark.cuda_no_leaks(filter=lambda group: group["bytes"] != 4096)
def test_filtered_out():
    KEPT.append(sim.malloc(4096))


@pytest.mark.cuda_no_leaks(warmups=2)
def test_warmups():
    RUNS["warm"] += 1
    if "ws" not in WORKSPACE:
        WORKSPACE["ws"] = sim.malloc(1 << 20)


def test_warmups_ran_the_body_three_times():
    assert RUNS["warm"] == 3


@pytest.mark.cuda_no_leaks(framework="torch")
def test_torch_cache_is_emptied_before_the_check():
    torch.tensor_freed_into_the_cache(8192)


def test_torch_was_synchronized_collected_and_emptied_in_order():
    calls = torch.CALLS
    start, end = calls.index("synchronize"), calls.index("empty_cache")
    assert start < end and "gc" in calls[start:end], calls


@pytest.mark.cuda_no_leaks
def test_torch_cache_without_the_option_looks_like_a_leak():
    torch.tensor_freed_into_the_cache(8192)  # LEAK cached
