// std::terminate in any thread of the process (a joinable std::thread destroyed, an exception leaving a noexcept
// function or a thread's entry, a forced unwind of a thread that touched Python during interpreter shutdown) ends it
// with SIGABRT and libstdc++'s one line, which says neither which thread nor where. This handler, installed when
// the device core is loaded, prints the thread's name and a native backtrace to stderr first, then hands over to
// the handler installed before it (libstdc++'s verbose one by default), so the process still aborts as before.
// Plain C++: no torch header.
#include <cxxabi.h>
#include <execinfo.h>
#include <pthread.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <typeinfo>

namespace {

std::terminate_handler g_previous = nullptr;

[[noreturn]] void report_terminate() {
  char name[32] = "?";
  pthread_getname_np(pthread_self(), name, sizeof name);
  const std::type_info* type = abi::__cxa_current_exception_type();
  std::fprintf(stderr, "npudist: std::terminate on thread '%s' (%s%s); native backtrace:\n", name,
               type ? "handling an exception of type " : "no exception being handled", type ? type->name() : "");
  std::fflush(stderr);
  void* frames[64];
  const int n = backtrace(frames, 64);
  backtrace_symbols_fd(frames, n, STDERR_FILENO);
  if (g_previous != nullptr) g_previous();
  std::abort();
}

struct InstallTerminateReport {
  InstallTerminateReport() { g_previous = std::set_terminate(&report_terminate); }
} g_install;

}  // namespace
