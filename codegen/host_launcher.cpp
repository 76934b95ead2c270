// The LLVM-emitted host launcher of exported kernels (see host_launcher.h for what it does).
//
// Layout of the emitted module, for kernel NAME (every helper has internal linkage, so
// several exported objects link into one program):
//   @tj.cubin.M          the CUBIN of module M (one per distinct CUBIN + entry)
//   @tj.fn               CUfunction per (module, context slot), written once under @tj.lock
//   @tj.ctx.*            the contexts seen so far: handle, compute capability, SM count
//   @tj.msg.buf/len      thread-local detail of the last failure (NAME_last_error)
//   tj.msg.*             append text / integers / a tensor description to the message
//   tj.cuda_fail         formats "what: CUDA_ERROR_X (description)", returns TJ_ERROR_CUDA
//   tj.ctx_get           current context -> slot, compute capability, SM count
//   tj.fn_get            (module, slot) -> CUfunction, loading the module on first use
//   tj.variant.I         checks, launch extents, packing and launch of specialization I
//   NAME_launch / NAME_launch_dlpack / NAME_launchv / NAME_load / NAME_last_error /
//   NAME_specializations, and tj_status_message (weak).
#include "codegen/host_launcher.h"

#include <cuda.h>
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <unordered_map>
#include <variant>

#include <llvm/ADT/SmallVector.h>
#include <llvm/ADT/Triple.h>
#include <llvm/IR/BasicBlock.h>
#include <llvm/IR/Constants.h>
#include <llvm/IR/DerivedTypes.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/GlobalVariable.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/IR/MDBuilder.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/Verifier.h>
#include <llvm/MC/TargetRegistry.h>
#include <llvm/Object/Archive.h>
#include <llvm/Object/ArchiveWriter.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Support/Host.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>
#include <llvm/Target/TargetOptions.h>

#include "core/error.h"

namespace tj::codegen {

namespace {

static_assert(static_cast<int>(DType::f32) == 0 && static_cast<int>(DType::f16) == 1 && static_cast<int>(DType::bf16) == 2 &&
                  static_cast<int>(DType::e4m3) == 3 && static_cast<int>(DType::e5m2) == 4 &&
                  static_cast<int>(DType::i32) == 5 && static_cast<int>(DType::i64) == 6 && static_cast<int>(DType::i1) == 7,
              "tj_dtype in the exported header mirrors tj::DType");

constexpr int64_t kMsgCap = 2048;
constexpr int kNumDTypes = 8;
constexpr int64_t kMaxGrid = 0x7fffffffLL;

// tj_tensor {void* data; int32_t dtype; int32_t rank; const int64_t* shape; const int64_t* strides;}
constexpr unsigned kTensorData = 0, kTensorDType = 8, kTensorRank = 12, kTensorShape = 16, kTensorStrides = 24,
                   kTensorSize = 32;
// tj_arg {int32_t kind; int32_t reserved; union {const tj_tensor* tensor; double f; int64_t i;} value;}
constexpr unsigned kArgKind = 0, kArgValue = 8, kArgSize = 16;
enum ArgKind : int32_t { kArgTensor = 0, kArgFloat = 1, kArgInt = 2 };
// DLTensor (dlpack.h, stable ABI): data, device {type, id}, ndim, dtype {code, bits, lanes},
// shape, strides, byte_offset.
constexpr unsigned kDlData = 0, kDlDeviceType = 8, kDlNdim = 16, kDlCode = 20, kDlBits = 21, kDlLanes = 22,
                   kDlShape = 24, kDlStrides = 32, kDlByteOffset = 40;
constexpr int kDLCUDA = 2, kDLCUDAManaged = 13;

struct ArchInfo {
  int major = 0, minor = 0;
  bool specific = false;   // the 'a' suffix: this exact compute capability only
  int cc() const { return major * 10 + minor; }
  int rank() const { return cc() * 2 + (specific ? 1 : 0); }
};

ArchInfo parse_arch(const std::string& arch) {
  std::string digits;
  size_t i = arch.rfind('_');
  std::string rest = i == std::string::npos ? arch : arch.substr(i + 1);
  ArchInfo a;
  while (!rest.empty() && std::isdigit(static_cast<unsigned char>(rest.front()))) {
    digits += rest.front();
    rest.erase(rest.begin());
  }
  if (digits.size() < 2) throw Error(fmt::format("export: cannot read the architecture '{}' (expected e.g. sm_90a)", arch));
  a.major = std::stoi(digits.substr(0, digits.size() - 1));
  a.minor = digits.back() - '0';
  a.specific = rest == "a" || rest == "f";
  return a;
}

bool is_dynamic_dim(int64_t d) { return d < 0; }

int dynamic_dims(const LauncherVariant& v) {
  int n = 0;
  for (const auto& p : v.ir->params)
    for (int64_t d : p.static_shape) n += is_dynamic_dim(d);
  return n;
}

// Specializations in dispatch order: static before dynamic, the most specific architecture
// first; otherwise as given.
std::vector<size_t> dispatch_order(const LauncherKernel& k) {
  std::vector<size_t> order(k.variants.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    int da = dynamic_dims(k.variants[a]), db = dynamic_dims(k.variants[b]);
    if (da != db) return da < db;
    return parse_arch(k.variants[a].arch).rank() > parse_arch(k.variants[b].arch).rank();
  });
  return order;
}

std::string shape_str(const ir::Param& p) {
  std::vector<std::string> dims;
  for (int64_t d : p.static_shape) dims.push_back(d < 0 ? "?" : std::to_string(d));
  return fmt::format("{}[{}]", name(p.dtype), fmt::join(dims, ","));
}

std::string describe_variant(const LauncherKernel& k, const LauncherVariant& v) {
  std::vector<std::string> parts;
  size_t j = 0;
  for (size_t s = 0; s < k.slots.size(); ++s) {
    const Slot& slot = k.slots[s];
    if (slot.is_host()) {
      const ArgSpec& a = v.specs.at(s);
      if (const auto* b = std::get_if<bool>(&a)) parts.push_back(fmt::format("{}={}", slot.name, *b ? 1 : 0));
      else if (const auto* n = std::get_if<int64_t>(&a)) parts.push_back(fmt::format("{}={}", slot.name, *n));
      else if (const auto* d = std::get_if<double>(&a)) parts.push_back(fmt::format("{}={}", slot.name, *d));
      continue;
    }
    const ir::Param& p = v.ir->params.at(j++);
    if (p.is_tensor()) parts.push_back(fmt::format("{}={}", slot.name, shape_str(p)));
  }
  return fmt::format("{} {}", v.arch, fmt::join(parts, " "));
}

// One piece of a failure message.
struct Msg {
  enum Kind { text, integer, hex, tensor, real } kind;
  std::string s;
  llvm::Value* v = nullptr;
};
Msg T(std::string s) { return {Msg::text, std::move(s), nullptr}; }
Msg I(llvm::Value* v) { return {Msg::integer, {}, v}; }
Msg H(llvm::Value* v) { return {Msg::hex, {}, v}; }
Msg Tensor(llvm::Value* v) { return {Msg::tensor, {}, v}; }
Msg Real(llvm::Value* v) { return {Msg::real, {}, v}; }

class Emitter {
 public:
  Emitter(llvm::LLVMContext& ctx, const LauncherKernel& k, const HostLauncherOptions& o, llvm::TargetMachine* tm)
      : ctx_(ctx), k_(k), opt_(o), B_(ctx) {
    ctx_.setOpaquePointers(true);
    name_ = c_identifier(k.name);
    m_ = std::make_unique<llvm::Module>(name_ + ".tilejit", ctx_);
    if (tm) {   // before any IR: loads and stores take their alignment from the data layout
      m_->setTargetTriple(tm->getTargetTriple().str());
      m_->setDataLayout(tm->createDataLayout());
    }
    i1_ = llvm::Type::getInt1Ty(ctx_);
    i8_ = llvm::Type::getInt8Ty(ctx_);
    i16_ = llvm::Type::getInt16Ty(ctx_);
    i32_ = llvm::Type::getInt32Ty(ctx_);
    i64_ = llvm::Type::getInt64Ty(ctx_);
    f32_ = llvm::Type::getFloatTy(ctx_);
    f64_ = llvm::Type::getDoubleTy(ctx_);
    ptr_ = llvm::PointerType::get(ctx_, 0);
    void_ = llvm::Type::getVoidTy(ctx_);
  }

  std::unique_ptr<llvm::Module> run() {
    validate();
    compute_slot_types();
    order_ = dispatch_order(k_);
    listing_ = describe_variants(k_);
    collect_modules();
    declare_globals();
    build_messages();
    build_lock();
    build_ctx_get();
    build_fn_get();
    build_status_message();
    for (size_t i = 0; i < k_.variants.size(); ++i) variant_fns_.push_back(build_variant(i));
    build_launch();
    build_dlpack();
    build_launchv();
    build_load();
    build_info();
    std::string err;
    llvm::raw_string_ostream os(err);
    if (llvm::verifyModule(*m_, &os))
      throw Error(fmt::format("export: internal error: the launcher of '{}' does not verify: {}", k_.name, os.str()));
    return std::move(m_);
  }

 private:
  llvm::LLVMContext& ctx_;
  const LauncherKernel& k_;
  const HostLauncherOptions& opt_;
  llvm::IRBuilder<> B_;
  std::unique_ptr<llvm::Module> m_;
  std::string name_;
  llvm::Type *i1_, *i8_, *i16_, *i32_, *i64_, *f32_, *f64_, *void_;
  llvm::PointerType* ptr_;

  std::vector<size_t> order_;
  std::string listing_;
  // Distinct (CUBIN, entry) pairs and which one each variant uses.
  struct ModuleInfo {
    std::string_view cubin;
    std::string entry;
    int64_t smem = 0;
    std::string arch;
  };
  std::vector<ModuleInfo> modules_;
  std::vector<int> variant_module_;

  std::map<std::string, llvm::Constant*> strings_;
  llvm::GlobalVariable *lock_ = nullptr, *nctx_ = nullptr, *ctx_handles_ = nullptr, *ctx_cc_ = nullptr,
                       *ctx_sms_ = nullptr, *fn_table_ = nullptr, *msg_buf_ = nullptr, *msg_len_ = nullptr,
                       *cubins_ = nullptr, *entries_ = nullptr, *smems_ = nullptr, *dtype_names_ = nullptr;
  llvm::Function *msg_begin_ = nullptr, *msg_str_ = nullptr, *msg_i64_ = nullptr, *msg_hex_ = nullptr,
                 *msg_f64_ = nullptr, *msg_tensor_ = nullptr, *cuda_fail_ = nullptr, *lock_fn_ = nullptr,
                 *unlock_fn_ = nullptr, *ctx_get_ = nullptr, *fn_get_ = nullptr, *launch_ = nullptr;
  std::vector<llvm::Function*> variant_fns_;
  std::vector<llvm::Type*> slot_types_;
  std::vector<llvm::Type*> dlpack_types_;

  // ---- helpers ----------------------------------------------------------------------------

  llvm::ConstantInt* c32(int64_t v) { return llvm::ConstantInt::get(llvm::cast<llvm::IntegerType>(i32_), v, true); }
  llvm::ConstantInt* c64(int64_t v) { return llvm::ConstantInt::get(llvm::cast<llvm::IntegerType>(i64_), v, true); }
  llvm::Constant* null() { return llvm::ConstantPointerNull::get(ptr_); }

  llvm::Constant* str(const std::string& s) {
    auto it = strings_.find(s);
    if (it != strings_.end()) return it->second;
    auto* init = llvm::ConstantDataArray::getString(ctx_, s, true);
    auto* gv = new llvm::GlobalVariable(*m_, init->getType(), true, llvm::GlobalValue::PrivateLinkage, init, ".str");
    gv->setUnnamedAddr(llvm::GlobalValue::UnnamedAddr::Global);
    gv->setAlignment(llvm::Align(1));
    strings_[s] = gv;
    return gv;
  }

  llvm::Function* declare(const char* name, llvm::Type* ret, std::vector<llvm::Type*> params, bool vararg = false) {
    auto* ft = llvm::FunctionType::get(ret, params, vararg);
    auto callee = m_->getOrInsertFunction(name, ft);
    auto* f = llvm::cast<llvm::Function>(callee.getCallee());
    f->addFnAttr(llvm::Attribute::NoUnwind);
    return f;
  }
  llvm::Function* cu(const char* name) {
    // Every driver function returns CUresult (an int); parameters as below.
    static const std::map<std::string, std::vector<char>> sigs = {
        // p: pointer, i: 32-bit int, l: 64-bit int
        {"cuCtxGetCurrent", {'p'}},
        {"cuCtxGetDevice", {'p'}},
        {"cuDeviceGetAttribute", {'p', 'i', 'i'}},
        {"cuModuleLoadData", {'p', 'p'}},
        {"cuModuleGetFunction", {'p', 'p', 'p'}},
        {"cuFuncSetAttribute", {'p', 'i', 'i'}},
        {"cuOccupancyMaxActiveBlocksPerMultiprocessor", {'p', 'p', 'i', 'l'}},
        {"cuLaunchKernel", {'p', 'i', 'i', 'i', 'i', 'i', 'i', 'i', 'p', 'p', 'p'}},
        {"cuLaunchKernelEx", {'p', 'p', 'p', 'p'}},
        {"cuTensorMapEncodeTiled", {'p', 'i', 'i', 'p', 'p', 'p', 'p', 'p', 'i', 'i', 'i', 'i'}},
        {"cuGetErrorName", {'i', 'p'}},
        {"cuGetErrorString", {'i', 'p'}},
    };
    std::vector<llvm::Type*> params;
    for (char c : sigs.at(name)) params.push_back(c == 'p' ? static_cast<llvm::Type*>(ptr_) : c == 'i' ? i32_ : i64_);
    return declare(name, i32_, params);
  }

