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


def test_read_ahead_on_several_threads_keeps_the_input_order_and_returns_errors(tmp_path, monkeypatch):
    import numpy as np

    from indeed_cli.io import write_image
    from indeed_cli.pipelines import runner

    paths = []
    for i in range(6):
        p = tmp_path / f"img{i}.png"
        if i == 3:
            p.write_bytes(b"not an image")
        else:
            write_image(p, np.full((1, 8, 8), i / 8, np.float32))
        paths.append(p)
    slow = runner.read_image

    def read(p):  # the first images finish last: the order must come from the inputs, not the threads
        time.sleep(0.05 * (6 - int(p.stem[3:])))
        return slow(p)

    monkeypatch.setattr(runner, "read_image", read)
    got = list(runner.read_ahead(paths, depth=len(paths), workers=4))
    assert [p for p, _ in got] == paths
    assert isinstance(got[3][1], ImageError)
    for i in (0, 1, 2, 4, 5):
        assert abs(float(got[i][1].data.mean()) - i / 8) < 1 / 255


def test_reader_threads_one_on_a_cpu_several_on_an_accelerator():
    import torch

    from indeed_cli.pipelines import runner

    assert runner.reader_threads("cpu") == 1
    assert runner.reader_threads(torch.device("cpu")) == 1
    assert runner.reader_threads("cuda:0") == runner.reader_threads(torch.device("cuda")) == runner.ACCELERATOR_READERS
    assert runner.ACCELERATOR_READERS > 1


def test_denoise_reads_its_inputs_on_the_devices_reader_threads(tmp_path, monkeypatch, ckpt_paths):
    import numpy as np

    from indeed_cli.io import read_image, write_image
    from indeed_cli.pipelines import denoise as pipeline
    from indeed_cli.pipelines import runner

    src = tmp_path / "in"
    src.mkdir()
    for i in range(3):
        write_image(src / f"img{i}.png", np.full((3, 16, 16), (i + 1) / 8, np.float32))
    calls, real = [], runner.read_ahead

    def spy(paths, depth=2, workers=1):
        calls.append((len(paths), depth, workers))
        return real(paths, depth, workers)

    monkeypatch.setattr(runner, "read_ahead", spy)
    monkeypatch.setattr(runner, "reader_threads", lambda device: 3 if str(device) == "cpu" else 0)
    outcomes = pipeline.denoise_folder([src], tmp_path / "out", weights=ckpt_paths[3], device="cpu")
    assert calls == [(3, 3, 3)]
    assert [o.error for o in outcomes] == [None] * 3
    for i in range(3):  # every image written, in its own file
        assert read_image(tmp_path / "out" / f"img{i}.png").data.shape == (3, 16, 16)


def test_detect_reads_its_inputs_on_the_devices_reader_threads(tmp_path, monkeypatch):
    import numpy as np

    from indeed_cli.io import write_image
    from indeed_cli.pipelines import detect as pipeline
    from indeed_cli.pipelines import runner

    src = tmp_path / "in"
    src.mkdir()
    for i in range(2):
        write_image(src / f"img{i}.png", np.full((1, 16, 16), 0.5, np.float32))
    calls = []

    def spy(paths, depth=2, workers=1):  # reads nothing: only the reader count is under test here
        calls.append((len(paths), depth, workers))
        return iter(())

    monkeypatch.setattr(runner, "read_ahead", spy)
    monkeypatch.setattr(runner, "reader_threads", lambda device: 3 if str(device) == "cpu" else 0)
    pipeline.detect_folder([src], tmp_path / "maps", device="cpu", threshold=0.5)
    assert calls == [(2, 3, 3)]
