// The HTML report in a real browser: headless Chromium renders the page to a PNG screenshot, and a tiny PNG
// decoder (Python's zlib, no imaging library) counts the pixels that are not white and those that are
// coloured: a page whose SVG plots did not render would be text only (grey on white). Skipped when chromium or
// gnuplot is absent (scripts/setup.sh installs both).
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "core/plot.h"
#include "core/report.h"
#include "tests/test_util.h"

namespace ddpcheck {
namespace {

// Prints "WIDTH HEIGHT NONWHITE COLOURED" for an 8-bit RGB/RGBA PNG (non-interlaced, what Chromium writes).
constexpr const char* kPngStats = R"PY(
import struct, sys, zlib
data = open(sys.argv[1], 'rb').read()
assert data[:8] == b'\x89PNG\r\n\x1a\n', 'not a PNG'
pos, idat = 8, b''
while pos < len(data):
    n, kind = struct.unpack('>I4s', data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    if kind == b'IHDR':
        w, h, depth, ctype, _, _, interlace = struct.unpack('>IIBBBBB', body)
    elif kind == b'IDAT':
        idat += body
    pos += 12 + n
assert depth == 8 and ctype in (2, 6) and interlace == 0, (depth, ctype, interlace)
bpp = 3 if ctype == 2 else 4
raw = zlib.decompress(idat)
stride = w * bpp
prev = bytearray(stride)
nonwhite = coloured = 0
for y in range(h):
    f = raw[y * (stride + 1)]
    line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    if f == 1:
        for i in range(bpp, stride): line[i] = (line[i] + line[i - bpp]) & 255
    elif f == 2:
        line = bytearray((a + b) & 255 for a, b in zip(line, prev))
    elif f == 3:
        for i in range(stride):
            left = line[i - bpp] if i >= bpp else 0
            line[i] = (line[i] + ((left + prev[i]) >> 1)) & 255
    elif f == 4:
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    for x in range(0, stride, bpp):
        r, g, b = line[x], line[x + 1], line[x + 2]
        if r < 245 or g < 245 or b < 245:
            nonwhite += 1
            if max(r, g, b) - min(r, g, b) > 60:
                coloured += 1
    prev = line
print(w, h, nonwhite, coloured)
)PY";

std::string Which(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const std::string candidate = dir + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

std::string Chromium() {
  for (const char* name : {"chromium", "chromium-browser", "google-chrome"}) {
    if (std::string p = Which(name); !p.empty()) return p;
  }
  return "";
}

struct PngStats {
  long width = 0, height = 0, nonwhite = 0, coloured = 0;
};

// Screenshots `html_path` and measures the PNG.
PngStats Render(const std::string& chromium, const testing::TempDir& dir, const std::string& html_path,
                const std::string& name) {
  const std::string png = dir.File(name + ".png");
  const std::string cmd = "timeout 120 '" + chromium +
                          "' --headless --no-sandbox --disable-gpu --disable-quic --no-first-run "
                          "--disable-background-networking --disable-component-update --disable-sync "
                          "--disable-dev-shm-usage --hide-scrollbars --user-data-dir='" +
                          dir.File(name + "-profile") + "' --screenshot='" + png +
                          "' --window-size=1200,1600 'file://" + html_path + "' >'" + dir.File(name + ".log") +
                          "' 2>&1";
  const int rc = std::system(cmd.c_str());
  struct stat st {};
  EXPECT_EQ(::stat(png.c_str(), &st), 0) << "chromium wrote no screenshot (rc " << rc << "):\n"
                                          << testing::ReadFile(dir.File(name + ".log"));
  PngStats s;
  if (::stat(png.c_str(), &st) != 0) return s;
  testing::WriteFile(dir.File("png_stats.py"), kPngStats);
  const std::string out = dir.File(name + ".stats");
  const std::string py = "python3 '" + dir.File("png_stats.py") + "' '" + png + "' >'" + out + "' 2>&1";
  EXPECT_EQ(std::system(py.c_str()), 0) << testing::ReadFile(out);
  std::istringstream in(testing::ReadFile(out));
  in >> s.width >> s.height >> s.nonwhite >> s.coloured;
  return s;
}

core::RunReport FailingReport() {
  core::RunReport r;
  r.provenance = core::Provenance({{"backend", "sim/gloo"}, {"world", 4}});
  r.scenario = "browser";
  r.backend = "sim (gloo)";
  r.against = "reference";
  r.world = 4;
  r.steps = 12;
  r.faults = {"loss-times-world"};
  core::Mismatch m;
  m.key = {0, core::Checkpoint::kReduced, "0.weight", 0};
  m.kind = "reference-divergent";
  m.against = "reference";
  m.got = 4, m.want = 1, m.abs_err = 3, m.rel_err = 3, m.budget = 1e-12, m.elements = 8, m.bad_elements = 8;
  r.result.Add(m);
  r.result.stats["reduced"] = {48, 48, 3, 3, 1e15};
  r.result.stats["params"] = {48, 40, 0.3, 0.5, 1e14};
  for (int s = 0; s < 12; ++s) {
    r.lr_by_step[s] = 0.1 * (s < 6 ? 1.0 : 0.5);
    r.loss_by_step[s] = 2.0 / (s + 1);
    r.result.error_by_tensor["reduced/0.weight"][s] = 3.0 / (s + 1);
    r.result.error_by_tensor["params/0.weight"][s] = 0.01 * s;
    for (int rank = 0; rank < 4; ++rank) r.divergence_map[rank][s] = {0.01 * (s + 1) * (rank + 1), s > 0};
  }
  return r;
}

TEST(ReportHtmlBrowser, PlotsRenderInHeadlessChromium) {
  const std::string chromium = Chromium();
  if (chromium.empty()) GTEST_SKIP() << "chromium absent (Debian package chromium; scripts/setup.sh)";
  std::string gnuplot;
  if (!core::FindGnuplot(&gnuplot).ok()) GTEST_SKIP() << "gnuplot absent (Debian package gnuplot-nox)";
  if (Which("python3").empty()) GTEST_SKIP() << "python3 absent";

  testing::TempDir dir;
  std::string html;
  ASSERT_TRUE(core::ReportToHtml(FailingReport(), &html).ok());
  testing::WriteFile(dir.File("report.html"), html);
  testing::WriteFile(dir.File("blank.html"), "<!DOCTYPE html><html><body></body></html>\n");

  const PngStats blank = Render(chromium, dir, dir.File("blank.html"), "blank");
  const PngStats page = Render(chromium, dir, dir.File("report.html"), "report");
  ASSERT_EQ(page.width, 1200);
  ASSERT_GT(page.height, 0);
  const long pixels = page.width * page.height;
  EXPECT_LT(blank.nonwhite, pixels / 1000) << "the blank page is not blank: the measure is broken";
  // Text alone covers a few percent; the plots (frames, grids, lines, the filled divergence map) add more.
  EXPECT_GT(page.nonwhite, pixels / 50) << "nonwhite " << page.nonwhite << " of " << pixels;
  // Coloured pixels come from the verdict banner, the plot lines and the heatmap's palette.
  EXPECT_GT(page.coloured, pixels / 200) << "coloured " << page.coloured << " of " << pixels;
}

}  // namespace
}  // namespace ddpcheck
