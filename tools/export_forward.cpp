// `tilejit export ARGS` runs `tilejit-export ARGS`: the exporter links LLVM (~115 MB), which
// the `tilejit` program, libtilejit and the machines that only run kernels do without.
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "tools/commands.h"

namespace tj::tools {

int export_forward(const std::vector<std::string>& args) {
  std::error_code ec;
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  std::filesystem::path exe = ec ? std::filesystem::path("tilejit-export") : self.parent_path() / "tilejit-export";
  std::vector<std::string> storage{exe.string()};
  storage.insert(storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : storage) argv.push_back(s.data());
  argv.push_back(nullptr);
  ::execv(exe.c_str(), argv.data());
  std::cerr << "tilejit: cannot run " << exe.string() << " (" << std::strerror(errno)
            << "); `tilejit export` needs the tilejit-export program, built when LLVM 15 is found "
               "(llvm-15-dev; see scripts/setup.sh)\n";
  return 1;
}

}  // namespace tj::tools
