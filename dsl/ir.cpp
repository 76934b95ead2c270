#include "dsl/ir.h"

#include <fmt/format.h>

#include "dsl/rules.h"

namespace tj::ir {

std::string SourceLoc::str() const {
  if (!known()) return "<unknown>";
  return column > 0 ? fmt::format("{}:{}:{}", file, line, column) : fmt::format("{}:{}", file, line);
}

std::string_view name(OpKind k) {
  switch (k) {
    case OpKind::const_value: return "const";
    case OpKind::scalar_param: return "scalar_param";
    case OpKind::tensor_dim: return "tensor_dim";
    case OpKind::block_size: return "block_size";
    case OpKind::loop: return "loop";
    case OpKind::full: return "full";
    case OpKind::arange: return "arange";
    case OpKind::load: return "load";
    case OpKind::store: return "store";
    case OpKind::store_add: return "store_add";
    case OpKind::gather: return "gather";
    case OpKind::unary: return "unary";
    case OpKind::binary: return "binary";
    case OpKind::where: return "where";
    case OpKind::cast: return "cast";
    case OpKind::expand_dims: return "expand_dims";
    case OpKind::transpose: return "transpose";
    case OpKind::broadcast: return "broadcast";
    case OpKind::reduce: return "reduce";
    case OpKind::dot: return "dot";
    case OpKind::var_decl: return "var";
    case OpKind::var_read: return "read";
    case OpKind::var_write: return "write";
  }
  return "?";
}

std::string_view name(UnaryFn f) {
  switch (f) {
    case UnaryFn::neg: return "neg";
    case UnaryFn::exp2: return "exp2";
    case UnaryFn::log2: return "log2";
    case UnaryFn::exp: return "exp";
    case UnaryFn::log: return "log";
    case UnaryFn::sqrt: return "sqrt";
    case UnaryFn::rsqrt: return "rsqrt";
    case UnaryFn::abs: return "abs";
    case UnaryFn::tanh: return "tanh";
    case UnaryFn::logical_not: return "not";
  }
  return "?";
}

std::string_view name(BinaryFn f) {
  switch (f) {
    case BinaryFn::add: return "add";
    case BinaryFn::sub: return "sub";
    case BinaryFn::mul: return "mul";
    case BinaryFn::div: return "div";
    case BinaryFn::maximum: return "maximum";
    case BinaryFn::minimum: return "minimum";
    case BinaryFn::mod: return "mod";
    case BinaryFn::floordiv: return "floordiv";
    case BinaryFn::lt: return "lt";
    case BinaryFn::le: return "le";
    case BinaryFn::gt: return "gt";
    case BinaryFn::ge: return "ge";
    case BinaryFn::eq: return "eq";
    case BinaryFn::ne: return "ne";
    case BinaryFn::logical_and: return "and";
    case BinaryFn::logical_or: return "or";
  }
  return "?";
}

std::string_view name(ReduceFn f) {
  switch (f) {
    case ReduceFn::sum: return "sum";
    case ReduceFn::max: return "max";
    case ReduceFn::min: return "min";
  }
  return "?";
}

bool is_comparison(BinaryFn f) { return f >= BinaryFn::lt && f <= BinaryFn::ne; }

std::string type_str(const Function& f, const TileType& t) {
  if (t.is_scalar()) return std::string(tj::name(t.dtype));
  return fmt::format("{}{}", tj::name(t.dtype), rules::shape_str(&f, t.shape));
}

namespace {

std::string param_str(const Param& p) {
  if (!p.is_tensor()) return fmt::format("{}: {}", p.name, tj::name(p.dtype));
  std::string dims;
  for (size_t i = 0; i < p.static_shape.size(); ++i)
    dims += (i ? ", " : "") + (p.static_shape[i] < 0 ? std::string("?") : std::to_string(p.static_shape[i]));
  std::string strides;
  for (int i = 0; i < p.rank(); ++i)
    if (p.static_stride(i) >= 0) strides += fmt::format("{}{}: {}", strides.empty() ? ", strides {" : ", ", i, p.static_stride(i));
  if (!strides.empty()) strides += "}";
  const char* access = p.kind == ParamKind::tensor_in ? "in" : p.kind == ParamKind::tensor_out ? "out" : "inout";
  return fmt::format("{}: {} tensor<{}, [{}]{}>", p.name, access, tj::name(p.dtype), dims, strides);
}

void print_region(const Function& f, const Region& r, int depth, std::string& out) {
  std::string pad(2 * (depth + 1), ' ');
  auto v = [](int id) { return fmt::format("%{}", id); };
  for (const Op& op : r.ops) {
    std::string lhs = op.result >= 0 ? fmt::format("{} = ", v(op.result)) : "";
    std::string args;
    for (size_t i = 0; i < op.operands.size(); ++i) args += (i ? ", " : "") + v(op.operands[i]);
    std::string text;
    switch (op.kind) {
      case OpKind::const_value:
        text = is_int(f.type(op.result).dtype) || f.type(op.result).dtype == DType::i1 ? fmt::format("const {}", op.ival)
                                                                                       : fmt::format("const {}", op.fval);
        break;
      case OpKind::scalar_param: text = fmt::format("param {}", f.params.at(op.param).name); break;
      case OpKind::tensor_dim: text = fmt::format("dim {}, {}", f.params.at(op.param).name, op.axis); break;
      case OpKind::block_size: text = fmt::format("block_size {}", f.blocks.at(op.block_id).name); break;
      case OpKind::loop: {
        std::string kind = op.loop_kind == LoopKind::grid ? "grid" : "tile";
        std::string step = op.block_id >= 0 ? " step " + f.blocks.at(op.block_id).name : "";
        out += fmt::format("{}{} {} = {} to {}{}{} {{\n", pad, kind, v(op.body_index), v(op.operands[0]), v(op.operands[1]),
                           step, op.launch ? "  // launch" : "");
        print_region(f, *op.body, depth + 1, out);
        out += pad + "}\n";
        continue;
      }
      case OpKind::full: text = fmt::format("full {}", op.fval); break;
      case OpKind::arange: text = fmt::format("arange {} + [0, {})", args, f.blocks.at(op.block_id).name); break;
      case OpKind::load:
      case OpKind::store:
      case OpKind::store_add: {
        std::string idx;
        size_t n = op.indices.size();
        for (size_t i = 0; i < n; ++i) {
          const Index& ix = op.indices[i];
          idx += i ? ", " : "";
          if (ix.kind == Index::Kind::all) idx += ":";
          else if (ix.kind == Index::Kind::block) idx += fmt::format("{}:+{}", v(op.operands[i]), f.blocks.at(ix.block_id).name);
          else idx += v(op.operands[i]);
        }
        if (op.kind == OpKind::load) text = fmt::format("load {}[{}]", f.params.at(op.param).name, idx);
        else text = fmt::format("{} {}[{}] <- {}{}", op.kind == OpKind::store ? "store" : "store_add +=", f.params.at(op.param).name, idx, v(op.operands.at(n)),
                                op.ival == 1 ? fmt::format(" where {}", v(op.operands.at(n + 1))) : std::string());
        break;
      }
      case OpKind::gather: text = fmt::format("gather {}[{}]", f.params.at(op.param).name, args); break;
      case OpKind::unary: text = fmt::format("{} {}", name(op.unary), args); break;
      case OpKind::binary: text = fmt::format("{} {}", name(op.binary), args); break;
      case OpKind::reduce: text = fmt::format("reduce_{} {} axis {}", name(op.reduce), args, op.axis); break;
      case OpKind::expand_dims: text = fmt::format("expand_dims {} axis {}", args, op.axis); break;
      default: text = fmt::format("{} {}", name(op.kind), args); break;
    }
    std::string type = op.result >= 0 ? " : " + type_str(f, f.type(op.result)) : "";
    std::string tag = op.tag.empty() ? "" : "  #" + op.tag;
    out += fmt::format("{}{}{}{}{}\n", pad, lhs, text, type, tag);
  }
}

}  // namespace

Op copy_attributes(const Op& op) {
  Op c;
  c.kind = op.kind;
  c.loc = op.loc;
  c.fval = op.fval;
  c.ival = op.ival;
  c.param = op.param;
  c.axis = op.axis;
  c.block_id = op.block_id;
  c.unary = op.unary;
  c.binary = op.binary;
  c.reduce = op.reduce;
  c.loop_kind = op.loop_kind;
  c.launch = op.launch;
  c.indices = op.indices;
  c.tag = op.tag;
  return c;
}

Region clone(const Region& r) {
  Region out;
  out.id = r.id;
  out.ops.reserve(r.ops.size());
  for (const Op& op : r.ops) {
    Op c = copy_attributes(op);
    c.result = op.result;
    c.operands = op.operands;
    if (op.body) c.body = std::make_unique<Region>(clone(*op.body));
    c.body_index = op.body_index;
    out.ops.push_back(std::move(c));
  }
  return out;
}

Function clone(const Function& f) {
  Function out;
  out.name = f.name;
  out.params = f.params;
  out.values = f.values;
  out.blocks = f.blocks;
  out.body = clone(f.body);
  out.num_regions = f.num_regions;
  return out;
}

std::string print(const Function& f) {
  std::string params;
  for (size_t i = 0; i < f.params.size(); ++i) params += (i ? ", " : "") + param_str(f.params[i]);
  std::string out = fmt::format("kernel {}({}) {{\n", f.name, params);
  for (const auto& b : f.blocks)
    out += b.fixed > 0 ? fmt::format("  block {} = {}\n", b.name, b.fixed) : fmt::format("  block {}  // tunable\n", b.name);
  print_region(f, f.body, 0, out);
  return out + "}\n";
}

}  // namespace tj::ir
