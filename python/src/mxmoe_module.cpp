// The Python extension: mxmoe's weights, its CPU layer on NumPy arrays, and its GPU runner driven
// by raw device pointers and a CUDA stream handle, so that one build serves any PyTorch version
// (python/mxmoe/torch.py does the tensor side). Arrays cross as NumPy arrays, bf16 as uint16 bits;
// python/mxmoe/__init__.py checks every argument before it gets here.
#include <cuda_runtime.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <tuple>
#include <utility>

#include "mxmoe/checkpoint.hpp"
#include "mxmoe/device.hpp"
#include "mxmoe/error.hpp"
#include "mxmoe/model_loader.hpp"
#include "mxmoe/mx_format.hpp"
#include "mxmoe/reference.hpp"
#include "mxmoe/runner.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace mxmoe {
namespace {

// Host arrays of a fixed rank (nanobind raises TypeError for another dtype or rank).
template <typename T, size_t kRank = 2>
using HostArray = nb::ndarray<const T, nb::ndim<kRank>, nb::c_contig, nb::device::cpu>;
template <size_t kRank = 2>
using Bf16Array = HostArray<uint16_t, kRank>;

// One layer's weights, shared by the layers built from them.
struct Weights {
  std::shared_ptr<const MoeLayerWeights> w;
  nb::tuple shape() const {
    const MoeShape& s = w->shape;
    return nb::make_tuple(s.num_experts, s.top_k, s.hidden, s.intermediate);
  }
  // (router, routed_scaling, swiglu_alpha, swiglu_limit, up_offset, gate_up, expert_biases): mxmoe.Spec.
  nb::tuple spec() const {
    const LayerSpec& s = w->shape.spec;
    const char* router = s.router == RouterKind::kSoftmaxTopK    ? "softmax-top-k"
                         : s.router == RouterKind::kSqrtSoftplus ? "sqrt-softplus"
                                                                 : "caller-top-k";
    return nb::make_tuple(router, s.routed_scaling, s.activation.alpha, s.activation.limit, s.activation.up_offset,
                          s.gate_up == GateUpLayout::kInterleaved ? "interleaved" : "concatenated", s.expert_biases);
  }
  static Weights of(MoeLayerWeights weights) { return {std::make_shared<MoeLayerWeights>(std::move(weights))}; }
};

template <typename Array>
std::vector<Bf16> bf16_vector(const Array& a) {
  std::vector<Bf16> v(a.size());
  std::memcpy(v.data(), a.data(), a.size() * 2);
  return v;
}

// A copy of a uint8 array, kept alive with the weights.
template <typename Array>
std::span<const uint8_t> keep(std::vector<std::shared_ptr<std::vector<uint8_t>>>& storage, const Array& a) {
  storage.push_back(std::make_shared<std::vector<uint8_t>>(a.data(), a.data() + a.size()));
  return *storage.back();
}

Weights from_mxfp4_arrays(const Bf16Array<2>& router_weight, const Bf16Array<1>& router_bias,
                          const HostArray<uint8_t, 4>& fc1_blocks, const HostArray<uint8_t, 3>& fc1_scales,
                          const Bf16Array<2>& fc1_bias, const HostArray<uint8_t, 4>& fc2_blocks,
                          const HostArray<uint8_t, 3>& fc2_scales, const Bf16Array<2>& fc2_bias, int top_k) {
  auto w = std::make_shared<MoeLayerWeights>();
  w->shape = MoeShape{static_cast<int>(fc1_blocks.shape(0)), top_k, static_cast<int>(fc1_blocks.shape(2) * 32),
                      static_cast<int>(fc1_blocks.shape(1) / 2), 1};
  auto storage = std::make_shared<std::vector<std::shared_ptr<std::vector<uint8_t>>>>();
  w->router_weight = bf16_vector(router_weight);
  w->router_bias = bf16_vector(router_bias);
  w->fc1_bias = bf16_vector(fc1_bias);
  w->fc2_bias = bf16_vector(fc2_bias);
  w->fc1_blocks = keep(*storage, fc1_blocks);
  w->fc1_scales = keep(*storage, fc1_scales);
  w->fc2_blocks = keep(*storage, fc2_blocks);
  w->fc2_scales = keep(*storage, fc2_scales);
  w->storage = storage;
  w->validate();
  return {w};
}

// A DeepSeek-V4 layer (deepseek_v4_spec): the router's weight [R, H] and fp32 selection bias [R] (both
// absent for a hash-routed layer, which takes the caller's top-k), the experts' FC1 ([gate; up] rows)
// and FC2 blocks and scales. `experts`, where given, are the layer's ids of the E experts held (an
// expert-parallel shard of R routed experts).
Weights from_deepseek_v4_mxfp4(std::optional<Bf16Array<2>> router_weight,
                               std::optional<HostArray<float, 1>> selection_bias,
                               const HostArray<uint8_t, 4>& fc1_blocks, const HostArray<uint8_t, 3>& fc1_scales,
                               const HostArray<uint8_t, 4>& fc2_blocks, const HostArray<uint8_t, 3>& fc2_scales,
                               int top_k, float routed_scaling, std::optional<std::vector<int32_t>> experts) {
  if (router_weight.has_value() != selection_bias.has_value()) {
    throw Error("a DeepSeek-V4 layer's router has both its weight and its selection bias, or neither (hash-routed)");
  }
  if (experts && !router_weight) {
    throw Error("experts: a hash-routed layer has no router to count its routed experts: load the whole layer "
                "and shard it (Weights.expert_shard)");
  }
  LayerSpec spec = deepseek_v4_spec(routed_scaling);
  if (!router_weight) spec.router = RouterKind::kCallerTopK;
  auto w = std::make_shared<MoeLayerWeights>();
  w->shape = MoeShape{static_cast<int>(fc1_blocks.shape(0)), top_k, static_cast<int>(fc1_blocks.shape(2) * 32),
                      static_cast<int>(fc1_blocks.shape(1) / 2), 1, spec};
  auto storage = std::make_shared<std::vector<std::shared_ptr<std::vector<uint8_t>>>>();
  if (router_weight) {
    w->router_weight = bf16_vector(*router_weight);
    w->router_selection_bias.assign(selection_bias->data(), selection_bias->data() + selection_bias->size());
  }
  w->fc1_blocks = keep(*storage, fc1_blocks);
  w->fc1_scales = keep(*storage, fc1_scales);
  w->fc2_blocks = keep(*storage, fc2_blocks);
  w->fc2_scales = keep(*storage, fc2_scales);
  w->storage = storage;
  if (experts) {
    w->global_experts = std::move(*experts);
    w->routed_experts = static_cast<int>(router_weight->shape(0));
  }
  w->validate();
  return {w};
}

Weights from_bf16_experts(const Bf16Array<2>& router_weight, const Bf16Array<1>& router_bias,
                          const Bf16Array<3>& gate_up, const Bf16Array<2>& gate_up_bias, const Bf16Array<3>& down,
                          const Bf16Array<2>& down_bias, int top_k) {
  const MoeShape shape{static_cast<int>(gate_up.shape(0)), top_k, static_cast<int>(gate_up.shape(1)),
                       static_cast<int>(gate_up.shape(2) / 2), 1};
  const std::vector<Bf16> gate_up_v = bf16_vector(gate_up), down_v = bf16_vector(down);
  return Weights::of(quantize_bf16_experts(shape, bf16_vector(router_weight), bf16_vector(router_bias), gate_up_v,
                                           bf16_vector(gate_up_bias), down_v, bf16_vector(down_bias)));
}

Weights load_checkpoint(const std::string& path, int layer, std::optional<std::string> scheme, bool quantize) {
  LoadOptions options;
  if (scheme) options.scheme = parse_scheme(*scheme);
  options.quantize_bf16_experts = quantize;
  return Weights::of(load_moe_layer(Checkpoint::open(path), layer, options).weights);
}

// A new NumPy array of bf16 bits [rows, cols] holding `values`.
nb::ndarray<nb::numpy, uint16_t, nb::ndim<2>> bf16_result(std::vector<Bf16> values, size_t rows, size_t cols) {
  auto* owned = new std::vector<Bf16>(std::move(values));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<Bf16>*>(p); });
  return {reinterpret_cast<uint16_t*>(owned->data()), {rows, cols}, owner};
}

