// The groups of cross-field checks behind ValidateScenario (core/scenario.h). Each returns the first problem
// as InvalidArgument "<JSON path>: <expected>, got <found>" without the file name (ValidateScenario prefixes
// Scenario::source).
#pragma once

#include <string>

#include "core/scenario.h"
#include "core/status.h"

namespace ddpcheck::core {

// Layers are well-formed and their widths chain from the data's in_features to its out_features (or
// classes); the data (synthetic sizes, or loaded x / y) fits the model and the loss.
Status CheckModelAndData(const Scenario& s);
// Init seeds cover the world; npy/inline init values name real parameters/buffers with their shapes and
// cover every parameter.
Status CheckInit(const Scenario& s);
// world, batch_size, epochs, steps, ddp, optimizer (torch's own rules), schedulers, precision, amp, faults.
Status CheckTraining(const Scenario& s);

// "<path>: <expected>, got <value>" with the value printed as the shortest round-trip decimal.
Status ValueError(const std::string& path, const std::string& expected, double value);
Status ValueError(const std::string& path, const std::string& expected, int64_t value);

}  // namespace ddpcheck::core
