"""Split a safetensors file into two halves (tensors divided, metadata kept on both) and join them
again: the device tool returns files below 16 MiB only, and a grown gray model is larger.

    python benchmarks/explore/split_safetensors.py split model.safetensors OUT_PREFIX   # OUT_PREFIX.part{0,1}.safetensors
    python benchmarks/explore/split_safetensors.py join OUT_PREFIX model.safetensors
"""
import sys

from safetensors import safe_open
from safetensors.torch import load_file, save_file

if sys.argv[1] == "split":
    src, prefix = sys.argv[2], sys.argv[3]
    tensors = load_file(src)
    with safe_open(src, "pt") as f:
        meta = f.metadata()
    total, acc, first = sum(t.numel() * t.element_size() for t in tensors.values()), 0, []
    for k in sorted(tensors):  # the first half of the bytes
        if acc < total / 2:
            first.append(k)
            acc += tensors[k].numel() * tensors[k].element_size()
    second = [k for k in sorted(tensors) if k not in first]
    for i, part in enumerate((first, second)):
        save_file({k: tensors[k] for k in part}, f"{prefix}.part{i}.safetensors", metadata=meta)
else:
    prefix, out = sys.argv[2], sys.argv[3]
    tensors, meta = {}, None
    for i in (0, 1):
        tensors.update(load_file(f"{prefix}.part{i}.safetensors"))
        with safe_open(f"{prefix}.part{i}.safetensors", "pt") as f:
            meta = f.metadata()
    save_file(tensors, out, metadata=meta)