// A new NumPy float32 array [n] holding `values`.
nb::ndarray<nb::numpy, float, nb::ndim<1>> float_result(std::vector<float> values) {
  auto* owned = new std::vector<float>(std::move(values));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
  return {owned->data(), {owned->size()}, owner};
}

// `activations`: bf16, mxfp8 or fp8, the rows the GEMMs take (ReferenceOptions::activations).
auto cpu_forward(const Weights& weights, const Bf16Array<2>& x, std::optional<HostArray<float>> router_logits,
                 const std::string& activations) {
  const int tokens = static_cast<int>(x.shape(0));
  const std::vector<Bf16> input = bf16_vector(x);
  const ReferenceOptions options{.activations = parse_activation_format(activations)};
  ReferenceResult r;
  {
    nb::gil_scoped_release release;
    r = router_logits ? reference_forward_from_logits(*weights.w, input, tokens,
                                                      std::span(router_logits->data(), router_logits->size()), options)
                      : reference_forward(*weights.w, input, tokens, options);
  }
  return bf16_result(std::move(r.out_bf16), x.shape(0), x.shape(1));
}

// The engine form on the CPU: the caller's top-k (ids already checked to be in [-1, routed experts);
// -1 is kNoExpert).
auto cpu_experts(const Weights& weights, const Bf16Array<2>& x, const HostArray<int64_t>& topk_ids,
                 const HostArray<float>& topk_weights, const std::string& activations) {
  const ReferenceOptions options{.activations = parse_activation_format(activations)};
  Routing routing;
  routing.num_tokens = static_cast<int>(x.shape(0));
  routing.top_k = static_cast<int>(topk_ids.shape(1));
  routing.experts.assign(topk_ids.data(), topk_ids.data() + topk_ids.size());
  routing.weights.assign(topk_weights.data(), topk_weights.data() + topk_weights.size());
  const std::vector<Bf16> input = bf16_vector(x);
  ReferenceResult r;
  {
    nb::gil_scoped_release release;
    r = reference_forward_routed(*weights.w, input, std::move(routing), options);
  }
  return bf16_result(std::move(r.out_bf16), x.shape(0), x.shape(1));
}

