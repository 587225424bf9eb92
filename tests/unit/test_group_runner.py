"""`prism.runtime.group_runner.GroupRunner`: a group's exchanges run one at a time in issue order, on its
thread or on the thread that waits for one first."""

from __future__ import annotations

import threading

from prism.runtime.group_runner import GroupRunner


def test_a_waiting_thread_runs_the_exchanges_up_to_its_own_in_issue_order():
    runner = GroupRunner("test-g")
    gate = threading.Event()
    order, where = [], {}

    def job(k):
        def run():
            if k == 0:
                gate.wait(5)  # the group thread is busy with the first exchange
            order.append(k)
            where[k] = threading.current_thread().name
        return run

    jobs = [job(k) for k in range(4)]
    for j in jobs:
        runner.submit(j)
    waiter = threading.Thread(target=runner.run_through, args=(jobs[2],), name="waiter")
    waiter.start()
    gate.set()  # the group thread finishes 0; the waiter then runs 1 and 2 itself, or the group thread does
    waiter.join(5)
    assert not waiter.is_alive()
    assert order[:3] == [0, 1, 2]  # issue order, whoever ran them
    assert where[0].startswith("test-g")
    runner.run_through(jobs[3])  # on this thread unless the group thread took it first
    runner._thread.shutdown(wait=True)
    assert order == [0, 1, 2, 3]
    assert runner.inline == sum(1 for k in (1, 2, 3) if not where[k].startswith("test-g"))


def test_run_through_of_a_started_or_finished_job_returns_at_once():
    runner = GroupRunner("test-g")
    done = threading.Event()
    runner.submit(done.set)
    assert done.wait(5)
    runner.run_through(done.set)  # not pending any more: nothing runs twice
    runner._thread.shutdown(wait=True)
    assert runner.inline == 0


def test_a_group_thread_held_up_leaves_a_sync_op_to_its_waiter():
    """The group thread is busy elsewhere (here: a task put on its executor ahead), so the waiter runs its
    op inline at once; the group thread later finds nothing to run."""
    runner = GroupRunner("test-g")
    release = threading.Event()
    ran_by = []
    runner._thread.submit(release.wait, 5)
    own = lambda: ran_by.append(threading.current_thread().name)  # noqa: E731
    runner.submit(own)
    runner.run_through(own)
    release.set()
    runner._thread.shutdown(wait=True)
    assert ran_by == [threading.current_thread().name] and runner.inline == 1
