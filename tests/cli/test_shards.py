"""Sharded folder runs: the shards of a run write exactly what one run writes, under --shard,
torchrun and SLURM arrays; a shard that was killed resumes with --skip-existing."""

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest
from conftest import default_sigint, write_png

from indeed_cli.pipelines import parse_shard, shard_from_env, take_shard


@pytest.fixture
def folder(tmp_path, rng):
    d = tmp_path / "in"
    d.mkdir()
    for n in ("a", "b", "c", "d", "e"):
        write_png(d / f"{n}.png", rng.integers(0, 256, (36, 40, 3), dtype=np.uint8))
    return d


def digests(folder) -> dict:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.suffix != ".json"}  # fmt: skip


def merged(*outs: str) -> list[dict]:
    """JSON lines of several shards put back in the order of one run (docs/cli.md)."""
    lines = [json.loads(line) for out in outs for line in out.splitlines()]
    return sorted(lines, key=lambda r: r["index"])


def comparable(r: dict) -> dict:
    return {
        k: v
        for k, v in r.items()
        if k not in ("seconds", "index", "shard", "adapt_seconds", "outputs", "output", "maps")
    }


def test_shard_arithmetic_and_launchers():
    assert parse_shard("1/4") == (1, 4)
    for bad in ("4/4", "-1/2", "1", "a/b", "0/0"):
        with pytest.raises(ValueError):
            parse_shard(bad)
    assert take_shard(list("abcde"), (1, 2)) == (["b", "d"], [1, 3])
    assert shard_from_env({}) is None
    assert shard_from_env({"RANK": "3", "WORLD_SIZE": "4"}) == (3, 4)
    assert shard_from_env({"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_MIN": "5", "SLURM_ARRAY_TASK_COUNT": "3"}) == (
        2,
        3,
    )


@pytest.mark.parametrize("command", ["denoise", "decompose", "detect", "oag", "ag"])
def test_shards_together_write_what_one_run_writes(run_cli, folder, tmp_path, ckpt_paths, command):
    from conftest import tiny_model

    from indeed_cli.model import save_checkpoint

    if command == "detect":
        det = save_checkpoint(
            tmp_path / "det.safetensors", tiny_model(1, task="detect"), {}, {"detect": {"threshold": 0.01}}
        )
        args = ["detect", folder, "-w", det, "--maps"]
    elif command in ("oag", "ag"):
        args = ["adapt", folder, "--mode", command, "--steps", "2", "-w", ckpt_paths[3], "--precision", "fp32", "-o"]
    else:
        args = [command, folder, "-w", ckpt_paths[3], "-o"]
    code, whole, err = run_cli(*args, tmp_path / "whole", "--json", "-q")
    assert code == 0, err
    outs = []
    for k in (0, 1):
        code, out, err = run_cli(*args, tmp_path / "shards", "--json", "-q", "--shard", f"{k}/2")
        assert code == 0, err
        outs.append(out)
    assert digests(tmp_path / "shards") == digests(tmp_path / "whole")  # byte for byte
    lines = merged(*outs)
    assert [r["index"] for r in lines] == list(range(5)) and {r["shard"] for r in lines} == {"0/2", "1/2"}
    one = [json.loads(line) for line in whole.splitlines()]
    assert [comparable(r) for r in lines] == [{**comparable(r), "image": r["image"]} for r in one]


def test_a_killed_shard_resumes_with_skip_existing(tmp_path, rng):
    d = tmp_path / "in"
    d.mkdir()
    for i in range(8):
        write_png(d / f"{i}.png", rng.integers(0, 256, (512, 512, 3), dtype=np.uint8))
    cmd = [sys.executable, "-m", "indeed_cli", "denoise", d, "-o", tmp_path / "out", "--json", "--device", "cpu",
           "--shard", "1/2"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint)
    proc.stdout.readline()  # its first image is written
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=120)
    assert proc.returncode == 130
    first = {p.name for p in (tmp_path / "out").glob("*.png")}
    assert 1 <= len(first) < 4
    r = subprocess.run(cmd + ["--skip-existing"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert {p.name for p in (tmp_path / "out").glob("*.png")} == {"1.png", "3.png", "5.png", "7.png"}
    assert sum(json.loads(line).get("skipped", False) for line in r.stdout.splitlines()) == len(first)


def _torchrun(*args, env=None) -> subprocess.CompletedProcess:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(port), "-m", "indeed_cli", *map(str, args)]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)


@pytest.mark.slow  # two processes under torchrun (gloo on the CPU)
def test_torchrun_shards_a_folder_and_ag_averages_gradients(run_cli, folder, tmp_path, ckpt_paths):
    code, _, err = run_cli("denoise", folder, "-o", tmp_path / "whole", "-w", ckpt_paths[3], "-q")
    assert code == 0, err
    r = _torchrun("denoise", folder, "-o", tmp_path / "ranks", "-w", ckpt_paths[3], "--json", "-q", "--device", "cpu")
    assert r.returncode == 0, r.stderr[-2000:]
    assert digests(tmp_path / "ranks") == digests(tmp_path / "whole")
    assert sorted(json.loads(line)["index"] for line in r.stdout.splitlines()) == list(range(5))
    # one adaptation over the folder, the two ranks each computing half of every batch
    r = _torchrun("adapt", folder, "--mode", "ag", "-o", tmp_path / "ag", "-w", ckpt_paths[3], "--steps", "4",
                  "--json", "-q", "--device", "cpu", "--denoised-only", "--precision", "fp32",
                  "--save-weights", tmp_path / "ag.safetensors")  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert sorted(x["index"] for x in lines) == list(range(5)) and len({x["shard"] for x in lines}) == 2
    assert len({(x["loss_start"], x["loss_best"], x["best_step"]) for x in lines}) == 1  # the same adaptation
    assert len(list((tmp_path / "ag").glob("*.png"))) == 5 and (tmp_path / "ag.safetensors").exists()