// A Python allocator as the runner's DeviceAllocator: allocate(nbytes) -> int, a device address on
// the current device (0 for none), and release(address) -> None. The callbacks take the GIL, so a
// runner may be built with it released and freed with or without it. No Python exception crosses
// them: allocate's becomes a null address, its message kept for the runner's Error; release's is
// reported as unraisable and the memory left to the allocator.
class PyAllocator {
 public:
  PyAllocator(nb::callable allocate, nb::callable release)
      : allocate_(std::move(allocate)), release_(std::move(release)) {}
  ~PyAllocator() {
    if (!Py_IsInitialized()) {  // the interpreter is gone: nothing left to release the references to
      allocate_.release();
      release_.release();
      return;
    }
    nb::gil_scoped_acquire gil;
    allocate_.reset();
    release_.reset();
  }
  PyAllocator(const PyAllocator&) = delete;
  PyAllocator& operator=(const PyAllocator&) = delete;

  DeviceAllocator callbacks() { return {&allocate, &release, this}; }
  // The message of the last allocate that raised, cleared.
  std::string take_error() { return std::exchange(error_, {}); }

 private:
  static void* allocate(size_t bytes, void* context) noexcept {
    auto* self = static_cast<PyAllocator*>(context);
    if (!Py_IsInitialized()) return nullptr;
    nb::gil_scoped_acquire gil;
    try {
      return reinterpret_cast<void*>(nb::cast<uintptr_t>(self->allocate_(bytes)));
    } catch (nb::python_error& e) {
      self->error_ = std::string(nb::type_name(e.type()).c_str()) + ": " + nb::str(e.value()).c_str();
    } catch (const nb::cast_error&) {
      self->error_ = "allocate returned no int (a device address)";
    } catch (const std::exception& e) {
      self->error_ = e.what();
    }
    return nullptr;
  }
  static void release(void* ptr, size_t, void* context) noexcept {
    auto* self = static_cast<PyAllocator*>(context);
    if (!Py_IsInitialized()) return;  // the interpreter is gone, and the allocator's memory with it
    nb::gil_scoped_acquire gil;
    try {
      self->release_(reinterpret_cast<uintptr_t>(ptr));
    } catch (nb::python_error& e) {
      e.discard_as_unraisable("mxmoe: releasing a layer's device memory");
    } catch (...) {
    }
  }

