// The load: allocate the packed layer, then, on one stream, fill each matrix's records an expert
// chunk at a time (uploaded from the host, quantised from dense experts, or read in place), the
// biases and the router, and read back the two one-multiply flags at the end.
#include "load/layer_loader.hpp"

#include <algorithm>
#include <array>
#include <span>
#include <string>
#include <vector>

#include "format/mxfp4_records.hpp"
#include "format/record_layout.hpp"
#include "load/quantize_experts.hpp"
#include "load/repack_records.hpp"
#include "load/staged_upload.hpp"
#include "mxmoe/error.hpp"
#include "mxmoe/mx_format.hpp"

namespace mxmoe {
namespace {

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

// One expert matrix: its record geometry and row order, the bytes an expert of it takes in the
// checkpoint layout, and how many experts a chunk of scratch of at most `scratch_limit` bytes holds.
struct Matrix {
  const char* name;
  RecordGeometry geometry;
  RowOrder order;
  size_t scratch_limit;

  size_t block_bytes_per_expert() const { return static_cast<size_t>(geometry.rows) * geometry.k / 2; }
  size_t scale_bytes_per_expert() const { return static_cast<size_t>(geometry.rows) * geometry.k / kMxBlock; }
  size_t record_bytes_per_expert() const { return geometry.records_per_expert() * kernels::kRecordBytes; }
  int experts_per_chunk() const {
    const size_t per_expert = block_bytes_per_expert() + scale_bytes_per_expert();
    return static_cast<int>(std::clamp<size_t>(scratch_limit / per_expert, 1, geometry.experts));
  }
  size_t chunk_bytes() const {
    return static_cast<size_t>(experts_per_chunk()) * (block_bytes_per_expert() + scale_bytes_per_expert());
  }
};

std::array<Matrix, 2> matrices_of(const MoeShape& s, size_t scratch_limit = kLoadScratchBytes) {
  const RowOrder fc1_order = fc1_row_order(s.spec.gate_up == GateUpLayout::kConcatenated);
  return {Matrix{"fc1", {s.num_experts, s.fc1_rows(), s.hidden}, fc1_order, scratch_limit},
          Matrix{"fc2", {s.num_experts, s.hidden, s.intermediate}, RowOrder::kIdentity, scratch_limit}};
}

PackedLayer allocate_layer(const MoeShape& s, int routed_experts, bool shard, const DeviceAllocator& allocator) {
  const auto m = matrices_of(s);
  const size_t bytes[] = {m[0].geometry.bytes(),
                          static_cast<size_t>(s.num_experts) * s.fc1_rows() * 4,
                          m[1].geometry.bytes(),
                          static_cast<size_t>(s.num_experts) * s.hidden * 4,
                          static_cast<size_t>(routed_experts) * s.hidden * 2,
                          static_cast<size_t>(routed_experts) * 4,
                          static_cast<size_t>(routed_experts) * 4,
                          shard ? static_cast<size_t>(routed_experts) * 4 : 0};
  size_t total = 0;
  for (size_t b : bytes) total += align256(b);
  PackedLayer layer;
  layer.buffer = DeviceBuffer(total, "MoE layer weights (" + s.describe() + ")", allocator);
  unsigned char* at[std::size(bytes)];
  auto* next = static_cast<unsigned char*>(layer.buffer.get());
  for (size_t i = 0; i < std::size(bytes); ++i) {
    at[i] = next;
    next += align256(bytes[i]);
  }
  layer.fc1_records = at[0];
  layer.fc1_bias = reinterpret_cast<float*>(at[1]);
  layer.fc2_records = at[2];
  layer.fc2_bias = reinterpret_cast<float*>(at[3]);
  layer.router_weight = reinterpret_cast<__nv_bfloat16*>(at[4]);
  layer.router_bias = reinterpret_cast<float*>(at[5]);
  layer.selection_bias = reinterpret_cast<float*>(at[6]);
  if (shard) layer.local_experts = reinterpret_cast<int*>(at[7]);
  return layer;
}

// The writes of a load into a packed layer, on one stream, and its scratch: two flags (one per
// matrix: a scale code outside the one-multiply range was seen), then `scratch_bytes` for the caller.
class Packer {
 public:
  Packer(PackedLayer& layer, const MoeShape& shape, cudaStream_t stream, size_t scratch_bytes,
         const DeviceAllocator& allocator)
      : layer_(layer),
        matrices_(matrices_of(shape)),
        stream_(stream),
        scratch_(256 + scratch_bytes, "MoE layer load scratch (" + shape.describe() + ")", allocator) {
    cuda_check(cudaMemsetAsync(flags(), 0, 2 * sizeof(unsigned), stream_), "clearing the load's flags");
  }
  // Work in flight may still read the scratch or write the layer: wait for it before either goes.
  ~Packer() { cudaStreamSynchronize(stream_); }
  Packer(const Packer&) = delete;
  Packer& operator=(const Packer&) = delete;

