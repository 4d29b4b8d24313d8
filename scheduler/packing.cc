#include "scheduler/packing.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <mutex>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "graph/host_memory.h"
#include "graph/progress.h"
#include "instructions/instruction.h"
#include "instructions/swizzle.h"

namespace loom::scheduler {
namespace {

// A bf16 NaN or infinity: every exponent bit set.
constexpr uint16_t kBf16Exponent = 0x7F80;

// Whether any of `n` bf16 values is NaN or infinite: a branch-free maximum the compiler vectorizes, so checking
// a row just before copying it (it is in cache) costs little beside the copy.
bool AnyNonFinite(const uint16_t* v, uint64_t n) {
  uint16_t most = 0;
  for (uint64_t i = 0; i < n; ++i) most = std::max<uint16_t>(most, v[i] & kBf16Exponent);
  return most == kBf16Exponent;
}

// Packs `p` into its tensor `dst`, whose bytes start at `dst_bytes` (zero-filled; each packed tensor its own bytes:
// packings run in parallel).
absl::Status PackOne(const Schedule& s, const PackedWeight& p, const Tensor& dst, const graph::WeightStore& weights,
                     uint8_t* dst_bytes) {
  const uint64_t cols = p.cols(), stride = p.row_stride() > 0 ? p.row_stride() : cols;
  if (stride < cols) return absl::InvalidArgumentError(absl::StrCat("packing '", p.tensor(), "': row_stride < cols"));
  const bool f32 = p.dtype() == graph::F32;
  const bool fp8 = p.dtype() == graph::F8E4M3;    // e4m3 bytes of FP8 sources
  const bool row_scales = p.row_scales();         // the FP8 sources' row scales, one f32 a row
  const bool int4 = p.dtype() == graph::I4;       // int4 sources' values, in bands of 16 rows
  const bool int4_meta = p.int4_meta();           // int4 sources' groups (scale, zero point), in bands
  const uint32_t group_shift = static_cast<uint32_t>(std::countr_zero(std::max(p.group_size(), 1u)));
  const uint64_t elem = f32 ? 4 : fp8 ? 1 : 2;
  if (f32 && (p.tile_rows() != 0 || (p.order() != ROWS_IDENTITY && !row_scales))) {
    return absl::InvalidArgumentError(absl::StrCat("packing '", p.tensor(), "': f32 rows are row-major in order"));
  }
  if ((fp8 || row_scales) &&
      (p.tile_rows() != 0 || p.column_group() != 0 || p.order() == ROWS_TRANSPOSED || (row_scales && !f32) ||
       (row_scales && (cols != 1 || stride != 1)) ||
       (fp8 && (stride % isa::kMatvecFp8RowAlign != 0 || stride != isa::MatvecFp8RowStride(cols))))) {
    return absl::InvalidArgumentError(
        absl::StrCat("packing '", p.tensor(), "': FP8 rows and their scales are matvec rows (stride ",
                     isa::MatvecFp8RowStride(static_cast<uint32_t>(cols)), ", scales f32 [rows])"));
  }
  if ((int4 || int4_meta) &&
      (p.tile_rows() != 0 || p.column_group() != 0 || p.order() == ROWS_TRANSPOSED || p.source_rows() != 0 ||
       (int4_meta && p.dtype() != graph::I32) || p.group_size() < 32 || (p.group_size() & (p.group_size() - 1)) ||
       cols % p.group_size() != 0 || stride != isa::MatvecW4RowStride(static_cast<uint32_t>(cols)))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "packing '", p.tensor(), "': int4 rows and their groups are matvec bands (stride ",
        isa::MatvecW4RowStride(static_cast<uint32_t>(cols)), ", groups of a power of two >= 32 dividing ", cols,
        ")"));
  }
  const bool transposed = p.order() == ROWS_TRANSPOSED;
  // A source row's width, and where its column c goes (column groups padded: runs of `run` at the start of `padded`).
  const uint64_t run = p.column_group(), padded = p.column_group_padded();
  const bool grouped = run > 0;
  if (grouped && (padded < run || cols % padded != 0 || p.order() != ROWS_IDENTITY || f32)) {
    return absl::InvalidArgumentError(absl::StrCat("packing '", p.tensor(), "': columns in runs of ", run,
                                                   " padded to ", padded, " do not fit ", cols, " bf16 columns"));
  }
  // The FP8 sources' row scales: one per row of each source (a [rows, K] weight).
  const uint64_t src_width = grouped ? cols / padded * run : row_scales ? 0 : cols;
  auto column = [&](uint64_t c) { return grouped ? c / run * padded + c % run : c; };
  std::vector<const graph::HostTensor*> src;
  std::vector<const std::string*> src_names;
  uint64_t rows = 0;
  for (const std::string& name : p.sources()) {
    auto w = weights.find(name);
    if (w == weights.end()) {
      return absl::NotFoundError(absl::StrCat("packing '", p.tensor(), "': weight '", name, "' is missing"));
    }
    const std::vector<int64_t>& shape = w->second.shape;
    // Rows of a weight of rank >= 2 are its first dimension (a CONV2D weight's rows are [KH, KW, C / groups]).
    const int64_t size = w->second.size();
    const int64_t src_cols = transposed ? (shape.size() == 2 ? shape[0] : 0)
                             : shape.size() <= 1 ? 1 : shape[0] == 0 ? 0 : size / shape[0];
    const graph::DType d = w->second.dtype;
    if ((int4 || int4_meta) && (d != graph::I4 || src_cols != static_cast<int64_t>(cols) ||
                                w->second.Int4GroupSize() != p.group_size())) {
      return absl::InvalidArgumentError(absl::StrCat("packing '", p.tensor(), "': weight '", name,
                                                     "' is not an int4 weight with ", cols, " columns in groups of ",
                                                     p.group_size()));
    }
    if ((fp8 || row_scales) && (d != graph::F8E4M3 || (fp8 && src_cols != static_cast<int64_t>(cols)))) {
      return absl::InvalidArgumentError(absl::StrCat("packing '", p.tensor(), "': weight '", name,
                                                     "' is not an FP8 weight with ", cols, " columns"));
    }
    if (!fp8 && !row_scales && !int4 && !int4_meta &&
        ((d != graph::BF16 && d != graph::F32 && d != graph::F8E4M3 && d != graph::I4) ||
         src_cols != static_cast<int64_t>(src_width))) {
      return absl::InvalidArgumentError(absl::StrCat("packing '", p.tensor(), "': weight '", name,
                                                     "' is not bf16, f32 or FP8 with ", src_width,
                                                     transposed ? " rows (transposed)" : " columns"));
    }
    src.push_back(&w->second);
    src_names.push_back(&name);
    rows += row_scales || int4 || int4_meta ? static_cast<uint64_t>(shape[0])
                                            : static_cast<uint64_t>(w->second.size()) / src_width;
  }
  const bool ranged = p.source_rows() > 0;
  if (ranged) {
    if (src.size() != 1 || p.order() != ROWS_IDENTITY || p.source_row_begin() + p.source_rows() > rows) {
      return absl::InvalidArgumentError(absl::StrCat("packing '", p.tensor(), "': rows [", p.source_row_begin(), ", +",
                                                     p.source_rows(), ") of one source of ", rows, " rows needed"));
    }
    rows = p.source_rows();
  }
  const bool image = p.tile_rows() > 0;
  if (image && (p.tile_rows() != isa::kGemmTileM || stride != cols ||
                isa::GemmImageBytes(static_cast<uint32_t>(rows), static_cast<uint32_t>(cols)) != dst.bytes())) {
    return absl::InvalidArgumentError(absl::StrCat("packing '", p.tensor(), "': not a ", isa::kGemmTileM,
                                                   "-row operand image of ", rows, " x ", cols));
  }
  if (transposed && src.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("packing '", p.tensor(), "': transposing needs one source"));
  }
  const uint64_t groups = int4_meta ? isa::MatvecW4Groups(static_cast<uint32_t>(cols), group_shift) : 0;
  const uint64_t expected = int4 ? rows * stride / 2 : int4_meta ? rows * groups * 4 : rows * stride * elem;
  if ((int4 || int4_meta) && rows % isa::kMatvecW4BandRows != 0) {
    return absl::InvalidArgumentError(absl::StrCat("packing '", p.tensor(), "': ", rows,
                                                   " int4 rows are not bands of ", isa::kMatvecW4BandRows));
  }
  if (!image && expected != dst.bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("packing '", p.tensor(), "': sources hold ", rows,
                                                   " rows, the tensor has room for ", dst.bytes() / (stride * elem)));
  }
  // Row-major rows go straight to the region (zero-filled: the padding stays zero); an image's rows are
  // ordered first, then swizzled.
  std::vector<uint8_t> ordered(image ? rows * cols * 2 : 0);
  uint8_t* out = image ? ordered.data() : dst_bytes;
  // Every weight is checked for NaN and infinities on its way into the region (a broken checkpoint is refused
  // naming the weight, instead of decoding argmax-of-NaN tokens): the first source that holds one. A general
  // graph's constants may hold infinities (an ONNX attention mask's -inf), never NaN.
  const graph::HostTensor* non_finite = nullptr;
  const bool infinities = s.has_graph();
  auto bad = [&](float v) { return std::isnan(v) || (!infinities && std::isinf(v)); };
  auto refuse = [&](const graph::HostTensor* t) {
    if (non_finite == nullptr) non_finite = t;
  };
  // Row `row` of source `t` (its column `row` when transposed) as packed row `packed_row`.
  auto copy_row = [&](uint64_t packed_row, const graph::HostTensor* t, uint64_t row) {
    const uint64_t band = packed_row / isa::kMatvecW4BandRows, in_band = packed_row % isa::kMatvecW4BandRows;
    if (int4) {  // each value's nibble where MatvecW4Byte puts it (the padding columns stay 0)
      const uint64_t chunks = stride / isa::kMatvecW4ChunkColumns;
      for (uint64_t c = 0; c < cols; ++c) {
        const uint64_t i = row * cols + c;
        const uint8_t u = (t->f8[i / 2] >> (4 * (i & 1))) & 15;
        const isa::W4Nibble at = isa::MatvecW4Byte(static_cast<uint32_t>(in_band),
                                                   static_cast<uint32_t>(c % isa::kMatvecW4ChunkColumns));
        out[(band * chunks + c / isa::kMatvecW4ChunkColumns) * isa::kMatvecW4ChunkBytes + at.byte] |=
            static_cast<uint8_t>(u << (4 * at.high));
      }
      return;
    }
    if (int4_meta) {  // each group's scale and zero point (isa::MatvecW4MetaWord); a padding group scales by 0
      const uint64_t src_groups = t->bf16.size() / static_cast<uint64_t>(t->shape[0]);
      for (uint64_t g = 0; g < groups; ++g) {
        uint32_t word = isa::MatvecW4MetaWord(0, 8);
        if (g < src_groups) {
          const float scale = t->Int4Scale(static_cast<int64_t>(row * src_groups + g));
          // (every bf16 or float16 scale fits the word's 19 bits; anything else would be truncated: refused)
          if (!std::isfinite(scale) || !isa::MatvecW4ScaleFits(std::bit_cast<uint32_t>(scale))) refuse(t);
          word = isa::MatvecW4MetaWord(std::bit_cast<uint32_t>(scale),
                                       static_cast<uint32_t>(t->i32[row * src_groups + g]));
        }
        std::memcpy(out + ((band * groups + g) * isa::kMatvecW4BandRows + in_band) * 4, &word, 4);
      }
      return;
    }
    uint8_t* to = out + packed_row * stride * elem;
    if (row_scales) {  // the row's scale
      const float scale = t->f32[row];
      if (!std::isfinite(scale)) refuse(t);
      std::memcpy(to, &scale, 4);
      return;
    }
    if (fp8) {  // e4m3 bytes; each 512-column run in the device's lane order, which keeps runs of 4 columns whole
      const uint8_t* from = t->f8.data() + row * cols;
      bool nan = false;
      for (uint64_t c = 0; c < cols; c += 4) {
        const uint64_t n = std::min<uint64_t>(4, cols - c);
        uint8_t* dst = to + c / isa::kMatvecFp8RowAlign * isa::kMatvecFp8RowAlign +
                       isa::MatvecFp8Position(static_cast<uint32_t>(c % isa::kMatvecFp8RowAlign));
        std::memcpy(dst, from + c, n);
        for (uint64_t i = 0; i < n; ++i) nan |= (from[c + i] & 0x7f) == 0x7f;  // e4m3's NaN
      }
      if (nan) refuse(t);
      return;
    }
    if (!f32 && !transposed && !grouped && t->dtype == graph::BF16) {
      const uint16_t* from = t->bf16.data() + row * cols;
      if (AnyNonFinite(from, cols)) {
        for (uint64_t c = 0; c < cols; ++c) {
          if (bad(graph::Bf16ToFloat(from[c]))) refuse(t);
        }
      }
      std::memcpy(to, from, cols * 2);
      return;
    }
    for (uint64_t c = 0; c < src_width; ++c) {
      const float v = t->Get(static_cast<int64_t>(transposed ? c * rows + row : row * src_width + c));
      if (bad(v)) refuse(t);
      if (f32) {
        std::memcpy(to + c * 4, &v, 4);
      } else {
        const uint16_t bits = t->dtype == graph::BF16 && !transposed ? t->bf16[row * src_width + c]
                              : t->dtype == graph::BF16 ? t->bf16[c * rows + row]
                                                        : graph::FloatToBf16(v);
        std::memcpy(to + column(c) * 2, &bits, 2);
      }
    }
  };
  switch (p.order()) {
    case ROWS_TRANSPOSED:
      for (uint64_t r = 0; r < rows; ++r) copy_row(r, src[0], r);
      break;
    case ROWS_IDENTITY: {
      if (ranged) {
        for (uint64_t r = 0; r < rows; ++r) copy_row(r, src[0], p.source_row_begin() + r);
        break;
      }
      uint64_t r = 0;
      for (const graph::HostTensor* t : src) {
        const uint64_t n = row_scales || int4 || int4_meta ? static_cast<uint64_t>(t->shape[0])
                                                           : static_cast<uint64_t>(t->size()) / src_width;
        for (uint64_t i = 0; i < n; ++i) copy_row(r++, t, i);
      }
      break;
    }
    case ROWS_INTERLEAVE_PAIRS: {
      if (src.size() != 2 || src[0]->size() != src[1]->size() || src[0]->shape != src[1]->shape) {
        return absl::InvalidArgumentError(absl::StrCat("packing '", p.tensor(), "': interleaving needs two equal sources"));
      }
      for (uint64_t i = 0; i < rows / 2; ++i) {
        copy_row(2 * i, src[0], i);
        copy_row(2 * i + 1, src[1], i);
      }
      break;
    }
    case ROWS_QKV_GROUPED: {
      const uint64_t hd = p.head_dim(), kv = p.num_kv_heads();
      auto src_rows = [&](int i) { return static_cast<uint64_t>(src[i]->shape.empty() ? 0 : src[i]->shape[0]); };
      if (src.size() != 3 || hd == 0 || kv == 0 || src_rows(1) != kv * hd || src_rows(2) != kv * hd ||
          src[2]->size() != src[1]->size() || src_rows(0) % (kv * hd) != 0) {
        return absl::InvalidArgumentError(absl::StrCat("packing '", p.tensor(), "': q, k, v do not fit ", kv,
                                                       " KV heads of dimension ", hd));
      }
      const uint32_t group = static_cast<uint32_t>(src_rows(0) / (kv * hd));
      for (uint64_t r = 0; r < rows; ++r) {
        const isa::QkvRow row = isa::QkvGroupedRow(static_cast<uint32_t>(r), group, static_cast<uint32_t>(hd));
        copy_row(r, src[row.kind], uint64_t{row.head} * hd + row.dim);
      }
      break;
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat("packing '", p.tensor(), "': unknown row order"));
  }
  if (non_finite != nullptr) {
    const std::string& name = *src_names[std::find(src.begin(), src.end(), non_finite) - src.begin()];
    int64_t first = 0;  // the weight's first non-finite element, as an index into its shape
    while (first < non_finite->size() && !bad(non_finite->Get(first))) ++first;
    std::string index;
    for (int64_t d = static_cast<int64_t>(non_finite->shape.size()) - 1, rest = first; d >= 0; --d) {
      index = absl::StrCat(rest % non_finite->shape[d], index.empty() ? "" : ",", index);
      rest /= non_finite->shape[d];
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "weight '", name, "' holds ", non_finite->Get(first), " at [", index, "]: Loom refuses weights that ",
        infinities ? "are NaN" : "are not finite (a broken checkpoint?)"));
  }
  if (image) {
    const std::vector<uint16_t> swizzled =
        isa::PackSwizzled(reinterpret_cast<const uint16_t*>(ordered.data()), static_cast<uint32_t>(rows),
                          static_cast<uint32_t>(cols), isa::kGemmTileM, isa::Swizzle::k128B);
    std::memcpy(dst_bytes, swizzled.data(), dst.bytes());
  }
  return absl::OkStatus();
}