  nb::object allocate_, release_;
  std::string error_;
};

Dtype device_dtype(const std::string& name, const std::string& tensor) {
  if (name == "U8") return Dtype::kU8;
  if (name == "BF16") return Dtype::kBF16;
  if (name == "F32") return Dtype::kF32;
  throw Error(tensor + ": expected dtype U8, BF16 or F32, got " + name);
}

// One layer's device tensors by DeviceLayerTensors' member names: (address, dtype name, shape).
using DeviceTensorMap = std::map<std::string, std::tuple<uintptr_t, std::string, std::vector<int64_t>>>;

DeviceLayerTensors device_layer_tensors(const std::tuple<int, int, int, int>& shape, const DeviceTensorMap& tensors,
                                        uintptr_t stream) {
  DeviceLayerTensors t;
  const auto [experts, top_k, hidden, intermediate] = shape;
  t.shape = MoeShape{experts, top_k, hidden, intermediate, 1};
  t.stream = reinterpret_cast<cudaStream_t>(stream);
  const std::pair<const char*, DeviceTensor*> members[] = {
      {"router_weight", &t.router_weight}, {"router_bias", &t.router_bias}, {"fc1_blocks", &t.fc1_blocks},
      {"fc1_scales", &t.fc1_scales},       {"fc2_blocks", &t.fc2_blocks},   {"fc2_scales", &t.fc2_scales},
      {"gate_up", &t.gate_up},             {"down", &t.down},               {"fc1_bias", &t.fc1_bias},
      {"fc2_bias", &t.fc2_bias}};
  for (const auto& [name, value] : tensors) {
    auto member = std::find_if(std::begin(members), std::end(members), [&](const auto& m) { return name == m.first; });
    if (member == std::end(members)) throw Error("device layer tensors: no tensor is named " + name);
    const auto& [address, dtype, dims] = value;
    *member->second = DeviceTensor{reinterpret_cast<const void*>(address), device_dtype(dtype, name), dims};
  }
  return t;
}

// The GPU layer on one device: owns the repacked weights there until free() or collection. Their
// memory comes from cudaMalloc, or from a Python allocator (PyAllocator).
class Runner {
 public:
  // `activations`: bf16, mxfp8 or fp8 (RunnerOptions::activations).
  Runner(const Weights& weights, int device, std::optional<nb::callable> allocate, std::optional<nb::callable> release,
         const std::string& activations)
      : device_(checked_device(device)), allocator_(make_allocator(std::move(allocate), std::move(release))) {
    build(activations, [&](const RunnerOptions& options) { return std::make_unique<MoeRunner>(*weights.w, options); });
  }
  // Tensors on `device`, ready on `stream` (a cudaStream_t): see device_layer.hpp.
  Runner(const std::tuple<int, int, int, int>& shape, const DeviceTensorMap& tensors, uintptr_t stream, int device,
         std::optional<nb::callable> allocate, std::optional<nb::callable> release, const std::string& activations)
      : device_(checked_device(device)), allocator_(make_allocator(std::move(allocate), std::move(release))) {
    const DeviceLayerTensors t = device_layer_tensors(shape, tensors, stream);
    build(activations, [&](const RunnerOptions& options) { return std::make_unique<MoeRunner>(t, options); });
  }
  std::string activations() const { return activation_format_name(live().activations()); }
  ~Runner() { free(); }
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;

