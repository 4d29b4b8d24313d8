// Shared by the binding files of loom._loom: absl::Status -> Python exceptions
// (the C++ messages unchanged), and the GIL released around long C++ work.
#pragma once

#include <nanobind/nanobind.h>

#include <stdexcept>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace loom::python {

namespace nb = nanobind;

// A failed absl::Status on its way to Python (translated in module.cc by its code).
struct StatusError : std::runtime_error {
  explicit StatusError(const absl::Status& s) : std::runtime_error(std::string(s.message())), code(s.code()) {}
  absl::StatusCode code;
};

inline void Check(const absl::Status& s) {
  if (!s.ok()) throw StatusError(s);
}
template <typename T>
T Unwrap(absl::StatusOr<T> s) {
  if (!s.ok()) throw StatusError(s.status());
  return *std::move(s);
}
// An invalid argument from the bindings themselves, worded as the C++ layer words its own.
[[noreturn]] inline void Invalid(const std::string& why) { throw StatusError(absl::InvalidArgumentError(why)); }

void BindModel(nb::module_& m);
void BindGraph(nb::module_& m);
void BindSession(nb::module_& m);

}  // namespace loom::python