  llvm::Function* make_fn(const std::string& name, llvm::Type* ret, std::vector<llvm::Type*> params, bool exported) {
    auto* f = llvm::Function::Create(llvm::FunctionType::get(ret, params, false),
                                     exported ? llvm::GlobalValue::ExternalLinkage : llvm::GlobalValue::InternalLinkage,
                                     name, *m_);
    f->addFnAttr(llvm::Attribute::NoUnwind);
    f->setUWTableKind(llvm::UWTableKind::Async);
    B_.SetInsertPoint(llvm::BasicBlock::Create(ctx_, "entry", f));
    return f;
  }

  llvm::BasicBlock* block(const char* name) { return llvm::BasicBlock::Create(ctx_, name, B_.GetInsertBlock()->getParent()); }

  llvm::Value* field_ptr(llvm::Value* base, unsigned offset) {
    return offset == 0 ? base : B_.CreateConstInBoundsGEP1_64(i8_, base, offset);
  }
  llvm::Value* load(llvm::Type* t, llvm::Value* base, unsigned offset) { return B_.CreateLoad(t, field_ptr(base, offset)); }
  llvm::Value* at(llvm::Type* elem, llvm::Value* array, llvm::Value* index) { return B_.CreateInBoundsGEP(elem, array, index); }

  llvm::Value* alloca_bytes(uint64_t bytes, unsigned align, const char* name) {
    llvm::IRBuilder<> eb(&B_.GetInsertBlock()->getParent()->getEntryBlock(),
                         B_.GetInsertBlock()->getParent()->getEntryBlock().begin());
    auto* a = eb.CreateAlloca(llvm::ArrayType::get(i8_, bytes), nullptr, name);
    a->setAlignment(llvm::Align(align));
    return a;
  }
  llvm::AllocaInst* alloca_of(llvm::Type* t, const char* name, unsigned count = 1) {
    llvm::IRBuilder<> eb(&B_.GetInsertBlock()->getParent()->getEntryBlock(),
                         B_.GetInsertBlock()->getParent()->getEntryBlock().begin());
    auto* a = eb.CreateAlloca(count == 1 ? t : llvm::ArrayType::get(t, count), nullptr, name);
    a->setAlignment(llvm::Align(8));
    return a;
  }

  void emit_message(const std::vector<Msg>& parts) {
    B_.CreateCall(msg_begin_);
    for (const Msg& m : parts) {
      switch (m.kind) {
        case Msg::text: B_.CreateCall(msg_str_, {str(m.s)}); break;
        case Msg::integer: B_.CreateCall(msg_i64_, {B_.CreateSExtOrTrunc(m.v, i64_)}); break;
        case Msg::hex: B_.CreateCall(msg_hex_, {m.v->getType()->isPointerTy() ? B_.CreatePtrToInt(m.v, i64_) : m.v}); break;
        case Msg::real: B_.CreateCall(msg_f64_, {m.v->getType()->isFloatTy() ? B_.CreateFPExt(m.v, f64_) : m.v}); break;
        case Msg::tensor: B_.CreateCall(msg_tensor_, {m.v}); break;
      }
    }
  }

  // if (bad) { message; [unlock]; return status; }
  void fail_if(llvm::Value* bad, LaunchStatus status, const std::vector<Msg>& parts, bool unlock = false) {
    auto* fail = block("fail");
    auto* cont = block("ok");
    llvm::MDBuilder md(ctx_);
    B_.CreateCondBr(bad, fail, cont, md.createBranchWeights(1, 1 << 20));
    B_.SetInsertPoint(fail);
    if (unlock) B_.CreateCall(unlock_fn_);
    emit_message(parts);
    B_.CreateRet(c32(static_cast<int>(status)));
    B_.SetInsertPoint(cont);
  }
  void fail_now(LaunchStatus status, const std::vector<Msg>& parts) {
    emit_message(parts);
    B_.CreateRet(c32(static_cast<int>(status)));
  }
  // if (result != CUDA_SUCCESS) { [unlock]; return cuda_fail(result, what); }
  void check_cuda(llvm::Value* result, const std::string& what, bool unlock = false) {
    auto* fail = block("cuda_fail");
    auto* cont = block("cuda_ok");
    llvm::MDBuilder md(ctx_);
    B_.CreateCondBr(B_.CreateICmpNE(result, c32(0)), fail, cont, md.createBranchWeights(1, 1 << 20));
    B_.SetInsertPoint(fail);
    if (unlock) B_.CreateCall(unlock_fn_);
    B_.CreateRet(B_.CreateCall(cuda_fail_, {result, str(what)}));
    B_.SetInsertPoint(cont);
  }
  // if (status != 0) return status;
  void propagate(llvm::Value* status) {
    auto* fail = block("propagate");
    auto* cont = block("next");
    llvm::MDBuilder md(ctx_);
    B_.CreateCondBr(B_.CreateICmpNE(status, c32(0)), fail, cont, md.createBranchWeights(1, 1 << 20));
    B_.SetInsertPoint(fail);
    B_.CreateRet(status);
    B_.SetInsertPoint(cont);
  }

  llvm::LoadInst* atomic_load(llvm::Type* t, llvm::Value* p, llvm::AtomicOrdering o, unsigned align) {
    auto* l = B_.CreateLoad(t, p);
    l->setAtomic(o);
    l->setAlignment(llvm::Align(align));
    return l;
  }
  void atomic_store(llvm::Value* v, llvm::Value* p, llvm::AtomicOrdering o, unsigned align) {
    auto* s = B_.CreateStore(v, p);
    s->setAtomic(o);
    s->setAlignment(llvm::Align(align));
  }

  // cc compatible with a CUBIN for `arch`: sm_90a needs exactly 9.0, sm_80 any 8.x >= 8.0.
  llvm::Value* arch_ok(llvm::Value* cc, const std::string& arch) {
    ArchInfo a = parse_arch(arch);
    if (a.specific) return B_.CreateICmpEQ(cc, c32(a.cc()));
    return B_.CreateAnd(B_.CreateICmpSGE(cc, c32(a.cc())), B_.CreateICmpSLT(cc, c32((a.major + 1) * 10)));
  }

  // ---- structure --------------------------------------------------------------------------

  void validate() {
    if (k_.variants.empty()) throw Error(fmt::format("export: kernel '{}' has no specialization to export", k_.name));
    size_t non_host = 0;
    for (const Slot& s : k_.slots) non_host += !s.is_host();
    for (const auto& v : k_.variants) {
      if (!v.ir || !v.config || !v.kernel || v.cubin.empty())
        throw Error(fmt::format("export: kernel '{}': a specialization lacks its IR, config, code or CUBIN", k_.name));
      if (v.specs.size() != k_.slots.size())
        throw Error(fmt::format("export: kernel '{}': a specialization has {} argument specs for {} parameters", k_.name,
                                v.specs.size(), k_.slots.size()));
      if (v.ir->params.size() != non_host)
        throw Error(fmt::format("export: kernel '{}': the IR has {} parameters, the kernel {} tensor/scalar slots", k_.name,
                                v.ir->params.size(), non_host));
      size_t j = 0;
      for (const Slot& s : k_.slots) {
        if (s.is_host()) continue;
        const ir::Param& p = v.ir->params[j++];
        if (s.is_tensor() != p.is_tensor() || (!s.is_tensor() && p.kind != ir::ParamKind::scalar_f32))
          throw Error(fmt::format("export: kernel '{}': parameter '{}' of the IR does not match the kernel's slot '{}'",
                                  k_.name, p.name, s.name));
        if (p.is_tensor() && p.rank() > 8)
          throw Error(fmt::format("export: kernel '{}': tensor '{}' has rank {}; the launcher supports up to 8", k_.name,
                                  p.name, p.rank()));
      }
      parse_arch(v.arch);
      for (const TmaOperand& op : v.kernel->tma) {
        if (op.param < 0 || op.param >= static_cast<int>(v.ir->params.size()) || !v.ir->params[op.param].is_tensor())
          throw Error(fmt::format("export: kernel '{}': a TMA operand names parameter {}, not a tensor", k_.name, op.param));
        const ir::Param& p = v.ir->params[op.param];
        if (static_cast<int>(op.box.size()) != p.rank())
          throw Error(fmt::format("export: kernel '{}': the TMA box of '{}' has {} dims for rank {}", k_.name, p.name,
                                  op.box.size(), p.rank()));
        if (p.rank() > 5) throw Error(fmt::format("export: kernel '{}': TMA on '{}' needs more than 5 dims", k_.name, p.name));
        for (int b : op.box)
          if (b < 1 || b > 256)
            throw Error(fmt::format("export: kernel '{}': TMA box size {} of '{}' is outside [1, 256]", k_.name, b, p.name));
        if (!op.element_strides.empty() && op.element_strides.size() != op.box.size())
          throw Error(fmt::format("export: kernel '{}': the TMA traversal strides of '{}' have {} dims for rank {}", k_.name,
                                  p.name, op.element_strides.size(), p.rank()));
        for (size_t d = 0; d < op.element_strides.size(); ++d)
          if (op.element_strides[d] < 1 || op.element_strides[d] > 8)
            throw Error(fmt::format("export: kernel '{}': TMA traversal stride {} of '{}' (dim {}) is outside [1, 8]",
                                    k_.name, op.element_strides[d], p.name, d));
      }
    }
  }

  void collect_modules() {
    std::map<std::pair<std::string_view, std::string>, int> seen;
    for (const auto& v : k_.variants) {
      auto key = std::make_pair(v.cubin, v.kernel->entry);
      auto it = seen.find(key);
      if (it == seen.end()) {
        it = seen.emplace(key, static_cast<int>(modules_.size())).first;
        modules_.push_back({v.cubin, v.kernel->entry, static_cast<int64_t>(v.kernel->dynamic_smem_bytes), v.arch});
      }
      variant_module_.push_back(it->second);
    }
  }

  void declare_globals() {
    auto internal = llvm::GlobalValue::InternalLinkage;
    auto zero = [](llvm::Type* t) { return llvm::Constant::getNullValue(t); };
    lock_ = new llvm::GlobalVariable(*m_, i32_, false, internal, zero(i32_), "tj.lock");
    lock_->setAlignment(llvm::Align(4));
    nctx_ = new llvm::GlobalVariable(*m_, i32_, false, internal, zero(i32_), "tj.ctx.count");
    nctx_->setAlignment(llvm::Align(4));
    auto* handles_t = llvm::ArrayType::get(ptr_, kMaxLauncherContexts);
    auto* ints_t = llvm::ArrayType::get(i32_, kMaxLauncherContexts);
    ctx_handles_ = new llvm::GlobalVariable(*m_, handles_t, false, internal, zero(handles_t), "tj.ctx.handle");
    ctx_cc_ = new llvm::GlobalVariable(*m_, ints_t, false, internal, zero(ints_t), "tj.ctx.cc");
    ctx_sms_ = new llvm::GlobalVariable(*m_, ints_t, false, internal, zero(ints_t), "tj.ctx.sms");
    auto* fn_t = llvm::ArrayType::get(ptr_, modules_.size() * kMaxLauncherContexts);
    fn_table_ = new llvm::GlobalVariable(*m_, fn_t, false, internal, zero(fn_t), "tj.fn");
    fn_table_->setAlignment(llvm::Align(8));
    auto* buf_t = llvm::ArrayType::get(i8_, kMsgCap);
    msg_buf_ = new llvm::GlobalVariable(*m_, buf_t, false, internal, zero(buf_t), "tj.msg.buf", nullptr,
                                       llvm::GlobalValue::GeneralDynamicTLSModel);
    msg_len_ = new llvm::GlobalVariable(*m_, i64_, false, internal, zero(i64_), "tj.msg.len", nullptr,
                                       llvm::GlobalValue::GeneralDynamicTLSModel);

    std::vector<llvm::Constant*> cubin_ptrs, entry_ptrs, smems;
    for (size_t m = 0; m < modules_.size(); ++m) {
      const auto& mi = modules_[m];
      auto* data = llvm::ConstantDataArray::get(
          ctx_, llvm::ArrayRef<uint8_t>(reinterpret_cast<const uint8_t*>(mi.cubin.data()), mi.cubin.size()));
      auto* gv = new llvm::GlobalVariable(*m_, data->getType(), true, llvm::GlobalValue::PrivateLinkage, data,
                                          fmt::format("tj.cubin.{}", m));
      gv->setAlignment(llvm::Align(64));
      cubin_ptrs.push_back(gv);
      entry_ptrs.push_back(str(mi.entry));
      smems.push_back(c32(mi.smem));
    }
    auto table = [&](const char* n, llvm::Type* elem, std::vector<llvm::Constant*> values) {
      auto* t = llvm::ArrayType::get(elem, values.size());
      auto* gv = new llvm::GlobalVariable(*m_, t, true, llvm::GlobalValue::PrivateLinkage, llvm::ConstantArray::get(t, values), n);
      gv->setUnnamedAddr(llvm::GlobalValue::UnnamedAddr::Global);
      return gv;
    };
    cubins_ = table("tj.cubins", ptr_, cubin_ptrs);
    entries_ = table("tj.entries", ptr_, entry_ptrs);
    smems_ = table("tj.smem", i32_, smems);
    std::vector<llvm::Constant*> names;
    for (int t = 0; t < kNumDTypes; ++t) names.push_back(str(std::string(name(static_cast<DType>(t)))));
    dtype_names_ = table("tj.dtype_names", ptr_, names);
  }

  // ---- messages -----------------------------------------------------------------------------

