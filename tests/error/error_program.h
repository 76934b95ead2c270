#pragma once
// tests/error: each program makes one mistake a user can make and must fail with the message its
// `// EXPECT:` line gives (a regular expression; CMake turns it into the test's pass condition).
#include <cstdio>
#include <exception>
#include <functional>

#include "codegen/cuda_emitter.h"
#include "dsl/config.h"
#include "dsl/kernel.h"
#include "kernels/library.h"

// Runs `f`; prints the error it throws and returns 1, or says that none came and returns 0 (the
// test then fails: its pass condition is the message).
inline int run_expecting_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    std::printf("%s\n", e.what());
    return 1;
  }
  std::printf("no error\n");
  return 0;
}
