#include "io/activation_file.hpp"

#include <bit>
#include <cmath>
#include <cstring>
#include <optional>
#include <sstream>

#include "common/atomic_file.hpp"
#include "common/printable.hpp"
#include "common/read_file.hpp"
#include "mxmoe/error.hpp"
#include "mxmoe/safetensors.hpp"

namespace mxmoe {
namespace {

float half_to_float(uint16_t h) {
  const int sign = h >> 15, exponent = (h >> 10) & 31, mantissa = h & 1023;
  float magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -24);
  } else if (exponent == 31) {
    magnitude = mantissa ? NAN : INFINITY;
  } else {
    magnitude = std::ldexp(static_cast<float>(mantissa + 1024), exponent - 25);
  }
  return sign ? -magnitude : magnitude;
}

enum class Element { kF32, kF16, kBf16 };

// `count` little-endian elements of `element` at `bytes`, as bf16.
std::vector<Bf16> to_bf16(const uint8_t* bytes, size_t count, Element element) {
  std::vector<Bf16> out(count);
  for (size_t i = 0; i < count; ++i) {
    if (element == Element::kF32) {
      uint32_t u;
      std::memcpy(&u, bytes + 4 * i, 4);
      out[i] = float_to_bf16(std::bit_cast<float>(u));
    } else {
      uint16_t u;
      std::memcpy(&u, bytes + 2 * i, 2);
      out[i] = element == Element::kBf16 ? Bf16{u} : float_to_bf16(half_to_float(u));
    }
  }
  return out;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// The rows of a [T, width] tensor; throws Error when its shape is another.
int rows_of(const std::string& where, const std::vector<int64_t>& shape, int64_t width, const char* what) {
  if (shape.size() != 2 || shape[0] < 1 || shape[0] > (1 << 24) || shape[1] != width) {
    throw Error(where + ": expected " + what + " [T, " + std::to_string(width) + "] with T >= 1, got " +
                shape_text(shape));
  }
  return static_cast<int>(shape[0]);
}

ActivationInput read_safetensors_input(const std::string& path, int hidden, int num_experts) {
  const auto file = SafetensorsFile::open(path);
  const TensorInfo* x = file->find("x");
  if (!x && file->tensors().size() == 1) x = &file->tensors().front();
  if (!x) throw Error(printable(path) + ": no tensor 'x' (the activations [T, " + std::to_string(hidden) + "])");
  const std::string where = printable(path) + ": tensor '" + printable(x->name) + "'";
  Element element = Element::kBf16;
  if (x->dtype == Dtype::kF32) {
    element = Element::kF32;
  } else if (x->dtype == Dtype::kF16) {
    element = Element::kF16;
  } else if (x->dtype != Dtype::kBF16) {
    throw Error(where + ": expected BF16, F16 or F32, got " + x->describe());
  }
  ActivationInput in;
  in.num_tokens = rows_of(where, x->shape, hidden, "the activations");
  in.x = to_bf16(x->bytes.data(), static_cast<size_t>(in.num_tokens) * hidden, element);
  if (const TensorInfo* logits = file->find("router_logits")) {
    const std::string logits_where = printable(path) + ": tensor 'router_logits'";
    if (logits->dtype != Dtype::kF32 || rows_of(logits_where, logits->shape, num_experts, "F32") != in.num_tokens) {
      throw Error(logits_where + ": expected [" + std::to_string(in.num_tokens) + ", " + std::to_string(num_experts) +
                  "] F32, got " + logits->describe());
    }
    std::vector<float> values(static_cast<size_t>(in.num_tokens) * num_experts);
    std::memcpy(values.data(), logits->bytes.data(), values.size() * 4);
    in.router_logits = std::move(values);
  }
  return in;
}

// .npy (format 1.0 to 3.0): magic, version, header length, a Python dict literal, the data.
ActivationInput read_npy_input(const std::string& path, int hidden) {
  const std::optional<std::string> file = read_file(path);
  if (!file) throw Error(printable(path) + ": cannot open");
  const std::string& bytes = *file;
  const std::string where = printable(path);
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0) throw Error(where + ": not a .npy file");
  const int major = static_cast<unsigned char>(bytes[6]);
  const size_t length_bytes = major == 1 ? 2 : 4;
  if (major < 1 || major > 3 || bytes.size() < 8 + length_bytes) throw Error(where + ": unsupported .npy version");
  size_t header_length = 0;
  for (size_t i = 0; i < length_bytes; ++i) header_length |= static_cast<size_t>(static_cast<unsigned char>(bytes[8 + i])) << (8 * i);
  const size_t data_at = 8 + length_bytes + header_length;
  if (data_at > bytes.size()) throw Error(where + ": .npy header runs past the end of the file");
  const std::string header = bytes.substr(8 + length_bytes, header_length);
  auto field = [&](const std::string& key) {
    const size_t at = header.find("'" + key + "'");
    if (at == std::string::npos) throw Error(where + ": .npy header has no '" + key + "'");
    return header.substr(header.find(':', at) + 1);
  };
  const std::string descr = field("descr"), order = field("fortran_order"), shape_text_field = field("shape");
  if (order.find("False") == std::string::npos || order.find("False") > order.find(',')) {
    throw Error(where + ": a Fortran-ordered array; save it C-contiguous");
  }
  Element element;
  if (descr.find("'<f4'") < descr.find(',')) {
    element = Element::kF32;
  } else if (descr.find("'<f2'") < descr.find(',')) {
    element = Element::kF16;
  } else if (descr.find("'<u2'") < descr.find(',')) {
    element = Element::kBf16;
  } else {
    throw Error(where + ": dtype " + printable(descr.substr(0, descr.find(','))) +
                " is not float32 ('<f4'), float16 ('<f2') or uint16 holding bf16 bits ('<u2')");
  }
  std::vector<int64_t> shape;
  const size_t open = shape_text_field.find('('), close = shape_text_field.find(')');
  if (open == std::string::npos || close == std::string::npos) throw Error(where + ": .npy header has no shape");
  std::stringstream dims(shape_text_field.substr(open + 1, close - open - 1));
  for (std::string dim; std::getline(dims, dim, ',');) {
    if (dim.find_first_not_of(' ') == std::string::npos) continue;
    try {
      shape.push_back(std::stoll(dim));
    } catch (const std::exception&) {
      throw Error(where + ": .npy shape " + printable(shape_text_field.substr(open, close - open + 1)) + " is not a list of sizes");
    }
  }
  ActivationInput result;
  result.num_tokens = rows_of(where, shape, hidden, "the activations");
  const size_t count = static_cast<size_t>(result.num_tokens) * hidden;
  const size_t element_bytes = element == Element::kF32 ? 4 : 2;
  if (bytes.size() - data_at != count * element_bytes) {
    throw Error(where + ": holds " + std::to_string(bytes.size() - data_at) + " bytes of data, " + shape_text(shape) +
                " needs " + std::to_string(count * element_bytes));
  }
  result.x = to_bf16(reinterpret_cast<const uint8_t*>(bytes.data()) + data_at, count, element);
  return result;
}

}  // namespace

