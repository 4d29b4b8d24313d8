// loom._loom: a compiled model resident on the CPU VM or the GPU, generating
// tokens (runtime::Session), with its logits as arrays: copied to numpy, or
// (GPU) a DLPack view of device memory that torch.from_dlpack takes without a copy.
#include <nanobind/ndarray.h>
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "common.h"
#include "graph/model.h"
#include "runtime/session.h"

namespace loom::python {
namespace {

// The session; closed sessions refuse every call instead of crashing. Calls run with the GIL released, so two
// Python threads may call at once: `mutex` takes them one at a time (close() too, so it never frees a session
// another thread is running).
struct PySession {
  std::unique_ptr<runtime::Session> session;
  std::mutex mutex;
};

// f(session) with the GIL released and the session locked (the GIL first: a thread waiting for the lock holds none).
template <typename F>
auto Locked(PySession& s, F&& f) {
  nb::gil_scoped_release release;
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.session) throw StatusError(absl::FailedPreconditionError("this session is closed"));
  return f(*s.session);
}

runtime::Backend ParseBackend(const std::string& name) {
  if (name == "cpu") return runtime::Backend::kCpu;
  if (name == "gpu") return runtime::Backend::kGpu;
  Invalid(absl::StrCat("backend: unknown backend '", name, "' (cpu or gpu)"));
}

}  // namespace

