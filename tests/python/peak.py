"""A program whose peak is the budgets' subject (tests/budgets.rs): it
frees everything it allocates, and at its highest holds 8 MiB at weights
and 4 MiB at activations, a peak of 12 MiB. With PLANTED=1 in its
environment it also holds 3 MiB at planted_buffer then (15 MiB). The
tests run a copy with lines inserted above every site, as an edit moves
them between two builds."""

import os

import sim

MIB = 1 << 20


def weights():
    return sim.malloc(8 * MIB)  # SITE weights


def activations():
    return sim.malloc(4 * MIB)  # SITE activations


def planted_buffer():
    return sim.malloc(3 * MIB)  # SITE planted


w = weights()
a = activations()
if os.environ.get("PLANTED") == "1":
    sim.free(planted_buffer())
sim.free(a)
sim.free(w)