  llvm::Function* build_append(const char* fname, const char* format, llvm::Type* arg) {
    auto* snprintf_fn = declare("snprintf", i32_, {ptr_, i64_, ptr_}, true);
    auto* f = make_fn(fname, void_, {arg}, false);
    llvm::Value* len = B_.CreateLoad(i64_, msg_len_);
    llvm::Value* room = B_.CreateSub(c64(kMsgCap), len);
    llvm::Value* n = B_.CreateCall(snprintf_fn, {at(i8_, msg_buf_, len), room, str(format), f->getArg(0)});
    llvm::Value* grown = B_.CreateAdd(len, B_.CreateSExt(B_.CreateSelect(B_.CreateICmpSLT(n, c32(0)), c32(0), n), i64_));
    llvm::Value* capped = B_.CreateSelect(B_.CreateICmpSGT(grown, c64(kMsgCap - 1)), c64(kMsgCap - 1), grown);
    B_.CreateStore(capped, msg_len_);
    B_.CreateRetVoid();
    return f;
  }

  void build_messages() {
    msg_str_ = build_append("tj.msg.str", "%s", ptr_);
    msg_i64_ = build_append("tj.msg.i64", "%lld", i64_);
    msg_hex_ = build_append("tj.msg.hex", "0x%llx", i64_);
    msg_f64_ = build_append("tj.msg.f64", "%g", f64_);

    msg_begin_ = make_fn("tj.msg.begin", void_, {}, false);
    B_.CreateStore(c64(0), msg_len_);
    B_.CreateStore(llvm::ConstantInt::get(i8_, 0), msg_buf_);
    B_.CreateCall(msg_str_, {str(name_ + ": ")});
    B_.CreateRetVoid();

    // "bf16[2,4,128,64]" from a tj_tensor
    msg_tensor_ = make_fn("tj.msg.tensor", void_, {ptr_}, false);
    {
      llvm::Value* t = msg_tensor_->getArg(0);
      llvm::Value* dt = load(i32_, t, kTensorDType);
      llvm::Value* rank = load(i32_, t, kTensorRank);
      llvm::Value* shape = load(ptr_, t, kTensorShape);
      auto* known = block("known");
      auto* unknown = block("unknown");
      auto* dims = block("dims");
      B_.CreateCondBr(B_.CreateICmpULT(dt, c32(kNumDTypes)), known, unknown);
      B_.SetInsertPoint(known);
      B_.CreateCall(msg_str_, {B_.CreateLoad(ptr_, at(ptr_, dtype_names_, B_.CreateZExt(dt, i64_)))});
      B_.CreateBr(dims);
      B_.SetInsertPoint(unknown);
      B_.CreateCall(msg_str_, {str("dtype")});
      B_.CreateCall(msg_i64_, {B_.CreateSExt(dt, i64_)});
      B_.CreateBr(dims);
      B_.SetInsertPoint(dims);
      B_.CreateCall(msg_str_, {str("[")});
      auto* bad = block("bad_rank");
      auto* loop_pre = block("loop_pre");
      auto* loop = block("loop");
      auto* body = block("body");
      auto* done = block("done");
      llvm::Value* rank_bad = B_.CreateOr(B_.CreateICmpUGT(rank, c32(16)),
                                          B_.CreateAnd(B_.CreateICmpSGT(rank, c32(0)), B_.CreateICmpEQ(shape, null())));
      B_.CreateCondBr(rank_bad, bad, loop_pre);
      B_.SetInsertPoint(bad);
      B_.CreateCall(msg_str_, {str("rank ")});
      B_.CreateCall(msg_i64_, {B_.CreateSExt(rank, i64_)});
      B_.CreateBr(done);
      B_.SetInsertPoint(loop_pre);
      B_.CreateBr(loop);
      B_.SetInsertPoint(loop);
      auto* i = B_.CreatePHI(i32_, 2, "i");
      i->addIncoming(c32(0), loop_pre);
      B_.CreateCondBr(B_.CreateICmpSLT(i, rank), body, done);
      B_.SetInsertPoint(body);
      auto* sep = block("sep");
      auto* num = block("num");
      B_.CreateCondBr(B_.CreateICmpSGT(i, c32(0)), sep, num);
      B_.SetInsertPoint(sep);
      B_.CreateCall(msg_str_, {str(",")});
      B_.CreateBr(num);
      B_.SetInsertPoint(num);
      B_.CreateCall(msg_i64_, {B_.CreateLoad(i64_, at(i64_, shape, B_.CreateSExt(i, i64_)))});
      i->addIncoming(B_.CreateAdd(i, c32(1)), num);
      B_.CreateBr(loop);
      B_.SetInsertPoint(done);
      B_.CreateCall(msg_str_, {str("]")});
      B_.CreateRetVoid();
    }

    // cuda_fail(result, what): "what: CUDA_ERROR_X (description)"; returns TJ_ERROR_CUDA.
    cuda_fail_ = make_fn("tj.cuda_fail", i32_, {i32_, ptr_}, false);
    {
      llvm::Value* r = cuda_fail_->getArg(0);
      auto* name_slot = alloca_of(ptr_, "name");
      auto* desc_slot = alloca_of(ptr_, "desc");
      B_.CreateStore(null(), name_slot);
      B_.CreateStore(null(), desc_slot);
      B_.CreateCall(cu("cuGetErrorName"), {r, name_slot});
      B_.CreateCall(cu("cuGetErrorString"), {r, desc_slot});
      llvm::Value* n = B_.CreateLoad(ptr_, name_slot);
      llvm::Value* d = B_.CreateLoad(ptr_, desc_slot);
      B_.CreateCall(msg_begin_);
      B_.CreateCall(msg_str_, {cuda_fail_->getArg(1)});
      B_.CreateCall(msg_str_, {str(": ")});
      auto* named = block("named");
      auto* unnamed = block("unnamed");
      auto* desc = block("desc");
      auto* end = block("end");
      B_.CreateCondBr(B_.CreateICmpNE(n, null()), named, unnamed);
      B_.SetInsertPoint(named);
      B_.CreateCall(msg_str_, {n});
      B_.CreateBr(desc);
      B_.SetInsertPoint(unnamed);
      B_.CreateCall(msg_str_, {str("CUDA error ")});
      B_.CreateCall(msg_i64_, {B_.CreateSExt(r, i64_)});
      B_.CreateBr(desc);
      B_.SetInsertPoint(desc);
      auto* with_desc = block("with_desc");
      B_.CreateCondBr(B_.CreateICmpNE(d, null()), with_desc, end);
      B_.SetInsertPoint(with_desc);
      B_.CreateCall(msg_str_, {str(" (")});
      B_.CreateCall(msg_str_, {d});
      B_.CreateCall(msg_str_, {str(")")});
      B_.CreateBr(end);
      B_.SetInsertPoint(end);
      B_.CreateRet(c32(static_cast<int>(LaunchStatus::cuda)));
    }
  }

  // ---- lock, contexts, modules ----------------------------------------------------------------

  void build_lock() {
    auto* yield = declare("sched_yield", i32_, {});
    lock_fn_ = make_fn("tj.lock.acquire", void_, {}, false);
    {
      auto* loop = block("spin");
      auto* wait = block("wait");
      auto* done = block("done");
      B_.CreateBr(loop);
      B_.SetInsertPoint(loop);
      auto* x = B_.CreateAtomicCmpXchg(lock_, c32(0), c32(1), llvm::MaybeAlign(4), llvm::AtomicOrdering::Acquire,
                                       llvm::AtomicOrdering::Monotonic);
      B_.CreateCondBr(B_.CreateExtractValue(x, 1), done, wait);
      B_.SetInsertPoint(wait);
      B_.CreateCall(yield);
      B_.CreateBr(loop);
      B_.SetInsertPoint(done);
      B_.CreateRetVoid();
    }
    unlock_fn_ = make_fn("tj.lock.release", void_, {}, false);
    atomic_store(c32(0), lock_, llvm::AtomicOrdering::Release, 4);
    B_.CreateRetVoid();
  }

  // i32 tj.ctx_get(i32* slot, i32* cc, i32* sms)
  void build_ctx_get() {
    ctx_get_ = make_fn("tj.ctx_get", i32_, {ptr_, ptr_, ptr_}, false);
    llvm::Function* F = ctx_get_;
    auto* ctx_slot = alloca_of(ptr_, "ctx");
    B_.CreateStore(null(), ctx_slot);
    check_cuda(B_.CreateCall(cu("cuCtxGetCurrent"), {ctx_slot}), "cuCtxGetCurrent");
    llvm::Value* ctx = B_.CreateLoad(ptr_, ctx_slot);
    fail_if(B_.CreateICmpEQ(ctx, null()), LaunchStatus::no_context,
            {T("no CUDA context is current on this thread (make one current with cuCtxSetCurrent, or use the CUDA "
               "runtime first)")});
    auto* found = block("found");
    auto* idx_slot = alloca_of(i32_, "idx");

    // Lock-free lookup among the published entries.
    llvm::Value* n = atomic_load(i32_, nctx_, llvm::AtomicOrdering::Acquire, 4);
    auto scan = [&](llvm::Value* begin, llvm::Value* end, llvm::BasicBlock* not_found) {
      auto* pre = B_.GetInsertBlock();
      auto* loop = block("scan");
      auto* body = block("scan_body");
      B_.CreateBr(loop);
      B_.SetInsertPoint(loop);
      auto* i = B_.CreatePHI(i32_, 2, "i");
      i->addIncoming(begin, pre);
      B_.CreateCondBr(B_.CreateICmpSLT(i, end), body, not_found);
      B_.SetInsertPoint(body);
      llvm::Value* h = B_.CreateLoad(ptr_, at(ptr_, ctx_handles_, B_.CreateZExt(i, i64_)));
      auto* next = block("scan_next");
      auto* hit = block("scan_hit");
      B_.CreateCondBr(B_.CreateICmpEQ(h, ctx), hit, next);
      B_.SetInsertPoint(hit);
      B_.CreateStore(i, idx_slot);
      B_.CreateBr(found);
      B_.SetInsertPoint(next);
      i->addIncoming(B_.CreateAdd(i, c32(1)), next);
      B_.CreateBr(loop);
    };
    auto* slow = block("slow");
    scan(c32(0), n, slow);

    // Slow path: under the lock, look again (another thread may have added it), then add it.
    B_.SetInsertPoint(slow);
    B_.CreateCall(lock_fn_);
    llvm::Value* n2 = atomic_load(i32_, nctx_, llvm::AtomicOrdering::Monotonic, 4);
    auto* found_locked = block("found_locked");
    auto* add = block("add");
    {
      // Entries [n, n2) were added meanwhile.
      auto* pre = B_.GetInsertBlock();
      auto* loop = block("rescan");
      auto* body = block("rescan_body");
      B_.CreateBr(loop);
      B_.SetInsertPoint(loop);
      auto* i = B_.CreatePHI(i32_, 2, "j");
      i->addIncoming(n, pre);
      B_.CreateCondBr(B_.CreateICmpSLT(i, n2), body, add);
      B_.SetInsertPoint(body);
      llvm::Value* h = B_.CreateLoad(ptr_, at(ptr_, ctx_handles_, B_.CreateZExt(i, i64_)));
      auto* next = block("rescan_next");
      auto* hit = block("rescan_hit");
      B_.CreateCondBr(B_.CreateICmpEQ(h, ctx), hit, next);
      B_.SetInsertPoint(hit);
      B_.CreateStore(i, idx_slot);
      B_.CreateBr(found_locked);
      B_.SetInsertPoint(next);
      i->addIncoming(B_.CreateAdd(i, c32(1)), next);
      B_.CreateBr(loop);
    }
    B_.SetInsertPoint(found_locked);
    B_.CreateCall(unlock_fn_);
    B_.CreateBr(found);

    B_.SetInsertPoint(add);
    fail_if(B_.CreateICmpSGE(n2, c32(kMaxLauncherContexts)), LaunchStatus::too_many_contexts,
            {T(fmt::format("more than {} CUDA contexts used this launcher", kMaxLauncherContexts))}, true);
    auto* dev = alloca_of(i32_, "dev");
    auto* major = alloca_of(i32_, "major");
    auto* minor = alloca_of(i32_, "minor");
    auto* sms = alloca_of(i32_, "sms");
    check_cuda(B_.CreateCall(cu("cuCtxGetDevice"), {dev}), "cuCtxGetDevice", true);
    llvm::Value* d = B_.CreateLoad(i32_, dev);
    check_cuda(B_.CreateCall(cu("cuDeviceGetAttribute"), {major, c32(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR), d}),
               "cuDeviceGetAttribute(COMPUTE_CAPABILITY_MAJOR)", true);
    check_cuda(B_.CreateCall(cu("cuDeviceGetAttribute"), {minor, c32(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR), d}),
               "cuDeviceGetAttribute(COMPUTE_CAPABILITY_MINOR)", true);
    check_cuda(B_.CreateCall(cu("cuDeviceGetAttribute"), {sms, c32(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT), d}),
               "cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)", true);
    llvm::Value* idx64 = B_.CreateZExt(n2, i64_);
    B_.CreateStore(ctx, at(ptr_, ctx_handles_, idx64));
    B_.CreateStore(B_.CreateAdd(B_.CreateMul(B_.CreateLoad(i32_, major), c32(10)), B_.CreateLoad(i32_, minor)),
                   at(i32_, ctx_cc_, idx64));
    B_.CreateStore(B_.CreateLoad(i32_, sms), at(i32_, ctx_sms_, idx64));
    atomic_store(B_.CreateAdd(n2, c32(1)), nctx_, llvm::AtomicOrdering::Release, 4);
    B_.CreateStore(n2, idx_slot);
    B_.CreateCall(unlock_fn_);
    B_.CreateBr(found);

    B_.SetInsertPoint(found);
    llvm::Value* idx = B_.CreateLoad(i32_, idx_slot);
    llvm::Value* idx64b = B_.CreateZExt(idx, i64_);
    B_.CreateStore(idx, F->getArg(0));
    B_.CreateStore(B_.CreateLoad(i32_, at(i32_, ctx_cc_, idx64b)), F->getArg(1));
    B_.CreateStore(B_.CreateLoad(i32_, at(i32_, ctx_sms_, idx64b)), F->getArg(2));
    B_.CreateRet(c32(0));
  }

