#include "jit/cubin_info.hpp"

#include <string_view>
#include <vector>

#include "mxmoe/error.hpp"

namespace mxmoe {
namespace {

using Bytes = std::span<const uint8_t>;

constexpr uint16_t kMachineCuda = 190;       // EM_CUDA
constexpr uint32_t kSymbolTable = 2;         // SHT_SYMTAB
constexpr uint32_t kCudaInfo = 0x70000000;   // SHT_LOPROC: the .nv.info sections
constexpr size_t kSectionHeaderBytes = 64;   // Elf64_Shdr
constexpr size_t kSymbolBytes = 24;          // Elf64_Sym
constexpr uint8_t kSizedValue = 4;           // EIFMT_SVAL
constexpr uint8_t kRegisterCount = 0x2f;     // EIATTR_REGCOUNT

[[noreturn]] void malformed(const std::string& why) { throw Error("malformed cubin: " + why); }

// `size` bytes of `bytes` at `offset`; Error naming `what` where they run past its end.
Bytes slice(Bytes bytes, uint64_t offset, uint64_t size, const std::string& what) {
  if (offset > bytes.size() || size > bytes.size() - offset) {
    malformed(what + " (" + std::to_string(size) + " bytes at " + std::to_string(offset) + ") runs past the end of " +
              std::to_string(bytes.size()) + " bytes");
  }
  return bytes.subspan(offset, size);
}

// The little-endian T at `offset` of `bytes`.
template <typename T>
T read(Bytes bytes, uint64_t offset, const std::string& what) {
  const Bytes b = slice(bytes, offset, sizeof(T), what);
  T value = 0;
  for (size_t i = 0; i < sizeof(T); ++i) value = static_cast<T>(value | static_cast<T>(b[i]) << (8 * i));
  return value;
}

// The NUL-terminated string at `offset` of a string table.
std::string string_at(Bytes table, uint32_t offset, const std::string& what) {
  const Bytes rest = slice(table, offset, table.size() - std::min<size_t>(offset, table.size()), what);
  const std::string_view text(reinterpret_cast<const char*>(rest.data()), rest.size());
  const size_t end = text.find('\0');
  if (end == std::string_view::npos) malformed(what + " has no terminating NUL");
  return std::string(text.substr(0, end));
}

struct Section {
  std::string name;
  uint32_t type;
  Bytes data;
  uint32_t link;
  uint64_t entry_bytes;
};

std::vector<Section> sections_of(Bytes elf) {
  if (elf.size() < 64 || elf[0] != 0x7f || elf[1] != 'E' || elf[2] != 'L' || elf[3] != 'F') {
    malformed("not an ELF file (" + std::to_string(elf.size()) + " bytes)");
  }
  if (elf[4] != 2 || elf[5] != 1) malformed("not a little-endian ELF64");
  if (const auto machine = read<uint16_t>(elf, 0x12, "e_machine"); machine != kMachineCuda) {
    malformed("ELF machine " + std::to_string(machine) + ", not CUDA's");
  }
  const auto table = read<uint64_t>(elf, 0x28, "e_shoff");
  const auto stride = read<uint16_t>(elf, 0x3a, "e_shentsize");
  const auto count = read<uint16_t>(elf, 0x3c, "e_shnum");
  const auto names_index = read<uint16_t>(elf, 0x3e, "e_shstrndx");
  slice(elf, read<uint64_t>(elf, 0x20, "e_phoff"),
        uint64_t{read<uint16_t>(elf, 0x36, "e_phentsize")} * read<uint16_t>(elf, 0x38, "e_phnum"), "the program header table");
  if (stride < kSectionHeaderBytes) malformed("section headers of " + std::to_string(stride) + " bytes");
  if (names_index >= count) malformed("section name table " + std::to_string(names_index) + " of " +
                                      std::to_string(count) + " sections");
  std::vector<Section> sections;
  std::vector<uint32_t> name_offsets;
  for (uint16_t i = 0; i < count; ++i) {
    const std::string what = "section header " + std::to_string(i);
    const Bytes h = slice(elf, table + uint64_t{i} * stride, kSectionHeaderBytes, what);
    const auto type = read<uint32_t>(h, 4, what);
    constexpr uint32_t kNoBits = 8;  // SHT_NOBITS: occupies no bytes of the file
    const Bytes data = type == kNoBits ? Bytes{}
                                       : slice(elf, read<uint64_t>(h, 24, what), read<uint64_t>(h, 32, what),
                                               "section " + std::to_string(i));
    sections.push_back({"", type, data, read<uint32_t>(h, 40, what), read<uint64_t>(h, 56, what)});
    name_offsets.push_back(read<uint32_t>(h, 0, what));
  }
  for (size_t i = 0; i < sections.size(); ++i) {
    sections[i].name = string_at(sections[names_index].data, name_offsets[i], "the name of section " + std::to_string(i));
  }
  return sections;
}

}  // namespace

std::map<std::string, int> cubin_registers(std::span<const uint8_t> cubin) {
  const std::vector<Section> sections = sections_of(cubin);
  const Section* symbols = nullptr;
  for (const Section& s : sections) {
    if (s.type == kSymbolTable) symbols = &s;
  }
  if (!symbols) malformed("no symbol table");
  if (symbols->entry_bytes != kSymbolBytes) malformed("symbols of " + std::to_string(symbols->entry_bytes) + " bytes");
  if (symbols->link >= sections.size()) malformed("the symbol table's string table " + std::to_string(symbols->link));
  const Bytes symbol_names = sections[symbols->link].data;
  const uint64_t symbol_count = symbols->data.size() / kSymbolBytes;

  std::map<std::string, int> registers;
  for (const Section& s : sections) {
    if (s.type != kCudaInfo || !s.name.starts_with(".nv.info")) continue;
    for (uint64_t at = 0; at < s.data.size();) {
      const std::string what = "attribute at " + std::to_string(at) + " of " + s.name;
      const auto format = read<uint8_t>(s.data, at, what);
      const auto attribute = read<uint8_t>(s.data, at + 1, what);
      const auto field = read<uint16_t>(s.data, at + 2, what);  // SVAL: the value's size; else the value
      const Bytes value = format == kSizedValue ? slice(s.data, at + 4, field, what) : Bytes{};
      at += 4 + value.size();
      if (attribute != kRegisterCount) continue;
      if (format != kSizedValue || value.size() != 8) malformed(what + ": a register count of an unknown form");
      const auto symbol = read<uint32_t>(value, 0, what);
      if (symbol >= symbol_count) {
        malformed(what + ": symbol " + std::to_string(symbol) + " of " + std::to_string(symbol_count));
      }
      const std::string name = string_at(symbol_names, read<uint32_t>(symbols->data, uint64_t{symbol} * kSymbolBytes, what),
                                         "the name of symbol " + std::to_string(symbol));
      const int count = static_cast<int>(read<uint32_t>(value, 4, what));
      if (const auto [it, added] = registers.emplace(name, count); !added && it->second != count) {
        malformed(name + " has two register counts, " + std::to_string(it->second) + " and " + std::to_string(count));
      }
    }
  }
  return registers;
}

}  // namespace mxmoe