  int device() const { return device_; }
  bool freed() const { return !runner_; }
  void free() {
    if (!runner_) return;
    DeviceScope scope(device_);
    runner_.reset();
  }
  size_t device_bytes() const { return live().device_bytes(); }
  size_t workspace_size(int tokens) const { return live().workspace_size(tokens); }
  void prepare(int tokens) const {
    DeviceScope scope(device_);
    live().prepare(tokens);
  }
  int routed_experts() const { return live().routed_experts(); }
  // Pointers are device addresses on this runner's device; `logits` 0 computes the router logits.
  void forward(uintptr_t x, uintptr_t logits, uintptr_t out, int tokens, uintptr_t workspace, size_t workspace_bytes,
               uintptr_t stream) const {
    DeviceScope scope(device_);
    const auto* xp = reinterpret_cast<const __nv_bfloat16*>(x);
    auto* op = reinterpret_cast<__nv_bfloat16*>(out);
    auto* s = reinterpret_cast<cudaStream_t>(stream);
    if (logits) {
      live().forward(xp, reinterpret_cast<const float*>(logits), op, tokens, reinterpret_cast<void*>(workspace),
                     workspace_bytes, s);
    } else {
      live().forward(xp, op, tokens, reinterpret_cast<void*>(workspace), workspace_bytes, s);
    }
  }
  // The engine form: ids [T, k] int32 or int64 and weights [T, k] fp32, device addresses.
  void forward_experts(uintptr_t x, uintptr_t ids, bool ids_int64, uintptr_t weights, uintptr_t out, int tokens,
                       uintptr_t workspace, size_t workspace_bytes, uintptr_t stream) const {
    DeviceScope scope(device_);
    live().forward_experts(reinterpret_cast<const __nv_bfloat16*>(x),
                           GivenTopK{reinterpret_cast<const void*>(ids), ids_int64, reinterpret_cast<const float*>(weights)},
                           reinterpret_cast<__nv_bfloat16*>(out), tokens, reinterpret_cast<void*>(workspace),
                           workspace_bytes, reinterpret_cast<cudaStream_t>(stream));
  }

 private:
  // Makes `device` current for a call and restores the caller's device after it.
  struct DeviceScope {
    int previous = 0;
    explicit DeviceScope(int device) {
      cudaGetDevice(&previous);
      if (previous != device) cudaSetDevice(device);
    }
    ~DeviceScope() { cudaSetDevice(previous); }
  };
  static int checked_device(int device) {
    if (device < 0 || device >= static_cast<int>(list_gpus().size())) {
      throw Error("device " + std::to_string(device) + ": no such CUDA device (" + std::to_string(list_gpus().size()) +
                  " visible)");
    }
    return device;
  }
  static std::unique_ptr<PyAllocator> make_allocator(std::optional<nb::callable> allocate,
                                                     std::optional<nb::callable> release) {
    if (!allocate != !release) throw Error("allocator: expected both allocate and release, or neither");
    if (!allocate) return nullptr;
    return std::make_unique<PyAllocator>(std::move(*allocate), std::move(*release));
  }
  // Loads the runner on this device with the GIL released (the allocator's callbacks take it back);
  // a failed allocation's Error carries the allocator's exception.
  template <typename Make>
  void build(const std::string& activations, Make make) {
    RunnerOptions options;
    options.activations = parse_activation_format(activations);
    if (allocator_) options.allocator = allocator_->callbacks();
    try {
      nb::gil_scoped_release release;
      DeviceScope scope(device_);
      runner_ = make(options);
    } catch (const Error& e) {
      const std::string cause = allocator_ ? allocator_->take_error() : std::string();
      if (cause.empty()) throw;
      throw Error(std::string(e.what()) + " (" + cause + ")");
    }
  }
  const MoeRunner& live() const {
    if (!runner_) throw Error("this layer was freed");
    return *runner_;
  }
  int device_;
  std::unique_ptr<PyAllocator> allocator_;  // declared first, destroyed last: the runner releases into it
  std::unique_ptr<MoeRunner> runner_;
};


// ---- Whole-model loading: the host stage of load_model, with each layer handed to Python ----
// for_each_layer calls on_layer(layer, Weights) for each of `layers` in order (Python builds the
// layer's runner there, through the same constructor as any other), then on_progress(dict) where
// given; the next layer is read ahead into the page cache meanwhile. An empty `layers`: all of them.
int count_layers(const std::string& path) { return count_moe_layers(Checkpoint::open(path)); }

