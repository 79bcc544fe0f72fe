#!/usr/bin/python3
"""Writes the .npy seeds of the checked-in corpus with numpy:
    make_npy_seeds.py CORPUS_DIR/npy
One small valid file per dtype dist_npy_parse reads, plus the shapes and
header variants it must handle (0-d, empty, 1-tuple, format 2.0)."""
import io
import os
import sys

import numpy as np


def save(dirname, name, arr, version=None):
    buf = io.BytesIO()
    if version is None:
        np.save(buf, arr)
    else:
        np.lib.format.write_array(buf, arr, version=version)
    with open(os.path.join(dirname, name + ".npy"), "wb") as f:
        f.write(buf.getvalue())


def main():
    d = sys.argv[1]
    os.makedirs(d, exist_ok=True)
    save(d, "bool_2x3", np.array([[True, False, True], [False, True, True]]))
    save(d, "int8_4", np.arange(-2, 2, dtype=np.int8))
    save(d, "uint8_2x2", np.arange(4, dtype=np.uint8).reshape(2, 2))
    save(d, "int32_3", np.array([1, -1, 70000], dtype=np.int32))
    save(d, "int64_2x1x2", np.arange(4, dtype=np.int64).reshape(2, 1, 2))
    save(d, "float16_3", np.array([0.5, -2.0, 65504.0], dtype=np.float16))
    save(d, "float32_2x2", np.array([[1.5, 2.5], [3.5, 4.5]], dtype=np.float32))
    save(d, "float64_scalar", np.array(3.25, dtype=np.float64))
    save(d, "float32_empty_0x3", np.zeros((0, 3), dtype=np.float32))
    save(d, "uint16_as_bfloat16", np.array([0x3F80, 0xC000], dtype=np.uint16))
    save(d, "float32_v2", np.arange(6, dtype=np.float32).reshape(3, 2), version=(2, 0))
    save(d, "int32_8dims", np.zeros((1, 1, 1, 1, 1, 1, 1, 2), dtype=np.int32))


if __name__ == "__main__":
    main()