  cudaStream_t stream() const { return stream_; }
  unsigned char* scratch() const { return static_cast<unsigned char*>(scratch_.get()) + 256; }

  // Records of experts [first, first + count) of matrix `m` from checkpoint-layout values and scales
  // of those experts.
  void records(int m, int first, int count, const uint8_t* blocks, const uint8_t* scales) {
    const Matrix& matrix = matrices_[m];
    RecordGeometry chunk = matrix.geometry;
    chunk.experts = count;
    unsigned char* records = m == 0 ? layer_.fc1_records : layer_.fc2_records;
    launch_repack_records(chunk, matrix.order, blocks, scales, records + first * matrix.record_bytes_per_expert(),
                          flags() + m, stream_);
  }
  // Matrix m's bias [E, rows] (BF16 or F32) in packed row order; null values: zeros.
  void bias(int m, const void* values, Dtype dtype) {
    const Matrix& matrix = matrices_[m];
    row_vector(matrix.geometry, matrix.order, values, dtype, m == 0 ? layer_.fc1_bias : layer_.fc2_bias);
  }
  // The router's logit bias and its selection bias [R] (BF16 or F32) as fp32; null values: zeros.
  void router_biases(const void* logit_bias, Dtype logit_dtype, const void* selection_bias, Dtype selection_dtype,
                     int routed_experts) {
    const RecordGeometry vector{1, routed_experts, 0};
    row_vector(vector, RowOrder::kIdentity, logit_bias, logit_dtype, layer_.router_bias);
    row_vector(vector, RowOrder::kIdentity, selection_bias, selection_dtype, layer_.selection_bias);
  }
  // Zeros for the router weight [R, H] of a layer its caller routes.
  void zero_router_weight(int routed_experts, int hidden) {
    cuda_check(cudaMemsetAsync(layer_.router_weight, 0, static_cast<size_t>(routed_experts) * hidden * 2, stream_),
               "clearing the router weight");
  }
  // Waits for the load and sets the layer's one-multiply flags.
  void finish() {
    unsigned out_of_range[2] = {};
    cuda_check(cudaMemcpyAsync(out_of_range, flags(), sizeof(out_of_range), cudaMemcpyDeviceToHost, stream_),
               "reading the load's flags");
    cuda_check(cudaStreamSynchronize(stream_), "loading the layer");
    layer_.fc1_scales_one_multiply = out_of_range[0] == 0;
    layer_.fc2_scales_one_multiply = out_of_range[1] == 0;
  }

 private:
  unsigned* flags() const { return static_cast<unsigned*>(scratch_.get()); }
  void row_vector(const RecordGeometry& g, RowOrder order, const void* values, Dtype dtype, float* out) {
    if (values) {
      launch_pack_row_vector(g, order, values, dtype, out, stream_);
    } else {
      cuda_check(cudaMemsetAsync(out, 0, static_cast<size_t>(g.experts) * g.rows * sizeof(float), stream_),
                 "clearing a bias the layer does not have");
    }
  }