  // i32 tj.fn_get(i32 module, i32 slot, CUfunction* out)
  void build_fn_get() {
    fn_get_ = make_fn("tj.fn_get", i32_, {i32_, i32_, ptr_}, false);
    llvm::Function* F = fn_get_;
    llvm::Value* m = B_.CreateZExt(F->getArg(0), i64_);
    llvm::Value* idx = B_.CreateAdd(B_.CreateMul(m, c64(kMaxLauncherContexts)), B_.CreateZExt(F->getArg(1), i64_));
    llvm::Value* slot = at(ptr_, fn_table_, idx);
    llvm::Value* fn = atomic_load(ptr_, slot, llvm::AtomicOrdering::Acquire, 8);
    auto* have = block("have");
    auto* slow = block("load_module");
    llvm::MDBuilder md(ctx_);
    B_.CreateCondBr(B_.CreateICmpNE(fn, null()), have, slow, md.createBranchWeights(1 << 20, 1));
    B_.SetInsertPoint(have);
    B_.CreateStore(fn, F->getArg(2));
    B_.CreateRet(c32(0));

    B_.SetInsertPoint(slow);
    B_.CreateCall(lock_fn_);
    llvm::Value* again = atomic_load(ptr_, slot, llvm::AtomicOrdering::Monotonic, 8);
    auto* have_locked = block("have_locked");
    auto* do_load = block("do_load");
    B_.CreateCondBr(B_.CreateICmpNE(again, null()), have_locked, do_load);
    B_.SetInsertPoint(have_locked);
    B_.CreateCall(unlock_fn_);
    B_.CreateStore(again, F->getArg(2));
    B_.CreateRet(c32(0));

    B_.SetInsertPoint(do_load);
    auto* mod_slot = alloca_of(ptr_, "module");
    auto* fn_slot = alloca_of(ptr_, "function");
    llvm::Value* image = B_.CreateLoad(ptr_, at(ptr_, cubins_, m));
    check_cuda(B_.CreateCall(cu("cuModuleLoadData"), {mod_slot, image}),
               fmt::format("cuModuleLoadData (kernel {}; is the CUBIN's architecture this GPU's?)", k_.name), true);
    llvm::Value* entry = B_.CreateLoad(ptr_, at(ptr_, entries_, m));
    check_cuda(B_.CreateCall(cu("cuModuleGetFunction"), {fn_slot, B_.CreateLoad(ptr_, mod_slot), entry}),
               "cuModuleGetFunction", true);
    llvm::Value* loaded = B_.CreateLoad(ptr_, fn_slot);
    llvm::Value* smem = B_.CreateLoad(i32_, at(i32_, smems_, m));
    auto* optin = block("smem_optin");
    auto* publish = block("publish");
    // Opted in for any dynamic shared memory: a kernel's static shared memory counts against the 48
    // KiB a launch gets without asking too (the sm_90a attention kernels keep some arrays static).
    B_.CreateCondBr(B_.CreateICmpSGT(smem, c32(0)), optin, publish);
    B_.SetInsertPoint(optin);
    check_cuda(B_.CreateCall(cu("cuFuncSetAttribute"), {loaded, c32(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES), smem}),
               "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES) (does this GPU have that much shared memory per block?)",
               true);
    B_.CreateBr(publish);
    B_.SetInsertPoint(publish);
    atomic_store(loaded, slot, llvm::AtomicOrdering::Release, 8);
    B_.CreateCall(unlock_fn_);
    B_.CreateStore(loaded, F->getArg(2));
    B_.CreateRet(c32(0));
  }

  void build_status_message() {
    auto* f = make_fn("tj_status_message", ptr_, {i32_}, true);
    f->setLinkage(llvm::GlobalValue::WeakAnyLinkage);
    auto* deflt = block("unknown");
    auto* sw = B_.CreateSwitch(f->getArg(0), deflt);
    for (int s = 0; s <= static_cast<int>(LaunchStatus::too_many_contexts); ++s) {
      auto* bb = block("case");
      sw->addCase(c32(s), bb);
      B_.SetInsertPoint(bb);
      B_.CreateRet(str(status_message(static_cast<LaunchStatus>(s))));
    }
    B_.SetInsertPoint(deflt);
    B_.CreateRet(str("unknown tj_status"));
  }

  // ---- the launch-extent computation ---------------------------------------------------------

  struct ScalarEnv {
    const ir::Function* f = nullptr;
    const Config* cfg = nullptr;
    std::unordered_map<int, const ir::Op*> defs;
    std::unordered_map<int, llvm::Value*> memo;
    std::vector<std::vector<llvm::Value*>> dims;   // per param: i64 dims
    std::vector<llvm::Value*> scalars;             // per param: float
  };

  llvm::Type* scalar_type(const ScalarEnv& env, const ir::Op& op, DType t) {
    switch (t) {
      case DType::i64: return i64_;
      case DType::i32: return i32_;
      case DType::i1: return i1_;
      case DType::f32: return f32_;
      default:
        throw Error(fmt::format("export: kernel '{}': a launch-loop bound computes in {} ({}), which the exported launcher "
                                "does not evaluate; compute bounds in integers or f32",
                                env.f->name, name(t), op.loc.str()));
    }
  }

  [[noreturn]] void unsupported(const ScalarEnv& env, const ir::Op& op, const std::string& what) {
    throw Error(fmt::format("export: kernel '{}': a launch-loop bound uses {} ({}), which the exported launcher does not "
                            "evaluate (it needs no libm); keep launch bounds to integer arithmetic",
                            env.f->name, what, op.loc.str()));
  }

  // Converts a scalar of dtype `from` to `to` as runtime/reference.cpp's cast_elem does.
  llvm::Value* convert(llvm::Value* x, DType from, DType to) {
    if (from == to) return x;
    auto is_i = [](DType t) { return t == DType::i32 || t == DType::i64 || t == DType::i1; };
    if (to == DType::i1) return from == DType::f32 ? B_.CreateFCmpUNE(x, llvm::ConstantFP::get(f32_, 0.0))
                                                   : B_.CreateICmpNE(x, llvm::ConstantInt::get(x->getType(), 0));
    llvm::Type* tt = to == DType::i64 ? i64_ : to == DType::i32 ? i32_ : f32_;
    if (is_i(from) && is_i(to)) return from == DType::i1 ? B_.CreateZExt(x, tt) : B_.CreateSExtOrTrunc(x, tt);
    if (is_i(from) && to == DType::f32) return from == DType::i1 ? B_.CreateUIToFP(x, f32_) : B_.CreateSIToFP(x, f32_);
    if (from == DType::f32 && is_i(to)) return B_.CreateIntrinsic(llvm::Intrinsic::fptosi_sat, {tt, f32_}, {x});
    throw Error(fmt::format("export: internal error: conversion {} -> {}", name(from), name(to)));
  }

  llvm::Value* scalar(ScalarEnv& env, int value) {
    if (auto it = env.memo.find(value); it != env.memo.end()) return it->second;
    auto it = env.defs.find(value);
    if (it == env.defs.end())
      throw Error(fmt::format("export: kernel '{}': a launch loop bound depends on a loop index (%{})", env.f->name, value));
    const ir::Op& op = *it->second;
    const ir::Function& f = *env.f;
    if (!f.type(op.result).is_scalar()) throw Error(fmt::format("export: kernel '{}': a launch loop bound is not a scalar", f.name));
    const DType rt = f.type(op.result).dtype;
    llvm::Type* ty = scalar_type(env, op, rt);
    llvm::Value* r = nullptr;
    switch (op.kind) {
      case ir::OpKind::const_value:
        if (rt == DType::i1) r = llvm::ConstantInt::get(i1_, op.ival != 0);
        else if (rt == DType::f32) r = llvm::ConstantFP::get(f32_, static_cast<double>(static_cast<float>(op.fval)));
        else r = llvm::ConstantInt::get(ty, static_cast<uint64_t>(op.ival), true);
        break;
      case ir::OpKind::scalar_param: r = convert(env.scalars.at(op.param), DType::f32, rt); break;
      case ir::OpKind::tensor_dim: r = convert(env.dims.at(op.param).at(op.axis), DType::i64, rt); break;
      case ir::OpKind::block_size: r = convert(c64(env.cfg->block(f, op.block_id)), DType::i64, rt); break;
      case ir::OpKind::cast: {
        const DType from = f.type(op.operands[0]).dtype;
        llvm::Value* x = scalar(env, op.operands[0]);
        scalar_type(env, op, from);
        r = convert(x, from, rt);
        break;
      }
      case ir::OpKind::unary: r = unary(env, op, rt); break;
      case ir::OpKind::binary: r = binary(env, op, rt); break;
      default: unsupported(env, op, fmt::format("a '{}' op", ir::name(op.kind)));
    }
    env.memo[value] = r;
    return r;
  }

  llvm::Value* unary(ScalarEnv& env, const ir::Op& op, DType rt) {
    const DType t = env.f->type(op.operands[0]).dtype;
    llvm::Value* x = scalar(env, op.operands[0]);
    if (op.unary == ir::UnaryFn::logical_not) {
      llvm::Value* z = t == DType::f32 ? B_.CreateFCmpOEQ(x, llvm::ConstantFP::get(f32_, 0.0))
                                       : B_.CreateICmpEQ(x, llvm::ConstantInt::get(x->getType(), 0));
      return convert(z, DType::i1, rt);
    }
    if (t == DType::i32 || t == DType::i64) {
      llvm::Value* neg = B_.CreateSub(llvm::ConstantInt::get(x->getType(), 0), x);
      llvm::Value* v = nullptr;
      if (op.unary == ir::UnaryFn::neg) v = neg;
      else if (op.unary == ir::UnaryFn::abs) v = B_.CreateSelect(B_.CreateICmpSLT(x, llvm::ConstantInt::get(x->getType(), 0)), neg, x);
      else unsupported(env, op, fmt::format("{} of an integer", ir::name(op.unary)));
      return convert(v, t, rt);
    }
    if (t != DType::f32) unsupported(env, op, fmt::format("{} of {}", ir::name(op.unary), name(t)));
    llvm::Value* v = nullptr;
    switch (op.unary) {
      case ir::UnaryFn::neg: v = B_.CreateFNeg(x); break;
      case ir::UnaryFn::abs: v = B_.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, x); break;
      case ir::UnaryFn::sqrt: v = B_.CreateUnaryIntrinsic(llvm::Intrinsic::sqrt, x); break;
      case ir::UnaryFn::rsqrt: {
        llvm::Value* d = B_.CreateUnaryIntrinsic(llvm::Intrinsic::sqrt, B_.CreateFPExt(x, f64_));
        v = B_.CreateFPTrunc(B_.CreateFDiv(llvm::ConstantFP::get(f64_, 1.0), d), f32_);
        break;
      }
      default: unsupported(env, op, std::string(ir::name(op.unary)));
    }
    return convert(v, DType::f32, rt);
  }

