// NumPy .npy files <-> core::Tensor. Format versions 1.0, 2.0 and 3.0; C order; little-endian numbers.
//   read:  '<f8' -> float64, '<f4' -> float32, '<f2' -> float16, '<i8' -> int64, '<i4' -> int32, and the
//          small integer types '|u1' '|i1' '<u2' '<i2' -> int32 (their values are exact in an int32).
//   write: float64 '<f8', float32 '<f4', float16 '<f2', bfloat16 '<f4' (numpy has no bfloat16; every bfloat16
//          value is exact in a float32, so nothing is lost), int32 '<i4', int64 '<i8'. Version 1.0, or 2.0 when
//          the header does not fit 1.0's 65535 bytes. Header padded so the data starts at a multiple of 64.
// Every error names the file and says how to fix it: "x.npy: dtype '>f4' is big-endian; ...".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace ddpcheck::core {

// Reads the .npy file at `path` into *out (values as double, dtype and shape from the header).
// Errors (file named in each): missing file (NotFound), bad magic, unsupported version, unparsable header,
// fortran_order True, big-endian or unsupported dtype (InvalidArgument), truncated data (Io), int64 values
// beyond 2^53 that a double cannot hold (InvalidArgument).
Status ReadNpy(const std::string& path, Tensor* out);

// Parses an in-memory .npy image; `name` is used in messages in place of a path.
Status ParseNpy(const std::string& bytes, const std::string& name, Tensor* out);

// Writes `t` to `path` as described above. Fails (InvalidArgument) when a value does not fit the dtype exactly
// (a non-integer or out-of-range value in an integer tensor, a value that is not a float16 in a float16 tensor);
// float32 values are rounded to nearest like a cast. Shape must match data.size().
Status WriteNpy(const std::string& path, const Tensor& t);

// The .npy image WriteNpy would write.
Status EncodeNpy(const Tensor& t, std::string* bytes);
// The same for float32 values held as floats (a trace's compact record): bitwise EncodeNpy of their Tensor.
Status EncodeNpyFloats(const std::vector<int64_t>& shape, const std::vector<float>& values, std::string* bytes);

// OK when t.shape equals `expected`, where an expected -1 matches any size; otherwise InvalidArgument
// "<what>: expected shape (N, 8), got (64, 9)" (N printed for -1).
Status ExpectShape(const Tensor& t, std::vector<int64_t> expected, const std::string& what);

}  // namespace ddpcheck::core
