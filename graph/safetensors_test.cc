// Safetensors: round trips, dtype conversion, and every way a file can lie.
#include "graph/safetensors.h"

#include <fstream>

#include "absl/strings/str_cat.h"
#include "graph/proto_file.h"
#include "gtest/gtest.h"

namespace loom::graph {
namespace {

std::string WithHeader(const std::string& json, const std::string& data) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
  return out + json + data;
}

TEST(Safetensors, WriteThenReadRoundTripsBf16AndConvertsF32) {
  HostTensor a = HostTensor::Zeros(BF16, {2, 3});
  for (int i = 0; i < 6; ++i) a.bf16[i] = FloatToBf16(0.25f * i - 0.5f);
  HostTensor b = HostTensor::FromF32({4}, {1.0f, -2.5f, 3.14159f, 1e-3f});
  const std::string path = testing::TempDir() + "/rt.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, {{"a", &a}, {"b", &b}}).ok());
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  absl::StatusOr<HostTensor> ra = (*f)->ReadBf16("a");
  ASSERT_TRUE(ra.ok());
  EXPECT_EQ(ra->bf16, a.bf16);
  EXPECT_EQ(ra->shape, (std::vector<int64_t>{2, 3}));
  absl::StatusOr<HostTensor> rb = (*f)->ReadBf16("b");
  ASSERT_TRUE(rb.ok());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(rb->bf16[i], FloatToBf16(b.f32[i]));
  EXPECT_FALSE((*f)->ReadBf16("missing").ok());
}

TEST(Safetensors, F16IsConvertedExactly) {
  // 1.0 = 0x3c00, -2.0 = 0xc000, 0.5 = 0x3800 in IEEE half.
  const std::string data("\x00\x3c\x00\xc0\x00\x38", 6);
  const std::string path = testing::TempDir() + "/f16.safetensors";
  ASSERT_TRUE(WriteFileAtomically(
                  path, WithHeader(R"({"h":{"dtype":"F16","shape":[3],"data_offsets":[0,6]}})", data))
                  .ok());
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  absl::StatusOr<HostTensor> t = (*f)->ReadBf16("h");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->Get(0), 1.0f);
  EXPECT_EQ(t->Get(1), -2.0f);
  EXPECT_EQ(t->Get(2), 0.5f);
}

TEST(Safetensors, HostileHeadersAreRejectedWithTheReason) {
  const std::string data(16, '\x01');
  const std::vector<std::pair<std::string, std::string>> cases = {
      {std::string("\x05\x00", 2), "truncated"},
      {WithHeader("{\"a\":", data), "not a JSON object"},
      {WithHeader("[1,2]", data), "not a JSON object"},
      {WithHeader(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,64]}})", data), "outside"},
      {WithHeader(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", data), "shape needs 8"},
      {WithHeader(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", data), "outside"},
      {WithHeader(R"({"a":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})", data), "unsupported dtype Q4"},
      {WithHeader(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", data), "unsigned"},
      {WithHeader(R"({"a":{"dtype":"F32","shape":[2]}})", data), "data_offsets"},
      {WithHeader(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
                      "b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                  data),
       "overlap"},
      {WithHeader(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", data),
       "too large"},
  };
  for (const auto& [bytes, why] : cases) {
    const std::string path = testing::TempDir() + "/bad.safetensors";
    ASSERT_TRUE(WriteFileAtomically(path, bytes).ok());
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> f = SafetensorsFile::Open(path);
    ASSERT_FALSE(f.ok()) << why;
    EXPECT_NE(f.status().message().find(why), std::string::npos) << f.status();
    EXPECT_NE(f.status().message().find(path), std::string::npos) << f.status();
  }
  // A header length past the end of the file.
  std::string lying(8, '\0');
  lying[0] = '\x40';
  EXPECT_FALSE(ParseSafetensorsHeader(lying, 8, "x").ok());
}

}  // namespace
}  // namespace loom::graph