  llvm::Value* binary(ScalarEnv& env, const ir::Op& op, DType rt) {
    using ir::BinaryFn;
    const DType t = env.f->type(op.operands[0]).dtype;
    llvm::Value* a = scalar(env, op.operands[0]);
    llvm::Value* b = scalar(env, op.operands[1]);
    if (env.f->type(op.operands[1]).dtype != t) unsupported(env, op, "a binary op on mixed dtypes");
    const bool fl = t == DType::f32;
    if (ir::is_comparison(op.binary)) {
      llvm::Value* c = nullptr;
      if (fl) {
        switch (op.binary) {
          case BinaryFn::lt: c = B_.CreateFCmpOLT(a, b); break;
          case BinaryFn::le: c = B_.CreateFCmpOLE(a, b); break;
          case BinaryFn::gt: c = B_.CreateFCmpOGT(a, b); break;
          case BinaryFn::ge: c = B_.CreateFCmpOGE(a, b); break;
          case BinaryFn::eq: c = B_.CreateFCmpOEQ(a, b); break;
          default: c = B_.CreateFCmpUNE(a, b); break;
        }
      } else {
        const bool u = t == DType::i1;   // 0/1 values
        switch (op.binary) {
          case BinaryFn::lt: c = u ? B_.CreateICmpULT(a, b) : B_.CreateICmpSLT(a, b); break;
          case BinaryFn::le: c = u ? B_.CreateICmpULE(a, b) : B_.CreateICmpSLE(a, b); break;
          case BinaryFn::gt: c = u ? B_.CreateICmpUGT(a, b) : B_.CreateICmpSGT(a, b); break;
          case BinaryFn::ge: c = u ? B_.CreateICmpUGE(a, b) : B_.CreateICmpSGE(a, b); break;
          case BinaryFn::eq: c = B_.CreateICmpEQ(a, b); break;
          default: c = B_.CreateICmpNE(a, b); break;
        }
      }
      return convert(c, DType::i1, rt);
    }
    if (op.binary == BinaryFn::logical_and || op.binary == BinaryFn::logical_or) {
      llvm::Value* x = convert(a, t, DType::i1);
      llvm::Value* y = convert(b, t, DType::i1);
      return convert(op.binary == BinaryFn::logical_and ? B_.CreateAnd(x, y) : B_.CreateOr(x, y), DType::i1, rt);
    }
    if (rt != t) unsupported(env, op, "an arithmetic op whose result dtype differs from its operands'");
    if (fl) {
      switch (op.binary) {
        case BinaryFn::add: return B_.CreateFAdd(a, b);
        case BinaryFn::sub: return B_.CreateFSub(a, b);
        case BinaryFn::mul: return B_.CreateFMul(a, b);
        case BinaryFn::div: return B_.CreateFDiv(a, b);
        case BinaryFn::maximum: return B_.CreateMaxNum(a, b);
        case BinaryFn::minimum: return B_.CreateMinNum(a, b);
        default: unsupported(env, op, fmt::format("f32 {}", ir::name(op.binary)));
      }
    }
    if (t == DType::i1) unsupported(env, op, fmt::format("{} on i1", ir::name(op.binary)));
    llvm::Type* ty = a->getType();
    auto zero = llvm::ConstantInt::get(ty, 0), one = llvm::ConstantInt::get(ty, 1), minus1 = llvm::ConstantInt::getSigned(ty, -1);
    switch (op.binary) {
      case BinaryFn::add: return B_.CreateAdd(a, b);
      case BinaryFn::sub: return B_.CreateSub(a, b);
      case BinaryFn::mul: return B_.CreateMul(a, b);
      case BinaryFn::maximum: return B_.CreateSelect(B_.CreateICmpSGT(a, b), a, b);
      case BinaryFn::minimum: return B_.CreateSelect(B_.CreateICmpSLT(a, b), a, b);
      case BinaryFn::div:
      case BinaryFn::floordiv:
      case BinaryFn::mod: {
        fail_if(B_.CreateICmpEQ(b, zero), LaunchStatus::shape,
                {T(fmt::format("the launch grid divides by zero ({} at {}); check the tensor shapes", ir::name(op.binary),
                               op.loc.str()))});
        // x / -1 is computed as -x (INT_MIN / -1 would trap); mod by -1 is 0.
        llvm::Value* is_m1 = B_.CreateICmpEQ(b, minus1);
        llvm::Value* safe_b = B_.CreateSelect(is_m1, one, b);
        llvm::Value* q = B_.CreateSDiv(a, safe_b);
        llvm::Value* m = B_.CreateSRem(a, safe_b);
        llvm::Value* adjust = B_.CreateAnd(B_.CreateICmpNE(m, zero), B_.CreateICmpNE(B_.CreateICmpSLT(m, zero), B_.CreateICmpSLT(b, zero)));
        llvm::Value* r = nullptr;
        if (op.binary == BinaryFn::div) r = q;
        else if (op.binary == BinaryFn::floordiv) r = B_.CreateSelect(adjust, B_.CreateSub(q, one), q);
        else r = B_.CreateSelect(adjust, B_.CreateAdd(m, b), m);
        llvm::Value* by_m1 = op.binary == BinaryFn::mod ? static_cast<llvm::Value*>(zero) : B_.CreateSub(zero, a);
        return B_.CreateSelect(is_m1, by_m1, r);
      }
      default: unsupported(env, op, fmt::format("integer {}", ir::name(op.binary)));
    }
  }

  static std::vector<const ir::Op*> launch_chain(const ir::Function& f) {
    std::vector<const ir::Op*> chain;
    const ir::Region* region = &f.body;
    while (region) {
      const ir::Op* next = nullptr;
      for (const ir::Op& op : region->ops) {
        if (op.kind != ir::OpKind::loop || !op.launch) continue;
        if (next) throw Error(fmt::format("export: kernel '{}': two launch loops in one region (the IR is malformed)", f.name));
        next = &op;
      }
      if (!next) break;
      chain.push_back(next);
      region = next->body.get();
    }
    return chain;
  }

  // ---- one specialization -------------------------------------------------------------------

  std::vector<llvm::Type*> variant_params() {
    std::vector<llvm::Type*> p{ptr_};
    p.insert(p.end(), slot_types_.begin(), slot_types_.end());
    p.push_back(i32_);   // context slot
    p.push_back(i32_);   // SM count
    return p;
  }

  struct TensorVals {
    llvm::Value* data = nullptr;
    std::vector<llvm::Value*> dims, strides;
  };

  llvm::Function* build_variant(size_t vi) {
    const LauncherVariant& v = k_.variants[vi];
    const ir::Function& f = *v.ir;
    const GeneratedKernel& g = *v.kernel;
    llvm::Function* F = make_fn(fmt::format("tj.variant.{}", vi), i32_, variant_params(), false);
    llvm::Value* stream = F->getArg(0);
    const unsigned nslots = static_cast<unsigned>(k_.slots.size());
    llvm::Value* ctx_slot = F->getArg(1 + nslots);
    llvm::Value* sms = F->getArg(2 + nslots);

    std::vector<TensorVals> tv(f.params.size());
    std::vector<llvm::Value*> scalars(f.params.size(), nullptr);
    std::vector<std::string> pname(f.params.size());
    std::vector<llvm::Value*> targ(f.params.size(), nullptr);
    size_t j = 0;
    for (unsigned s = 0; s < nslots; ++s) {
      const Slot& slot = k_.slots[s];
      if (slot.is_host()) continue;
      const ir::Param& p = f.params[j];
      pname[j] = slot.name;
      llvm::Value* arg = F->getArg(1 + s);
      if (p.is_tensor()) {
        targ[j] = arg;
        TensorVals& t = tv[j];
        t.data = load(ptr_, arg, kTensorData);
        llvm::Value* shape = load(ptr_, arg, kTensorShape);
        llvm::Value* strides = load(ptr_, arg, kTensorStrides);
        const int R = p.rank();
        for (int d = 0; d < R; ++d)
          t.dims.push_back(p.static_shape[d] >= 0 ? static_cast<llvm::Value*>(c64(p.static_shape[d]))
                                                  : B_.CreateLoad(i64_, at(i64_, shape, c64(d))));
        if (R > 0) {
          auto* contig = alloca_of(i64_, "contiguous", R);
          llvm::Value* run = c64(1);
          for (int d = R - 1; d >= 0; --d) {
            B_.CreateStore(run, at(i64_, contig, c64(d)));
            run = B_.CreateMul(run, t.dims[d]);
          }
          llvm::Value* sp = B_.CreateSelect(B_.CreateICmpEQ(strides, null()), contig, strides);
          for (int d = 0; d < R; ++d) t.strides.push_back(B_.CreateLoad(i64_, at(i64_, sp, c64(d))));
        }
      } else {
        scalars[j] = arg;
      }
      ++j;
    }

    // Argument checks.
    for (size_t p = 0; p < f.params.size(); ++p) {
      const ir::Param& prm = f.params[p];
      if (!prm.is_tensor()) continue;
      const TensorVals& t = tv[p];
      const std::string at_arg = fmt::format("argument '{}': ", pname[p]);
      llvm::Value* numel = c64(1);
      for (int d = 0; d < prm.rank(); ++d) {
        if (prm.static_shape[d] < 0)
          fail_if(B_.CreateICmpSLT(t.dims[d], c64(0)), LaunchStatus::invalid_argument,
                  {T(at_arg + "dimension " + std::to_string(d) + " is negative ("), I(t.dims[d]), T(")")});
        numel = B_.CreateMul(numel, t.dims[d]);
      }
      fail_if(B_.CreateAnd(B_.CreateICmpEQ(t.data, null()), B_.CreateICmpNE(numel, c64(0))), LaunchStatus::invalid_argument,
              {T(at_arg + "data is NULL ("), Tensor(targ[p]), T(")")});
      const int elem = size_bytes(prm.dtype);
      if (elem > 1)
        fail_if(B_.CreateICmpNE(B_.CreateAnd(B_.CreatePtrToInt(t.data, i64_), c64(elem - 1)), c64(0)), LaunchStatus::alignment,
                {T(at_arg + "data pointer "), H(t.data), T(fmt::format(" is not aligned to {} bytes ({})", elem, name(prm.dtype)))});
    }

    // TMA operands: the layout checks of runtime/jit.cpp's encode_tma, and the map's dims.
    struct TmaVals {
      const TmaOperand* op;
      std::vector<llvm::Value*> dims, strides;   // outermost first, after folding
      std::vector<int64_t> box;
      std::vector<int64_t> elem_strides;   // traversal strides, after folding
    };
    std::vector<TmaVals> tmas;
    for (const TmaOperand& op : g.tma) {
      const ir::Param& prm = f.params[op.param];
      const TensorVals& t = tv[op.param];
      const std::string at_arg =
          fmt::format("argument '{}' ({} read with the tensor copy engine, TMA): ", pname[op.param], name(prm.dtype));
      TmaVals m{&op, t.dims, t.strides, std::vector<int64_t>(op.box.begin(), op.box.end()),
                op.element_strides.empty() ? std::vector<int64_t>(op.box.size(), 1)
                                           : std::vector<int64_t>(op.element_strides.begin(), op.element_strides.end())};
      const int elem = size_bytes(prm.dtype);
      fail_if(B_.CreateICmpNE(m.strides.back(), c64(1)), LaunchStatus::alignment,
              {T(at_arg + "the last dim must be contiguous (stride 1), got stride "), I(m.strides.back())});
      fail_if(B_.CreateICmpNE(B_.CreateAnd(B_.CreatePtrToInt(t.data, i64_), c64(15)), c64(0)), LaunchStatus::alignment,
              {T(at_arg + "the base address "), H(t.data), T(" must be 16-byte aligned")});
      const int rank = static_cast<int>(m.dims.size());
      for (int d = 0; d < rank - 1; ++d) {
        llvm::Value* bytes = B_.CreateMul(m.strides[d], c64(elem));
        fail_if(B_.CreateICmpNE(B_.CreateSRem(bytes, c64(16)), c64(0)), LaunchStatus::alignment,
                {T(at_arg + fmt::format("dim {} has a stride of ", d)), I(bytes),
                 T(fmt::format(" bytes, not a multiple of 16 (pad the last dim to a multiple of {} elements)", 16 / elem))});
      }
      tmas.push_back(std::move(m));
    }

    // Operands read in 16-byte pieces (cp.async): the layout checks of runtime/jit.cpp's
    // check_aligned16 (dims of extent 1 may have any stride).
    for (int param : g.aligned16_params) {
      const ir::Param& prm = f.params[param];
      const TensorVals& t = tv[param];
      const std::string at_arg =
          fmt::format("argument '{}' ({} read in 16-byte pieces, cp.async): ", pname[param], name(prm.dtype));
      const int elem = size_bytes(prm.dtype);
      const int rank = prm.rank();
      fail_if(B_.CreateAnd(B_.CreateICmpSGT(t.dims[rank - 1], c64(1)), B_.CreateICmpNE(t.strides[rank - 1], c64(1))),
              LaunchStatus::alignment,
              {T(at_arg + "the last dim must be contiguous (stride 1), got stride "), I(t.strides[rank - 1])});
      fail_if(B_.CreateICmpNE(B_.CreateAnd(B_.CreatePtrToInt(t.data, i64_), c64(15)), c64(0)), LaunchStatus::alignment,
              {T(at_arg + "the base address "), H(t.data), T(" must be 16-byte aligned")});
      for (int d = 0; d < rank - 1; ++d) {
        llvm::Value* bytes = B_.CreateMul(t.strides[d], c64(elem));
        fail_if(B_.CreateAnd(B_.CreateICmpSGT(t.dims[d], c64(1)), B_.CreateICmpNE(B_.CreateSRem(bytes, c64(16)), c64(0))),
                LaunchStatus::alignment,
                {T(at_arg + fmt::format("dim {} has a stride of ", d)), I(bytes),
                 T(fmt::format(" bytes, not a multiple of 16 (pad the last dim to a multiple of {} elements)", 16 / elem))});
      }
    }

    // The function (loads the module on first use in this context).
    auto* fn_slot = alloca_of(ptr_, "fn");
    propagate(B_.CreateCall(fn_get_, {c32(variant_module_[vi]), ctx_slot, fn_slot}));
    llvm::Value* fn = B_.CreateLoad(ptr_, fn_slot);

    // Launch extents: the launch loops' bounds, evaluated from the IR's scalar ops.
    ScalarEnv env;
    env.f = &f;
    env.cfg = v.config;
    ir::walk(f.body, [&](const ir::Op& op, int) {
      if (op.result >= 0) env.defs[op.result] = &op;
    });
    for (size_t p = 0; p < f.params.size(); ++p) {
      env.dims.push_back(tv[p].dims);
      env.scalars.push_back(scalars[p]);
    }
    llvm::Value* programs = c64(1);
    for (const ir::Op* loop : launch_chain(f)) {
      llvm::Value* begin = convert(scalar(env, loop->operands[0]), f.type(loop->operands[0]).dtype, DType::i64);
      llvm::Value* end = convert(scalar(env, loop->operands[1]), f.type(loop->operands[1]).dtype, DType::i64);
      llvm::Value* n = B_.CreateSub(end, begin);
      n = B_.CreateSelect(B_.CreateICmpSLT(n, c64(0)), c64(0), n);
      if (loop->loop_kind == ir::LoopKind::tile) {
        const int64_t block = v.config->block(f, loop->block_id);
        if (block < 1) throw Error(fmt::format("export: kernel '{}': block size {} is not positive", f.name, block));
        n = B_.CreateUDiv(B_.CreateAdd(n, c64(block - 1)), c64(block));
      }
      llvm::Value* prod = B_.CreateBinaryIntrinsic(llvm::Intrinsic::umul_with_overflow, programs, n);
      fail_if(B_.CreateExtractValue(prod, 1), LaunchStatus::too_large, {T("the launch grid overflows 64 bits")});
      programs = B_.CreateExtractValue(prod, 0);
    }
    auto* nothing = block("nothing_to_launch");
    auto* some = block("launch");
    B_.CreateCondBr(B_.CreateICmpEQ(programs, c64(0)), nothing, some);
    B_.SetInsertPoint(nothing);
    B_.CreateRet(c32(0));
    B_.SetInsertPoint(some);

    // Grid (as launch_geometry): one block per program (or per programs_per_block); persistent kernels at most
    // SMs * blocks_per_sm blocks (and max_blocks); rounded up to a multiple of the cluster size.
    llvm::Value* grid = programs;
    if (g.programs_per_block > 1)   // several programs a block (GeneratedKernel::programs_per_block)
      grid = B_.CreateUDiv(B_.CreateAdd(grid, c64(g.programs_per_block - 1)), c64(g.programs_per_block));
    if (g.persistent) {
      llvm::Value* per_sm = c64(std::max(1, g.blocks_per_sm));
      if (g.blocks_per_sm == 0) {   // as many as fit (GeneratedKernel::blocks_per_sm)
        auto* fit = alloca_of(i32_, "resident_blocks");
        check_cuda(B_.CreateCall(cu("cuOccupancyMaxActiveBlocksPerMultiprocessor"),
                                 {fit, fn, c32(g.threads), c64(static_cast<int64_t>(g.dynamic_smem_bytes))}),
                   "cuOccupancyMaxActiveBlocksPerMultiprocessor");
        per_sm = B_.CreateSExt(B_.CreateLoad(i32_, fit), i64_);
        per_sm = B_.CreateSelect(B_.CreateICmpSLT(per_sm, c64(1)), c64(1), per_sm);   // none fit: still one
      }
      llvm::Value* cap = B_.CreateMul(B_.CreateSExt(sms, i64_), per_sm);
      cap = B_.CreateSelect(B_.CreateICmpSLT(cap, c64(1)), c64(1), cap);
      grid = B_.CreateSelect(B_.CreateICmpSLT(cap, grid), cap, grid);
      if (g.max_blocks > 0) grid = B_.CreateSelect(B_.CreateICmpSLT(c64(g.max_blocks), grid), c64(g.max_blocks), grid);
    }
    if (g.cluster_x > 1) {
      grid = B_.CreateMul(B_.CreateUDiv(B_.CreateAdd(grid, c64(g.cluster_x - 1)), c64(g.cluster_x)), c64(g.cluster_x));
    }
    fail_if(B_.CreateICmpUGT(grid, c64(kMaxGrid)), LaunchStatus::too_large,
            {T("the problem needs "), I(programs), T(" programs; at most 2^31-1 thread blocks fit one launch")});

    // Packing, exactly as runtime/jit.cpp: TensorArg<R> {data, shape[R], stride[R]}, floats,
    // then TMA descriptors, then tj_programs for persistent kernels.
    const size_t nparams = f.params.size() + g.tma.size() + (g.persistent ? 1 : 0);
    auto* params = alloca_of(ptr_, "params", static_cast<unsigned>(std::max<size_t>(1, nparams)));
    size_t pi = 0;
    for (size_t p = 0; p < f.params.size(); ++p) {
      llvm::Value* slot = nullptr;
      if (f.params[p].is_tensor()) {
        const int R = f.params[p].rank();
        slot = alloca_of(i64_, "tensor_arg", 1 + 2 * R);
        B_.CreateStore(tv[p].data, slot);
        for (int d = 0; d < R; ++d) {
          B_.CreateStore(tv[p].dims[d], at(i64_, slot, c64(1 + d)));
          B_.CreateStore(tv[p].strides[d], at(i64_, slot, c64(1 + R + d)));
        }
      } else {
        slot = alloca_of(f32_, "scalar_arg");
        B_.CreateStore(scalars[p], slot);
      }
      B_.CreateStore(slot, at(ptr_, params, c64(pi++)));
    }
    for (const TmaVals& m : tmas) {
      const ir::Param& prm = f.params[m.op->param];
      llvm::Value* map = alloca_bytes(sizeof(CUtensorMap), 64, "tensor_map");
      const int rank = static_cast<int>(m.dims.size());
      auto* dims = alloca_of(i64_, "tma_dims", 5);
      auto* gstrides = alloca_of(i64_, "tma_strides", 5);
      auto* boxes = alloca_of(i32_, "tma_box", 5);
      auto* estrides = alloca_of(i32_, "tma_elem_strides", 5);
      const int elem = size_bytes(prm.dtype);
      for (int jj = 0; jj < rank; ++jj) {
        const int d = rank - 1 - jj;   // innermost first
        B_.CreateStore(m.dims[d], at(i64_, dims, c64(jj)));
        B_.CreateStore(c32(m.box[d]), at(i32_, boxes, c64(jj)));
        B_.CreateStore(c32(m.elem_strides[d]), at(i32_, estrides, c64(jj)));
        if (jj > 0) B_.CreateStore(B_.CreateMul(m.strides[d], c64(elem)), at(i64_, gstrides, c64(jj - 1)));
      }
      CUtensorMapDataType dt = CU_TENSOR_MAP_DATA_TYPE_UINT8;   // fp8: raw bytes
      switch (prm.dtype) {
        case DType::f32: dt = CU_TENSOR_MAP_DATA_TYPE_FLOAT32; break;
        case DType::f16: dt = CU_TENSOR_MAP_DATA_TYPE_FLOAT16; break;
        case DType::bf16: dt = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16; break;
        case DType::i32: dt = CU_TENSOR_MAP_DATA_TYPE_INT32; break;
        default: break;
      }
      const int sw = m.op->swizzle_bytes;
      CUtensorMapSwizzle swizzle = sw == 128  ? CU_TENSOR_MAP_SWIZZLE_128B
                                   : sw == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
                                   : sw == 32 ? CU_TENSOR_MAP_SWIZZLE_32B
                                              : CU_TENSOR_MAP_SWIZZLE_NONE;
      check_cuda(B_.CreateCall(cu("cuTensorMapEncodeTiled"),
                               {map, c32(dt), c32(rank), tv[m.op->param].data, dims, gstrides, boxes, estrides,
                                c32(CU_TENSOR_MAP_INTERLEAVE_NONE), c32(swizzle), c32(CU_TENSOR_MAP_L2_PROMOTION_L2_256B),
                                c32(CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)}),
                 fmt::format("cuTensorMapEncodeTiled for argument '{}'", pname[m.op->param]));
      B_.CreateStore(map, at(ptr_, params, c64(pi++)));
    }
    if (g.persistent) {
      auto* slot = alloca_of(i64_, "tj_programs");
      B_.CreateStore(programs, slot);
      B_.CreateStore(slot, at(ptr_, params, c64(pi++)));
    }

    // Launch.
    llvm::Value* grid32 = B_.CreateTrunc(grid, i32_);
    if (g.cluster_x <= 1) {
      llvm::Value* r = B_.CreateCall(cu("cuLaunchKernel"), {fn, grid32, c32(1), c32(1), c32(g.threads), c32(1), c32(1),
                                                             c32(static_cast<int64_t>(g.dynamic_smem_bytes)), stream,
                                                             params, null()});
      check_cuda(r, fmt::format("cuLaunchKernel ({} threads per block, {} bytes of dynamic shared memory)", g.threads,
                                g.dynamic_smem_bytes));
    } else {
      llvm::Value* attr = alloca_bytes(sizeof(CUlaunchAttribute), 8, "attr");
      llvm::Value* config = alloca_bytes(sizeof(CUlaunchConfig), 8, "config");
      B_.CreateMemSet(attr, llvm::ConstantInt::get(i8_, 0), sizeof(CUlaunchAttribute), llvm::MaybeAlign(8));
      B_.CreateMemSet(config, llvm::ConstantInt::get(i8_, 0), sizeof(CUlaunchConfig), llvm::MaybeAlign(8));
      B_.CreateStore(c32(CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION), field_ptr(attr, offsetof(CUlaunchAttribute, id)));
      const unsigned value = offsetof(CUlaunchAttribute, value);
      B_.CreateStore(c32(g.cluster_x), field_ptr(attr, value + 0));
      B_.CreateStore(c32(1), field_ptr(attr, value + 4));
      B_.CreateStore(c32(1), field_ptr(attr, value + 8));
      B_.CreateStore(grid32, field_ptr(config, offsetof(CUlaunchConfig, gridDimX)));
      B_.CreateStore(c32(1), field_ptr(config, offsetof(CUlaunchConfig, gridDimY)));
      B_.CreateStore(c32(1), field_ptr(config, offsetof(CUlaunchConfig, gridDimZ)));
      B_.CreateStore(c32(g.threads), field_ptr(config, offsetof(CUlaunchConfig, blockDimX)));
      B_.CreateStore(c32(1), field_ptr(config, offsetof(CUlaunchConfig, blockDimY)));
      B_.CreateStore(c32(1), field_ptr(config, offsetof(CUlaunchConfig, blockDimZ)));
      B_.CreateStore(c32(static_cast<int64_t>(g.dynamic_smem_bytes)), field_ptr(config, offsetof(CUlaunchConfig, sharedMemBytes)));
      B_.CreateStore(stream, field_ptr(config, offsetof(CUlaunchConfig, hStream)));
      B_.CreateStore(attr, field_ptr(config, offsetof(CUlaunchConfig, attrs)));
      B_.CreateStore(c32(1), field_ptr(config, offsetof(CUlaunchConfig, numAttrs)));
      llvm::Value* r = B_.CreateCall(cu("cuLaunchKernelEx"), {config, fn, params, null()});
      check_cuda(r, fmt::format("cuLaunchKernelEx (cluster of {}, {} threads per block, {} bytes of dynamic shared memory)",
                                g.cluster_x, g.threads, g.dynamic_smem_bytes));
    }
    B_.CreateRet(c32(0));
    return F;
  }

