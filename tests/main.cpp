// The doctest runner for tilejit_tests; also records the running test's name for
// TJ_REQUIRE_GPU() (tests/gpu.h).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <string>

namespace tj_test {
namespace {
std::string g_current_test;

// A doctest listener: sees every test case start, reports nothing.
struct CurrentTestListener : doctest::IReporter {
  explicit CurrentTestListener(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats&) override {}
  void test_case_start(const doctest::TestCaseData& tc) override { g_current_test = tc.m_name; }
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};
}  // namespace

const std::string& current_test_name() { return g_current_test; }
}  // namespace tj_test

DOCTEST_REGISTER_LISTENER("tj_current_test", 1, tj_test::CurrentTestListener);
