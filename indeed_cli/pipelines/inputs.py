"""Which files a folder run reads and writes, decided before any work is done.

Inputs are files, folders (their images, sorted; sub-folders with ``recursive``), glob patterns
and ``-`` (standard input).  Outputs never overwrite an input, never collide, and are refused
when they exist unless ``force``; ``skip_existing`` leaves out inputs whose outputs all exist.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from pathlib import Path

from ..inference import check_ensemble, check_pixel_shuffle
from ..io import OUTPUT_SUFFIXES, STDIO, is_image_path, is_stdio


class UsageError(ValueError):
    """The request cannot run as given (bad inputs, outputs or settings); nothing was written."""


def pixel_shuffle_setting(value) -> int | str:
    """A ``--pixel-shuffle`` value (1 to MAX_PIXEL_SHUFFLE, or "auto") for the denoising pipelines;
    UsageError for anything else."""
    try:
        return check_pixel_shuffle(value)
    except ValueError as e:
        raise UsageError(f"--pixel-shuffle: {e}") from None


def ensemble_setting(value) -> int:
    """An ``--ensemble`` value (1, 2, 4 or 8) for the denoising pipelines; UsageError for anything else."""
    try:
        return check_ensemble(value)
    except ValueError as e:
        raise UsageError(f"--ensemble: {e}") from None


def stem(path: Path) -> str:
    """The name outputs are made from: the file's stem, ``stdin`` for standard input."""
    return "stdin" if is_stdio(path) else path.stem


def input_names(inputs: Sequence[str | Path], paths: list[Path], recursive: bool = False) -> list[str]:
    """The name each input's outputs are made from: its :func:`stem`, or with ``recursive``, for an
    image found in a folder input, its path below that folder without the suffix (``sub/x``), so
    that the outputs mirror the input tree and ``a/x.png`` and ``b/x.png`` do not collide."""
    roots = [Path(s).expanduser().resolve() for s in map(str, inputs) if s != STDIO and Path(s).expanduser().is_dir()]
    names = []
    for p in paths:
        name = stem(p)
        if recursive and not is_stdio(p):
            rp = p.resolve()
            inside = [r for r in roots if r in rp.parents]
            if inside:  # the innermost folder given, if one folder input holds another
                name = rp.relative_to(max(inside, key=lambda r: len(r.parts))).with_suffix("").as_posix()
        names.append(name)
    return names


def expand_inputs(inputs: Sequence[str | Path], recursive: bool = False) -> list[Path]:
    """Files, folders (their images, sorted), glob patterns and ``-`` (standard input) ->
    unique image paths."""
    out: list[Path] = []
    for spec in map(str, inputs):
        p = Path(spec).expanduser()
        if spec == STDIO:
            out.append(Path(STDIO))
        elif p.is_dir():
            it = p.rglob("*") if recursive else p.iterdir()
            found = sorted(q for q in it if q.is_file() and is_image_path(q) and not q.name.startswith("."))
            if not found:
                raise UsageError(f"no images found in folder {spec}")
            out.extend(found)
        elif p.exists():
            out.append(p)
        elif any(c in spec for c in "*?["):
            found = sorted(Path(q) for q in glob.glob(spec, recursive=True) if Path(q).is_file())
            if not found:
                raise UsageError(f"no files match {spec!r}")
            out.extend(found)
        else:
            raise UsageError(f"no such file or folder: {spec}")
    seen, unique = set(), []
    for p in out:
        key = STDIO if is_stdio(p) else p.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(p)
    return unique


def plan_outputs(
    inputs: list[Path],
    output: Path,
    suffix: str = ".png",
    force: bool = False,
    skip_existing: bool = False,
    names: list[str] | None = None,
    shard: tuple[int, int] | None = None,
) -> tuple[list[Path], list[Path], list[Path]]:
    """Where each input's result goes: ``output`` itself for one input when it names an image file
    (its suffix says the format: :data:`OUTPUT_SUFFIXES`), else ``output/<name><suffix>``, the names
    from :func:`input_names` (default: the stems).  Refuses input overwrites, name clashes and
    (without --force) existing files, before any work is done.  Returns the inputs to process,
    their targets, and the inputs left out by ``skip_existing``; with ``shard`` (K, N), only the
    K-th of every N inputs (:func:`skip_done`).  ``-o -`` (one input) is standard output."""
    if is_stdio(output):
        if len(inputs) != 1:
            raise UsageError(f"-o - (standard output) takes one input, not {len(inputs)}")
        if skip_existing:
            raise UsageError("--skip-existing cannot check standard output")
        return inputs, [output], []
    looks_like_file = is_image_path(output) and not output.is_dir()
    if looks_like_file and output.suffix.lower() not in OUTPUT_SUFFIXES:
        raise UsageError(f"{output}: cannot write {output.suffix} files; use one of {', '.join(OUTPUT_SUFFIXES)}")
    if looks_like_file and len(inputs) != 1:
        raise UsageError(f"{len(inputs)} inputs need an output folder, not the file name {output}")
    if not looks_like_file:
        require_folder(output, "--output")  # else each image failed on its own with "File exists"
    names = names or [stem(p) for p in inputs]
    targets = [output] if looks_like_file else [output / f"{n}{suffix}" for n in names]
    inputs, plans, skipped = skip_done(inputs, [{"output": t} for t in targets], skip_existing, force, shard)
    return inputs, [plan["output"] for plan in plans], skipped


