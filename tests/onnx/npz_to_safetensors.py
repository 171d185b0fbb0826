#!/usr/bin/env python3
"""Converts a .npz of named float arrays (onnx_trunk.py's `*_params.npz`: the trunk's
unfolded parameters under torchvision's names, those of ir/resnet34_trunk.ir) to the
.safetensors file that `primjit run --params` reads. Needs numpy and safetensors:

    /tmp/ov/bin/pip install numpy safetensors
    /tmp/ov/bin/python tests/onnx/npz_to_safetensors.py trunk_params.npz trunk_params.safetensors
"""
import sys

import numpy as np
from safetensors.numpy import save_file

src, dst = sys.argv[1], sys.argv[2]
arrays = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in np.load(src).items()}
save_file(arrays, dst)
print(f"{dst}: {len(arrays)} tensors, {sum(a.size for a in arrays.values())} values")
