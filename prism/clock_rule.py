"""The clock model: when an event ends and when a communication completes. One definition, two users.

The calibrate sweep (`prism.calibrate.sweep`, its plain-Python reference `prism.calibrate.reference`) and the
runtime's timed replay of emulate (`prism.runtime.replay.clock`, `prism.runtime.replay.cone`) compute the same
global clock: the prediction is the sweep's, the emulated sandbox runs on the replay's. This module is the rule
both call, so that they cannot drift apart (`tests/unit/test_clock_rule.py` runs both on one graph). It is
neutral (numpy and numba only), as the layering rule asks of a module both sides import.

The rule, all times int64 ns:

- every rank's events run back to back in program order: an event starts when its rank's previous event
  ended, and one that does not wait ends its duration later (`ends`);
- an *issue* (a collective's member op, a send, a recv) is its rank's arrival at the comm; issuing never
  blocks;
- a collective completes its transfer after its last member's arrival (`collective_done`); a send/recv pair
  at max(the recv's arrival, the send's arrival + the transfer) (`p2p_done`);
- a wait on a collective or on a recv ends its own time after the later of its start and the completion
  (`wait_ends`); a wait on a send is local (a send completes locally): its own time only.

A wait's own time is what its member spends after the completion: copying the result out, and, in a measured
run, how much later than the comm's completion this member saw it (members of one gloo collective see it
complete one after another; the group's next op and the member's next compute wait for *its* view). The
comm's transfer is then the first member's delay and every member keeps its own lag (`wait_own`, the
inverse). Before (session 8 and earlier) a wait ended at max(start + own, completion) with one transfer per
comm for all members: that rule made the late members early, and the sweep on the truth's own measurements
ran 1-14 % low (`docs/fidelity.md`, "The model on the truth's own inputs").

The functions are numba-compiled and inlined into the kernels of both sides; called from Python they take
numpy arrays as well.
"""

from __future__ import annotations

import numpy as np
from numba import njit

NEG = -(2**62)  # "no arrival / not known yet"; far from int64's limits so that adding a transfer cannot wrap


@njit(cache=True, inline="always")
def ends(start, duration):
    """An event that takes its own time only (compute, marker, an issue, a wait on a send)."""
    return start + duration


@njit(cache=True, inline="always")
def collective_done(last_arrival, transfer):
    """A collective's completion: its transfer after the last member's arrival."""
    return last_arrival + transfer


@njit(cache=True, inline="always")
def p2p_done(recv_arrival, send_arrival, transfer):
    """A send/recv pair's completion: the transfer after the send, not before the recv was issued."""
    return np.maximum(recv_arrival, send_arrival + transfer)


@njit(cache=True, inline="always")
def wait_ends(start, own, completion):
    """A wait on a collective or a recv: its own time after the later of its start and the completion."""
    return np.maximum(start, completion) + own


def wait_own(start, end, completion):
    """The inverse of `wait_ends` on a timeline: the own time that ends a wait started at `start` at `end`
    for a comm completed at `completion` (clipped at 0)."""
    start, end, completion = (np.asarray(a, dtype=np.int64) for a in (start, end, completion))
    return np.maximum(end - np.maximum(start, completion), 0)


def transfer_of(completion, base):
    """The inverse of `collective_done` / `p2p_done`: the transfer that puts a comm's completion at
    `completion` after `base` (the last arrival; for a send/recv pair the send's), clipped at 0."""
    return np.maximum(np.asarray(completion, dtype=np.int64) - np.asarray(base, dtype=np.int64), 0)


__all__ = ["NEG", "collective_done", "ends", "p2p_done", "transfer_of", "wait_ends", "wait_own"]
