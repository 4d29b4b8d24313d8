#include "runtime/graph_runner.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/gpu_backend.h"
#include "runtime/gpu_machine.h"
#include "runtime/reference_vm.h"
#include "runtime/trace.h"
#include "scheduler/packing.h"

namespace loom::runtime {

absl::StatusOr<std::unique_ptr<GraphRunner>> GraphRunner::Create(const scheduler::Schedule& pass,
                                                                 const graph::WeightStore& weights, Backend backend) {
  if (!pass.has_graph()) return absl::InvalidArgumentError("not a general graph's pass (scheduler::CompileGraphPass)");
  std::unique_ptr<GraphRunner> r(new GraphRunner);
  r->pass_ = pass;
  if (backend == Backend::kCpu) {
    absl::StatusOr<std::unique_ptr<ReferenceVm>> vm = ReferenceVm::Create(pass, weights);
    if (!vm.ok()) return vm.status();
    r->vm_ = *std::move(vm);
    return r;
  }
  std::string why;
  if (!GpuAvailable(&why)) return absl::UnavailableError(why);
  if (absl::Status s = CheckDeviceMemory(pass.weight_bytes(), pass.arena_bytes()); !s.ok()) return s;
  absl::StatusOr<GpuProgram> program = ProgramFromSchedule(pass);
  if (!program.ok()) return program.status();
  absl::StatusOr<std::vector<uint8_t>> packed = scheduler::PackWeights(pass, weights);
  if (!packed.ok()) return packed.status();
  absl::StatusOr<std::unique_ptr<GpuMachine>> machine = GpuMachine::Create(*program, *packed);
  if (!machine.ok()) return machine.status();
  r->program_ = std::make_unique<GpuProgram>(*std::move(program));
  r->gpu_ = *std::move(machine);
  return r;
}

GraphRunner::~GraphRunner() = default;

absl::Status GraphRunner::WriteInputs(const TensorMap& inputs) {
  for (const scheduler::IoTensor& io : pass_.graph().inputs()) {
    auto it = inputs.find(io.name());
    if (it == inputs.end()) return absl::InvalidArgumentError(absl::StrCat("input '", io.name(), "' is missing"));
    const scheduler::Tensor& t = pass_.tensors(io.tensor());
    const graph::HostTensor& given = it->second;
    const graph::DType dtype = t.dtype() == graph::I32 ? graph::I32 : graph::F32;
    graph::HostTensor widened;  // integers for an f32 input (an ONNX integer input read in arithmetic), exactly
    if (dtype == graph::F32 && given.dtype == graph::I32) {
      for (size_t i = 0; i < given.i32.size(); ++i) {
        if (given.i32[i] > (1 << 24) || given.i32[i] < -(1 << 24)) {
          return absl::InvalidArgumentError(absl::StrCat("input '", io.name(), "': value ", i, " is ", given.i32[i],
                                                         ", past 2^24 (read as float32, which holds it inexactly)"));
        }
      }
      widened = graph::HostTensor::FromF32(given.shape, std::vector<float>(given.i32.begin(), given.i32.end()));
    }
    const graph::HostTensor& v = widened.dtype == graph::F32 ? widened : given;
    // A scalar (rank 0) is the graph's [1]: ONNX's rank-0 inputs are imported so (graph::ImportOnnx).
    const bool scalar = v.shape.empty() && t.shape_size() == 1 && t.shape(0) == 1;
    if (v.dtype != dtype ||
        (!scalar && !std::equal(v.shape.begin(), v.shape.end(), t.shape().begin(), t.shape().end()))) {
      return absl::InvalidArgumentError(absl::StrCat("input '", io.name(), "' must be ", graph::DTypeName(dtype), " [",
                                                     absl::StrJoin(t.shape(), ", "), "], got ",
                                                     graph::DTypeName(v.dtype), " [", absl::StrJoin(v.shape, ", "), "]"));
    }
    if (dtype == graph::I32) {  // embedding ids: EMBED would read one outside the table as row 0
      for (size_t i = 0; i < v.i32.size(); ++i) {
        if (v.i32[i] < 0 || static_cast<uint64_t>(v.i32[i]) >= io.id_limit()) {
          return absl::InvalidArgumentError(absl::StrCat("input '", io.name(), "': value ", i, " is ", v.i32[i],
                                                         ", outside the table's rows [0, ", io.id_limit(), ")"));
        }
      }
    }
    const void* data = dtype == graph::I32 ? static_cast<const void*>(v.i32.data()) : v.f32.data();
    if (vm_ != nullptr) {
      vm_->WriteArena(t.offset(), data, t.bytes());
    } else if (absl::Status s = gpu_->WriteArena(t.offset(), data, t.bytes()); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<TensorMap> GraphRunner::Run(const TensorMap& inputs, bool trace) {
  if (trace && gpu_ == nullptr) return absl::InvalidArgumentError("traces are taken on the GPU only");
  if (absl::Status s = WriteInputs(inputs); !s.ok()) return s;
  if (vm_ != nullptr) {
    const auto start = std::chrono::steady_clock::now();
    if (absl::Status s = vm_->RunGraph(); !s.ok()) return s;
    last_ms_ = std::chrono::duration<float, std::milli>(std::chrono::steady_clock::now() - start).count();
  } else {
    absl::StatusOr<float> ms = gpu_->Run(1, trace);
    if (!ms.ok()) return ms.status();
    last_ms_ = *ms;
  }
  TensorMap outputs;
  for (const scheduler::IoTensor& io : pass_.graph().outputs()) {
    const scheduler::Tensor& t = pass_.tensors(io.tensor());
    graph::HostTensor out = graph::HostTensor::Zeros(graph::F32, {t.shape().begin(), t.shape().end()});
    if (vm_ != nullptr) {
      const std::vector<uint8_t> bytes = vm_->ReadArena(t.offset(), t.bytes());
      std::memcpy(out.f32.data(), bytes.data(), t.bytes());
    } else if (absl::Status s = gpu_->ReadArena(t.offset(), out.f32.data(), t.bytes()); !s.ok()) {
      return s;
    }
    outputs[io.name()] = std::move(out);
  }
  return outputs;
}

absl::StatusOr<std::string> GraphRunner::TraceReport(const std::string& chrome_path) const {
  if (gpu_ == nullptr || gpu_->trace().empty()) return absl::FailedPreconditionError("no traced GPU run");
  const std::vector<std::vector<std::string>> names = OpNames(pass_);
  TraceInput in{program_.get(), &gpu_->queue_begin(), &gpu_->trace(), 1, 0, &names};
  if (!chrome_path.empty()) {
    if (absl::Status s = WriteChromeTrace(chrome_path, in); !s.ok()) return s;
  }
  return TraceSummary(in);
}

}  // namespace loom::runtime
