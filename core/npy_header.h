// The header dictionary of a .npy file: "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }".
// Internal to core/npy.cc; separate so the small Python-literal parser is testable on its own.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace ddpcheck::core {

struct NpyHeader {
  std::string descr;  // "<f4"
  bool fortran_order = false;
  std::vector<int64_t> shape;
};

// Parses the dictionary literal numpy writes (keys in any order, any whitespace, trailing commas, single or
// double quotes). Requires exactly the keys descr, fortran_order and shape. Errors are InvalidArgument with
// a message that does not name the file (the caller prefixes it), e.g. "header: 'shape' must be a tuple of
// non-negative integers, got [3, 4]".
Status ParseNpyHeader(const std::string& text, NpyHeader* out);

// The dictionary literal numpy itself writes for `h`, without padding or newline.
std::string FormatNpyHeader(const NpyHeader& h);

}  // namespace ddpcheck::core