ActivationInput read_activations(const std::string& path, int hidden, int num_experts) {
  if (path.ends_with(".safetensors")) return read_safetensors_input(path, hidden, num_experts);
  if (path.ends_with(".npy")) return read_npy_input(path, hidden);
  throw Error(printable(path) + ": expected a .safetensors or .npy file");
}

void write_output(const std::string& path, std::span<const Bf16> y, int num_tokens, int hidden) {
  if (path.ends_with(".safetensors")) {
    const TensorToWrite tensor{"y", Dtype::kBF16, {num_tokens, hidden},
                               {reinterpret_cast<const uint8_t*>(y.data()), y.size() * 2}};
    write_safetensors(path, std::span(&tensor, 1));
    return;
  }
  if (!path.ends_with(".npy")) throw Error(printable(path) + ": expected a .safetensors or .npy output file");
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::to_string(num_tokens) + ", " +
                       std::to_string(hidden) + "), }";
  header.append(63 - (10 + header.size()) % 64, ' ').push_back('\n');  // data 64-byte aligned, as numpy writes
  std::string bytes = "\x93NUMPY\x01";
  bytes.push_back('\0');
  bytes.push_back(static_cast<char>(header.size() & 0xff));
  bytes.push_back(static_cast<char>(header.size() >> 8));
  bytes += header;
  for (Bf16 v : y) {
    const uint32_t u = std::bit_cast<uint32_t>(bf16_to_float(v));
    for (int b = 0; b < 4; ++b) bytes.push_back(static_cast<char>(u >> (8 * b)));
  }
  const std::span<const uint8_t> piece(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  write_file_atomically(path, std::span(&piece, 1));
}

}  // namespace mxmoe
