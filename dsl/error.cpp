#include "dsl/error.h"

#include <fmt/format.h>

#include <fstream>

namespace tj {

namespace {
std::string source_line(const std::string& file, int line) {
  std::ifstream in(file);
  std::string text;
  for (int i = 1; in && std::getline(in, text); ++i)
    if (i == line) return text;
  return {};
}
}  // namespace

std::string format_at(const ir::SourceLoc& loc, const std::string& message) {
  if (!loc.known()) return fmt::format("error: {}", message);
  std::string out = fmt::format("{}: error: {}", loc.str(), message);
  std::string text = source_line(loc.file, loc.line);
  if (!text.empty()) {
    out += fmt::format("\n  {:>5} | {}", loc.line, text);
    if (loc.column > 0) out += fmt::format("\n        | {}^", std::string(loc.column - 1, ' '));
  }
  return out;
}

DslError::DslError(const ir::SourceLoc& loc, const std::string& message)
    : Error(format_at(loc, message)), loc_(loc), message_(message) {}

}  // namespace tj