  // ---- the public functions -----------------------------------------------------------------

  void compute_slot_types() {
    slot_types_.clear();
    dlpack_types_.clear();
    for (const Slot& s : k_.slots) {
      llvm::Type* t = nullptr;
      switch (s.kind) {
        case SlotKind::tensor_in:
        case SlotKind::tensor_out:
        case SlotKind::tensor_inout: t = ptr_; break;
        case SlotKind::scalar_f32: t = f32_; break;
        case SlotKind::host_bool: t = i32_; break;
        case SlotKind::host_int: t = i64_; break;
        case SlotKind::host_float: t = f64_; break;
      }
      slot_types_.push_back(t);
      dlpack_types_.push_back(t);
    }
  }

  std::vector<llvm::Type*> launch_params() {
    std::vector<llvm::Type*> p{ptr_};
    p.insert(p.end(), slot_types_.begin(), slot_types_.end());
    return p;
  }

  void build_launch() {
    launch_ = make_fn(name_ + "_launch", i32_, launch_params(), true);
    llvm::Function* F = launch_;
    const unsigned nslots = static_cast<unsigned>(k_.slots.size());
    struct Given {
      llvm::Value* dtype = nullptr;
      llvm::Value* rank = nullptr;
      llvm::Value* shape = nullptr;
    };
    std::vector<Given> given(nslots);
    for (unsigned s = 0; s < nslots; ++s) {
      if (!k_.slots[s].is_tensor()) continue;
      llvm::Value* t = F->getArg(1 + s);
      fail_if(B_.CreateICmpEQ(t, null()), LaunchStatus::invalid_argument,
              {T(fmt::format("argument '{}' is NULL", k_.slots[s].name))});
      given[s].dtype = load(i32_, t, kTensorDType);
      given[s].rank = load(i32_, t, kTensorRank);
      given[s].shape = load(ptr_, t, kTensorShape);
      fail_if(B_.CreateOr(B_.CreateICmpSLT(given[s].rank, c32(0)),
                          B_.CreateAnd(B_.CreateICmpSGT(given[s].rank, c32(0)), B_.CreateICmpEQ(given[s].shape, null()))),
              LaunchStatus::invalid_argument,
              {T(fmt::format("argument '{}' has rank ", k_.slots[s].name)), I(given[s].rank), T(" and shape pointer "),
               H(given[s].shape)});
    }
    auto* slot_p = alloca_of(i32_, "ctx_slot");
    auto* cc_p = alloca_of(i32_, "cc");
    auto* sms_p = alloca_of(i32_, "sms");
    propagate(B_.CreateCall(ctx_get_, {slot_p, cc_p, sms_p}));
    llvm::Value* ctx_slot = B_.CreateLoad(i32_, slot_p);
    llvm::Value* cc = B_.CreateLoad(i32_, cc_p);
    llvm::Value* sms = B_.CreateLoad(i32_, sms_p);
    auto* arch_miss = alloca_of(i1_, "arch_miss");
    auto* dtype_hit = alloca_of(i1_, "dtype_hit");
    B_.CreateStore(llvm::ConstantInt::getFalse(ctx_), arch_miss);
    B_.CreateStore(llvm::ConstantInt::getFalse(ctx_), dtype_hit);

    for (size_t vi : order_) {
      const LauncherVariant& v = k_.variants[vi];
      auto* next = block("next_variant");
      // ranks and dtypes
      llvm::Value* ok = llvm::ConstantInt::getTrue(ctx_);
      size_t j = 0;
      for (unsigned s = 0; s < nslots; ++s) {
        if (k_.slots[s].is_host()) continue;
        const ir::Param& p = v.ir->params[j++];
        if (!p.is_tensor()) continue;
        ok = B_.CreateAnd(ok, B_.CreateAnd(B_.CreateICmpEQ(given[s].rank, c32(p.rank())),
                                           B_.CreateICmpEQ(given[s].dtype, c32(static_cast<int>(p.dtype)))));
      }
      auto* dims = block("dims");
      B_.CreateCondBr(ok, dims, next);
      B_.SetInsertPoint(dims);
      B_.CreateStore(llvm::ConstantInt::getTrue(ctx_), dtype_hit);
      // static dims and host values
      ok = llvm::ConstantInt::getTrue(ctx_);
      j = 0;
      for (unsigned s = 0; s < nslots; ++s) {
        const Slot& slot = k_.slots[s];
        llvm::Value* arg = F->getArg(1 + s);
        if (slot.is_host()) {
          const ArgSpec& a = v.specs.at(s);
          if (const auto* b = std::get_if<bool>(&a)) ok = B_.CreateAnd(ok, B_.CreateICmpEQ(B_.CreateICmpNE(arg, c32(0)), llvm::ConstantInt::getBool(ctx_, *b)));
          else if (const auto* n = std::get_if<int64_t>(&a)) ok = B_.CreateAnd(ok, B_.CreateICmpEQ(arg, c64(*n)));
          else if (const auto* d = std::get_if<double>(&a)) ok = B_.CreateAnd(ok, B_.CreateFCmpOEQ(arg, llvm::ConstantFP::get(f64_, *d)));
          continue;
        }
        const ir::Param& p = v.ir->params[j++];
        if (!p.is_tensor()) continue;
        for (int d = 0; d < p.rank(); ++d)
          if (p.static_shape[d] >= 0)
            ok = B_.CreateAnd(ok, B_.CreateICmpEQ(B_.CreateLoad(i64_, at(i64_, given[s].shape, c64(d))), c64(p.static_shape[d])));
      }
      auto* arch = block("arch");
      B_.CreateCondBr(ok, arch, next);
      B_.SetInsertPoint(arch);
      auto* go = block("go");
      auto* miss = block("arch_miss");
      B_.CreateCondBr(arch_ok(cc, v.arch), go, miss);
      B_.SetInsertPoint(miss);
      B_.CreateStore(llvm::ConstantInt::getTrue(ctx_), arch_miss);
      B_.CreateBr(next);
      B_.SetInsertPoint(go);
      std::vector<llvm::Value*> args;
      for (auto& a : F->args()) args.push_back(&a);
      args.push_back(ctx_slot);
      args.push_back(sms);
      B_.CreateRet(B_.CreateCall(variant_fns_[vi], args));
      B_.SetInsertPoint(next);
    }

    // No specialization fits: say what was given and what exists.
    std::vector<Msg> given_msg;
    for (unsigned s = 0; s < nslots; ++s) {
      const Slot& slot = k_.slots[s];
      llvm::Value* arg = F->getArg(1 + s);
      if (slot.is_tensor()) {
        given_msg.push_back(T(" " + slot.name + "="));
        given_msg.push_back(Tensor(arg));
      } else if (slot.kind == SlotKind::host_bool || slot.kind == SlotKind::host_int) {
        given_msg.push_back(T(" " + slot.name + "="));
        given_msg.push_back(I(slot.kind == SlotKind::host_bool ? B_.CreateZExt(B_.CreateICmpNE(arg, c32(0)), i64_) : arg));
      } else if (slot.kind == SlotKind::host_float) {
        given_msg.push_back(T(" " + slot.name + "="));
        given_msg.push_back(Real(arg));
      }
    }
    auto with = [&](std::vector<Msg> head, const std::string& tail) {
      head.insert(head.end(), given_msg.begin(), given_msg.end());
      head.push_back(T(" on a GPU of compute capability "));
      head.push_back(I(B_.CreateSDiv(cc, c32(10))));
      head.push_back(T("."));
      head.push_back(I(B_.CreateSRem(cc, c32(10))));
      head.push_back(T("; " + tail));
      return head;
    };
    auto* device_bb = block("unsupported_device");
    auto* other_bb = block("no_specialization");
    B_.CreateCondBr(B_.CreateLoad(i1_, arch_miss), device_bb, other_bb);
    B_.SetInsertPoint(device_bb);
    std::set<std::string> archs;
    for (const auto& v : k_.variants) archs.insert(v.arch);
    fail_now(LaunchStatus::unsupported_device,
             with({T("no CUBIN for this GPU:")}, fmt::format("exported for {} (re-export with --arch for this GPU)",
                                                             fmt::join(archs, ", "))));
    B_.SetInsertPoint(other_bb);
    auto* dtype_bb = block("dtype");
    auto* shape_bb = block("shape");
    B_.CreateCondBr(B_.CreateLoad(i1_, dtype_hit), shape_bb, dtype_bb);
    B_.SetInsertPoint(dtype_bb);
    fail_now(LaunchStatus::dtype, with({T("no exported specialization takes these element types or ranks:")},
                                       "exported: " + listing_one_line()));
    B_.SetInsertPoint(shape_bb);
    fail_now(LaunchStatus::shape, with({T("no exported specialization for these shapes:")},
                                       "exported: " + listing_one_line()));
  }

