#include "core/npy.h"

#include "core/file.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "core/npy_header.h"

namespace ddpcheck::core {

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;
constexpr size_t kAlign = 64;

// A .npy element type ddpcheck reads: its descr, numpy name, bytes, how to decode it, and the DType it becomes.
enum class Kind { kFloat, kSigned, kUnsigned };
struct NpyType {
  const char* descr;
  const char* numpy_name;
  int bytes;
  Kind kind;
  DType dtype;
};
constexpr NpyType kTypes[] = {
    {"<f8", "float64", 8, Kind::kFloat, DType::kFloat64},  {"<f4", "float32", 4, Kind::kFloat, DType::kFloat32},
    {"<f2", "float16", 2, Kind::kFloat, DType::kFloat16},  {"<i8", "int64", 8, Kind::kSigned, DType::kInt64},
    {"<i4", "int32", 4, Kind::kSigned, DType::kInt32},     {"<i2", "int16", 2, Kind::kSigned, DType::kInt32},
    {"<u2", "uint16", 2, Kind::kUnsigned, DType::kInt32},  {"|i1", "int8", 1, Kind::kSigned, DType::kInt32},
    {"|u1", "uint8", 1, Kind::kUnsigned, DType::kInt32},
};

const NpyType* FindType(const std::string& descr) {
  for (const auto& t : kTypes) {
    if (descr == t.descr) return &t;
  }
  return nullptr;
}

const char* kReadable = "ddpcheck reads little-endian float32/float64/int32/int64";

Status DTypeError(const std::string& name, const std::string& descr) {
  if (!descr.empty() && descr[0] == '>') {
    return Status::Invalid(name + ": dtype '" + descr + "' is big-endian; " + kReadable + " — convert with arr.astype('<" +
                           descr.substr(1) + "')");
  }
  return Status::Invalid(name + ": dtype '" + descr + "' is not supported; " + kReadable +
                         " — convert with arr.astype('<f8')");
}

uint64_t LoadLittleEndian(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void StoreLittleEndian(uint64_t v, int bytes, std::string* out) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

double HalfToDouble(uint16_t h) {
  int sign = h >> 15, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  double v;
  if (exp == 0) {
    v = std::ldexp(mant, -24);
  } else if (exp == 31) {
    v = mant ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else {
    v = std::ldexp(1024 + mant, exp - 25);
  }
  return sign ? -v : v;
}

// The float16 bits of v when v is exactly a float16 (or inf/NaN); false otherwise.
bool DoubleToHalfExact(double v, uint16_t* out) {
  uint16_t sign = std::signbit(v) ? 0x8000 : 0;
  double a = std::fabs(v);
  if (std::isnan(v)) { *out = sign | 0x7e00; return true; }
  if (std::isinf(v)) { *out = sign | 0x7c00; return true; }
  if (a == 0) { *out = sign; return true; }
  if (a < 0x1p-14) {  // subnormal: a = mant * 2^-24
    double m = std::ldexp(a, 24);
    if (m != std::floor(m)) return false;
    *out = sign | static_cast<uint16_t>(m);
    return true;
  }
  int e;
  double f = std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1)
  int exp = e - 1 + 15;
  if (exp >= 31) return false;
  double m = (2 * f - 1) * 1024;
  if (m != std::floor(m)) return false;
  *out = sign | static_cast<uint16_t>(exp << 10) | static_cast<uint16_t>(m);
  return true;
}

double Decode(const unsigned char* p, const NpyType& t) {
  uint64_t bits = LoadLittleEndian(p, t.bytes);
  switch (t.kind) {
    case Kind::kFloat:
      if (t.bytes == 8) return std::bit_cast<double>(bits);
      if (t.bytes == 4) return std::bit_cast<float>(static_cast<uint32_t>(bits));
      return HalfToDouble(static_cast<uint16_t>(bits));
    case Kind::kSigned: {
      int shift = 64 - 8 * t.bytes;  // sign-extend
      return static_cast<double>(static_cast<int64_t>(bits << shift) >> shift);
    }
    case Kind::kUnsigned: return static_cast<double>(bits);
  }
  return 0;
}

// numel * bytes, or -1 on overflow past 2^62.
int64_t DataBytes(const std::vector<int64_t>& shape, int bytes) {
  int64_t n = bytes;
  for (int64_t d : shape) {
    if (d != 0 && n > (int64_t{1} << 62) / d) return -1;
    n *= d;
  }
  return n;
}

// Where a .npy image's data lies and what it holds, from its first bytes (magic, version, header).
struct NpyLayout {
  NpyHeader header;
  const NpyType* type = nullptr;
  size_t data_offset = 0;  // preamble + header
  int64_t data_bytes = 0;  // what the header's shape and dtype need
};

// Reads the layout from `bytes`, the image or at least its first data_offset bytes. Errors as ParseNpy's.
Status ParseNpyLayout(const std::string& bytes, const std::string& name, NpyLayout* out) {
  if (bytes.size() < kMagicLen || bytes.compare(0, kMagicLen, kMagic, kMagicLen) != 0) {
    return Status::Invalid(name + ": not a .npy file (bad magic; expected \\x93NUMPY, as written by numpy.save)");
  }
  if (bytes.size() < kMagicLen + 2) return Status::Io(name + ": truncated: the file ends inside the version bytes");
  int major = static_cast<unsigned char>(bytes[6]), minor = static_cast<unsigned char>(bytes[7]);
  if (minor != 0 || major < 1 || major > 3) {
    return Status::Invalid(name + ": unsupported .npy format version " + std::to_string(major) + "." +
                           std::to_string(minor) + "; ddpcheck reads 1.0, 2.0 and 3.0");
  }
  size_t len_bytes = major == 1 ? 2 : 4;
  size_t preamble = kMagicLen + 2 + len_bytes;
  if (bytes.size() < preamble) return Status::Io(name + ": truncated: the file ends inside the header length");
  auto* u = reinterpret_cast<const unsigned char*>(bytes.data());
  size_t header_len = LoadLittleEndian(u + 8, static_cast<int>(len_bytes));
  if (bytes.size() < preamble + header_len) {
    return Status::Io(name + ": truncated: header length says " + std::to_string(header_len) + " bytes, file has " +
                      std::to_string(bytes.size() - preamble));
  }
  Status st = ParseNpyHeader(bytes.substr(preamble, header_len), &out->header);
  if (!st.ok()) return st.Prefixed(name);
  out->type = FindType(out->header.descr);
  if (out->type == nullptr) return DTypeError(name, out->header.descr);
  if (out->header.fortran_order) {
    return Status::Invalid(name + ": fortran_order is True (a Fortran-ordered array); ddpcheck reads C order — save "
                           "np.ascontiguousarray(arr) instead");
  }
  out->data_bytes = DataBytes(out->header.shape, out->type->bytes);
  if (out->data_bytes < 0) return Status::Invalid(name + ": shape " + ShapeString(out->header.shape) + " is too large");
  out->data_offset = preamble + header_len;
  return Status::Ok();
}

// OK when `have` bytes of data are what the layout needs; else why not (truncated, or bytes after the data).
Status CheckDataSize(const NpyLayout& l, uint64_t have, const std::string& name) {
  const auto need = static_cast<uint64_t>(l.data_bytes);
  const std::string said = "header says shape " + ShapeString(l.header.shape) + " " + l.type->numpy_name + " = " +
                           std::to_string(need) + " bytes";
  if (have < need) return Status::Io(name + ": truncated: " + said + " of data, file has " + std::to_string(have));
  if (have > need) {  // (QA round 16: 1 GiB appended after the data was read and accepted)
    return Status::Invalid(name + ": " + std::to_string(have - need) + " bytes after the data (its " + said +
                           "): not one array as np.save writes it; save it again");
  }
  return Status::Ok();
}

}  // namespace

Status ParseNpy(const std::string& bytes, const std::string& name, Tensor* out) {
  NpyLayout l;
  DDPCHECK_RETURN_IF_ERROR(ParseNpyLayout(bytes, name, &l));
  const NpyType* type = l.type;
  DDPCHECK_RETURN_IF_ERROR(CheckDataSize(l, bytes.size() - l.data_offset, name));
  Tensor t(type->dtype, l.header.shape, {});
  int64_t numel = NumelOf(l.header.shape);
  t.data.resize(static_cast<size_t>(numel));
  auto* u = reinterpret_cast<const unsigned char*>(bytes.data());
  const unsigned char* p = u + l.data_offset;
  for (int64_t i = 0; i < numel; ++i) {
    double v = Decode(p + i * type->bytes, *type);
    int64_t exact = type->dtype == DType::kInt64 ? static_cast<int64_t>(LoadLittleEndian(p + i * type->bytes, 8)) : 0;
    if (exact > (int64_t{1} << 53) || exact < -(int64_t{1} << 53)) {
      return Status::Invalid(name + ": int64 value " + std::to_string(exact) + " at flat index " + std::to_string(i) +
                             " is beyond 2^53 and cannot be held exactly; ddpcheck needs |value| <= 2^53");
    }
    t.data[static_cast<size_t>(i)] = v;
  }
  *out = std::move(t);
  return Status::Ok();
}

Status ReadNpy(const std::string& path, Tensor* out) {
  // The header first: a file whose size is not what its header says (cut short, or bytes after the data) is refused
  // before its data is read (QA round 16: a file of 1 GiB was read whole to be refused).
  constexpr size_t kHead = 64 * 1024;
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (!ec && size > kHead) {
    std::string head(kHead, '\0');
    std::ifstream in(path, std::ios::binary);
    if (in && in.read(head.data(), static_cast<std::streamsize>(kHead))) {
      NpyLayout l;
      if (ParseNpyLayout(head, path, &l).ok()) {  // (else: read whole, and ParseNpy says why)
        DDPCHECK_RETURN_IF_ERROR(CheckDataSize(l, size - l.data_offset, path));
      }
    }
  }
  std::string bytes;
  DDPCHECK_RETURN_IF_ERROR(ReadFileToString(path, &bytes));
  return ParseNpy(bytes, path, out);
}

namespace {

// Magic, version and header of a .npy image, padded so that the data starts at a multiple of kAlign.
std::string NpyPrefix(const NpyHeader& h) {
  std::string header = FormatNpyHeader(h);
  size_t preamble = kMagicLen + 2 + 2;
  int major = 1;
  size_t padded = (preamble + header.size() + 1 + kAlign - 1) / kAlign * kAlign - preamble;
  if (padded > 65535) {
    major = 2;
    preamble += 2;
    padded = (preamble + header.size() + 1 + kAlign - 1) / kAlign * kAlign - preamble;
  }
  header.append(padded - header.size() - 1, ' ');
  header.push_back('\n');
  std::string out(kMagic, kMagicLen);
  out.push_back(static_cast<char>(major));
  out.push_back(0);
  StoreLittleEndian(header.size(), major == 1 ? 2 : 4, &out);
  out += header;
  return out;
}

}  // namespace

Status EncodeNpyFloats(const std::vector<int64_t>& shape, const std::vector<float>& values, std::string* bytes) {
  if (NumelOf(shape) != static_cast<int64_t>(values.size())) {
    return Status::Invalid("cannot write a tensor of shape " + ShapeString(shape) + " holding " +
                           std::to_string(values.size()) + " values");
  }
  NpyHeader h;
  h.shape = shape;
  h.descr = "<f4";
  std::string out = NpyPrefix(h);
  const size_t at = out.size();
  out.resize(at + values.size() * sizeof(float));
  static_assert(std::endian::native == std::endian::little, "a .npy '<f4' is the host's float bytes");
  if (!values.empty()) std::memcpy(out.data() + at, values.data(), values.size() * sizeof(float));
  *bytes = std::move(out);
  return Status::Ok();
}

Status EncodeNpy(const Tensor& t, std::string* bytes) {
  for (int64_t d : t.shape) {
    if (d < 0) return Status::Invalid("cannot write shape " + ShapeString(t.shape) + ": negative size");
  }
  if (NumelOf(t.shape) != t.numel()) {
    return Status::Invalid("cannot write a tensor of shape " + ShapeString(t.shape) + " holding " +
                           std::to_string(t.numel()) + " values");
  }
  NpyHeader h;
  h.shape = t.shape;
  int size = 0;
  switch (t.dtype) {
    case DType::kFloat64: h.descr = "<f8"; size = 8; break;
    case DType::kFloat32:
    case DType::kBFloat16: h.descr = "<f4"; size = 4; break;
    case DType::kFloat16: h.descr = "<f2"; size = 2; break;
    case DType::kInt64: h.descr = "<i8"; size = 8; break;
    case DType::kInt32: h.descr = "<i4"; size = 4; break;
  }
  std::string out = NpyPrefix(h);
  out.reserve(out.size() + t.data.size() * static_cast<size_t>(size));
  for (size_t i = 0; i < t.data.size(); ++i) {
    double v = t.data[i];
    auto misfit = [&] {
      return Status::Invalid("cannot write value " + std::to_string(v) + " at flat index " + std::to_string(i) +
                             " as " + DTypeName(t.dtype));
    };
    switch (t.dtype) {
      case DType::kFloat64: StoreLittleEndian(std::bit_cast<uint64_t>(v), 8, &out); break;
      case DType::kFloat32:
      case DType::kBFloat16:
        StoreLittleEndian(std::bit_cast<uint32_t>(static_cast<float>(v)), 4, &out);
        break;
      case DType::kFloat16: {
        uint16_t bits;
        if (!DoubleToHalfExact(v, &bits)) return misfit();
        StoreLittleEndian(bits, 2, &out);
        break;
      }
      case DType::kInt32:
        if (v != std::floor(v) || v < -0x1p31 || v >= 0x1p31) return misfit();
        StoreLittleEndian(static_cast<uint32_t>(static_cast<int32_t>(v)), 4, &out);
        break;
      case DType::kInt64:
        if (v != std::floor(v) || v < -0x1p63 || v >= 0x1p63) return misfit();
        StoreLittleEndian(static_cast<uint64_t>(static_cast<int64_t>(v)), 8, &out);
        break;
    }
  }
  *bytes = std::move(out);
  return Status::Ok();
}

Status WriteNpy(const std::string& path, const Tensor& t) {
  std::string bytes;
  Status st = EncodeNpy(t, &bytes);
  if (!st.ok()) return st.Prefixed(path);
  return WriteStringToFile(path, bytes);  // names a full disk; removes a partly written file
}

Status ExpectShape(const Tensor& t, std::vector<int64_t> expected, const std::string& what) {
  bool ok = t.shape.size() == expected.size();
  for (size_t i = 0; ok && i < expected.size(); ++i) ok = expected[i] < 0 || expected[i] == t.shape[i];
  if (ok) return Status::Ok();
  std::string want = "(";
  for (size_t i = 0; i < expected.size(); ++i) {
    if (i) want += ", ";
    want += expected[i] < 0 ? "N" : std::to_string(expected[i]);
  }
  want += ")";
  return Status::Invalid(what + ": expected shape " + want + ", got " + ShapeString(t.shape));
}

}  // namespace ddpcheck::core
