// Builders of small ONNX models for tests (what the backend data does not cover).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "onnx/onnx.pb.h"

namespace loom {

inline onnx::TensorProto FloatTensor(const std::string& name, const std::vector<int64_t>& dims,
                                     std::vector<float> values) {
  onnx::TensorProto t;
  t.set_name(name);
  t.set_data_type(onnx::TensorProto::FLOAT);
  for (int64_t d : dims) t.add_dims(d);
  for (float v : values) t.add_float_data(v);
  return t;
}
inline onnx::TensorProto Int64Tensor(const std::string& name, const std::vector<int64_t>& dims,
                                     std::vector<int64_t> values) {
  onnx::TensorProto t;
  t.set_name(name);
  t.set_data_type(onnx::TensorProto::INT64);
  for (int64_t d : dims) t.add_dims(d);
  for (int64_t v : values) t.add_int64_data(v);
  return t;
}
inline onnx::TensorProto BoolTensor(const std::string& name, const std::vector<int64_t>& dims,
                                    std::vector<int32_t> values) {  // (bools are stored in int32_data)
  onnx::TensorProto t;
  t.set_name(name);
  t.set_data_type(onnx::TensorProto::BOOL);
  for (int64_t d : dims) t.add_dims(d);
  for (int32_t v : values) t.add_int32_data(v);
  return t;
}
// A node of `type` named after its one output.
inline onnx::NodeProto* AddNamedNode(onnx::GraphProto* g, const std::string& type,
                                     const std::vector<std::string>& in, const std::string& out) {
  onnx::NodeProto* n = g->add_node();
  n->set_op_type(type);
  n->set_name(out);
  for (const std::string& i : in) n->add_input(i);
  n->add_output(out);
  return n;
}
inline void AddValue(onnx::ValueInfoProto* v, const std::string& name, const std::vector<int64_t>& dims) {
  v->set_name(name);
  v->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  for (int64_t d : dims) v->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_value(d);
}

}  // namespace loom
