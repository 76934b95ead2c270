#pragma once
// Subcommands of the `tilejit` program. Each returns the process exit status.

namespace tj::tools {

// `tilejit doctor`: what this machine can do (driver, GPU, NVRTC, features, cache).
int doctor();

}  // namespace tj::tools