// What a window of the region holds: packings (index into Schedule.packing) and constants (into constants), each
// with its destination tensor.
struct WindowItem {
  const Tensor* dst;
  int packing = -1, constant = -1;
};

// Packs the window [begin, begin + buffer.size()) of the region into `buffer` (zero-filled): its packings on up to 8
// threads, each taking the next one, the largest first (a window's last packing to start is a small one, so the
// threads finish together); the first failure in offset order is returned (as one thread would). Operand
// images (a full-size ordered copy and a swizzled one each) pack one at a time, so the host holds at most one
// image's temporaries. Progress is reported on the calling thread (a Python hook takes the GIL there).
absl::Status PackWindow(const Schedule& s, const graph::WeightStore& weights, const std::vector<WindowItem>& items,
                        uint64_t begin, std::vector<uint8_t>& buffer, graph::Progress& progress) {
  std::vector<const WindowItem*> packings;
  for (const WindowItem& item : items) {
    if (item.packing >= 0) packings.push_back(&item);
  }
  std::vector<absl::Status> status(packings.size());
  std::vector<size_t> order(packings.size());  // indices into packings, largest first
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return packings[a]->dst->bytes() > packings[b]->dst->bytes(); });
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> packed{0};
  std::mutex image_lock;
  uint64_t reported = 0;
  auto work = [&](bool report) {
    for (size_t n; (n = next.fetch_add(1)) < packings.size();) {
      const size_t i = order[n];
      const PackedWeight& p = s.packing(packings[i]->packing);
      const Tensor& dst = *packings[i]->dst;
      std::unique_lock<std::mutex> image(image_lock, std::defer_lock);
      if (p.tile_rows() > 0) image.lock();
      status[i] = PackOne(s, p, dst, weights, buffer.data() + (dst.offset() - begin));
      packed += dst.bytes();
      if (report) {
        const uint64_t now = packed;
        progress.Add(now - reported);
        reported = now;
      }
    }
  };
  std::vector<std::thread> workers;
  const int threads = std::clamp<int>(static_cast<int>(std::thread::hardware_concurrency()), 1, 8);
  for (int w = 1; w < std::min<int>(threads, static_cast<int>(packings.size())); ++w) workers.emplace_back(work, false);
  work(true);
  for (std::thread& worker : workers) worker.join();
  progress.Add(packed - reported);
  for (const absl::Status& st : status) {
    if (!st.ok()) return st;
  }
  for (const WindowItem& item : items) {
    if (item.constant < 0) continue;
    const Constant& c = s.constants(item.constant);
    uint8_t* out = buffer.data() + (item.dst->offset() - begin);
    if (item.dst->dtype() == graph::I32) {  // integral values (the verifier checks), as int32
      for (int k = 0; k < c.values_size(); ++k) {
        const int32_t v = static_cast<int32_t>(c.values(k));
        std::memcpy(out + 4 * k, &v, 4);
      }
    } else {
      std::memcpy(out, c.values().data(), item.dst->bytes());
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status PackWeightsInWindows(const Schedule& s, const graph::WeightStore& weights, uint64_t window_bytes,
                                  const WeightWindowSink& sink, std::vector<uint8_t>* whole) {
  absl::flat_hash_map<std::string, const Tensor*> by_name;
  for (const Tensor& t : s.tensors()) by_name[t.name()] = &t;
  std::vector<WindowItem> items;
  absl::flat_hash_set<const Tensor*> written;  // each packing writes its own tensor (they run in parallel)
  for (int i = 0; i < s.packing_size(); ++i) {
    const PackedWeight& p = s.packing(i);
    auto it = by_name.find(p.tensor());
    if (it == by_name.end()) return absl::InvalidArgumentError(absl::StrCat("packing: no tensor '", p.tensor(), "'"));
    if (!written.insert(it->second).second) {
      return absl::InvalidArgumentError(absl::StrCat("packing names '", p.tensor(), "' twice"));
    }
    items.push_back({it->second, i, -1});
  }
  for (int i = 0; i < s.constants_size(); ++i) {
    const Constant& c = s.constants(i);
    auto it = by_name.find(c.tensor());
    if (it == by_name.end() || it->second->bytes() != 4u * c.values_size()) {
      return absl::InvalidArgumentError(absl::StrCat("constant '", c.tensor(), "' has no matching tensor"));
    }
    items.push_back({it->second, -1, i});
  }
  for (const WindowItem& item : items) {
    if (item.dst->region() != WEIGHTS || item.dst->offset() + item.dst->bytes() > s.weight_bytes()) {
      return absl::InvalidArgumentError(
          absl::StrCat("packing: '", item.dst->name(), "' is not inside the WEIGHTS region"));
    }
  }
  std::stable_sort(items.begin(), items.end(),
                   [](const WindowItem& a, const WindowItem& b) { return a.dst->offset() < b.dst->offset(); });
  // Windows of consecutive tensors, each as large as window_bytes allows and at least one tensor; the last one runs
  // to the region's end (bytes no tensor holds are zero).
  struct Window {
    size_t first, last;
    uint64_t begin, end;
  };
  std::vector<Window> windows;
  uint64_t largest = 0;
  for (size_t first = 0, begin = 0; begin < s.weight_bytes() || first < items.size();) {
    Window w{first, first, begin, begin};
    while (w.last < items.size()) {
      const Tensor& t = *items[w.last].dst;
      if (t.offset() < w.end) {
        return absl::InvalidArgumentError(absl::StrCat("packing: '", t.name(), "' overlaps the tensor before it"));
      }
      if (w.last > w.first && t.offset() + t.bytes() - w.begin > window_bytes) break;
      w.end = t.offset() + t.bytes();
      ++w.last;
    }
    if (w.last == items.size()) w.end = s.weight_bytes();
    windows.push_back(w);
    largest = std::max(largest, w.end - w.begin);
    begin = w.end;
    first = w.last;
  }
  // Two windows' buffers when there are several: window k packs into one while the sink takes window k - 1 from
  // the other on a thread of its own (an upload overlaps the next window's packing; the sink's calls stay in order,
  // one at a time).
  const bool overlap = sink && whole == nullptr && windows.size() > 1;
  if (absl::Status st = graph::CheckHostMemory((overlap ? 2 : 1) * largest,
                                               absl::StrCat("packing the weights of ", s.model()),
                                               windows.size() == 1 ? "the WEIGHTS region"
                                                                   : "two windows of the WEIGHTS region");
      !st.ok()) {
    return st;
  }
  graph::Progress progress("packing weights", s.weight_bytes());
  std::vector<uint8_t> local[2];
  std::thread sending;
  absl::Status sent;
  auto wait_sent = [&] {
    if (sending.joinable()) sending.join();
    return sent;
  };
  for (size_t k = 0; k < windows.size(); ++k) {
    const Window& w = windows[k];
    std::vector<uint8_t>& buffer = whole != nullptr ? *whole : local[overlap ? k % 2 : 0];
    buffer.assign(w.end - w.begin, 0);  // (its last window, k - 2, was sent before window k - 1's send began)
    const std::vector<WindowItem> in_window(items.begin() + w.first, items.begin() + w.last);
    absl::Status st = PackWindow(s, weights, in_window, w.begin, buffer, progress);
    if (absl::Status prior = wait_sent(); !prior.ok()) return prior;
    if (!st.ok()) return st;
    if (!sink) continue;
    if (!overlap) {
      if (absl::Status sunk = sink(w.begin, buffer.data(), buffer.size()); !sunk.ok()) return sunk;
      continue;
    }
    sending = std::thread([&sink, &sent, &buffer, begin = w.begin] { sent = sink(begin, buffer.data(), buffer.size()); });
  }
  if (absl::Status last = wait_sent(); !last.ok()) return last;
  progress.Done();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint8_t>> PackWeights(const Schedule& s, const graph::WeightStore& weights) {
  std::vector<uint8_t> region;
  if (absl::Status st = PackWeightsInWindows(s, weights, s.weight_bytes(), nullptr, &region); !st.ok()) return st;
  return region;
}

}  // namespace loom::scheduler