def skip_done(
    inputs: list[Path],
    plans: list[dict[str, Path]],
    skip_existing: bool,
    force: bool,
    shard: tuple[int, int] | None = None,
) -> tuple[list[Path], list[dict[str, Path]], list[Path]]:
    """The inputs still to do with their planned files, and (with --skip-existing) the inputs left
    out because all their planned files exist.  What remains is checked by check_targets, so an
    input with only some of its outputs is refused without --force: never overwritten silently.
    With ``shard`` (K, N) only the K-th of every N inputs remains, after a check that no two of
    all the inputs share a file: the shards of one run refuse what the whole run would."""
    if skip_existing and force:
        raise UsageError("--skip-existing and --force contradict each other; choose one")
    if shard is not None:
        check_targets([], [f for plan in plans for f in plan.values()], force=True)  # clashes between shards
        inputs, _ = take_shard(inputs, shard)
        plans, _ = take_shard(plans, shard)
    done = [skip_existing and bool(plan) and all(f.exists() for f in plan.values()) for plan in plans]
    skipped = [p for p, d in zip(inputs, done) if d]
    todo = [i for i, d in enumerate(done) if not d]
    inputs, plans = [inputs[i] for i in todo], [plans[i] for i in todo]
    check_targets(inputs, [f for plan in plans for f in plan.values()], force)
    return inputs, plans, skipped


def require_folder(path: Path, option: str) -> None:
    """An output folder option must not name an existing file, and the folder must be one this process can
    make or write into: checked on its nearest existing ancestor before any work, without making anything
    (else every image failed on its own after its work was done)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UsageError(f"{option} must be a folder, and {path} is a file")
    here = path
    while not here.exists() and here != here.parent:
        here = here.parent
    if not here.is_dir():
        raise UsageError(f"{option} {path}: cannot make a folder under {here}, which is a file")
    if not os.access(here, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {path}: {here} is not writable")


def check_targets(inputs: list[Path], targets: list[Path], force: bool) -> None:
    ins = {p.resolve() for p in inputs if not is_stdio(p)}
    seen: dict[Path, int] = {}
    for t in targets:
        r = t.resolve()
        if r in ins:
            raise UsageError(f"refusing to overwrite the input {t}; choose another output")
        if r in seen:
            raise UsageError(f"two inputs would write the same output {t} (same file name; -r keeps sub-folders apart)")
        seen[r] = 1
        if t.exists() and not force:
            raise UsageError(f"output exists: {t} (use --force to overwrite)")


def parse_scales(text: str) -> tuple[float, ...]:
    """'1,0.5,0.25' -> (1.0, 0.5, 0.25): image pyramid or read-out scales, each in (0, 1], no repeats."""
    try:
        scales = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise UsageError(f"--scales must be comma-separated numbers, got {text!r}") from None
    if not scales or any(not 0 < v <= 1 for v in scales) or len(set(scales)) != len(scales):
        raise UsageError(f"--scales must be distinct numbers in (0, 1], got {text!r}")
    return scales


def parse_shard(text: str) -> tuple[int, int]:
    """'K/N' -> (K, N): the K-th of N shards, K counted from 0."""
    try:
        k, n = (int(v) for v in text.split("/"))
    except ValueError:
        raise UsageError(f"--shard must look like K/N (e.g. 0/4), got {text!r}") from None
    if n < 1 or not 0 <= k < n:
        raise UsageError(f"--shard K/N needs 0 <= K < N, got {text!r}")
    return k, n


def shard_from_env(env: dict | None = None) -> tuple[int, int] | None:
    """The shard a launcher gave this process: torchrun (RANK, WORLD_SIZE) or a SLURM job array
    (SLURM_ARRAY_TASK_ID counted from SLURM_ARRAY_TASK_MIN, SLURM_ARRAY_TASK_COUNT); None alone."""
    env = os.environ if env is None else env
    if int(env.get("WORLD_SIZE", "1")) > 1:
        return int(env.get("RANK", "0")), int(env["WORLD_SIZE"])
    if "SLURM_ARRAY_TASK_ID" in env and int(env.get("SLURM_ARRAY_TASK_COUNT", "1")) > 1:
        task = int(env["SLURM_ARRAY_TASK_ID"]) - int(env.get("SLURM_ARRAY_TASK_MIN", "0"))
        return task, int(env["SLURM_ARRAY_TASK_COUNT"])
    return None


def take_shard(items: list, shard: tuple[int, int] | None) -> tuple[list, list[int]]:
    """Every N-th item starting at the K-th, in the stable input order, and their positions."""
    if shard is None:
        return items, list(range(len(items)))
    k, n = shard
    return items[k::n], list(range(k, len(items), n))