  std::string listing_one_line() {
    std::vector<std::string> items;
    for (size_t vi : order_) items.push_back(describe_variant(k_, k_.variants[vi]));
    return fmt::format("{}", fmt::join(items, "; "));
  }

  void build_dlpack() {
    auto* F = make_fn(name_ + "_launch_dlpack", i32_, launch_params(), true);
    const unsigned nslots = static_cast<unsigned>(k_.slots.size());
    std::vector<llvm::Value*> args{F->getArg(0)};
    for (unsigned s = 0; s < nslots; ++s) {
      const Slot& slot = k_.slots[s];
      llvm::Value* arg = F->getArg(1 + s);
      if (!slot.is_tensor()) {
        args.push_back(arg);
        continue;
      }
      const std::string at_arg = fmt::format("argument '{}' ", slot.name);
      fail_if(B_.CreateICmpEQ(arg, null()), LaunchStatus::invalid_argument, {T(at_arg + "is NULL")});
      llvm::Value* dev = load(i32_, arg, kDlDeviceType);
      fail_if(B_.CreateAnd(B_.CreateICmpNE(dev, c32(kDLCUDA)), B_.CreateICmpNE(dev, c32(kDLCUDAManaged))),
              LaunchStatus::invalid_argument,
              {T(at_arg + "is not in CUDA device memory (DLPack device type "), I(dev), T("; kDLCUDA is 2)")});
      llvm::Value* code = B_.CreateZExt(load(i8_, arg, kDlCode), i32_);
      llvm::Value* bits = B_.CreateZExt(load(i8_, arg, kDlBits), i32_);
      llvm::Value* lanes = B_.CreateZExt(load(i16_, arg, kDlLanes), i32_);
      fail_if(B_.CreateICmpNE(lanes, c32(1)), LaunchStatus::dtype,
              {T(at_arg + "has a vector DLPack dtype ("), I(lanes), T(" lanes)")});
      // (code << 8 | bits) -> tj_dtype
      llvm::Value* key = B_.CreateOr(B_.CreateShl(code, c32(8)), bits);
      auto* bad = block("bad_dtype");
      auto* done = block("dtype_done");
      auto* sw = B_.CreateSwitch(key, bad);
      const std::vector<std::pair<int, DType>> table = {
          {2 << 8 | 32, DType::f32},  {2 << 8 | 16, DType::f16},  {4 << 8 | 16, DType::bf16},
          {10 << 8 | 8, DType::e4m3},  // kDLFloat8_e4m3fn (DLPack 1.1)
          {12 << 8 | 8, DType::e5m2},  // kDLFloat8_e5m2
          {0 << 8 | 32, DType::i32},  {0 << 8 | 64, DType::i64},  {6 << 8 | 8, DType::i1},   // kDLBool
      };
      B_.SetInsertPoint(done);
      auto* phi = B_.CreatePHI(i32_, static_cast<unsigned>(table.size()), "dtype");
      for (const auto& [k, dt] : table) {
        auto* bb = llvm::BasicBlock::Create(ctx_, "dt", F);
        sw->addCase(c32(k), bb);
        B_.SetInsertPoint(bb);
        B_.CreateBr(done);
        phi->addIncoming(c32(static_cast<int>(dt)), bb);
      }
      B_.SetInsertPoint(bad);
      fail_now(LaunchStatus::dtype, {T(at_arg + "has a DLPack dtype (code "), I(code), T(", bits "), I(bits),
                                     T(") that no tilejit kernel takes")});
      B_.SetInsertPoint(done);
      llvm::Value* data = load(ptr_, arg, kDlData);
      llvm::Value* offset = load(i64_, arg, kDlByteOffset);
      llvm::Value* t = alloca_bytes(kTensorSize, 8, "tensor");
      B_.CreateStore(B_.CreateGEP(i8_, data, offset), field_ptr(t, kTensorData));
      B_.CreateStore(phi, field_ptr(t, kTensorDType));
      B_.CreateStore(load(i32_, arg, kDlNdim), field_ptr(t, kTensorRank));
      B_.CreateStore(load(ptr_, arg, kDlShape), field_ptr(t, kTensorShape));
      B_.CreateStore(load(ptr_, arg, kDlStrides), field_ptr(t, kTensorStrides));
      args.push_back(t);
    }
    B_.CreateRet(B_.CreateCall(launch_, args));
  }

  void build_launchv() {
    auto* F = make_fn(name_ + "_launchv", i32_, {ptr_, ptr_, i32_}, true);
    const unsigned nslots = static_cast<unsigned>(k_.slots.size());
    llvm::Value* argv = F->getArg(1);
    std::vector<std::string> names;
    for (const Slot& s : k_.slots) names.push_back(s.name);
    fail_if(B_.CreateICmpNE(F->getArg(2), c32(nslots)), LaunchStatus::invalid_argument,
            {T(fmt::format("takes {} arguments ({}), got ", nslots, fmt::join(names, ", "))), I(F->getArg(2))});
    if (nslots > 0) fail_if(B_.CreateICmpEQ(argv, null()), LaunchStatus::invalid_argument, {T("the argument array is NULL")});
    std::vector<llvm::Value*> args{F->getArg(0)};
    for (unsigned s = 0; s < nslots; ++s) {
      const Slot& slot = k_.slots[s];
      llvm::Value* a = field_ptr(argv, s * kArgSize);
      llvm::Value* kind = load(i32_, a, kArgKind);
      llvm::Value* as_f = load(f64_, a, kArgValue);
      llvm::Value* as_i = load(i64_, a, kArgValue);
      llvm::Value* is_f = B_.CreateICmpEQ(kind, c32(kArgFloat));
      llvm::Value* is_i = B_.CreateICmpEQ(kind, c32(kArgInt));
      const std::string what = fmt::format("argument {} ('{}') ", s, slot.name);
      switch (slot.kind) {
        case SlotKind::tensor_in:
        case SlotKind::tensor_out:
        case SlotKind::tensor_inout:
          fail_if(B_.CreateICmpNE(kind, c32(kArgTensor)), LaunchStatus::invalid_argument, {T(what + "must be TJ_ARG_TENSOR")});
          args.push_back(load(ptr_, a, kArgValue));
          break;
        case SlotKind::scalar_f32:
          fail_if(B_.CreateNot(B_.CreateOr(is_f, is_i)), LaunchStatus::invalid_argument,
                  {T(what + "must be TJ_ARG_FLOAT or TJ_ARG_INT")});
          args.push_back(B_.CreateSelect(is_f, B_.CreateFPTrunc(as_f, f32_), B_.CreateSIToFP(as_i, f32_)));
          break;
        case SlotKind::host_bool:
          fail_if(B_.CreateNot(B_.CreateOr(is_f, is_i)), LaunchStatus::invalid_argument,
                  {T(what + "must be TJ_ARG_INT (0 or 1)")});
          args.push_back(B_.CreateZExt(B_.CreateSelect(is_f, B_.CreateFCmpUNE(as_f, llvm::ConstantFP::get(f64_, 0.0)),
                                                       B_.CreateICmpNE(as_i, c64(0))),
                                       i32_));
          break;
        case SlotKind::host_int:
          fail_if(B_.CreateNot(is_i), LaunchStatus::invalid_argument, {T(what + "must be TJ_ARG_INT")});
          args.push_back(as_i);
          break;
        case SlotKind::host_float:
          fail_if(B_.CreateNot(B_.CreateOr(is_f, is_i)), LaunchStatus::invalid_argument,
                  {T(what + "must be TJ_ARG_FLOAT or TJ_ARG_INT")});
          args.push_back(B_.CreateSelect(is_f, as_f, B_.CreateSIToFP(as_i, f64_)));
          break;
      }
    }
    B_.CreateRet(B_.CreateCall(launch_, args));
  }

  void build_load() {
    auto* F = make_fn(name_ + "_load", i32_, {}, true);
    (void)F;
    auto* slot_p = alloca_of(i32_, "ctx_slot");
    auto* cc_p = alloca_of(i32_, "cc");
    auto* sms_p = alloca_of(i32_, "sms");
    propagate(B_.CreateCall(ctx_get_, {slot_p, cc_p, sms_p}));
    llvm::Value* slot = B_.CreateLoad(i32_, slot_p);
    llvm::Value* cc = B_.CreateLoad(i32_, cc_p);
    auto* fn_slot = alloca_of(ptr_, "fn");
    llvm::Value* any = llvm::ConstantInt::getFalse(ctx_);
    for (size_t m = 0; m < modules_.size(); ++m) {
      llvm::Value* ok = arch_ok(cc, modules_[m].arch);
      any = B_.CreateOr(any, ok);
      auto* load_bb = block("load");
      auto* next = block("next");
      B_.CreateCondBr(ok, load_bb, next);
      B_.SetInsertPoint(load_bb);
      propagate(B_.CreateCall(fn_get_, {c32(static_cast<int64_t>(m)), slot, fn_slot}));
      B_.CreateBr(next);
      B_.SetInsertPoint(next);
    }
    std::set<std::string> archs;
    for (const auto& v : k_.variants) archs.insert(v.arch);
    fail_if(B_.CreateNot(any), LaunchStatus::unsupported_device,
            {T("no CUBIN for this GPU (compute capability "), I(B_.CreateSDiv(cc, c32(10))), T("."),
             I(B_.CreateSRem(cc, c32(10))), T(fmt::format("); exported for {}", fmt::join(archs, ", ")))});
    B_.CreateRet(c32(0));
  }

