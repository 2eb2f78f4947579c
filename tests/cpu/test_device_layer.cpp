// The host side of building a runner from device tensors: DeviceLayerTensors::validate names the
// tensor that is missing, mis-shaped, of another dtype or misaligned; and a DeviceBuffer takes its
// memory from the caller's allocator (here one that hands out host memory and counts), with the
// sizes it asked for, and says what and how many bytes when the allocator has none (or gives memory
// that is not 256-byte aligned, which goes straight back).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "device/cuda_check.hpp"
#include "mxmoe/device_layer.hpp"
#include "mxmoe/error.hpp"

namespace mxmoe {
namespace {

// Addresses the validation only compares; nothing reads them.
alignas(256) unsigned char fake_memory[256];
const void* address(size_t offset = 0) { return fake_memory + offset; }

DeviceLayerTensors mxfp4_tensors(const MoeShape& s) {
  const int64_t e = s.num_experts, h = s.hidden, i = s.intermediate;
  DeviceLayerTensors t;
  t.shape = s;
  t.router_weight = {address(), Dtype::kBF16, {e, h}};
  t.router_bias = {address(), Dtype::kF32, {e}};
  t.fc1_blocks = {address(), Dtype::kU8, {e, 2 * i, h / 32, 16}};
  t.fc1_scales = {address(), Dtype::kU8, {e, 2 * i, h / 32}};
  t.fc2_blocks = {address(), Dtype::kU8, {e, h, i / 2}};  // the [E, N, K/2] form is taken as well
  t.fc2_scales = {address(), Dtype::kU8, {e, h, i / 32}};
  t.fc1_bias = {address(), Dtype::kBF16, {e, 2 * i}};
  t.fc2_bias = {address(), Dtype::kF32, {e, h}};
  return t;
}

DeviceLayerTensors dense_tensors(const MoeShape& s) {
  DeviceLayerTensors t = mxfp4_tensors(s);
  t.fc1_blocks = t.fc1_scales = t.fc2_blocks = t.fc2_scales = {};
  t.gate_up = {address(), Dtype::kBF16, {s.num_experts, s.hidden, 2 * s.intermediate}};
  t.down = {address(), Dtype::kF32, {s.num_experts, s.intermediate, s.hidden}};
  return t;
}

std::string error_of(const DeviceLayerTensors& t) {
  try {
    t.validate();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

const MoeShape kShape{8, 2, 96, 160, 1};

TEST(DeviceLayerTensors, BothFormsValidate) {
  EXPECT_NO_THROW(mxfp4_tensors(kShape).validate());
  EXPECT_NO_THROW(dense_tensors(kShape).validate());
  EXPECT_FALSE(mxfp4_tensors(kShape).dense());
  EXPECT_TRUE(dense_tensors(kShape).dense());
}

TEST(DeviceLayerTensors, ErrorsNameTheTensorAndWhatWasExpected) {
  DeviceLayerTensors t = mxfp4_tensors(kShape);
  t.fc1_scales.shape = {8, 320, 1};
  EXPECT_EQ(error_of(t),
            "device layer tensors (E=8 k=2 H=96 I=160): fc1_scales: expected [8, 320, 3] U8, got [8, 320, 1] U8");

  t = mxfp4_tensors(kShape);
  t.fc2_blocks.data = nullptr;
  EXPECT_EQ(error_of(t), "device layer tensors (E=8 k=2 H=96 I=160): fc2_blocks: null device address");

  t = mxfp4_tensors(kShape);
  t.fc1_blocks.dtype = Dtype::kI8;
  EXPECT_NE(error_of(t).find("fc1_blocks: expected [8, 320, 3, 16] U8 or [8, 320, 48] U8, got [8, 320, 3, 16] I8"),
            std::string::npos)
      << error_of(t);

  t = mxfp4_tensors(kShape);
  t.router_weight.dtype = Dtype::kF16;
  EXPECT_NE(error_of(t).find("router_weight: expected [8, 96] BF16 or F32, got [8, 96] F16"), std::string::npos);

  t = mxfp4_tensors(kShape);
  t.fc2_bias.shape = {8, 160};
  EXPECT_NE(error_of(t).find("fc2_bias: expected [8, 96] BF16 or F32"), std::string::npos);

  t = mxfp4_tensors(kShape);
  t.fc1_blocks.data = address(8);
  EXPECT_NE(error_of(t).find("fc1_blocks: device address"), std::string::npos);
  EXPECT_NE(error_of(t).find("is not 16-byte aligned"), std::string::npos);

  t = mxfp4_tensors(kShape);
  t.fc1_bias.dtype = Dtype::kF32;
  t.fc1_bias.data = address(2);  // F32 needs 4 bytes
  EXPECT_NE(error_of(t).find("fc1_bias: device address"), std::string::npos);

  t = dense_tensors(kShape);
  t.down.shape = {8, 96, 160};  // [E, H, I]: transposed
  EXPECT_NE(error_of(t).find("down: expected [8, 160, 96] BF16 or F32, got [8, 96, 160] F32"), std::string::npos)
      << error_of(t);

  t = dense_tensors(kShape);
  t.down.data = nullptr;
  EXPECT_NE(error_of(t).find("down: null device address"), std::string::npos);

  t = dense_tensors(kShape);
  t.fc2_scales = mxfp4_tensors(kShape).fc2_scales;
  EXPECT_NE(error_of(t).find("fc2_scales: given with dense experts"), std::string::npos);

  t = mxfp4_tensors(kShape);
  t.shape.hidden = 100;
  EXPECT_NE(error_of(t).find("hidden must be a positive multiple of 32"), std::string::npos);
}

// DeepSeek-V4's spec: no expert biases and no logit bias; a selection bias, except on a layer its
// caller routes, which has no router at all. What the spec has is required, what it has not refused.
TEST(DeviceLayerTensors, TheSpecSaysWhichTensorsAreThere) {
  MoeShape v4 = kShape;
  v4.spec = deepseek_v4_spec(1.5f);
  DeviceLayerTensors t = mxfp4_tensors(v4);
  t.router_bias = t.fc1_bias = t.fc2_bias = {};
  t.router_selection_bias = {address(), Dtype::kF32, {8}};
  EXPECT_EQ(error_of(t), "");

  DeviceLayerTensors missing = t;
  missing.router_selection_bias = {};
  EXPECT_NE(error_of(missing).find("router_selection_bias: null device address"), std::string::npos)
      << error_of(missing);
  for (DeviceTensor DeviceLayerTensors::*extra :
       {&DeviceLayerTensors::router_bias, &DeviceLayerTensors::fc1_bias, &DeviceLayerTensors::fc2_bias}) {
    DeviceLayerTensors given = t;
    given.*extra = mxfp4_tensors(kShape).*extra;
    EXPECT_NE(error_of(given).find("given, but the layer's spec"), std::string::npos) << error_of(given);
  }

  DeviceLayerTensors hash = t;
  hash.shape.spec.router = RouterKind::kCallerTopK;
  hash.shape.spec.routed_scaling = 1.0f;
  EXPECT_NE(error_of(hash).find("router_weight: given, but"), std::string::npos) << error_of(hash);
  hash.router_weight = {};
  EXPECT_NE(error_of(hash).find("router_selection_bias: given, but"), std::string::npos) << error_of(hash);
  hash.router_selection_bias = {};
  EXPECT_EQ(error_of(hash), "");

  DeviceLayerTensors gpt_oss = mxfp4_tensors(kShape);  // gpt-oss's spec has no selection bias
  gpt_oss.router_selection_bias = {address(), Dtype::kF32, {8}};
  EXPECT_NE(error_of(gpt_oss).find("router_selection_bias: given, but"), std::string::npos) << error_of(gpt_oss);
}

struct Counting {
  std::vector<size_t> allocated, released;
  bool refuse = false;
};

void* counting_allocate(size_t bytes, void* context) {
  auto& c = *static_cast<Counting*>(context);
  if (c.refuse) return nullptr;
  c.allocated.push_back(bytes);
  return std::aligned_alloc(256, (bytes + 255) / 256 * 256);
}

void counting_release(void* ptr, size_t bytes, void* context) {
  static_cast<Counting*>(context)->released.push_back(bytes);
  std::free(ptr);
}

TEST(DeviceBuffer, TakesAndReturnsMemoryThroughTheAllocator) {
  Counting counting;
  const DeviceAllocator allocator{counting_allocate, counting_release, &counting};
  {
    DeviceBuffer a(1000, "a", allocator);
    DeviceBuffer b(24, "b", allocator);
    EXPECT_NE(a.get(), nullptr);
    EXPECT_EQ(a.bytes(), 1000u);
    DeviceBuffer moved = std::move(a);
    EXPECT_EQ(moved.bytes(), 1000u);
    EXPECT_EQ(counting.allocated, (std::vector<size_t>{1000, 24}));
    EXPECT_TRUE(counting.released.empty());
  }
  EXPECT_EQ(counting.released.size(), 2u);
  EXPECT_EQ(counting.released[0] + counting.released[1], 1024u);
}

TEST(DeviceBuffer, AnAllocatorWithNoMemoryIsAnErrorNamingWhatAndTheBytes) {
  Counting counting;
  counting.refuse = true;
  try {
    DeviceBuffer buffer(4096, "MoE layer weights", DeviceAllocator{counting_allocate, counting_release, &counting});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "MoE layer weights (4096 bytes): the allocator returned no memory");
  }
  EXPECT_THROW(DeviceBuffer(16, "half an allocator", DeviceAllocator{counting_allocate, nullptr, &counting}), Error);
}

// Memory that is not 256-byte aligned goes back to the allocator at once, and is an Error.
void* misaligned_allocate(size_t bytes, void* context) {
  return static_cast<unsigned char*>(counting_allocate(bytes + 16, context)) + 16;
}
void misaligned_release(void* ptr, size_t bytes, void* context) {
  counting_release(static_cast<unsigned char*>(ptr) - 16, bytes + 16, context);
}

TEST(DeviceBuffer, MisalignedMemoryFromTheAllocatorIsReturnedAndAnError) {
  Counting counting;
  try {
    DeviceBuffer buffer(64, "scratch", DeviceAllocator{misaligned_allocate, misaligned_release, &counting});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "scratch (64 bytes): the allocator returned memory that is not 256-byte aligned");
  }
  EXPECT_EQ(counting.allocated, counting.released);
}

}  // namespace
}  // namespace mxmoe
