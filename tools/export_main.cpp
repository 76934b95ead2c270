// The `tilejit-export` program: `tilejit export` (tools/export.cpp). A separate program
// because it links LLVM, which `tilejit` and libtilejit do not.
#include <CLI/CLI.hpp>

#include <exception>
#include <iostream>

#include "tools/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"tilejit export: CUBINs + an LLVM-emitted launcher object + a C header per kernel, for applications "
               "that link only the CUDA driver"};
  app.name("tilejit export");
  tj::tools::ExportOptions options;
  tj::tools::add_export_options(&app, options);
  CLI11_PARSE(app, argc, argv);
  try {
    return tj::tools::export_kernels(options);
  } catch (const std::exception& e) {
    std::cerr << "tilejit export: " << e.what() << "\n";
    return 1;
  }
}