  PackedLayer& layer_;
  std::array<Matrix, 2> matrices_;
  cudaStream_t stream_;
  DeviceBuffer scratch_;
};

class OwnedStream {
 public:
  OwnedStream() { cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "creating the load stream"); }
  ~OwnedStream() { cudaStreamDestroy(stream_); }
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

template <typename T>
std::span<const uint8_t> bytes_of(const std::vector<T>& v) {
  return {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(T)};
}

// Where the load reads `view` from: its file, where it lies in one of the weights' mapped files.
HostSource source_of(const MoeLayerWeights& weights, std::span<const uint8_t> view) {
  for (const auto& file : weights.mapped_files) {
    if (view.data() >= file.base && view.data() + view.size() <= file.base + file.bytes) {
      return {nullptr, file.fd, static_cast<uint64_t>(view.data() - file.base)};
    }
  }
  return {view.data()};
}

// Throws Error unless `data` is memory the current device can read as its own.
void check_on_current_device(const char* name, const void* data) {
  int device = 0;
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  cudaPointerAttributes attributes{};
  cuda_check(cudaPointerGetAttributes(&attributes, data), std::string(name) + ": cudaPointerGetAttributes");
  const bool device_memory = attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
  if (!device_memory || (attributes.type == cudaMemoryTypeDevice && attributes.device != device)) {
    throw Error(std::string(name) + ": not device memory of the current device (" + std::to_string(device) + ")");
  }
}

}  // namespace

PackedLayer load_layer(const MoeLayerWeights& weights, const DeviceAllocator& allocator, size_t scratch_limit) {
  weights.validate();
  const MoeShape& s = weights.shape;
  const int routed = weights.num_routed_experts();
  const std::vector<int32_t> local_experts =
      weights.global_experts.empty() ? std::vector<int32_t>{} : weights.local_experts();
  PackedLayer layer = allocate_layer(s, routed, !local_experts.empty(), allocator);
  const OwnedStream stream;
  const auto matrices = matrices_of(s, scratch_limit);
  const size_t chunk_bytes = std::max(matrices[0].chunk_bytes(), matrices[1].chunk_bytes());
  // The bf16 biases go to the scratch after the chunk, each in its own place: a later upload must
  // not overwrite what an earlier launch has yet to read.
  struct HostBias {
    const char* name;
    std::span<const uint8_t> bytes;
    unsigned char* at = nullptr;
  };
  HostBias biases[] = {{"fc1 bias", bytes_of(weights.fc1_bias)},
                       {"fc2 bias", bytes_of(weights.fc2_bias)},
                       {"router bias", bytes_of(weights.router_bias)},
                       {"router selection bias", bytes_of(weights.router_selection_bias)}};
  size_t scratch_bytes = chunk_bytes;
  for (const auto& b : biases) scratch_bytes += align256(b.bytes.size());
  Packer packer(layer, s, stream.get(), scratch_bytes, allocator);
  StagedUpload upload(stream.get(), std::max(chunk_bytes, weights.router_weight.size() * 2));

  const std::span<const uint8_t> blocks[] = {weights.fc1_blocks, weights.fc2_blocks};
  const std::span<const uint8_t> scales[] = {weights.fc1_scales, weights.fc2_scales};
  for (int m = 0; m < 2; ++m) {
    const Matrix& matrix = matrices[m];
    const std::string blocks_name = std::string(matrix.name) + " blocks",
                      scales_name = std::string(matrix.name) + " scales";
    for (int first = 0; first < s.num_experts; first += matrix.experts_per_chunk()) {
      const int count = std::min(matrix.experts_per_chunk(), s.num_experts - first);
      const size_t block_bytes = count * matrix.block_bytes_per_expert();
      unsigned char* chunk_blocks = packer.scratch();
      unsigned char* chunk_scales = chunk_blocks + block_bytes;
      upload.copy(chunk_blocks, source_of(weights, blocks[m]).advanced(first * matrix.block_bytes_per_expert()),
                  block_bytes, blocks_name.c_str());
      upload.copy(chunk_scales, source_of(weights, scales[m]).advanced(first * matrix.scale_bytes_per_expert()),
                  count * matrix.scale_bytes_per_expert(), scales_name.c_str());
      packer.records(m, first, count, chunk_blocks, chunk_scales);
    }
  }
  unsigned char* next = packer.scratch() + chunk_bytes;
  for (HostBias& b : biases) {
    if (b.bytes.empty()) continue;  // the spec has none: at stays null, and the packer writes zeros
    b.at = next;
    upload.copy(b.at, {b.bytes.data()}, b.bytes.size(), b.name);
    next += align256(b.bytes.size());
  }
  packer.bias(0, biases[0].at, Dtype::kBF16);
  packer.bias(1, biases[1].at, Dtype::kBF16);
  packer.router_biases(biases[2].at, Dtype::kBF16, biases[3].at, Dtype::kF32, routed);
  if (weights.router_weight.empty()) {
    packer.zero_router_weight(routed, s.hidden);
  } else {
    upload.copy(layer.router_weight, {weights.router_weight.data()}, weights.router_weight.size() * 2,
                "router weight");
  }
  if (!local_experts.empty()) {
    upload.copy(layer.local_experts, {local_experts.data()}, local_experts.size() * 4, "local experts");
  }
  packer.finish();
  return layer;
}

PackedLayer load_layer(const DeviceLayerTensors& t, const DeviceAllocator& allocator, size_t scratch_limit) {
  t.validate();
  const MoeShape& s = t.shape;
  for (const auto& [name, tensor] :
       {std::pair{"router_weight", &t.router_weight}, std::pair{"router_bias", &t.router_bias},
        std::pair{"router_selection_bias", &t.router_selection_bias},
        std::pair{"fc1_blocks", &t.fc1_blocks}, std::pair{"fc1_scales", &t.fc1_scales},
        std::pair{"fc2_blocks", &t.fc2_blocks}, std::pair{"fc2_scales", &t.fc2_scales},
        std::pair{"gate_up", &t.gate_up}, std::pair{"down", &t.down}, std::pair{"fc1_bias", &t.fc1_bias},
        std::pair{"fc2_bias", &t.fc2_bias}}) {
    if (tensor->data) check_on_current_device(name, tensor->data);
  }
  PackedLayer layer = allocate_layer(s, s.num_experts, false, allocator);
  const auto matrices = matrices_of(s, scratch_limit);
  const size_t chunk_bytes = t.dense() ? std::max(matrices[0].chunk_bytes(), matrices[1].chunk_bytes()) : 0;
  Packer packer(layer, s, t.stream, chunk_bytes, allocator);

  const DeviceTensor* dense[] = {&t.gate_up, &t.down};
  const DeviceTensor* blocks[] = {&t.fc1_blocks, &t.fc2_blocks};
  const DeviceTensor* scales[] = {&t.fc1_scales, &t.fc2_scales};
  for (int m = 0; m < 2; ++m) {
    const Matrix& matrix = matrices[m];
    if (!t.dense()) {
      packer.records(m, 0, s.num_experts, static_cast<const uint8_t*>(blocks[m]->data),
                     static_cast<const uint8_t*>(scales[m]->data));
      continue;
    }
    const size_t dense_bytes_per_expert =
        static_cast<size_t>(matrix.geometry.rows) * matrix.geometry.k * dtype_size(dense[m]->dtype);
    for (int first = 0; first < s.num_experts; first += matrix.experts_per_chunk()) {
      const int count = std::min(matrix.experts_per_chunk(), s.num_experts - first);
      unsigned char* chunk_blocks = packer.scratch();
      unsigned char* chunk_scales = chunk_blocks + count * matrix.block_bytes_per_expert();
      launch_quantize_experts(static_cast<const unsigned char*>(dense[m]->data) + first * dense_bytes_per_expert,
                              dense[m]->dtype, count, matrix.geometry.k, matrix.geometry.rows, chunk_blocks,
                              chunk_scales, packer.stream());
      packer.records(m, first, count, chunk_blocks, chunk_scales);
    }
  }
  packer.bias(0, t.fc1_bias.data, t.fc1_bias.dtype);
  packer.bias(1, t.fc2_bias.data, t.fc2_bias.dtype);
  packer.router_biases(t.router_bias.data, t.router_bias.dtype, t.router_selection_bias.data,
                       t.router_selection_bias.dtype, s.num_experts);
  auto* router_weight = reinterpret_cast<uint16_t*>(layer.router_weight);
  const size_t router_values = static_cast<size_t>(s.num_experts) * s.hidden;
  if (!t.router_weight.data) {
    packer.zero_router_weight(s.num_experts, s.hidden);
  } else if (t.router_weight.dtype == Dtype::kBF16) {
    cuda_check(
        cudaMemcpyAsync(router_weight, t.router_weight.data, router_values * 2, cudaMemcpyDeviceToDevice, t.stream),
        "copying the router weight");
  } else {
    launch_round_to_bf16(static_cast<const float*>(t.router_weight.data), static_cast<long long>(router_values),
                         router_weight, t.stream);
  }
  packer.finish();
  return layer;
}

}  // namespace mxmoe
