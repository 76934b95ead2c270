#pragma once
// GPU tests: put TJ_REQUIRE_GPU(); first in a TEST_CASE. Without a usable CUDA GPU the test
// prints "SKIPPED: <test name>: no CUDA GPU (<reason>)" (doctest MESSAGE and stderr; CTest
// counts it as skipped) and returns. TJ_REQUIRE_HOPPER() also skips on a GPU that is not sm_90a
// ("SKIPPED: <test name>: not a Hopper GPU (<arch>)").
#include <doctest/doctest.h>

#include <iostream>
#include <string>

namespace tj_test {
// True when the driver loads, a device exists and its primary context can be made
// current (cached after the first call).
bool gpu_available();
// Why gpu_available() is false ("" when true).
const std::string& gpu_unavailable_reason();
// The name of the running TEST_CASE (tests/main.cpp).
const std::string& current_test_name();
// The current device's architecture ("sm_90a", ...); call only when gpu_available().
std::string gpu_arch();
}  // namespace tj_test

#define TJ_REQUIRE_GPU()                                                                  \
  do {                                                                                    \
    if (!::tj_test::gpu_available()) {                                                    \
      const std::string tj_skip_message_ = "SKIPPED: " + ::tj_test::current_test_name() + \
                                           ": no CUDA GPU (" +                            \
                                           ::tj_test::gpu_unavailable_reason() + ")";     \
      MESSAGE(tj_skip_message_);                                                          \
      std::cerr << tj_skip_message_ << std::endl;                                         \
      return;                                                                             \
    }                                                                                     \
  } while (0)

#define TJ_REQUIRE_HOPPER()                                                                                    \
  do {                                                                                                         \
    TJ_REQUIRE_GPU();                                                                                          \
    if (const std::string tj_arch_ = ::tj_test::gpu_arch(); tj_arch_ != "sm_90a") {                            \
      const std::string tj_skip_message_ =                                                                     \
          "SKIPPED: " + ::tj_test::current_test_name() + ": not a Hopper GPU (" + tj_arch_ + ")";               \
      MESSAGE(tj_skip_message_);                                                                               \
      std::cerr << tj_skip_message_ << std::endl;                                                              \
      return;                                                                                                  \
    }                                                                                                          \
  } while (0)
