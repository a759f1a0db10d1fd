// Unit tests of the torch-free caching allocator core (device_core/allocator), with faked device hooks
// (core_test_common.h). Built and run by test_core.py: `core_test <name>` runs one test, `core_test --list`
// lists them; the tests live in core_test_{pools,streams,oom,expandable,stats}.cpp.
#include <iostream>
#include <string>

#include "core_test_common.h"

std::vector<CoreTest>& core_tests() {
  static std::vector<CoreTest> tests;
  return tests;
}

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--list") {
    for (const auto& t : core_tests()) std::cout << t.first << "\n";
    return 0;
  }
  int failed = 0;
  for (const auto& t : core_tests()) {
    if (argc > 1 && t.first != std::string(argv[1])) continue;
    try {
      t.second();
      std::cout << "PASS " << t.first << "\n";
    } catch (const std::exception& ex) {
      std::cout << "FAIL " << t.first << ": " << ex.what() << "\n";
      ++failed;
    }
  }
  return failed ? 1 : 0;
}
