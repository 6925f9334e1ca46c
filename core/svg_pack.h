// PackSvg: gnuplot's SVG made small enough to inline many plots in one page (the HTML report's size budget),
// drawing the same picture: drops <title>/<desc>, the whitespace between tags, and the empty groups gnuplot
// opens and closes for every style change; and turns the style attributes that every group repeats (fill,
// stroke, font, ...) into one CSS class per distinct set, defined in a <style> element at the top of the SVG.
// Class names start with `prefix` so several SVGs share a page.
#pragma once

#include <string>

namespace ddpcheck::core {

std::string PackSvg(const std::string& svg, const std::string& prefix);

}  // namespace ddpcheck::core
