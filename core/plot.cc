#include "core/plot.h"
#include "core/file.h"
#include "core/svg_pack.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <fmt/format.h>

extern char** environ;

namespace ddpcheck::core {

namespace {

constexpr const char* kMissing =
    "gnuplot not found: the HTML report draws its plots with gnuplot. Install the Debian package gnuplot-nox "
    "(apt-get install gnuplot-nox, or scripts/setup.sh), or point DDPCHECK_GNUPLOT at a gnuplot executable";

// A temp folder removed on scope exit.
class ScratchDir {
 public:
  Status Create() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "ddpcheck_plot_XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) return Status::Io(tmpl + ": mkdtemp failed");
    path_ = tmpl;
    return Status::Ok();
  }
  ~ScratchDir() {
    if (path_.empty()) return;
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  if (!out) return Status::Io(path + ": cannot write");
  out << text;
  return out ? Status::Ok() : Status::Io(path + ": write failed");
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string ReplaceAll(std::string s, const std::string& from, const std::string& to) {
  for (size_t pos = s.find(from); pos != std::string::npos; pos = s.find(from, pos + to.size())) {
    s.replace(pos, from.size(), to);
  }
  return s;
}

std::string Num(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return "NaN";  // gnuplot cannot place infinities; the tables carry them
  return fmt::format("{:.17g}", v);
}

std::string Header(int width, int height, const std::string& title) {
  return fmt::format(
      "set terminal svg size {},{} font 'sans,11' background '#ffffff' noenhanced\n"
      "set output '@DIR@/out.svg'\n"
      "set title {}\n"
      "set grid lc rgb '#dddddd'\n"
      "set border lc rgb '#444444'\n",
      width, height, GnuplotQuote(title));
}

}  // namespace

std::string GnuplotQuote(const std::string& s) { return "'" + ReplaceAll(s, "'", "''") + "'"; }

Status FindGnuplot(std::string* path) {
  if (const char* env = std::getenv("DDPCHECK_GNUPLOT"); env != nullptr && *env != '\0') {
    if (IsExecutable(env)) {
      *path = env;
      return Status::Ok();
    }
    return Status::NotFound(std::string(kMissing) + " (DDPCHECK_GNUPLOT=" + env + " is not an executable)");
  }
  *path = FindInPath("gnuplot", "/usr/bin:/bin");
  return path->empty() ? Status::NotFound(kMissing) : Status::Ok();
}

std::string InlineSvg(const std::string& svg, const std::string& id_prefix) {
  size_t start = svg.find("<svg");
  std::string s = start == std::string::npos ? svg : svg.substr(start);
  s = ReplaceAll(s, " xmlns=\"http://www.w3.org/2000/svg\"", "");
  s = ReplaceAll(s, " xmlns:xlink=\"http://www.w3.org/1999/xlink\"", "");
  s = ReplaceAll(s, "\n xmlns=\"http://www.w3.org/2000/svg\"", "");
  s = ReplaceAll(s, "\n xmlns:xlink=\"http://www.w3.org/1999/xlink\"", "");
  // Prefix every id and every reference to one, so plots on one page do not share ids.
  std::set<std::string> ids;
  for (const char* attr : {"id='", "id=\""}) {
    for (size_t pos = s.find(attr); pos != std::string::npos; pos = s.find(attr, pos + 1)) {
      const size_t begin = pos + 4;
      const size_t end = s.find(s[pos + 3], begin);
      if (end == std::string::npos) break;
      ids.insert(s.substr(begin, end - begin));
    }
  }
  for (const auto& id : ids) {
    for (const char* q : {"'", "\""}) {
      s = ReplaceAll(s, std::string("id=") + q + id + q, std::string("id=") + q + id_prefix + id + q);
      s = ReplaceAll(s, std::string(q) + "#" + id + q, std::string(q) + "#" + id_prefix + id + q);
    }
    s = ReplaceAll(s, "url(#" + id + ")", "url(#" + id_prefix + id + ")");
  }
  return PackSvg(s, id_prefix);
}

Status RunGnuplot(const std::string& script, const std::vector<std::pair<std::string, std::string>>& files,
                  std::string* svg) {
  std::string gnuplot;
  DDPCHECK_RETURN_IF_ERROR(FindGnuplot(&gnuplot));
  ScratchDir dir;
  DDPCHECK_RETURN_IF_ERROR(dir.Create());
  for (const auto& [name, content] : files) DDPCHECK_RETURN_IF_ERROR(WriteFile(dir.path() + "/" + name, content));
  const std::string script_path = dir.path() + "/plot.gp";
  DDPCHECK_RETURN_IF_ERROR(WriteFile(script_path, ReplaceAll(script, "@DIR@", dir.path())));
  const std::string err_path = dir.path() + "/stderr.txt";

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, err_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  std::vector<char*> argv = {const_cast<char*>(gnuplot.c_str()), const_cast<char*>(script_path.c_str()), nullptr};
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, gnuplot.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return Status::Io(gnuplot + ": cannot start: " + std::strerror(rc));
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return Status::Io(gnuplot + ": waitpid failed");
  }
  const std::string out = ReadAll(dir.path() + "/out.svg");
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || out.find("</svg>") == std::string::npos) {
    return Status::Internal(fmt::format("gnuplot failed ({}): {}",
                                        WIFEXITED(status) ? "exit " + std::to_string(WEXITSTATUS(status)) : "killed",
                                        ReadAll(err_path)));
  }
  static std::atomic<int> counter{0};
  *svg = InlineSvg(out, fmt::format("p{}_", counter.fetch_add(1)));
  return Status::Ok();
}