  void build_info() {
    make_fn(name_ + "_last_error", ptr_, {}, true);
    B_.CreateRet(msg_buf_);
    make_fn(name_ + "_specializations", ptr_, {}, true);
    B_.CreateRet(str(listing_));
  }
};

std::unique_ptr<llvm::TargetMachine> target_machine(const std::string& requested_triple) {
  static const bool initialized = [] {
    llvm::InitializeAllTargetInfos();
    llvm::InitializeAllTargets();
    llvm::InitializeAllTargetMCs();
    llvm::InitializeAllAsmPrinters();
    return true;
  }();
  (void)initialized;
  std::string triple = requested_triple.empty() ? llvm::sys::getDefaultTargetTriple() : requested_triple;
  std::string err;
  const llvm::Target* target = llvm::TargetRegistry::lookupTarget(triple, err);
  if (!target) throw Error(fmt::format("export: LLVM has no target for '{}': {}", triple, err));
  llvm::TargetOptions to;
  std::unique_ptr<llvm::TargetMachine> tm(target->createTargetMachine(triple, "generic", "", to, llvm::Reloc::PIC_,
                                                                      llvm::None, llvm::CodeGenOpt::Default));
  if (!tm) throw Error(fmt::format("export: LLVM cannot make a target machine for '{}'", triple));
  return tm;
}

void optimize(llvm::Module& m, llvm::TargetMachine& tm) {
  llvm::LoopAnalysisManager lam;
  llvm::FunctionAnalysisManager fam;
  llvm::CGSCCAnalysisManager cgam;
  llvm::ModuleAnalysisManager mam;
  llvm::PassBuilder pb(&tm);
  pb.registerModuleAnalyses(mam);
  pb.registerCGSCCAnalyses(cgam);
  pb.registerFunctionAnalyses(fam);
  pb.registerLoopAnalyses(lam);
  pb.crossRegisterProxies(lam, fam, cgam, mam);
  llvm::ModulePassManager mpm = pb.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O2);
  mpm.run(m, mam);
}

std::unique_ptr<llvm::Module> build_module(llvm::LLVMContext& ctx, const LauncherKernel& k, const HostLauncherOptions& o,
                                           llvm::TargetMachine* tm) {
  Emitter e(ctx, k, o, tm);
  auto m = e.run();
  m->setPICLevel(llvm::PICLevel::BigPIC);
  auto* ident = m->getOrInsertNamedMetadata("llvm.ident");
  ident->addOperand(llvm::MDNode::get(ctx, {llvm::MDString::get(ctx, "tilejit " + o.tilejit_version + " export")}));
  return m;
}

std::string c_type(SlotKind k) {
  switch (k) {
    case SlotKind::tensor_in:
    case SlotKind::tensor_out:
    case SlotKind::tensor_inout: return "const tj_tensor*";
    case SlotKind::scalar_f32: return "float";
    case SlotKind::host_bool: return "int";
    case SlotKind::host_int: return "int64_t";
    case SlotKind::host_float: return "double";
  }
  return "?";
}

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace


std::string c_identifier(std::string_view name) {
  std::string out;
  for (char c : name) out += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  if (out.empty() || std::isdigit(static_cast<unsigned char>(out[0]))) out = "_" + out;
  return out;
}

std::string describe_variants(const LauncherKernel& k) {
  std::vector<std::string> sig;
  for (const Slot& s : k.slots) {
    const char* kind = s.kind == SlotKind::tensor_in      ? "in"
                       : s.kind == SlotKind::tensor_out   ? "out"
                       : s.kind == SlotKind::tensor_inout ? "inout"
                       : s.kind == SlotKind::scalar_f32   ? "float"
                       : s.kind == SlotKind::host_bool    ? "flag"
                       : s.kind == SlotKind::host_int     ? "int64"
                                                          : "double";
    sig.push_back(fmt::format("{}:{}", s.name, kind));
  }
  std::string out = fmt::format("{}({})\n", c_identifier(k.name), fmt::join(sig, ", "));
  int i = 0;
  for (size_t vi : dispatch_order(k)) {
    const LauncherVariant& v = k.variants[vi];
    out += fmt::format("  {}: {}  config {}{}\n", i++, describe_variant(k, v), v.config ? v.config->to_json() : "{}",
                       v.note.empty() ? "" : " (" + v.note + ")");
  }
  return out;
}

std::string emit_launcher_ir(const LauncherKernel& k, const HostLauncherOptions& options) {
  llvm::LLVMContext ctx;
  auto tm = target_machine(options.triple);
  auto m = build_module(ctx, k, options, tm.get());
  std::string text;
  llvm::raw_string_ostream os(text);
  m->print(os, nullptr);
  return os.str();
}

std::string emit_launcher_object(const LauncherKernel& k, const HostLauncherOptions& options) {
  llvm::LLVMContext ctx;
  auto tm = target_machine(options.triple);
  auto m = build_module(ctx, k, options, tm.get());
  optimize(*m, *tm);
  llvm::SmallVector<char, 0> buffer;
  llvm::raw_svector_ostream os(buffer);
  llvm::legacy::PassManager pm;
  if (tm->addPassesToEmitFile(pm, os, nullptr, llvm::CGFT_ObjectFile))
    throw Error("export: LLVM cannot emit an object file for this target");
  pm.run(*m);
  return std::string(buffer.data(), buffer.size());
}

std::string emit_launcher_header(const LauncherKernel& k, const HostLauncherOptions& options) {
  const std::string n = c_identifier(k.name);
  const std::string guard = "TILEJIT_EXPORT_" + upper(n) + "_H";
  std::vector<std::string> params{"CUstream stream"}, dl_params{"CUstream stream"};
  for (const Slot& s : k.slots) {
    params.push_back(c_type(s.kind) + " " + c_identifier(s.name));
    dl_params.push_back((s.is_tensor() ? std::string("const tj_dltensor*") : c_type(s.kind)) + " " + c_identifier(s.name));
  }
  std::string listing;
  {
    std::string d = describe_variants(k);
    size_t pos = 0;
    while (pos < d.size()) {
      size_t nl = d.find('\n', pos);
      std::string line = d.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
      // keep "*/" out of the comment
      for (size_t q; (q = line.find("*/")) != std::string::npos;) line.replace(q, 2, "* /");
      listing += " *   " + line + "\n";
      if (nl == std::string::npos) break;
      pos = nl + 1;
    }
  }
  std::string arg_doc;
  for (const Slot& s : k.slots) {
    const char* what = s.kind == SlotKind::tensor_in      ? "input tensor (device memory)"
                       : s.kind == SlotKind::tensor_out   ? "output tensor (device memory, written)"
                       : s.kind == SlotKind::tensor_inout ? "tensor read and written (device memory)"
                       : s.kind == SlotKind::scalar_f32   ? "runtime scalar"
                       : s.kind == SlotKind::host_bool    ? "flag (0 or 1) selecting a specialization"
                       : s.kind == SlotKind::host_int     ? "integer selecting a specialization"
                                                          : "value selecting a specialization";
    arg_doc += fmt::format(" *   {:<12} {}\n", c_identifier(s.name), what);
  }
  return fmt::format(R"(/* {n}.h: the exported tilejit kernel '{kname}'. Generated by `tilejit export` (tilejit {ver}); do not edit.
 *
 * Link {n}.o (or the static library next to it) and libcuda; nothing else is needed at run time
 * (no NVRTC, no tilejit library). Modules load on first use in each CUDA context.
 *
 * Arguments of {n}_launch, after the stream:
{args} *
 * Specializations, in dispatch order (static shapes serve exactly that shape, '?' any size):
{listing} */
#ifndef {guard}
#define {guard}

#include <stddef.h>
#include <stdint.h>
#include <cuda.h>

#ifndef TJ_EXPORT_NO_DLPACK
#if defined(__has_include)
#if __has_include(<dlpack/dlpack.h>)
#include <dlpack/dlpack.h>
#ifndef TJ_EXPORT_HAVE_DLPACK
#define TJ_EXPORT_HAVE_DLPACK 1
#endif
#endif
#endif
#endif

#ifdef __cplusplus
extern "C" {{
#endif

#ifndef TJ_EXPORT_COMMON_TYPES
#define TJ_EXPORT_COMMON_TYPES 1
#define TJ_EXPORT_ABI_VERSION 1

/* Results of every exported function. tj_status_message() describes a code;
 * NAME_last_error() says what failed on the calling thread, with the arguments given. */
typedef enum tj_status {{
  TJ_SUCCESS = 0,
  TJ_ERROR_INVALID_ARGUMENT = 1,   /* NULL tensor, negative dim, wrong argument kind/count, not GPU memory */
  TJ_ERROR_DTYPE = 2,              /* no specialization takes these element types / ranks */
  TJ_ERROR_SHAPE = 3,              /* no specialization for these shapes / flags (the message lists them) */
  TJ_ERROR_ALIGNMENT = 4,          /* data or strides not aligned as the kernel needs (TMA: 16 bytes) */
  TJ_ERROR_UNSUPPORTED_DEVICE = 5, /* no CUBIN for this GPU's architecture */
  TJ_ERROR_NO_CONTEXT = 6,         /* no current CUDA context on this thread */
  TJ_ERROR_CUDA = 7,               /* a CUDA driver call failed */
  TJ_ERROR_TOO_LARGE = 8,          /* more thread blocks than one launch allows */
  TJ_ERROR_TOO_MANY_CONTEXTS = 9   /* more than 64 CUDA contexts */
}} tj_status;

/* Element types (the values of tj_tensor.dtype). */
typedef enum tj_dtype {{
  TJ_F32 = 0, TJ_F16 = 1, TJ_BF16 = 2, TJ_E4M3 = 3, TJ_E5M2 = 4, TJ_I32 = 5, TJ_I64 = 6, TJ_BOOL = 7
}} tj_dtype;

/* A tensor in GPU memory. Strides are in elements; NULL strides mean contiguous row-major.
 * `data` is a CUdeviceptr cast to a pointer. */
typedef struct tj_tensor {{
  void* data;
  int32_t dtype;            /* tj_dtype */
  int32_t rank;
  const int64_t* shape;     /* rank entries */
  const int64_t* strides;   /* rank entries, or NULL */
}} tj_tensor;

/* One argument of NAME_launchv, in the kernel's parameter order: tensors as TJ_ARG_TENSOR,
 * runtime scalars and specialization values as TJ_ARG_FLOAT or TJ_ARG_INT. */
typedef enum tj_arg_kind {{ TJ_ARG_TENSOR = 0, TJ_ARG_FLOAT = 1, TJ_ARG_INT = 2 }} tj_arg_kind;
typedef struct tj_arg {{
  int32_t kind;             /* tj_arg_kind */
  int32_t reserved;
  union {{
    const tj_tensor* tensor;
    double f;
    int64_t i;
  }} value;
}} tj_arg;

#ifdef TJ_EXPORT_HAVE_DLPACK
typedef DLTensor tj_dltensor;
#else
typedef struct tj_dltensor_unavailable tj_dltensor;   /* include <dlpack/dlpack.h> first */
#endif

/* A short description of a status code (static storage). */
const char* tj_status_message(tj_status status);
#endif /* TJ_EXPORT_COMMON_TYPES */

/* Launches '{kname}' on `stream` (asynchronous; NULL: the legacy default stream) in the
 * calling thread's current CUDA context. Checks the arguments and picks the specialization
 * for their dtypes, shapes and flags and the GPU; returns TJ_SUCCESS once queued. */
tj_status {n}_launch({params});

/* The same with DLPack tensors (kDLCUDA or kDLCUDAManaged memory; byte_offset honored;
 * dtypes float32/16, bfloat16, float8_e4m3fn (code 10), float8_e5m2 (code 12), int32/64, bool).
 * No copies: PyTorch's torch.utils.dlpack.to_dlpack(t) and others pass tensors straight in. */
tj_status {n}_launch_dlpack({dl_params});

/* Generic form: `nargs` arguments in parameter order (for bindings and test drivers). */
tj_status {n}_launchv(CUstream stream, const tj_arg* args, int32_t nargs);

/* Loads every CUBIN that fits the current context's GPU now (otherwise the first launch does). */
tj_status {n}_load(void);

/* What the calling thread's last failed call of this kernel was, e.g.
 * "{n}: argument 'x': ..."; "" before any failure. Valid until that thread's next failure. */
const char* {n}_last_error(void);

/* The signature and the exported specializations, one per line (static storage). */
const char* {n}_specializations(void);

#ifdef __cplusplus
}}
#endif

#endif /* {guard} */
)",
                     fmt::arg("n", n), fmt::arg("kname", k.name), fmt::arg("ver", options.tilejit_version),
                     fmt::arg("args", arg_doc), fmt::arg("listing", listing), fmt::arg("guard", guard),
                     fmt::arg("params", fmt::join(params, ", ")), fmt::arg("dl_params", fmt::join(dl_params, ", ")));
}

std::string write_static_library(const std::vector<std::pair<std::string, std::string>>& objects) {
  std::vector<llvm::NewArchiveMember> members;
  for (const auto& [member, bytes] : objects)
    members.emplace_back(llvm::MemoryBufferRef(llvm::StringRef(bytes.data(), bytes.size()), member));
  auto out = llvm::writeArchiveToBuffer(members, true, llvm::object::Archive::K_GNU, true, false);
  if (!out) {
    std::string msg = llvm::toString(out.takeError());
    throw Error("export: cannot write the static library: " + msg);
  }
  return std::string((*out)->getBufferStart(), (*out)->getBufferSize());
}

}  // namespace tj::codegen
