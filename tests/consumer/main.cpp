// Built by the install_consumer test against an installed tilejit.
#include <cstdio>

#include "runtime/nvrtc.h"

int main() {
  int version = tj::runtime::nvrtc_version();
  std::printf("tilejit consumer: NVRTC %d.%d\n", version / 1000, (version % 1000) / 10);
  return version > 0 ? 0 : 1;
}