Status RenderLinePlot(const LinePlot& plot, std::string* svg) {
  std::string script = Header(plot.width, plot.height, plot.title);
  script += fmt::format("set xlabel {}\nset ylabel {}\n", GnuplotQuote(plot.xlabel), GnuplotQuote(plot.ylabel));
  // Horizontal grid lines only: the steps are on the x axis already, and each grid line is a path in the SVG.
  script += "set key outside right top vertical Left reverse noautotitle\nset xtics nomirror\nset ytics nomirror\n"
            "set grid noxtics ytics\n";
  std::vector<std::pair<std::string, std::string>> files;
  std::vector<std::string> clauses;
  bool any_positive = false, any_point = false;
  double xmin = INFINITY, xmax = -INFINITY;
  if (plot.mark_x) {
    script += fmt::format("set arrow 1 from {}, graph 0 to {}, graph 1 nohead lc rgb '#c0392b' lw 1.5 dt 2 front\n"
                          "set label 1 {} at {}, graph 0.97 left offset 0.5,0 textcolor rgb '#c0392b' front\n",
                          Num(*plot.mark_x), Num(*plot.mark_x), GnuplotQuote(plot.mark_label), Num(*plot.mark_x));
  }
  for (size_t i = 0; i < plot.series.size(); ++i) {
    const auto& series = plot.series[i];
    std::string data;
    for (const auto& [x, y] : series.points) {
      xmin = std::min(xmin, x), xmax = std::max(xmax, x);
      const bool drop = plot.logy && !(y > 0);
      data += Num(x) + " " + (drop ? "NaN" : Num(y)) + "\n";
      if (!drop && std::isfinite(y)) any_point = true;
      if (y > 0 && std::isfinite(y)) any_positive = true;
    }
    const std::string name = fmt::format("s{}.dat", i);
    files.emplace_back(name, data);
    const int color = series.color > 0 ? series.color : static_cast<int>(i) + 1;
    clauses.push_back(fmt::format("'@DIR@/{}' using 1:2 with {} lt {} lw 1.5{} title {}", name,
                                  plot.points ? "linespoints pt 7 ps 0.4" : "lines", color,
                                  series.dashed ? " dt 2" : "", GnuplotQuote(series.title)));
  }
  if (plot.hline && xmin <= xmax) {  // drawn as data, so the y range always includes it, below the top border
    script += "set offsets 0, 0, graph 0.08, 0\n";
    files.emplace_back("hline.dat", Num(xmin) + " " + Num(*plot.hline) + "\n" + Num(xmax) + " " + Num(*plot.hline) + "\n");
    clauses.push_back("'@DIR@/hline.dat' using 1:2 with lines lc rgb '#555555' lw 1 dt 3 title " +
                      GnuplotQuote(plot.hline_label));
  }
  // No minor tics: on a log scale gnuplot draws eight per decade, each a path in the SVG.
  if (plot.logy && any_positive) script += "set logscale y\nset format y '%.0e'\nunset mytics\n";
  if (xmax >= xmin && xmax - xmin <= 20) script += "set xtics 1\n";
  if (!any_point || clauses.empty()) {
    // Nothing to draw on this scale: an empty frame with a note, not a gnuplot error.
    script += "set xrange [0:1]\nset yrange [0:1]\nunset xtics\nunset ytics\n"
              "set label 1 'no non-zero values' at graph 0.5, graph 0.5 center\nplot NaN notitle\n";
    return RunGnuplot(script, {}, svg);
  }
  script += "plot ";
  for (size_t i = 0; i < clauses.size(); ++i) script += (i ? ", \\\n     " : "") + clauses[i];
  script += "\n";
  return RunGnuplot(script, files, svg);
}

