// ReportToHtml: one self-contained page (inline CSS, inline SVG; no scripts, no external references): the
// verdict, provenance, the per-checkpoint table with a units row, the first divergence's evidence, the
// diagnosis, events, the tolerance derivation, and plots drawn by gnuplot (core/plot.h): error vs step per
// tensor (one chart per checkpoint), lr / loss scale / loss vs step, and the rank x step divergence map.
#include <algorithm>
#include <cmath>
#include <sstream>

#include <fmt/format.h>

#include "core/fault_guide.h"
#include "core/plot.h"
#include "core/report_html_charts.h"
#include "core/report.h"

namespace ddpcheck::core {

namespace {

std::string Esc(const std::string& s) { return HtmlEscape(s); }

constexpr const char* kStyle = R"(
body { font-family: sans-serif; margin: 24px auto; max-width: 1100px; color: #222; }
h1 { font-size: 20px; } h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #ddd; }
.verdict { padding: 12px 16px; border-radius: 6px; font-weight: bold; font-size: 16px; }
.pass { background: #e3f4e1; border: 1px solid #4a9c3f; } .fail { background: #fbe3e1; border: 1px solid #c0392b; }
table { border-collapse: collapse; margin: 8px 0; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 8px; } td.n { text-align: right; font-family: monospace; }
tr.units td { color: #666; font-style: italic; background: #f6f6f6; } tr.bad td { background: #fdecea; }
code, pre { font-family: monospace; font-size: 12px; } pre { white-space: pre-wrap; background: #f6f6f6; padding: 8px; }
.plot svg { max-width: 100%; height: auto; display: block; margin: 6px 0 16px; }
.note { color: #666; font-size: 13px; }
)";

std::string Num(double v, const char* spec = "{:.3g}") { return fmt::format(fmt::runtime(spec), v); }

}  // namespace

Status ReportToHtml(const RunReport& r, std::string* html) {
  std::string gnuplot;
  DDPCHECK_RETURN_IF_ERROR(FindGnuplot(&gnuplot));
  std::ostringstream os;
  const std::string verdict = r.pass() ? "PASS" : "FAIL";
  os << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  os << "<title>ddpcheck " << verdict << ": " << Esc(r.scenario) << "</title>\n";
  os << "<style>" << kStyle << "</style>\n</head>\n<body>\n";
  os << fmt::format("<h1>ddpcheck report: scenario <code>{}</code>, {} vs {}, W={}, {}, {} steps</h1>\n",
                    Esc(r.scenario), Esc(r.backend), Esc(r.against), r.world, DTypeName(r.precision), r.steps);
  os << "<div class=\"verdict " << (r.pass() ? "pass" : "fail") << "\" id=\"verdict\">" << Esc(VerdictLine(r))
     << "</div>\n";

  os << "<h2>Provenance</h2>\n<table>\n";
  for (const auto& [k, v] : r.provenance.items()) {
    os << "<tr><th>" << Esc(k) << "</th><td><code>" << Esc(v.is_string() ? v.get<std::string>() : v.dump())
       << "</code></td></tr>\n";
  }
  for (const auto& f : r.faults) os << "<tr><th>fault injected</th><td><code>" << Esc(f) << "</code></td></tr>\n";
  os << "</table>\n";

  os << "<h2>Checkpoints</h2>\n<table id=\"checkpoints\">\n";
  os << "<tr><th>checkpoint</th><th>tensors</th><th>failed</th><th>check</th><th>max abs err</th>"
        "<th>max err/scale</th><th>budget used</th></tr>\n";
  os << "<tr class=\"units\"><td></td><td>(count)</td><td>(count)</td><td></td><td>(value units)</td><td>(ratio)</td>"
        "<td>(ratio)</td></tr>\n";
  for (int c = 0; c < kNumCheckpoints; ++c) {
    const std::string name = CheckpointName(static_cast<Checkpoint>(c));
    auto it = r.result.stats.find(name);
    if (it == r.result.stats.end()) continue;
    const auto& st = it->second;
    const CheckpointCells cells = FormatCheckpointCells(r, name, st);
    os << fmt::format(
        "<tr{}><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td><td class=\"n\">{}</td>"
        "<td class=\"n\">{}</td><td class=\"n\">{}</td></tr>\n",
        st.failed ? " class=\"bad\"" : "", name, st.compared, st.failed, cells.check, cells.max_abs_err,
        cells.max_scaled_err, cells.budget_used);
  }
  os << "</table>\n";

  if (r.result.first) {
    const Mismatch& m = *r.result.first;
    os << "<h2>First divergence</h2>\n";
    os << "<p id=\"first-divergence\"><code>" << Esc(MismatchHeadline(m)) << "</code></p>\n";
    if (m.elements > 0) {
      os << "<table id=\"evidence\">\n<tr><th>element</th><th>got</th><th>want</th><th>abs err</th><th>rel err</th>"
            "<th>ulps</th><th>budget</th><th>budget used</th><th>elements differing</th></tr>\n";
      os << "<tr class=\"units\"><td>(index)</td><td>(value)</td><td>(value)</td><td>(value units)</td>"
            "<td>(ratio)</td><td>(ulp)</td><td>(value units)</td><td>(ratio)</td><td>(count)</td></tr>\n";
      os << fmt::format(
          "<tr><td class=\"n\">{}</td><td class=\"n\">{:.17g}</td><td class=\"n\">{:.17g}</td><td class=\"n\">{}</td>"
          "<td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>"
          "<td class=\"n\">{} of {}</td></tr>\n</table>\n",
          m.index, m.got, m.want, Num(m.abs_err), Num(m.rel_err), Num(m.ulps, "{:.0f}"), Num(m.budget),
          Num(BudgetUsed(m)), m.bad_elements, m.elements);
      if (m.ratio != 0.0) os << fmt::format("<p>Every element is <b>{:.6g}x</b> the {}.</p>\n", m.ratio, Esc(m.against));
    }
    if (!m.message.empty()) os << "<pre>" << Esc(m.message) << "</pre>\n";
  }
  if (r.diagnosis) {
    os << "<h2>Diagnosis</h2>\n<p id=\"diagnosis\"><b>" << Esc(r.diagnosis->pattern) << "</b> ("
       << Esc(r.diagnosis->kind) << (r.diagnosis->expected_semantics ? ", DDP's documented semantics" : "")
       << "): " << Esc(r.diagnosis->explanation) << "</p>\n";
    if (const FaultGuide* g = FindFaultGuide(r.diagnosis->pattern)) {
      os << "<p id=\"how-to-fix\"><b>How to fix:</b> " << Esc(g->fix) << " (docs/bugs.md, <code>ddpcheck faults "
         << Esc(g->name) << "</code>)</p>\n<pre># before\n" << Esc(g->before) << "\n# after\n" << Esc(g->after)
         << "</pre>\n";
    }
  }
  if (!r.events.empty()) {
    os << "<h2>Events</h2>\n<table>\n<tr><th>step</th><th>rank</th><th>kind</th><th>message</th></tr>\n";
    for (const auto& e : r.events) {
      os << fmt::format("<tr><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td><td>{}</td></tr>\n", e.step,
                        e.rank, Esc(e.kind), Esc(e.message));
    }
    os << "</table>\n";
  }
  if (!r.result.derivation.empty()) os << "<h2>Tolerance</h2>\n<p>" << Esc(r.result.derivation) << "</p>\n";

  // Plots.
  os << "<h2>Divergence map (rank x step)</h2>\n<div class=\"plot\" id=\"plot-divergence-map\">\n";
  {
    HeatmapPlot map;
    map.title = "max |got - reference| per rank and step (x: a value failed its budget, an invariant or an event)";
    map.xlabel = "step";
    map.ylabel = "rank";
    map.cblabel = "max abs err (value units)";
    map.height = std::clamp(120 + 28 * static_cast<int>(r.divergence_map.size()), 240, 640);
    for (const auto& [rank, by_step] : r.divergence_map) {
      for (const auto& [step, cell] : by_step) {
        map.cells.push_back({static_cast<double>(step), static_cast<double>(rank), cell.max_abs_err});
        if (cell.failed) map.marks.emplace_back(static_cast<double>(step), static_cast<double>(rank));
      }
    }
    std::string svg;
    DDPCHECK_RETURN_IF_ERROR(RenderHeatmap(map, &svg));
    os << svg << "\n</div>\n";
  }

  DDPCHECK_RETURN_IF_ERROR(WriteErrorCharts(r, os));
  DDPCHECK_RETURN_IF_ERROR(WriteTrainingCharts(r, os));

  if (!r.result.mismatches.empty()) {
    constexpr size_t kShown = 50;
    os << fmt::format("<h2>Mismatches</h2>\n<details><summary>{}{} listed, first {} shown</summary>\n<ol>\n",
                      r.result.mismatches.size(),
                      r.result.mismatches.size() >= CompareResult::kMaxMismatches ? "+" : "",
                      std::min(kShown, r.result.mismatches.size()));
    for (size_t i = 0; i < r.result.mismatches.size() && i < kShown; ++i) {
      os << "<li><code>" << Esc(DescribeMismatch(r.result.mismatches[i])) << "</code></li>\n";
    }
    os << "</ol>\n</details>\n";
  }
  os << "<p class=\"note\">Plots drawn by gnuplot. Report format version " << kReportFormatVersion
     << " (reports/FORMAT.md).</p>\n</body>\n</html>\n";
  *html = os.str();
  return Status::Ok();
}

}  // namespace ddpcheck::core
