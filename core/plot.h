// Plot: charts for the HTML report, drawn by gnuplot (a real plotting tool) run as a subprocess: the data go
// to files in a fresh temp folder, gnuplot's svg terminal draws, and the SVG comes back ready to inline in an
// HTML page (no XML prolog, no namespace URLs, element ids prefixed so several plots share one page).
// gnuplot is found through $DDPCHECK_GNUPLOT, else on $PATH; when it is absent every call returns NotFound
// (CLI exit code 2) with a message naming the Debian package (gnuplot-nox).
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace ddpcheck::core {

struct PlotSeries {
  std::string title;
  std::vector<std::pair<double, double>> points;  // (x, y); NaN y = a gap
  int color = 0;        // gnuplot line type for the colour (1, 2, ...); 0: the series' position
  bool dashed = false;  // drawn dashed (a reference beside the backend's solid line)
};

struct LinePlot {
  std::string title, xlabel, ylabel;
  bool logy = false;  // non-positive y values are left out
  bool points = true;  // a marker at every point (false: lines only, a smaller SVG)
  int width = 1000, height = 360;
  std::vector<PlotSeries> series;
  std::optional<double> mark_x;  // a vertical line at this x (the first divergence), labelled mark_label
  std::string mark_label;
  std::optional<double> hline;  // a horizontal line at this y (a budget), labelled hline_label
  std::string hline_label;
};

// A map of cells (x, y) coloured by value on a log scale; cells with value 0 are drawn white ("exact"), and
// `marks` (x, y) get a cross ("failed").
struct HeatmapPlot {
  std::string title, xlabel, ylabel, cblabel;
  int width = 1000, height = 360;
  struct Cell {
    double x = 0, y = 0, value = 0;
  };
  std::vector<Cell> cells;
  std::vector<std::pair<double, double>> marks;
  std::string marks_title = "failed";
};

// The gnuplot executable, or NotFound naming the package to install.
Status FindGnuplot(std::string* path);
Status RenderLinePlot(const LinePlot& plot, std::string* svg);
Status RenderHeatmap(const HeatmapPlot& plot, std::string* svg);

// Runs `script` (gnuplot commands; "@DIR@" stands for the temp folder, which also holds `files` as name ->
// content) with `set output '@DIR@/out.svg'` prepended after the terminal, and returns the inline-ready SVG.
Status RunGnuplot(const std::string& script, const std::vector<std::pair<std::string, std::string>>& files,
                  std::string* svg);

// Makes gnuplot's standalone SVG inline-ready: drops the XML prolog, namespace URLs, title/desc and the empty
// groups gnuplot writes for every style change, collapses whitespace between tags, prefixes every id.
std::string InlineSvg(const std::string& svg, const std::string& id_prefix);

// A gnuplot single-quoted string literal.
std::string GnuplotQuote(const std::string& s);

}  // namespace ddpcheck::core
