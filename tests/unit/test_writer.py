"""OrderedWriter: outputs written on worker threads, results handed back in input order."""

import threading
import time

import pytest

from indeed_cli.io import ImageError
from indeed_cli.pipelines import OrderedWriter


def test_results_come_back_in_submission_order_even_when_later_jobs_finish_first():
    seen, finished = [], []

    def job(i, delay):
        def write():
            time.sleep(delay)
            finished.append(i)
            if i == 2:
                raise ImageError(f"img{i}: cannot write")
            return i

        return write

    with OrderedWriter(workers=3) as w:
        for i, delay in enumerate([0.3, 0.0, 0.1, 0.0]):
            w.submit(job(i, delay), lambda r, e, i=i: seen.append((i, r, str(e) if e else None)))
        w.then(lambda: seen.append("end"))
    assert finished[0] != 0  # the first job really finished after others
    assert seen == [(0, 0, None), (1, 1, None), (2, None, "img2: cannot write"), (3, 3, None), "end"]


def test_a_job_over_the_byte_budget_waits_for_the_others_and_runs_alone():
    running, overlap = set(), []
    lock = threading.Lock()

    def job(name):
        def write():
            with lock:
                running.add(name)
                overlap.append(set(running))
            time.sleep(0.05)
            with lock:
                running.discard(name)

        return write

    order = []
    with OrderedWriter(workers=2, max_bytes=100) as w:
        w.submit(job("a"), lambda *_: order.append("a"), 40)
        w.submit(job("b"), lambda *_: order.append("b"), 40)
        w.submit(job("big"), lambda *_: order.append("big"), 1000)  # inline, after a and b
        w.submit(job("c"), lambda *_: order.append("c"), 40)
    assert order == ["a", "b", "big", "c"]
    assert {"big"} in overlap and not any("big" in s and len(s) > 1 for s in overlap)


def test_other_errors_propagate_and_inline_mode_runs_at_once():
    with pytest.raises(ZeroDivisionError):
        with OrderedWriter(workers=1) as w:
            w.submit(lambda: 1 / 0, lambda *_: None)
    seen = []
    w = OrderedWriter(workers=0)
    w.submit(lambda: 5, lambda r, e: seen.append(r))
    assert seen == [5]  # no thread: done before submit returns
