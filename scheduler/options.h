// Compiler options: defaults, validation, and reading an options file.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "scheduler/schedule.pb.h"

namespace loom::scheduler {

// Shared memory one block may use on an H100 (the 227 KB opt-in limit).
inline constexpr uint32_t kMaxSmemBytes = 227 * 1024;
// What the device interpreter keeps beside pages and activations (instruction ring, mbarriers, scratch).
inline constexpr uint32_t kSmemReserveBytes = 5120;
inline constexpr uint32_t kMaxActivationSlots = 4;

// Shared memory a block needs for `smem`: pages, the activation ring and the reserve.
inline uint64_t SmemTotalBytes(const SmemConfig& smem) {
  return uint64_t{smem.page_bytes()} * smem.num_pages() + smem.activation_bytes() + kSmemReserveBytes;
}

// Every fusion switched off: the unfused opcodes run instead.
FusionOptions AllFusionsOff();

// Every unset (zero) option replaced by its default; fusion flags made explicit.
CompileOptions ResolveOptions(const CompileOptions& options);
// Grows the activation ring of `resolved` to at least `needed` bytes (a matvec
// keeps its whole input vector in it), taking pages away to stay within the
// SM's shared memory, where `requested` left both unset. Otherwise keeps them.
void FitActivationRing(uint64_t needed, const CompileOptions& requested, CompileOptions* resolved);
// Rejects options no schedule can be built from, naming the option.
absl::Status ValidateOptions(const CompileOptions& resolved);
// Reads a text-format (.pbtxt) or binary CompileOptions file.
absl::StatusOr<CompileOptions> LoadOptions(const std::string& path);

// The compile options as the `loom` command's flags and the Python API's keyword arguments name them, so both
// accept the same values with the same messages. Unset (0, empty) leaves the options file's value or the default.
struct OptionSettings {
  std::string options_file;         // a CompileOptions file (.pbtxt or .pb) the others override
  int64_t num_sms = 0;              // SMs to schedule for
  std::string policy;               // round-robin, lpt or critical-path
  std::string granularity;          // op or chunk
  std::vector<std::string> unfuse;  // fusions to turn off: norm, qkv, residual, silu, argmax, embed
  int64_t max_seq = 0;              // KV-cache capacity in tokens
  std::optional<bool> prefill;      // pack the one-pass prefill's weights (unset: where the graph has one)
};
// Resolves and validates `settings`; every message starts with the option's name behind `prefix` ("--" for the
// command's flags, "" for keyword arguments).
absl::StatusOr<CompileOptions> OptionsFromSettings(const OptionSettings& settings, absl::string_view prefix);

}  // namespace loom::scheduler
