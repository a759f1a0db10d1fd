// Notes C++ warnings (TORCH_WARN) raised in a scope: the op path keeps a signature whose kernel warns
// synchronous, and checks an out= form without letting its warnings reach the caller.
#pragma once
#include <c10/util/Exception.h>

namespace npudist {

// Whether the code in its scope raised a C++ warning (TORCH_WARN), forwarding each one to the handler it
// replaced (the Python warning handler of the calling op) or, for a probe whose warnings are not the caller's,
// swallowing it.
class WarningProbe final : public c10::WarningHandler {
 public:
  explicit WarningProbe(bool forward) : prev_(c10::WarningUtils::get_warning_handler()), forward_(forward) {
    c10::WarningUtils::set_warning_handler(this);
  }
  ~WarningProbe() override { c10::WarningUtils::set_warning_handler(prev_); }
  WarningProbe(const WarningProbe&) = delete;
  WarningProbe& operator=(const WarningProbe&) = delete;
  void process(const c10::Warning& warning) override {
    warned_ = true;
    if (forward_) prev_->process(warning);
  }
  bool warned() const { return warned_; }

 private:
  c10::WarningHandler* prev_;
  bool forward_;
  bool warned_ = false;
};

}  // namespace npudist
