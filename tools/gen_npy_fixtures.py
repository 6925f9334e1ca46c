#!/usr/bin/python3
"""Writes the .npy fixtures of tests/npy_test.cc into tests/golden/npy/ with real numpy.

Run from the repository root: /usr/bin/python3 tools/gen_npy_fixtures.py
Every array's values follow a closed form the test recomputes on its own (value(i) for flat index i):
  floats:  (i - 5) / 4           (exact in float16/32/64)
  ints:    (i - 5) * 3           (negative and positive)
  i8_big:  [2**53, -2**53, 7]    (the largest magnitudes a double holds exactly)
  i8_huge: [2**53 + 1]           (not exact in a double: ReadNpy must refuse it)
"""
import os
import sys

import numpy as np

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden", "npy")


def floats(shape, dtype):
    n = int(np.prod(shape))
    return ((np.arange(n) - 5) / 4).astype(dtype).reshape(shape)


def ints(shape, dtype):
    n = int(np.prod(shape))
    return ((np.arange(n) - 5) * 3).astype(dtype).reshape(shape)


def save(name, arr, version=None):
    path = os.path.join(OUT, name)
    with open(path, "wb") as f:
        np.lib.format.write_array(f, arr, version=version, allow_pickle=False)
    return path


def main():
    os.makedirs(OUT, exist_ok=True)
    # One file per dtype, format 1.0, shape (3, 4).
    save("v1_f8.npy", floats((3, 4), "<f8"), (1, 0))
    save("v1_f4.npy", floats((3, 4), "<f4"), (1, 0))
    save("v1_f2.npy", floats((3, 4), "<f2"), (1, 0))
    save("v1_i8.npy", ints((3, 4), "<i8"), (1, 0))
    save("v1_i4.npy", ints((3, 4), "<i4"), (1, 0))
    save("v1_i2.npy", ints((3, 4), "<i2"), (1, 0))
    save("v1_u1.npy", np.arange(12, dtype="|u1").reshape(3, 4) * 20, (1, 0))
    # Format versions 2.0 and 3.0 (numpy writes them on request; 3.0 allows utf-8 headers).
    save("v2_f8.npy", floats((2, 3, 2), "<f8"), (2, 0))
    save("v3_f4.npy", floats((5,), "<f4"), (3, 0))
    # Shapes at the edges: a 0-d scalar, an empty array, a 1-d vector.
    save("scalar_f8.npy", np.array(-1.25, dtype="<f8"), (1, 0))
    save("empty_f4.npy", np.zeros((0, 3), dtype="<f4"), (1, 0))
    save("vector_i8.npy", np.array([2**53, -2**53, 7], dtype="<i8"), (1, 0))
    # Files ddpcheck must refuse with a clear message.
    save("i8_huge.npy", np.array([2**53 + 1], dtype="<i8"), (1, 0))
    save("fortran_f8.npy", np.asfortranarray(floats((3, 4), "<f8")), (1, 0))
    save("big_endian_f4.npy", floats((3, 4), ">f4"), (1, 0))
    save("complex_c8.npy", np.zeros((2,), dtype="<c8"), (1, 0))
    path = save("truncated_f4.npy", floats((64, 8), "<f4"), (1, 0))  # 2048 bytes of data, cut to 1000
    with open(path, "rb") as f:
        data = f.read()
    header_end = len(data) - 64 * 8 * 4
    with open(path, "wb") as f:
        f.write(data[: header_end + 1000])
    print("wrote fixtures to", os.path.normpath(OUT), "with numpy", np.__version__, file=sys.stderr)


if __name__ == "__main__":
    main()
