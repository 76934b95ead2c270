// The `tilejit` command-line program.
#include <CLI/CLI.hpp>

#include <exception>
#include <iostream>

#include "runtime/error.h"
#include "tools/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"tilejit: a tile-level kernel language for C++ (trace -> CUDA C++ -> NVRTC -> GPU)"};
  app.require_subcommand(1);

  auto* doctor = app.add_subcommand(
      "doctor", "Check the CUDA driver, GPU, NVRTC and cache, and say what works here");

  CLI11_PARSE(app, argc, argv);

  try {
    if (*doctor) return tj::tools::doctor();
  } catch (const std::exception& e) {
    std::cerr << "tilejit: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
