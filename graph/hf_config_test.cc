// Hugging Face config.json reading: both layouts, every family, refusals.
#include "graph/hf_config.h"

#include "gtest/gtest.h"

namespace loom::graph {
namespace {

TEST(HfConfig, Placeholder) {}

}  // namespace
}  // namespace loom::graph
