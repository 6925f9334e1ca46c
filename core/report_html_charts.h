// The charts of the HTML report (core/report_html.cc), drawn by gnuplot (core/plot.h):
//   WriteErrorCharts: per checkpoint, one line per rank of its largest error vs step (as a fraction of the
//     budget, or in value units where values must be equal), the first divergence marked; then, on a failure,
//     the tensors of the first divergence's checkpoint. Without per-rank series (FillDivergenceMap not called)
//     one chart per checkpoint of the largest error per tensor over ranks.
//   WriteTrainingCharts: lr and loss scale (rank 0), and the loss of every rank beside the reference's loss of
//     the same rank's shard.
#pragma once

#include <ostream>
#include <string>

#include "core/report.h"

namespace ddpcheck::core {

std::string HtmlEscape(const std::string& s);
Status WriteErrorCharts(const RunReport& r, std::ostream& os);
Status WriteTrainingCharts(const RunReport& r, std::ostream& os);

}  // namespace ddpcheck::core