Status RenderHeatmap(const HeatmapPlot& plot, std::string* svg) {
  std::string script = Header(plot.width, plot.height, plot.title);
  script += fmt::format("set xlabel {}\nset ylabel {}\nset cblabel {}\n", GnuplotQuote(plot.xlabel),
                        GnuplotQuote(plot.ylabel), GnuplotQuote(plot.cblabel));
  double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
  double vmin = INFINITY, vmax = -INFINITY;
  std::string zero, positive, marks;
  for (const auto& c : plot.cells) {
    xmin = std::min(xmin, c.x), xmax = std::max(xmax, c.x), ymin = std::min(ymin, c.y), ymax = std::max(ymax, c.y);
    if (c.value > 0) {
      const double v = std::isfinite(c.value) ? c.value : 1e300;
      vmin = std::min(vmin, v), vmax = std::max(vmax, v);
      positive += Num(c.x) + " " + Num(c.y) + " " + Num(v) + "\n";
    } else {
      zero += Num(c.x) + " " + Num(c.y) + "\n";
    }
  }
  for (const auto& [x, y] : plot.marks) marks += Num(x) + " " + Num(y) + "\n";
  if (plot.cells.empty()) {
    script += "set xrange [0:1]\nset yrange [0:1]\nunset xtics\nunset ytics\n"
              "set label 1 'no cells' at graph 0.5, graph 0.5 center\nplot NaN notitle\n";
    return RunGnuplot(script, {}, svg);
  }
  // Row 0 (rank 0) on top.
  script += fmt::format("set xrange [{}:{}]\nset yrange [{}:{}]\n", xmin - 0.5, xmax + 0.5, ymax + 0.5, ymin - 0.5);
  if (xmax - xmin <= 20) script += "set xtics 1\n";
  script += "set grid noxtics noytics\nset ytics 1\nset xtics nomirror out\nset ytics nomirror out\n";
  script += "set key outside right top\n";
  script += "set object 1 rectangle from graph 0,0 to graph 1,1 behind fc rgb '#eeeeee' fs solid noborder\n";
  // 16 colours: gnuplot draws the colour box as one polygon per colour (a few hundred by default).
  script += "set palette defined (0 '#fdd0a2', 1 '#fdae6b', 2 '#e6550d', 3 '#7f2704') maxcolors 16\n";
  if (!positive.empty()) {
    if (vmin == vmax) vmin = vmax / 10;
    script += fmt::format("set logscale cb\nset cbrange [{}:{}]\nset format cb '%.0e'\n", Num(vmin), Num(vmax));
  } else {
    script += "unset colorbox\n";
  }
  std::vector<std::string> clauses;
  std::vector<std::pair<std::string, std::string>> files;
  if (!positive.empty()) {
    files.emplace_back("positive.dat", positive);
    clauses.push_back("'@DIR@/positive.dat' using 1:2:(0.5):(0.5):3 with boxxyerror fc palette fs solid 1.0 "
                      "noborder notitle");
  }
  if (!zero.empty()) {
    files.emplace_back("zero.dat", zero);
    clauses.push_back("'@DIR@/zero.dat' using 1:2:(0.5):(0.5) with boxxyerror fc rgb '#ffffff' fs solid 1.0 "
                      "border lc rgb '#cccccc' title 'equal (0)'");
  }
  if (!marks.empty()) {
    files.emplace_back("marks.dat", marks);
    clauses.push_back("'@DIR@/marks.dat' using 1:2 with points pt 2 ps 1.0 lw 1.5 lc rgb '#000000' title " +
                      GnuplotQuote(plot.marks_title));
  }
  script += "plot ";
  for (size_t i = 0; i < clauses.size(); ++i) script += (i ? ", \\\n     " : "") + clauses[i];
  script += "\n";
  return RunGnuplot(script, files, svg);
}

}  // namespace ddpcheck::core
