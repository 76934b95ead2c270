#pragma once
// Errors in the user's kernel: they name the user's source line and show it.
#include <string>

#include "dsl/ir.h"
#include "core/error.h"

namespace tj {

class DslError : public Error {
 public:
  DslError(const ir::SourceLoc& loc, const std::string& message);
  const ir::SourceLoc& where() const { return loc_; }
  const std::string& what_only() const { return message_; }  // without location/context

 private:
  ir::SourceLoc loc_;
  std::string message_;
};

// "file:line:col: error: message" followed by the source line and a caret, when the
// file can be read (as a compiler prints it).
std::string format_at(const ir::SourceLoc& loc, const std::string& message);

}  // namespace tj
