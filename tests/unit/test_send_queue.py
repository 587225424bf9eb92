"""The timed emulation's sends (`runtime/emulate/works.py` `SendQueue`): a send completes for the program at once
and goes out on a sender thread; one whose receiver never posts the recv is named at the rank's end, not waited out
(the hang watchdog sees the program's send as complete)."""

from __future__ import annotations

import threading

import pytest
import torch

from prism.runtime.emulate.works import SendQueue


class _PG:
    """A gloo instance whose sends to `stuck` never complete (their receiver never posts the recv)."""

    def __init__(self, stuck: int) -> None:
        self.stuck, self.release, self.sent = stuck, threading.Event(), []

    def send(self, tensors, dst, tag):
        pg = self

        class W:
            def wait(self):
                if dst == pg.stuck:
                    pg.release.wait()
                pg.sent.append((dst, tag, tensors[0].clone()))
                return True

        return W()


def test_a_send_completes_for_the_program_and_goes_out_with_the_values_it_had():
    q, pg = SendQueue(), _PG(stuck=-1)
    x = torch.arange(4.0)
    work = q.send(pg, [x], 1, 5)
    assert work.is_completed() and work.wait()
    x.fill_(-1)  # the program may write its buffer once "sent"
    q.drain(timeout_s=10)
    assert [(d, t) for d, t, _ in pg.sent] == [(1, 5)] and pg.sent[0][2].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_a_send_whose_receiver_never_posts_is_named_at_the_ranks_end():
    q, pg = SendQueue(), _PG(stuck=3)
    q.send(pg, [torch.ones(2)], 1, 4)
    q.send(pg, [torch.ones(2)], 3, 7)
    with pytest.raises(TimeoutError, match=r"1 send\(s\).*group rank 3 \(tag 7\).*PRISM_HANG_TIMEOUT"):
        q.drain(timeout_s=0.3)
    pg.release.set()
    q.drain(timeout_s=10)  # once the receiver came, it went out
    assert sorted(d for d, _, _ in pg.sent) == [1, 3]
