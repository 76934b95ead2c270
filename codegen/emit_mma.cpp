// The CUDA emitter's tensor-core ops (see emitter.h): TMA rings for staged loads, wgmma and
// mma.sync dots, and the waits and slot releases of the async plan.
#include <fmt/format.h>

#include "codegen/emitter.h"
#include "codegen/emitter_knobs.h"
#include "core/error.h"

namespace tj::codegen::emitter {

std::string operand_type(const SmemTile& t) {
  return fmt::format("tj::dev::SmemOperand<{}, {}, {}, {}, {}>", t.rows, t.row_bytes, t.swizzle, t.mn_major, t.elem_bytes);
}

namespace {

std::string describe(const MmaOperand& o, const ir::Function& f, const MmaPlan& plan) {
  const std::string major = o.tile.mn_major ? "MN-major" : "K-major";
  if (o.source == MmaOperand::Source::staged) {
    const StagedLoad& s = plan.staged[o.staged];
    if (s.copy)
      return fmt::format("'{}' copied by the threads ({}{})", f.params.at(s.op->param).name, major,
                         s.rows_by_parity ? ", even rows then odd" : "");
    if (s.transposed_copy)
      return fmt::format("'{}' by TMA ({} stage{}), copied K-major by the producer warpgroup ({} slots)",
                         f.params.at(s.op->param).name, s.stages, s.stages == 1 ? "" : "s", s.read_stages);
    return fmt::format("'{}' by TMA ({}, {} stage{}{})", f.params.at(s.op->param).name, major, s.stages,
                       s.stages == 1 ? "" : "s", s.rows_by_parity ? ", even rows then odd" : "");
  }
  if (o.source == MmaOperand::Source::fragment) return plan.wgmma() ? "registers (wgmma's register A)" : "registers (A fragments)";
  return fmt::format("registers through shared memory ({})", major);
}

}  // namespace

std::string Emitter::dot_dest(const Op& dot) const {
  auto ip = async_.in_place.find(&dot);
  return ip != async_.in_place.end() ? ref(ip->second) : fmt::format("v{}", dot.result);
}

void Emitter::emit_mma_prologue() {
  if (!mma_.wgmma()) {   // mma.sync: the copy rings' use counters
    for (const StagedLoad& s : mma_.staged)
      if (s.copy && s.stages > 1)
        line(fmt::format("unsigned tj_use{} = 0;   // uses of copy ring {} so far (use n reads slot n % {})", staged_index(s),
                         staged_index(s), s.stages));
    return;
  }
  line(fmt::format("// Tensor cores: {} staged operand ring(s) filled by TMA, {} register operand buffer(s), in tj_tc.",
                   mma_.staged.size(), mma_.buffers.size()));
  for (const StagedLoad& s : mma_.staged) {
    const int i = staged_index(s);
    line(fmt::format("const tj::dev::Ring<{}> tj_r{}{{reinterpret_cast<unsigned long long*>(tj_tc + {})}};", s.stages, i,
                     s.barriers),
         &s.op->loc);
    if (s.transposed_copy)
      line(fmt::format("const tj::dev::Ring<{}> tj_rt{}{{reinterpret_cast<unsigned long long*>(tj_tc + {})}};   // ring {} "
                       "copied K-major",
                       s.read_stages, i, s.read_barriers, i),
           &s.op->loc);
    line(fmt::format("unsigned tj_use{} = 0;   // uses of ring {} so far (fill n goes to slot n % {})", i, i, s.stages));
  }
  line("if (threadIdx.x == 0) {");
  for (const StagedLoad& s : mma_.staged) {
    const int i = staged_index(s);
    if (!s.transposed_copy) {
      line(fmt::format("  tj_r{}.init({});", i, plan_.threads / 32));
      continue;
    }
    // The transposer warps release the TMA slots and fill the K-major ones.
    line(fmt::format("  tj_r{}.init({});", i, kTransposerWarps));
    line(fmt::format("  tj_rt{}.init({}, {});", i, plan_.threads / 32, kTransposerWarps));
  }
  for (size_t t = 0; t < mma_.tmas.size(); ++t) line(fmt::format("  tj::dev::prefetch_tma_descriptor(&tj_tma{});", t));
  line("  tj::dev::fence_mbarrier_init();");
  line("}");
  line("__syncthreads();");
}

std::string Emitter::ahead_expr(int v, const Op& loop, const std::string& iteration) const {
  if (v == loop.body_index) return iteration;
  const Op* d = def_[v];
  bool inside = false;
  ir::walk(*loop.body, [&](const Op& op, int) { inside |= &op == d; });
  if (!inside) return ref(v);
  const TileType& t = f_.type(v);
  switch (d->kind) {
    case OpKind::const_value:
    case OpKind::scalar_param:
    case OpKind::tensor_dim:
    case OpKind::block_size:
      return leaf_name(*d);
    case OpKind::unary: return scalar::unary_expr(d->unary, t.dtype, ahead_expr(d->operands[0], loop, iteration), fast_math_);
    case OpKind::binary:
      return fmt::format("({})", scalar::binary_expr(d->binary, f_.type(d->operands[0]).dtype, t.dtype,
                                                     ahead_expr(d->operands[0], loop, iteration),
                                                     ahead_expr(d->operands[1], loop, iteration)));
    case OpKind::cast:
      return scalar::cast_expr(f_.type(d->operands[0]).dtype, t.dtype, ahead_expr(d->operands[0], loop, iteration));
    case OpKind::where:
      return fmt::format("({} ? {} : {})", ahead_expr(d->operands[0], loop, iteration),
                         ahead_expr(d->operands[1], loop, iteration), ahead_expr(d->operands[2], loop, iteration));
    default:
      throw Error(fmt::format("internal error: kernel '{}': the index at {} cannot be computed ahead", f_.name, d->loc.str()));
  }
}

void Emitter::emit_fill(const StagedLoad& s, const std::string& fill, const std::string& iteration) {
  const int i = staged_index(s);
  const ir::Param& p = f_.params.at(s.op->param);
  const int rank = p.rank();
  const int pieces = static_cast<int>(s.tile.row_bytes / s.tile.swizzle);
  const int piece_elems = s.tile.swizzle / s.tile.elem_bytes;
  line(fmt::format("tj_r{}.acquire({}, {}u);", i, fill, s.tile.bytes()));
  line(fmt::format("unsigned char* const tj_dst = tj_tc + {} + (({}) % {}u) * {};", s.smem_offset, fill, s.stages, s.slot_stride));
  for (int piece = 0; piece < pieces; ++piece) {
    std::vector<std::string> coords;   // innermost first
    for (int d = rank - 1; d >= 0; --d) {
      std::string c = "0";
      if (s.op->indices[d].kind != ir::Index::Kind::all) {
        const int v = s.op->operands[d];
        c = iteration.empty() ? ref(v) : ahead_expr(v, *s.home, iteration);
      }
      if (d == s.inner_dim && piece > 0) c = fmt::format("{} + {}", c, piece * piece_elems);
      coords.push_back(fmt::format("(int)({})", c));
    }
    const int64_t at = static_cast<int64_t>(piece) * s.tile.rows * s.tile.swizzle;
    line(fmt::format("tj::dev::tma_load_{}d(tj_dst + {}, &tj_tma{}, tj_r{}.full({}), {});{}", rank, at, s.tma, i, fill,
                     fmt::join(coords, ", "), s.rows_by_parity ? "   // the even rows" : ""),
         &s.op->loc);
    if (!s.rows_by_parity) continue;
    // The odd rows: the same box (a traversal stride of 2 rows) one row on, into the slot's second half.
    std::string& row = coords.at(static_cast<size_t>(rank - 1 - s.row_dim));
    row = fmt::format("{} + 1)", row.substr(0, row.size() - 1));
    line(fmt::format("tj::dev::tma_load_{}d(tj_dst + {}, &tj_tma{}, tj_r{}.full({}), {});   // the odd rows", rank,
                     at + s.tile.rows / 2 * s.tile.swizzle, s.tma, i, fill, fmt::join(coords, ", ")),
         &s.op->loc);
  }
}

std::vector<const StagedLoad*> Emitter::copy_rings(const Op& loop) const {
  std::vector<const StagedLoad*> out;
  for (const StagedLoad& s : mma_.staged)
    if (s.copy && s.home == &loop && s.stages > 1) out.push_back(&s);
  return out;
}

void Emitter::emit_copy(const StagedLoad& s, const std::string& slot, const std::string& iteration) {
  const Op& op = *s.op;
  const ir::Param& p = f_.params.at(op.param);
  const std::string& T = names_param_.at(op.param);
  auto val = [&](int v) { return iteration.empty() ? ref(v) : ahead_expr(v, *s.home, iteration); };
  const auto [offset, ok] = scalar_index_terms(op, val);
  std::vector<std::string> spans;   // the slot's rows, then their bytes
  for (size_t d = 0; d < op.indices.size(); ++d) {
    if (op.indices[d].kind == ir::Index::Kind::scalar) continue;
    const std::string start = op.indices[d].kind == ir::Index::Kind::all ? "0LL" : val(op.operands[d]);
    spans.push_back(fmt::format("{{{}, {}, {}}}", start, stride_of(p, T, static_cast<int>(d)), dim_limit(op.param, static_cast<int>(d))));
  }
  line(fmt::format("tj::dev::copy_operand<{}, {}, {}{}>({}, {}.data, {}, {}, {}, {});{}", dtag(p.dtype), operand_type(s.tile),
                   plan_.threads, s.rows_by_parity ? ", true" : "", slot, T, offset, ok, spans.at(0), spans.at(1),
                   s.rows_by_parity ? "   // its even rows, then its odd ones" : ""),
       &op.loc);
}

void Emitter::emit_ring_prologue(const Op& loop) {
  if (const auto rings = copy_rings(loop); !rings.empty()) {
    // mma.sync: the first stages - 1 iterations' tiles, one cp.async group per iteration.
    const int S = rings[0]->stages;
    const std::string step = loop_step(loop);
    line("tj::dev::sync_threads();   // every warp is done with the slots' last contents", &loop.loc);
    line("{");
    ++indent_;
    line(fmt::format("long long tj_it = {};", ref(loop.operands[0])));
    line(fmt::format("for (unsigned tj_p = 0; tj_p < {}u; ++tj_p, tj_it += {}) {{", S - 1, step));
    ++indent_;
    line(fmt::format("if (tj_it < {}) {{", ref(loop.operands[1])));
    ++indent_;
    for (const StagedLoad* s : rings) {
      const int i = staged_index(*s);
      emit_copy(*s, fmt::format("tj_tc + {} + ((tj_use{} + tj_p) % {}u) * {}", s->smem_offset, i, S, s->slot_stride), "tj_it");
    }
    --indent_;
    line("}");
    line("tj::dev::cp_async_commit();");
    --indent_;
    line("}");
    --indent_;
    line("}");
  }

  for (const StagedLoad& s : mma_.staged) {
    if (s.home != &loop || s.copy) continue;
    const int i = staged_index(s);
    line(fmt::format("const unsigned tj_first{} = tj_use{};   // ring {}: this run of the loop's first use", i, i, i));
    if (!s.prefetch || s.producer) continue;   // filled where it stands, or by the producer warpgroup
    const std::string step = loop_step(loop);
    line(fmt::format("if (threadIdx.x == 0) {{   // ring {}: fills for the loop's first {} iterations", i, s.stages), &loop.loc);
    ++indent_;
    line(fmt::format("long long tj_it = {};", ref(loop.operands[0])));
    line(fmt::format("for (unsigned tj_p = 0; tj_p < {}u && tj_it < {}; ++tj_p, tj_it += {}) {{", s.stages,
                     ref(loop.operands[1]), step));
    ++indent_;
    emit_fill(s, fmt::format("tj_use{} + tj_p", i), "tj_it");
    --indent_;
    line("}");
    --indent_;
    line("}");
  }
}

void Emitter::emit_ring_iteration(const Op& loop) {
  for (const StagedLoad& s : mma_.staged)
    if (s.home == &loop && (!s.copy || s.stages > 1)) {
      const int i = staged_index(s);
      line(fmt::format("const unsigned tj_u{} = tj_use{}++;   // this iteration's use of ring {}", i, i, i));
    }
  if (const auto rings = copy_rings(loop); !rings.empty()) {
    // mma.sync: this iteration's tiles have landed (the newer groups are the next stages - 2
    // iterations'); after the barrier every warp is done with the previous iteration's slots,
    // which take the tiles of the iteration stages - 1 ahead.
    const int S = rings[0]->stages;
    const std::string step = loop_step(loop);
    line(fmt::format("tj::dev::cp_async_wait<{}>();", S - 2));
    line("tj::dev::sync_threads();");
    line(fmt::format("if (const long long tj_next = {} + {} * {}; tj_next < {}) {{", ref(loop.body_index), S - 1, step,
                     ref(loop.operands[1])));
    ++indent_;
    for (const StagedLoad* s : rings) {
      const int i = staged_index(*s);
      emit_copy(*s, fmt::format("tj_tc + {} + ((tj_u{} + {}u) % {}u) * {}", s->smem_offset, i, S - 1, S, s->slot_stride),
                "tj_next");
    }
    --indent_;
    line("}");
    line("tj::dev::cp_async_commit();");
  }
}

void Emitter::emit_staged_load(const Op& op, const StagedLoad& s) {
  if (s.copy) {
    const int i = staged_index(s);
    names_[op.result] = fmt::format("v{}", op.result);
    if (s.stages > 1) {   // filled ahead (emit_ring_iteration)
      line(fmt::format("unsigned char* const v{} = tj_tc + {} + (tj_u{} % {}u) * {};   // '{}' [{} x {} bytes]", op.result,
                       s.smem_offset, i, s.stages, s.slot_stride, f_.params.at(op.param).name, s.tile.rows, s.tile.row_bytes),
           &op.loc);
      return;
    }
    // Copied where it stands, once every warp is done with the slot's last contents.
    line("tj::dev::sync_threads();   // every warp is done with the slot's last contents", &op.loc);
    line(fmt::format("unsigned char* const v{} = tj_tc + {};", op.result, s.smem_offset), &op.loc);
    emit_copy(s, fmt::format("v{}", op.result), "");
    line("tj::dev::cp_async_wait_all();");
    line("tj::dev::sync_threads();");
    return;
  }
  const int i = staged_index(s);
  if (!s.home) line(fmt::format("const unsigned tj_u{} = tj_use{}++;", i, i));
  if (!s.prefetch && !s.producer) {
    line("if (threadIdx.x == 0) {", &op.loc);
    ++indent_;
    emit_fill(s, fmt::format("tj_u{}", i), "");
    --indent_;
    line("}");
  }
  // (Knob overlap: a late load reads the use of the iteration its late ops belong to.)
  const auto renamed = use_name_.find(i);
  const std::string use = renamed != use_name_.end() ? renamed->second : fmt::format("tj_u{}", i);
  names_[op.result] = fmt::format("v{}", op.result);
  if (s.transposed_copy) {
    line(fmt::format("{}.wait({});   // '{}' [{} x {} bytes], copied K-major, has landed", read_ring(s), use,
                     f_.params.at(op.param).name, s.read_tile.rows, s.read_tile.row_bytes),
         &op.loc);
    line(fmt::format("const unsigned v{} = tj::dev::smem_u32(tj_tc + {}) + ({} % {}u) * {}u;", op.result, s.read_offset, use,
                     s.read_stages, s.read_slot_stride),
         &op.loc);
    return;
  }
  line(fmt::format("tj_r{}.wait({});   // '{}' [{} x {} bytes] has landed", i, use, f_.params.at(op.param).name, s.tile.rows,
                   s.tile.row_bytes),
       &op.loc);
  line(fmt::format("const unsigned v{} = tj::dev::smem_u32(tj_tc + {}) + ({} % {}u) * {}u;", op.result, s.smem_offset, use,
                   s.stages, s.slot_stride),
       &op.loc);
}

std::string Emitter::read_ring(const StagedLoad& s) const {
  return fmt::format("{}{}", s.transposed_copy ? "tj_rt" : "tj_r", staged_index(s));
}

void Emitter::note_computed(const Op& op) {
  if (!pin_waits_ || op.result < 0) return;
  switch (op.kind) {
    case OpKind::unary:
    case OpKind::binary:
    case OpKind::where:
    case OpKind::cast:
    case OpKind::reduce:
      break;
    default:
      return;
  }
  if (f_.type(op.result).dtype != DType::f32 || !plan_.of(op.result).in_registers()) return;
  since_wait_.emplace_back(op.result, indent_);
}

void Emitter::emit_pin() {
  std::vector<std::pair<int, int>> noted;
  noted.swap(since_wait_);
  std::set<int> in_scope, used;
  for (const auto& [v, indent] : noted)
    if (indent == indent_) in_scope.insert(v);
  // A noted tile computed from another (directly or through un-noted ops: broadcasts, reads)
  // keeps that one above the wait too.
  std::set<int> seen;
  std::function<void(int, bool)> mark = [&](int v, bool top) {
    if (v < 0 || !seen.insert(v).second) return;
    if (!top && in_scope.count(v)) used.insert(v);
    const Op* d = def_[v];
    if (!d || d->kind == OpKind::loop || d->kind == OpKind::var_read || d->kind == OpKind::dot) return;
    for (int x : d->operands) mark(x, false);
  };
  for (int v : in_scope) {
    seen.clear();
    mark(v, true);
  }
  std::vector<std::string> sinks;
  for (int v : in_scope)
    if (!used.count(v)) sinks.push_back(ref(v));
  if (sinks.empty()) return;
  pins_used_ = true;
  line(fmt::format("tj::dev::pin_above_wait(tj_smem + tj_pin_at, {});   // computed above the wait (knob pin_waits)",
                   fmt::join(sinks, ", ")));
}

void Emitter::emit_wait(const AsyncPlan::Wait& w, const ir::SourceLoc* loc, const Op* exited_loop) {
  if (w.pending >= 0) {
    emit_pin();
    line(fmt::format("tj::dev::wgmma_wait<{}>();", w.pending), loc);
    for (const Op* d : w.completed) line(fmt::format("tj::dev::fence_tile({});", dot_dest(*d)));
  }
  for (const AsyncPlan::Release& r : w.releases) {
    const StagedLoad& s = mma_.staged[r.staged];
    const int i = staged_index(s);
    const std::string ring = read_ring(s);
    if (!s.home) {   // once per program
      line(fmt::format("{1}.release(tj_u{0});   // ring {0}: this program's use", i, ring));
      continue;
    }
    const Op& home = *s.home;
    const std::string step = loop_step(home);
    if (exited_loop == &home) {   // after its home loop: the last iteration's use, if the loop ran
      line(fmt::format("if (tj_use{0} != tj_first{0}) {1}.release(tj_use{0} - 1u);   // ring {0}: the last iteration's use",
                       i, ring));
      continue;
    }
    const std::string idx = ref(home.body_index), begin = ref(home.operands[0]), end = ref(home.operands[1]);
    const std::string use = r.previous ? fmt::format("tj_u{} - 1u", i) : fmt::format("tj_u{}", i);
    const std::string it = r.previous ? fmt::format("{} - {}", idx, step) : idx;
    line(r.previous ? fmt::format("if ({} != {}) {{   // ring {}: the previous iteration's use", idx, begin, i)
                    : fmt::format("{{   // ring {}: this iteration's use", i));
    ++indent_;
    line(fmt::format("{}.release({});", ring, use));
    if (s.prefetch && !s.producer) {
      line(fmt::format("const long long tj_next = {} + {} * {};", it, s.stages, step));
      line(fmt::format("if (threadIdx.x == 0 && tj_next < {}) {{", end));
      ++indent_;
      emit_fill(s, fmt::format("({}) + {}u", use, s.stages), "tj_next");
      --indent_;
      line("}");
    }
    --indent_;
    line("}");
  }
}

// ---- the producer warpgroup ------------------------------------------------------------------------

bool holds_producer_load(const Op& op, const MmaPlan& mma, bool transposed) {
  bool found = false;
  if (!op.body) return false;
  ir::walk(*op.body, [&](const Op& o, int) {
    const StagedLoad* s = mma.staged_of(&o);
    found |= s && s->producer && (!transposed || s->transposed_copy);
  });
  return found;
}

void Emitter::emit_producer(const std::vector<const ir::Region*>& regions, const std::vector<const Op*>& chain,
                            const std::function<void()>& program_begin, const std::function<void()>& program_end) {
  // The scalars the fills and the loops around them need.
  std::vector<int> work;
  for (const StagedLoad& s : mma_.staged) {
    if (!s.producer) continue;
    work.insert(work.end(), s.op->operands.begin(), s.op->operands.end());
  }
  ir::walk(f_.body, [&](const Op& op, int) {
    if (op.kind == OpKind::loop && !op.launch && holds_producer_load(op, mma_))
      work.insert(work.end(), op.operands.begin(), op.operands.end());
  });
  producer_needs_.clear();
  while (!work.empty()) {
    const int v = work.back();
    work.pop_back();
    const Op* d = def_[v];
    if (!d || !producer_needs_.insert(v).second) continue;
    work.insert(work.end(), d->operands.begin(), d->operands.end());
  }
  // Registers: a warp scheduler holds 512 per lane, shared by one warp of each warpgroup of the
  // blocks on the SM (knob simt_min_blocks, default 1); the producer's warpgroup gives up all but
  // a few to the tiles' warpgroups (setmaxnreg).
  const int G = mma_.warpgroups * slots_;   // the warpgroups that hold tiles, of every slot
  const int B = static_cast<int>(std::max<int64_t>(1, knobs::simt_min_blocks.of(cfg_)));
  const int producer_regs = G * B >= 3 ? 24 : 40;
  const int tile_regs = std::min(256, (512 / B / 8 * 8 - producer_regs) / G / 8 * 8);
  const bool share = G >= 2 || B >= 2;   // one block of one tile warpgroup: every thread has its 255
  line(fmt::format("if (threadIdx.x >= {}) {{   // the producer warpgroup: TMA fills of the staged operands, ahead of use",
                   tile_threads()));
  ++indent_;
  if (share) line(fmt::format("tj::dev::setmaxnreg_dec<{}>();", producer_regs));
  line(fmt::format("if (threadIdx.x == {}) {{", tile_threads()));
  ++indent_;
  auto nest = [&](ProducerRole role) {
    emitting_producer_ = true;
    program_begin();
    emit_producer_nest(regions, chain, role);
    program_end();
    emitting_producer_ = false;
  };
  nest(ProducerRole::fill);
  --indent_;
  line("}");
  if (std::any_of(mma_.staged.begin(), mma_.staged.end(), [](const StagedLoad& s) { return s.transposed_copy; })) {
    // The warpgroup's last warps copy the fp8 fills that the dots read K-major, one fill behind TMA.
    line(fmt::format("else if (threadIdx.x >= {}) {{   // the transposer warps: K-major copies of fp8 fills",
                     plan_.threads + 32 * (4 - kTransposerWarps)));
    ++indent_;
    line(fmt::format("const int tj_tid = (int)threadIdx.x - {};", plan_.threads + 32 * (4 - kTransposerWarps)));
    nest(ProducerRole::transpose);
    --indent_;
    line("}");
  }
  line("return;");
  --indent_;
  line("}");
  if (share) line(fmt::format("tj::dev::setmaxnreg_inc<{}>();   // the tiles' warpgroups take the producer's registers", tile_regs));
}

void Emitter::emit_producer_nest(const std::vector<const ir::Region*>& regions, const std::vector<const Op*>& chain,
                                 ProducerRole role) {
  for (size_t k = 0; k < chain.size(); ++k)
    for (const Op& op : regions[k]->ops)
      if (&op != chain[k] && !hoisted_.count(&op)) emit_producer_op(op, role);
  for (const Op& op : regions[chain.size()]->ops) emit_producer_op(op, role);
}

void Emitter::emit_producer_op(const Op& op, ProducerRole role) {
  if (op.kind == OpKind::loop) {
    if (!holds_producer_load(op, mma_, role == ProducerRole::transpose)) return;
    names_[op.body_index] = fmt::format("v{}", op.body_index);
    const std::string step = loop_step(op);
    line(fmt::format("for (long long v{0} = {1}; v{0} < {2}; v{0} += {3}) {{", op.body_index, ref(op.operands[0]),
                     ref(op.operands[1]), step),
         &op.loc);
    ++indent_;
    for (const Op& inner : op.body->ops) emit_producer_op(inner, role);
    --indent_;
    line("}");
    return;
  }
  if (const StagedLoad* s = mma_.staged_of(&op)) {
    if (!s->producer) return;
    const int i = staged_index(*s);
    if (role == ProducerRole::transpose) {
      if (!s->transposed_copy) return;
      const std::string name = f_.params.at(op.param).name;
      line(fmt::format("{{   // '{}': fill n, copied K-major into slot n % {} of ring {} copied", name, s->read_stages, i), &op.loc);
      ++indent_;
      line(fmt::format("const unsigned tj_f = tj_use{}++;", i));
      line(fmt::format("tj_r{}.wait(tj_f);   // TMA's fill has landed", i));
      line(fmt::format("tj_rt{}.acquire_slot(tj_f);   // the dots are done with the slot's last copy", i));
      SmemTile src = s->tile;
      src.mn_major = true;
      line(fmt::format("tj::dev::transpose_8bit<{}, {}{}>(tj_tc + {} + (tj_f % {}u) * {}, tj_tc + {} + (tj_f % {}u) * {}, tj_tid, {});",
                       operand_type(src), operand_type(s->read_tile), s->permute_k ? ", true" : "", s->smem_offset,
                       s->stages, s->slot_stride,
                       s->read_offset, s->read_stages, s->read_slot_stride, 32 * kTransposerWarps));
      line("tj::dev::fence_proxy_async_shared();   // the copy, visible to the tensor cores");
      line(fmt::format("tj_rt{}.filled(tj_f);", i));
      line(fmt::format("tj_r{}.release(tj_f);   // TMA may refill the slot", i));
      --indent_;
      line("}");
      return;
    }
    if (role == ProducerRole::count) {
      line(fmt::format("++tj_use{};", i), &op.loc);
      return;
    }
    line("{");
    ++indent_;
    line(fmt::format("const unsigned tj_f = tj_use{}++;", i));
    emit_fill(*s, "tj_f", "");
    --indent_;
    line("}");
    return;
  }
  if (op.result >= 0 && producer_needs_.count(op.result)) emit_simt_op(op);
}

int64_t Emitter::row_blocks(const MmaDot& d) const {
  return mma_.wgmma() ? d.m / (64 * mma_.warpgroups) : d.m / (16 * mma_.warps_r);
}

int64_t Emitter::a_frag_regs(const MmaDot& d) const { return row_blocks(d) * (d.k * size_bytes(d.ta) / 32) * 4; }

void Emitter::emit_a_frags(const Op& op, const MmaDot& d, const std::string& frags) {
  std::string value = ref(d.a.value);
  const size_t kpos = op.ival == 1 ? 3 : 2;
  if (d.k_masked && op.operands.size() >= kpos + 2 && !provably_full(op.operands[kpos], op.operands[kpos + 1], d.k)) {
    // Where the tile runs past the dot's k range, its columns there contribute nothing.
    const std::string masked = fresh(d.a.value, "k"), kb = ref(op.operands[kpos]), ke = ref(op.operands[kpos + 1]);
    line(fmt::format("{} {} = {};", tile_type(DType::f32, plan_.of(d.a.value)), masked, value), &op.loc);
    line(fmt::format("if ({} + {} > {}) {} = tj::dev::mask_k_cols({}, {}, {});", kb, d.k, ke, masked, value, kb, ke), &op.loc);
    value = masked;
  }
  // B's K in key order (its transposed copy put it so): the fragments need no shuffles.
  const bool in_order = d.b.source == MmaOperand::Source::staged && mma_.staged.at(d.b.staged).permute_k;
  line(fmt::format("tj::dev::tile_to_a_frag<{}, {}, {}{}>({}, {});", wgmma_type(d.ta), row_blocks(d), d.k,
                   in_order ? fmt::format(", {}, true", alias(plan_.of(d.a.value))) : "",
                   value, frags),
       &op.loc);
}

void Emitter::emit_mma_dot(const Op& op, const MmaDot& d) {
  const Layout& L = plan_.of(op.result);
  if (!L.is_mma())
    throw Error(fmt::format("internal error: kernel '{}': the tensor-core dot at {} has no accumulator layout", f_.name,
                            op.loc.str()));
  const int es = size_bytes(d.ta);
  const int k_step = 32 / es;
  const bool wg = mma_.wgmma();
  line(fmt::format("// {} x {} += {} x {} . {} x {} on the tensor cores: {} m{}n{}k{} {} x {}; a: {}; b: {}", d.m, d.n, d.m,
                   d.k, d.k, d.n, wg ? "wgmma" : "mma.sync", wg ? 64 : 16, d.n_per_instr, k_step, name(d.ta), name(d.tb),
                   describe(d.a, f_, mma_), describe(d.b, f_, mma_)),
       &op.loc);
  const bool has_acc = op.ival == 1;
  const size_t kpos = has_acc ? 3 : 2;
  const bool has_krange = op.operands.size() >= kpos + 2;
  // 1. The registers it accumulates in: its variable's (in place), or its own.
  const std::string dest = dot_dest(op);
  auto ip = async_.in_place.find(&op);
  if (ip != async_.in_place.end()) {
    if (has_acc) {
      const Op* acc = def_[op.operands[2]];
      auto alias = acc ? async_.alias_reads.find(acc) : async_.alias_reads.end();
      if (alias == async_.alias_reads.end() || alias->second != ip->second)
        line(fmt::format("{} = {};", dest, operand(op.operands[2], plan_.of(ip->second), op.loc)), &op.loc);
    }
  } else {
    line(fmt::format("{} {}{};", tile_type(DType::f32, L), dest,
                     has_acc ? fmt::format(" = {}", operand(op.operands[2], L, op.loc)) : std::string()),
         &op.loc);
    names_[op.result] = dest;
  }
  // 2. The operands' shared-memory tiles (a register-A fragment for a in the accumulator layout).
  std::string addr[2];
  const int G = mma_.warpgroups;
  const int64_t rb = row_blocks(d);
  const int64_t ks = d.k * es / 32;
  bool staging = false;   // a register operand is being written into its buffer
  for (int which = 0; which < 2; ++which) {
    const MmaOperand& o = which == 0 ? d.a : d.b;
    if (o.source == MmaOperand::Source::fragment) {
      if (auto carried = carried_fragment_.find(&op); carried != carried_fragment_.end()) {
        addr[which] = carried->second;   // knob overlap: converted (and k-masked) where the value was made
        continue;
      }
      addr[which] = fmt::format("tj_a{}", op.result);
      line(fmt::format("unsigned {}[{}];   // a as register fragments", addr[which], a_frag_regs(d)), &op.loc);
      emit_a_frags(op, d, addr[which]);
      continue;
    }
    // Which dim of the operand's tile holds K.
    const int k_dim = which == 0 ? (o.transposed ? 0 : 1) : (o.transposed ? 1 : 0);
    if (o.source == MmaOperand::Source::staged) {
      addr[which] = ref(o.value);
      // (No tail where every tile of the k range is whole: the loop's index and end multiples of it.)
      const bool k_tail = d.k_masked && !provably_full(op.operands[kpos], op.operands[kpos + 1], d.k);
      if (k_tail && !wg) {
        const std::string kb = ref(op.operands[kpos]), ke = ref(op.operands[kpos + 1]);
        line(fmt::format("if ({} + {} > {}) {{   // the tile runs past the dot's k range: zero its tail", kb, d.k, ke), &op.loc);
        line("  tj::dev::sync_threads();   // no warp still reads the buffer for an earlier dot");
        line(fmt::format("  tj::dev::zero_k_tail<{}, {}>({}, (int)({} - {}));", operand_type(o.tile), plan_.threads, addr[which],
                         ke, kb));
        line("  tj::dev::sync_threads();");
        line("}");
      } else if (k_tail) {
        // Past k_end the rows of K contribute nothing: zero them where the tile runs past it.
        const std::string kb = ref(op.operands[kpos]), ke = ref(op.operands[kpos + 1]);
        line(fmt::format("if ({} + {} > {}) {{   // the tile runs past the dot's k range: zero its tail", kb, d.k, ke), &op.loc);
        line("  tj::dev::sync_threads();   // no warpgroup still reads the buffer for an earlier dot");
        const bool key_order = mma_.staged.at(o.staged).permute_k;
        line(fmt::format("  tj::dev::zero_k_tail<{}, {}, {}{}>({}, (int)({} - {}));", operand_type(o.tile), o.tile.mn_major,
                         plan_.threads, key_order ? ", true" : "", addr[which], ke, kb));
        line("  tj::dev::fence_proxy_async_shared();");
        line("  tj::dev::sync_threads();");
        line("}");
      }
      continue;
    }
    const OperandBuffer& b = mma_.buffers.at(o.buffer);
    const int rows_dim = 1 - k_dim;
    const bool kmask = d.k_masked && has_krange && !provably_full(op.operands[kpos], op.operands[kpos + 1], d.k);
    if (!staging) line("tj::dev::sync_threads();   // every warp is done with the buffers' last contents", &op.loc);
    staging = true;
    line(fmt::format("tj::dev::stage_operand<{}, {}, {}, {}>({}, tj_tc + {}, {}, {});", dtag(which == 0 ? d.ta : d.tb),
                     operand_type(b.tile), rows_dim, kmask, ref(o.value), b.smem_offset,
                     kmask ? ref(op.operands[kpos]) : "0", kmask ? ref(op.operands[kpos + 1]) : "0"),
         &op.loc);
    addr[which] = wg ? fmt::format("tj::dev::smem_u32(tj_tc + {})", b.smem_offset) : fmt::format("tj_tc + {}", b.smem_offset);
  }
  if (staging) {   // the buffers' writes before the tensor cores read them
    if (wg) line("tj::dev::fence_proxy_async_shared();");
    line("tj::dev::sync_threads();");
  }
  if (!wg) {   // 3. mma.sync: each warp its rows, done when it returns
    if (d.a.source == MmaOperand::Source::fragment)
      line(fmt::format("tj::dev::mma_sync_rs<{}, {}, {}, {}, {}, {}>({}.v, {}, {}, {});", rb, d.n, ks, wgmma_type(d.ta),
                       wgmma_type(d.tb), operand_type(d.b.tile), dest, addr[0], addr[1], has_acc ? 1 : 0),
           &op.loc);
    else
      line(fmt::format("tj::dev::mma_sync_ss<{}, {}, {}, {}, {}, {}, {}, {}, {}>({}.v, {}, {}, {});", mma_.warps_r, mma_.warps_c, rb, d.n, ks,
                       wgmma_type(d.ta), wgmma_type(d.tb), operand_type(d.a.tile), operand_type(d.b.tile), dest, addr[0],
                       addr[1], has_acc ? 1 : 0),
           &op.loc);
    return;
  }
  // 3. Issue: one commit group per dot (in its warpgroup's turn, knob wg_turns).
  const auto turn = turns_.find(&op);
  if (turn != turns_.end()) line(fmt::format("tj::dev::Turns<{}>::take();", G));
  line("tj::dev::wgmma_fence();");
  if (d.a.source == MmaOperand::Source::fragment)
    line(fmt::format("tj::dev::wgmma_rs<{}, {}, {}, {}, {}, {}, {}>({}.v, {}, {}, {});", rb, d.n, d.n_per_instr, ks,
                     wgmma_type(d.ta), wgmma_type(d.tb), operand_type(d.b.tile), dest, addr[0], addr[1], has_acc ? 1 : 0),
         &op.loc);
  else
    line(fmt::format("tj::dev::wgmma_ss<{}, {}, {}, {}, {}, {}, {}, {}, {}>({}.v, {}, {}, {}, {});", G, rb, d.n, d.n_per_instr, ks,
                     wgmma_type(d.ta), wgmma_type(d.tb), operand_type(d.a.tile), operand_type(d.b.tile), dest, addr[0], addr[1],
                     has_acc ? 1 : 0, G > 1 ? "tj_wg" : "0"),
         &op.loc);
  line("tj::dev::wgmma_commit();");
  if (turn != turns_.end()) {
    const Op& loop = *turn->second.loop;
    line(fmt::format("tj::dev::Turns<{}>::pass({});", G,
                     turn->second.last ? fmt::format("v{} + {} >= {}", loop.body_index, loop_step(loop), ref(loop.operands[1]))
                                       : "false"));
  }
  line(fmt::format("tj::dev::fence_tile({});", dest));
}

}  // namespace tj::codegen::emitter
