#include "core/report_html_charts.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include <fmt/format.h>

#include "core/plot.h"

namespace ddpcheck::core {

namespace {

constexpr size_t kMaxLines = 12;  // more lines than this are unreadable and make the page heavy

double Peak(const PlotSeries& s) {
  double m = 0;
  for (const auto& [x, y] : s.points) m = std::max(m, std::isnan(y) ? INFINITY : y);
  return m;
}

// Keeps the kMaxLines series with the largest peak, noting what was left out.
void KeepLargest(const std::string& what, std::vector<PlotSeries>* series, std::vector<std::string>* notes) {
  if (series->size() <= kMaxLines) return;
  std::stable_sort(series->begin(), series->end(),
                   [](const PlotSeries& a, const PlotSeries& b) { return Peak(a) > Peak(b); });
  notes->push_back(fmt::format("{}: the {} lines with the largest error of {} are drawn", what, kMaxLines,
                               series->size()));
  series->resize(kMaxLines);
}

bool AnyNonZero(const std::vector<PlotSeries>& series) {
  for (const auto& s : series) {
    for (const auto& [x, y] : s.points) {
      if (!(y == 0)) return true;
    }
  }
  return false;
}

PlotSeries Series(const std::string& title, const std::map<int64_t, double>& m) {
  PlotSeries s{title, {}};
  for (const auto& [step, v] : m) s.points.emplace_back(static_cast<double>(step), v);
  return s;
}

void MarkFirstDivergence(const RunReport& r, LinePlot* plot) {
  if (!r.result.first || r.result.first->key.step < 0) return;
  plot->mark_x = static_cast<double>(r.result.first->key.step);
  plot->mark_label = fmt::format("first divergence (step {})", r.result.first->key.step);
}

Status Draw(LinePlot plot, const std::string& id, std::ostream& os) {
  // Lines alone keep long runs small; a few steps need a marker per point (a single step draws no line).
  size_t longest = 0;
  for (const auto& s : plot.series) longest = std::max(longest, s.points.size());
  plot.points = plot.points || longest <= 12;
  std::string svg;
  DDPCHECK_RETURN_IF_ERROR(RenderLinePlot(plot, &svg));
  os << "<div class=\"plot\" id=\"" << HtmlEscape(id) << "\">\n" << svg << "\n</div>\n";
  return Status::Ok();
}

// error_by_tensor ("<checkpoint>/<tensor>" -> step -> max abs err over ranks) of one checkpoint, or of all.
std::vector<std::pair<std::string, std::vector<PlotSeries>>> PerTensorSeries(const RunReport& r,
                                                                             const std::string& only) {
  std::map<int, std::pair<std::string, std::vector<PlotSeries>>> by_checkpoint;
  for (const auto& [key, by_step] : r.result.error_by_tensor) {
    const size_t slash = key.find('/');
    const std::string cp = key.substr(0, slash);
    if (!only.empty() && cp != only) continue;
    Checkpoint c;
    const int order = ParseCheckpoint(cp, &c) ? static_cast<int>(c) : kNumCheckpoints;
    auto& entry = by_checkpoint[order];
    entry.first = cp;
    entry.second.push_back(Series(slash == std::string::npos ? key : key.substr(slash + 1), by_step));
  }
  std::vector<std::pair<std::string, std::vector<PlotSeries>>> charts;
  for (auto& [order, entry] : by_checkpoint) charts.push_back(std::move(entry));
  return charts;
}

Status WritePerTensorCharts(const RunReport& r, const std::string& only, std::ostream& os,
                            std::vector<std::string>* notes) {
  for (auto& [checkpoint, series] : PerTensorSeries(r, only)) {
    if (!AnyNonZero(series)) {
      os << "<p class=\"note\" id=\"plot-error-" << HtmlEscape(checkpoint) << "\">" << HtmlEscape(checkpoint)
         << ": every floating value equals the reference (error 0 at every step).</p>\n";
      continue;
    }
    KeepLargest(checkpoint, &series, notes);
    LinePlot plot;
    plot.title = "max |got - reference| at checkpoint '" + checkpoint + "' per tensor (over ranks)";
    plot.xlabel = "step";
    plot.ylabel = "max abs err (value units)";
    plot.logy = true;
    plot.points = false;
    plot.height = 300;
    plot.series = std::move(series);
    MarkFirstDivergence(r, &plot);
    DDPCHECK_RETURN_IF_ERROR(Draw(plot, "plot-error-" + checkpoint + (only.empty() ? "" : "-tensors"), os));
  }
  return Status::Ok();
}

}  // namespace

std::string HtmlEscape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

Status WriteErrorCharts(const RunReport& r, std::ostream& os) {
  std::vector<std::string> notes;
  if (r.rank_error.empty()) {
    os << "<h2>Error vs step, per tensor</h2>\n";
    if (r.result.error_by_tensor.empty()) {
      os << "<p class=\"note\">No floating values were compared with the reference.</p>\n";
    }
    DDPCHECK_RETURN_IF_ERROR(WritePerTensorCharts(r, "", os, &notes));
  } else {
    os << "<h2>Error vs step, per rank</h2>\n<p class=\"note\">One line per rank: the largest error of any tensor "
          "of that rank at that checkpoint and step, as a fraction of its budget (1 = the budget: above it, a "
          "value failed) where values are compared within a budget, in value units where they must be equal. "
          "The dashed red line marks the first divergence.</p>\n";
    for (int c = 0; c < kNumCheckpoints; ++c) {
      const std::string cp = CheckpointName(static_cast<Checkpoint>(c));
      const auto it = r.rank_error.find(cp);
      if (it == r.rank_error.end()) continue;
      const auto summary = r.checkpoint_summary.find(cp);
      const bool exact = summary == r.checkpoint_summary.end() || summary->second.exact;
      std::vector<PlotSeries> series;
      for (const auto& [rank, by_step] : it->second) {
        PlotSeries s{fmt::format("rank {}", rank), {}, rank + 1};
        for (const auto& [step, cell] : by_step) {
          s.points.emplace_back(static_cast<double>(step), exact ? cell.max_abs_err : cell.budget_used);
        }
        series.push_back(std::move(s));
      }
      if (!AnyNonZero(series)) {
        os << "<p class=\"note\" id=\"plot-error-" << HtmlEscape(cp) << "\">" << HtmlEscape(cp)
           << ": every value of every rank equals the reference (error 0 at every step).</p>\n";
        continue;
      }
      KeepLargest(cp, &series, &notes);
      LinePlot plot;
      plot.title = exact ? "checkpoint " + cp + ": max |got - reference| per rank (must be equal)"
                         : "checkpoint " + cp + ": max |got - reference| / budget per rank";
      plot.xlabel = "step";
      plot.ylabel = exact ? "max abs err (value units)" : "budget used (ratio)";
      plot.logy = true;
      plot.points = false;
      plot.height = 260;
      plot.series = std::move(series);
      if (!exact) {
        plot.hline = 1.0;
        plot.hline_label = "budget";
      }
      MarkFirstDivergence(r, &plot);
      DDPCHECK_RETURN_IF_ERROR(Draw(plot, "plot-error-" + cp, os));
    }
    if (r.result.first && r.result.first->elements > 0) {
      const std::string cp = CheckpointName(r.result.first->key.checkpoint);
      os << "<h2>At the first divergence's checkpoint ('" << HtmlEscape(cp) << "'), per tensor</h2>\n";
      DDPCHECK_RETURN_IF_ERROR(WritePerTensorCharts(r, cp, os, &notes));
    }
  }
  for (const auto& n : notes) os << "<p class=\"note\">" << HtmlEscape(n) << "</p>\n";
  return Status::Ok();
}

Status WriteTrainingCharts(const RunReport& r, std::ostream& os) {
  os << "<h2>Training series</h2>\n";
  struct SeriesChart {
    const char* id;
    const char* title;
    const char* ylabel;
    const std::map<int64_t, double>* data;
    bool logy;
  };
  const SeriesChart charts[] = {
      {"lr", "learning rate in effect at each optimizer step (rank 0)", "lr", &r.lr_by_step, false},
      {"scale", "GradScaler loss scale after update() (rank 0)", "scale (log)", &r.scale_by_step, true},
  };
  for (const auto& c : charts) {
    if (c.data->empty()) {
      os << "<p class=\"note\">" << c.id << ": not recorded in this scenario"
         << (std::string(c.id) == "scale" ? " (no AMP GradScaler)" : "") << ".</p>\n";
      continue;
    }
    LinePlot plot;
    plot.title = c.title;
    plot.xlabel = "step";
    plot.ylabel = c.ylabel;
    plot.logy = c.logy;
    plot.points = false;
    plot.height = 260;
    plot.series = {Series(c.id, *c.data)};
    DDPCHECK_RETURN_IF_ERROR(Draw(plot, std::string("plot-") + c.id, os));
  }
  LinePlot loss;
  loss.xlabel = "step";
  loss.ylabel = "loss";
  loss.points = false;
  loss.height = 300;
  if (r.loss_by_rank.empty()) {
    if (r.loss_by_step.empty()) {
      os << "<p class=\"note\">loss: not recorded.</p>\n";
      return Status::Ok();
    }
    loss.title = "loss (rank 0, backend)";
    loss.series = {Series("loss", r.loss_by_step)};
  } else {
    loss.title = "loss of every rank (solid) beside the reference's loss of the same rank's shard (dashed)";
    for (const auto& [rank, by_step] : r.loss_by_rank) {
      if (loss.series.size() >= kMaxLines) break;
      PlotSeries s = Series(fmt::format("rank {}", rank), by_step);
      s.color = rank + 1;
      loss.series.push_back(std::move(s));
      const auto ref = r.reference_loss_by_rank.find(rank);
      if (ref == r.reference_loss_by_rank.end()) continue;
      PlotSeries w = Series(fmt::format("reference {}", rank), ref->second);
      w.color = rank + 1;
      w.dashed = true;
      loss.series.push_back(std::move(w));
    }
  }
  MarkFirstDivergence(r, &loss);
  return Draw(loss, "plot-loss", os);
}

}  // namespace ddpcheck::core