void BindSession(nb::module_& m) {
  nb::class_<PySession>(m, "Session", "A compiled model resident on a backend, generating tokens (see loom.Session).")
      .def(
          "__init__",
          [](PySession* s, const graph::Model& model, const scheduler::Schedule& schedule, const std::string& backend) {
            const runtime::Backend b = ParseBackend(backend);
            if (model.weights.empty()) Invalid(absl::StrCat("model '", model.spec, "' was loaded without weights"));
            if (schedule.vocab_size() != static_cast<uint32_t>(model.config.vocab_size) &&
                model.config.vocab_size > 0) {
              Invalid(absl::StrCat("the schedule (", schedule.model(), ", vocabulary ", schedule.vocab_size(),
                                   ") is not a schedule of model '", model.spec, "' (vocabulary ",
                                   model.config.vocab_size, ")"));
            }
            std::unique_ptr<runtime::Session> created;
            {
              nb::gil_scoped_release release;
              created = Unwrap(runtime::Session::Create(model.graph, schedule, model.weights, b));
            }
            new (s) PySession{std::move(created)};
          },
          nb::arg("model"), nb::arg("schedule"), nb::arg("backend") = "cpu")
      .def(
          "start",
          [](PySession& s, const std::vector<int32_t>& prompt, bool prefill, bool keep_logits) {
            runtime::StartOptions options;
            options.prefill = prefill;
            options.keep_logits = keep_logits;
            Locked(s, [&](runtime::Session& x) { Check(x.Start(prompt, options)); });
          },
          nb::arg("prompt"), nb::arg("prefill") = true, nb::arg("keep_logits") = false,
          "Loads the prompt at position 0 and consumes it; tokens() then ends with the first new token. keep_logits: "
          "kept_logits() gets every step's logits from the prompt's first position on.")
      .def(
          "lower_ahead", [](PySession& s) { Locked(s, [](runtime::Session& x) { Check(x.LowerAhead({})); }); },
          "Lowers every prompt bucket's prefill pass in a background thread (Session::LowerAhead); returns at once.")
      .def(
          "wait_lowered_ahead",
          [](PySession& s) { return Locked(s, [](runtime::Session& x) { return x.WaitLoweredAhead(); }); },
          "Waits until lower_ahead's passes are all lowered; returns how many it lowered.")
      .def(
          "step", [](PySession& s, int n) { Locked(s, [&](runtime::Session& x) { Check(x.Step(n)); }); },
          nb::arg("n") = 1, "Generates n more tokens (one kernel launch on the GPU).")
      .def(
          "trace_steps",
          [](PySession& s, int n, const std::filesystem::path& path, int steps_per_launch) {
            return Locked(s, [&](runtime::Session& x) {
              return Unwrap(x.TraceSteps(n, path.string(), steps_per_launch));
            });
          },
          nb::arg("n"), nb::arg("json_path"), nb::arg("steps_per_launch") = 0,
          "GPU: n steps timed per instruction (in launches of steps_per_launch; 0: one); writes the trace, returns "
          "the summary.")
      .def(
          "close",
          [](PySession& s) {
            nb::gil_scoped_release release;
            std::lock_guard<std::mutex> lock(s.mutex);
            s.session.reset();
          },
          "Frees the session's memory (GPU memory too).")
      .def_prop_ro("closed",
                   [](PySession& s) {
                     nb::gil_scoped_release release;
                     std::lock_guard<std::mutex> lock(s.mutex);
                     return !s.session;
                   })
      .def_prop_ro("backend",
                   [](PySession& s) {
                     return Locked(s, [](runtime::Session& x) {
                       return x.backend() == runtime::Backend::kGpu ? std::string("gpu") : std::string("cpu");
                     });
                   })
      .def_prop_ro("position",
                   [](PySession& s) { return Locked(s, [](runtime::Session& x) { return Unwrap(x.position()); }); })
      .def_prop_ro(
          "tokens", [](PySession& s) { return Locked(s, [](runtime::Session& x) { return Unwrap(x.tokens()); }); },
          "The prompt followed by every token generated since start().")
      .def_prop_ro("vocab_size",
                   [](PySession& s) { return Locked(s, [](runtime::Session& x) { return x.vocab_size(); }); })
      .def_prop_ro("max_seq", [](PySession& s) { return Locked(s, [](runtime::Session& x) { return x.max_seq(); }); })
      .def_prop_ro("used_prefill",
                   [](PySession& s) { return Locked(s, [](runtime::Session& x) { return x.used_prefill(); }); })
      .def_prop_ro(
          "prefill_note",
          [](PySession& s) { return Locked(s, [](runtime::Session& x) { return x.prefill_note(); }); },
          "Why the last prompt went token by token ('' when a prefill pass took it).")
      .def_prop_ro("prompt_ms",
                   [](PySession& s) { return Locked(s, [](runtime::Session& x) { return x.prompt_ms(); }); })
      .def_prop_ro("step_ms", [](PySession& s) { return Locked(s, [](runtime::Session& x) { return x.step_ms(); }); })
      .def_prop_ro(
          "ttft_ms", [](PySession& s) { return Locked(s, [](runtime::Session& x) { return x.ttft_ms(); }); },
          "Wall clock of the last start(): the prompt's ids to the first new token on the host, everything counted.")
      .def_prop_ro(
          "pass_lower_ms",
          [](PySession& s) { return Locked(s, [](runtime::Session& x) { return x.pass_lower_ms(); }); },
          "Lowering the last start()'s prefill pass, in ms (0 when its prompt length was lowered before).")
      .def(
          "logits_host",
          [](PySession& s) {
            auto* data = new std::vector<float>(
                Locked(s, [](runtime::Session& x) { return Unwrap(x.logits()); }));
            nb::capsule owner(data, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
            const size_t shape[1] = {data->size()};
            return nb::ndarray<nb::numpy, float, nb::ndim<1>>(data->data(), 1, shape, owner);
          },
          "The last step's logits, copied to a numpy array.")
      .def(
          "kept_logits",
          [](PySession& s) {
            uint32_t vocab = 0;
            auto* data = new std::vector<float>(Locked(s, [&](runtime::Session& x) {
              vocab = x.vocab_size();
              return x.kept_logits();
            }));
            nb::capsule owner(data, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
            const size_t shape[2] = {vocab == 0 ? 0 : data->size() / vocab, vocab};
            return nb::ndarray<nb::numpy, float, nb::ndim<2>>(data->data(), 2, shape, owner);
          },
          "Every step's logits since a start() with keep_logits, [steps, vocab] (a copy; empty without it).")
      .def(
          "logits_device",
          [](nb::handle self) {
            PySession& s = nb::cast<PySession&>(self);
            const float* p = Locked(s, [](runtime::Session& x) { return Unwrap(x.device_logits()); });
            const size_t shape[1] = {Locked(s, [](runtime::Session& x) { return size_t{x.vocab_size()}; })};
            int device = 0;
            // Owned by the session object: the view keeps it alive (its memory moves on the next call).
            return nb::ndarray<float, nb::ndim<1>, nb::device::cuda>(
                const_cast<float*>(p), 1, shape, self, nullptr, nb::dtype<float>(), nb::device::cuda::value, device);
          },
          "GPU: the last step's logits in device memory, a DLPack-capable view valid until the next call.");
}

}  // namespace loom::python