void for_each_layer(const std::string& path, std::vector<int> layers, std::optional<std::string> scheme,
                    bool quantize, const nb::callable& on_layer, std::optional<nb::callable> on_progress) {
  LoadOptions options;
  if (scheme) options.scheme = parse_scheme(*scheme);
  options.quantize_bf16_experts = quantize;
  const Checkpoint checkpoint = Checkpoint::open(path);
  if (layers.empty()) {
    for (int l = 0, count = count_moe_layers(checkpoint); l < count; ++l) layers.push_back(l);
    if (layers.empty()) load_moe_layer(checkpoint, 0, options);  // throws, naming what it looked for
  }
  LayerProgressCallback progress;
  if (on_progress) {
    progress = [&](const LayerLoadProgress& p) {
      nb::dict d;
      d["layer"] = p.layer;
      d["layers_done"] = p.layers_done;
      d["layers_total"] = p.layers_total;
      d["layer_bytes"] = p.layer_bytes;
      d["layer_seconds"] = p.layer_seconds;
      d["bytes_done"] = p.bytes_done;
      d["seconds_done"] = p.seconds_done;
      (*on_progress)(d);
    };
  }
  for_each_moe_layer(
      checkpoint, layers, options,
      [&](int layer, const LoadedLayer& loaded) { on_layer(layer, Weights::of(loaded.weights)); }, progress);
}

}  // namespace
}  // namespace mxmoe

