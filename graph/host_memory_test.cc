// Host memory guards: the check's one-line message, and models the host cannot hold refused before any weight is
// made or read.
#include "graph/host_memory.h"

#include <filesystem>
#include <fstream>

#include "graph/model.h"
#include "gtest/gtest.h"

namespace loom::graph {
namespace {

TEST(HostMemory, SaysWhatIsNeededAndWhatIsFree) {
  EXPECT_TRUE(CheckMemoryFits(4e9, 5e9, "x").ok());
  EXPECT_TRUE(CheckMemoryFits(4e9, std::nullopt, "x").ok());  // unknown: nothing refused
  const absl::Status s = CheckMemoryFits(12.34e9, 4.5e9, "m/config.json", "weights 12.3 GB");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(), "m/config.json needs 12.3 GB of host memory (weights 12.3 GB), has 4.5 GB free");
  const std::optional<uint64_t> free = HostMemoryAvailable();
  ASSERT_TRUE(free.has_value());  // Linux: /proc/meminfo
  EXPECT_GT(*free, 0u);
}

// A 246B-parameter Llama (80 layers, hidden 16384, intermediate 49152): every field is plausible, its 490 GB of
// bf16 weights are not for this host. Refused by LoadModel in well under a second, nothing allocated.
TEST(HostMemory, ModelsTheHostCannotHoldAreRefusedBeforeLoading) {
  const std::string path = (std::filesystem::temp_directory_path() / "loom_host_memory_test_246b.json").string();
  std::ofstream(path) << R"({"model_type": "llama", "hidden_size": 16384, "num_hidden_layers": 80,
    "num_attention_heads": 128, "num_key_value_heads": 16, "intermediate_size": 49152, "vocab_size": 128256,
    "max_position_embeddings": 8192, "rope_theta": 500000.0})";
  const std::optional<uint64_t> free = HostMemoryAvailable();
  if (!free || *free > 600e9) GTEST_SKIP() << "this host could hold the model";
  ModelOptions options;
  options.packed_copies = 2;
  absl::StatusOr<Model> m = LoadModel("random:" + path, options);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string message(m.status().message());
  EXPECT_NE(message.find("random:" + path + " needs 1"), std::string::npos) << message;
  EXPECT_NE(message.find(" GB of host memory (245.80B parameters: 491.6 GB of bf16 weights, 983.2 GB packed, "),
            std::string::npos)
      << message;
  EXPECT_NE(message.find(" GB free"), std::string::npos) << message;
  options.load_weights = false;  // compiling needs no weights: nothing to refuse
  EXPECT_TRUE(LoadModel("random:" + path, options).ok());
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace loom::graph