NB_MODULE(_mxmoe, m) {
  using namespace mxmoe;
  m.doc() = "mxmoe's C++ core; use the mxmoe package, which checks arguments before calling these.";
  nb::exception<Error>(m, "Error", PyExc_RuntimeError);
  nb::class_<Weights>(m, "Weights")
      .def_prop_ro("shape", &Weights::shape, "(num_experts, top_k, hidden, intermediate)")
      .def_prop_ro("routed_experts", [](const Weights& w) { return w.w->num_routed_experts(); })
      .def_prop_ro("global_experts",
                   [](const Weights& w) {
                     std::vector<int> ids(w.w->shape.num_experts);
                     for (size_t e = 0; e < ids.size(); ++e) {
                       ids[e] = w.w->global_experts.empty() ? static_cast<int>(e) : w.w->global_experts[e];
                     }
                     return ids;
                   })
      .def_prop_ro("spec", &Weights::spec, "(router, routed_scaling, swiglu_alpha, swiglu_limit, up_offset, "
                                           "gate_up, expert_biases)")
      .def_prop_ro("router",
                   [](const Weights& w) {
                     if (w.w->router_weight.empty()) throw Error("the layer is hash-routed: it has no router");
                     const size_t routed = w.w->num_routed_experts(), hidden = w.w->shape.hidden;
                     std::vector<float> bias = w.w->router_selection_bias;
                     for (const Bf16 b : w.w->router_bias) bias.push_back(bf16_to_float(b));
                     return nb::make_tuple(bf16_result(w.w->router_weight, routed, hidden),
                                           float_result(std::move(bias)));
                   },
                   "(weight [R, H] as bf16 bits, bias [R] float32): the logits' bias (softmax-top-k) or the "
                   "selection bias (sqrt-softplus); the layer has a router unless its spec's is caller-top-k")
      .def("tensor_parallel_shard",
           [](const Weights& w, int rank, int world) { return Weights::of(tensor_parallel_shard(*w.w, rank, world)); },
           "rank"_a, "world"_a)
      .def("expert_parallel_shard",
           [](const Weights& w, int rank, int world) { return Weights::of(expert_parallel_shard(*w.w, rank, world)); },
           "rank"_a, "world"_a)
      .def("expert_shard",
           [](const Weights& w, const std::vector<int32_t>& experts) { return Weights::of(expert_shard(*w.w, experts)); },
           "experts"_a);
  m.def("load_checkpoint", &load_checkpoint, "path"_a, "layer"_a, "scheme"_a.none(), "quantize_bf16_experts"_a);
  m.def("weights_from_mxfp4", &from_mxfp4_arrays, "router_weight"_a, "router_bias"_a, "fc1_blocks"_a, "fc1_scales"_a,
        "fc1_bias"_a, "fc2_blocks"_a, "fc2_scales"_a, "fc2_bias"_a, "top_k"_a);
  m.def("weights_from_deepseek_v4_mxfp4", &from_deepseek_v4_mxfp4, "router_weight"_a.none(), "selection_bias"_a.none(),
        "fc1_blocks"_a, "fc1_scales"_a, "fc2_blocks"_a, "fc2_scales"_a, "top_k"_a, "routed_scaling"_a,
        "experts"_a.none());
  m.def("weights_from_bf16_experts", &from_bf16_experts, "router_weight"_a, "router_bias"_a, "gate_up"_a,
        "gate_up_bias"_a, "down"_a, "down_bias"_a, "top_k"_a);
  m.def("synthetic_weights",
        [](int experts, int top_k, int hidden, int intermediate, uint64_t seed) {
          return Weights::of(make_synthetic_layer(MoeShape{experts, top_k, hidden, intermediate, 1}, seed));
        },
        "num_experts"_a, "top_k"_a, "hidden"_a, "intermediate"_a, "seed"_a);
  m.def("model_names", [] {
    std::vector<std::string> names;
    for (const ModelPreset& p : model_presets()) names.emplace_back(p.name);
    return names;
  });
  m.def(
      "synthetic_model_weights",
      [](const std::string& model, uint64_t seed) {
        MoeShape shape = model_shape(model);
        shape.num_layers = 1;
        return Weights::of(make_synthetic_layer(shape, seed));
      },
      "model"_a, "seed"_a);
  m.def("cpu_forward", &cpu_forward, "weights"_a, "x"_a, "router_logits"_a.none(), "activations"_a = "bf16");
  m.def("cpu_experts", &cpu_experts, "weights"_a, "x"_a, "topk_ids"_a, "topk_weights"_a, "activations"_a = "bf16");
  m.def("gpu_count", [] { return static_cast<int>(list_gpus().size()); });
  nb::class_<Runner>(m, "Runner")
      .def(nb::init<const Weights&, int, std::optional<nb::callable>, std::optional<nb::callable>, const std::string&>(),
           "weights"_a, "device"_a, "allocate"_a = nb::none(), "release"_a = nb::none(), "activations"_a = "bf16")
      .def(nb::init<const std::tuple<int, int, int, int>&, const DeviceTensorMap&, uintptr_t, int,
                    std::optional<nb::callable>, std::optional<nb::callable>, const std::string&>(),
           "shape"_a, "tensors"_a, "stream"_a, "device"_a, "allocate"_a = nb::none(), "release"_a = nb::none(),
           "activations"_a = "bf16",
           "One layer's device tensors, {name: (address, 'U8' | 'BF16' | 'F32', shape)} by DeviceLayerTensors' "
           "member names, ready on `stream`; shape (num_experts, top_k, hidden, intermediate).")
      .def_prop_ro("device", &Runner::device)
      .def_prop_ro("activations", &Runner::activations)
      .def_prop_ro("freed", &Runner::freed)
      .def("free", &Runner::free)
      .def_prop_ro("routed_experts", &Runner::routed_experts)
      .def_prop_ro("device_bytes", &Runner::device_bytes)
      .def("workspace_size", &Runner::workspace_size, "tokens"_a)
      .def("prepare", &Runner::prepare, "tokens"_a)
      .def("forward", &Runner::forward, "x"_a, "router_logits"_a, "out"_a, "tokens"_a, "workspace"_a,
           "workspace_bytes"_a, "stream"_a)
      .def("forward_experts", &Runner::forward_experts, "x"_a, "topk_ids"_a, "ids_int64"_a, "topk_weights"_a, "out"_a,
           "tokens"_a, "workspace"_a, "workspace_bytes"_a, "stream"_a);
  // Whole-model loading (see for_each_layer).
  m.def("count_layers", &count_layers, "path"_a);
  m.def("for_each_layer", &for_each_layer, "path"_a, "layers"_a, "scheme"_a.none(), "quantize_bf16_experts"_a,
        "on_layer"_a, "on_progress"_a.none());
}
