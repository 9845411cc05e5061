// ember._C.Replay: the kernel calls one forward of a graph segment made, recorded once and run again in one call,
// with no Python between them (python/ember/_optimize/graph/replay.py records them and decides when a replay
// stands for the segment's forward).
//
// Why: inside a transformer's forward at batch 1 each fused node costs 30-50 us of interpreter and dispatcher time
// around a kernel of about as long (the interpreter runs cold after each kernel), and the view operations between
// the nodes cost as much again. A replay pays that once per segment.
//
// Each operand of a recorded call is a view at a byte offset into one of the replay's slots: the tensors each run
// passes (the segment's inputs and the outputs it returns, allocated by the caller), or tensors bound for the
// replay's life (weights read in place, a mask computed from sizes alone, the buffer the segment's intermediate
// values share). The view's sizes, strides and dtype are the recorded ones; a run checks that each tensor it is
// given reaches as far as the views into its slot reach, so no run reads or writes outside what it was given.
#include "replay_binding.h"

#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <array>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dlpack_arg.h"
#include "ember/attention.h"
#include "ember/bf16.h"
#include "ember/convolution.h"
#include "ember/copy.h"
#include "ember/epilogue.h"
#include "ember/errors.h"
#include "ember/kv_cache.h"
#include "ember/linear.h"
#include "ember/norm.h"
#include "ember/pool.h"
#include "ember/rope.h"
#include "onednn_binding.h"
#include "pool_binding.h"
#include "tensor_args.h"

namespace py = pybind11;

namespace ember::binding {
namespace {

using Bases = std::vector<char*>;

/// A recorded operand: the view's sizes, strides and dtype, at `offset` bytes from the start of slot `slot`.
struct SlotView {
  int slot = 0;
  int64_t offset = 0;
  TensorView view;  // (data() null: a run places it)

  TensorView at(const Bases& bases) const { return view.with_data(bases[static_cast<size_t>(slot)] + offset); }
};

class Replay {
 public:
  explicit Replay(int call_slots) : call_slots_(call_slots) {
    EMBER_CHECK(call_slots >= 0, ValueError, "Replay: call_slots must be >= 0, got ", call_slots);
    reach_.assign(static_cast<size_t>(call_slots), 0);
  }

  int constant(const TensorArg& tensor) {
    constants_.push_back(std::make_unique<DLPackArg>(tensor.ptr(), "Replay.constant", "tensor"));
    const int64_t extent = constants_.back()->view().byte_extent();
    EMBER_CHECK(extent >= 0, ValueError, "Replay.constant: tensor must have no negative strides, got ",
                constants_.back()->view().describe());
    reach_.push_back(0);
    extents_.push_back(extent);
    return slots() - 1;
  }

  void linear(const py::object& layer, const py::handle& x, const py::handle& weight, const py::handle& out,
              const std::vector<std::string>& epilogue, const py::handle& residual) {
    constexpr const char* op = "Replay.linear";
    const Linear& kernel = layer.cast<const Linear&>();
    SlotView xs = ref(x, op, "x"), os = ref(out, op, "out");
    std::optional<SlotView> ws = optional_ref(weight, op, "weight"), rs = optional_ref(residual, op, "residual");
    check_same_leading(xs.view, os.view, op, "out");
    if (rs) check_same_leading(xs.view, rs->view, op, "residual");
    xs.view = rows_of(xs.view, op, "x");
    os.view = rows_of(os.view, op, "out");
    if (rs) rs->view = rows_of(rs->view, op, "residual");
    Epilogue ops = parse_epilogue(epilogue, op);
    keep_.push_back(layer);
    steps_.emplace_back([&kernel, xs, ws, os, rs, ops = std::move(ops)](const Bases& b) {
      const std::optional<TensorView> w = ws ? std::optional(ws->at(b)) : std::nullopt;
      const std::optional<TensorView> r = rs ? std::optional(rs->at(b)) : std::nullopt;
      kernel.forward(xs.at(b), w ? &*w : nullptr, os.at(b), ops, r ? &*r : nullptr);
    });
  }

  void convolution(const py::object& layer, const py::handle& x, const py::handle& out,
                   const std::vector<std::string>& epilogue, const py::handle& residual) {
    constexpr const char* op = "Replay.convolution";
    const Convolution& kernel = layer.cast<const Convolution&>();
    const SlotView xs = ref(x, op, "x"), os = ref(out, op, "out");
    const std::optional<SlotView> rs = optional_ref(residual, op, "residual");
    Epilogue ops = parse_epilogue(epilogue, op);
    keep_.push_back(layer);
    steps_.emplace_back([&kernel, xs, os, rs, ops = std::move(ops)](const Bases& b) {
      const std::optional<TensorView> r = rs ? std::optional(rs->at(b)) : std::nullopt;
      kernel.forward(xs.at(b), os.at(b), ops, r ? &*r : nullptr);
    });
  }

  void row_norm(const std::string& kind, const py::handle& x, const py::handle& residual, const py::handle& weight,
                const py::handle& bias, double eps, const py::handle& out, const py::handle& sum_out,
                const py::handle& out_bf16) {
    constexpr const char* op = "Replay.row_norm";
    EMBER_CHECK(kind == "layer" || kind == "rms", ValueError, op, ": kind must be 'layer' or 'rms', got '", kind, "'");
    const norm::RowNorm k = kind == "rms" ? norm::RowNorm::rms : norm::RowNorm::layer;
    const SlotView xs = ref(x, op, "x"), os = ref(out, op, "out");
    const std::optional<SlotView> rs = optional_ref(residual, op, "residual"), ws = optional_ref(weight, op, "weight"),
                                  bs = optional_ref(bias, op, "bias"), ss = optional_ref(sum_out, op, "sum_out"),
                                  ls = optional_ref(out_bf16, op, "out_bf16");
    steps_.emplace_back([k, xs, rs, ws, bs, eps, os, ss, ls](const Bases& b) {
      const auto place = [&b](const std::optional<SlotView>& s) {
        return s ? std::optional<TensorView>(s->at(b)) : std::nullopt;
      };
      const auto r = place(rs), w = place(ws), bias = place(bs), s = place(ss), l = place(ls);
      const auto ptr = [](const std::optional<TensorView>& v) { return v ? &*v : nullptr; };
      norm::row_norm(k, xs.at(b), ptr(r), ptr(w), ptr(bias), eps, os.at(b), ptr(s), ptr(l));
    });
  }

  void attention(const py::handle& q, const py::handle& k, const py::handle& v, const py::handle& mask, bool causal,
                 double scale, const py::handle& out) {
    constexpr const char* op = "Replay.attention";
    const SlotView qs = ref(q, op, "q"), ks = ref(k, op, "k"), vs = ref(v, op, "v"), os = ref(out, op, "out");
    const std::optional<SlotView> ms = optional_ref(mask, op, "mask");
    steps_.emplace_back([qs, ks, vs, ms, causal, scale, os](const Bases& b) {
      const std::optional<TensorView> m = ms ? std::optional(ms->at(b)) : std::nullopt;
      attention::scaled_dot_product(qs.at(b), ks.at(b), vs.at(b), m ? &*m : nullptr, causal, scale, os.at(b));
    });
  }

  void rotary_embedding(const py::handle& x, const py::handle& cos, const py::handle& sin, const py::handle& out) {
    constexpr const char* op = "Replay.rotary_embedding";
    const SlotView xs = ref(x, op, "x"), cs = ref(cos, op, "cos"), ss = ref(sin, op, "sin"), os = ref(out, op, "out");
    steps_.emplace_back(
        [xs, cs, ss, os](const Bases& b) { rope::rotate_half(xs.at(b), cs.at(b), ss.at(b), os.at(b)); });
  }

  // A generation's decode step (python/ember/llm/decode_replay.py): the cache is the one the run is given, so one
  // recording serves every generation of its batch size.
  void kv_write(int64_t layer, const py::handle& k, const py::handle& v) {
    constexpr const char* op = "Replay.kv_write";
    const SlotView ks = ref(k, op, "k"), vs = ref(v, op, "v");
    steps_.emplace_back(
        [this, layer, ks, vs](const Bases& b) { run_cache(op).write(layer, ks.at(b), vs.at(b), nullptr); });
  }

  void attention_over_cache(const py::handle& q, int64_t layer, int64_t window, double scale, const py::handle& out,
                            double softcap) {
    constexpr const char* op = "Replay.attention_over_cache";
    const SlotView qs = ref(q, op, "q"), os = ref(out, op, "out");
    steps_.emplace_back([this, qs, layer, window, scale, os, softcap](const Bases& b) {
      attention::over_cache(qs.at(b), run_cache(op), layer, nullptr, window, scale, os.at(b), softcap);
    });
  }

  void round_bf16(const py::handle& x, const py::handle& out) {
    constexpr const char* op = "Replay.round_bf16";
    const SlotView xs = ref(x, op, "x"), os = ref(out, op, "out");
    steps_.emplace_back([xs, os](const Bases& b) { bf16::round(xs.at(b), os.at(b)); });
  }

  void copy(const py::handle& src, const py::handle& out) {
    constexpr const char* op = "Replay.copy";
    const SlotView ss = ref(src, op, "src"), os = ref(out, op, "out");
    EMBER_CHECK(ss.view.dtype() == os.view.dtype() && ss.view.ndim() == os.view.ndim() &&
                    std::equal(ss.view.sizes(), ss.view.sizes() + ss.view.ndim(), os.view.sizes()),
                ValueError, op, ": out must have src's dtype and sizes, got ", os.view.describe(), " for ",
                ss.view.describe());
    steps_.emplace_back([ss, os](const Bases& b) { ember::copy(ss.at(b), os.at(b)); });
  }

  void multiply(const py::handle& x, const py::handle& factor, const py::handle& out) {
    constexpr const char* op = "Replay.multiply";
    const SlotView xs = ref(x, op, "x"), fs = ref(factor, op, "factor"), os = ref(out, op, "out");
    steps_.emplace_back([xs, fs, os](const Bases& b) { ember::multiply(xs.at(b), fs.at(b), os.at(b)); });
  }

  void zero(const py::handle& out) {
    const SlotView os = ref(out, "Replay.zero", "out");
    steps_.emplace_back([os](const Bases& b) { ember::zero(os.at(b)); });
  }

  void gather_rows(const py::handle& src, const py::handle& rows, const py::handle& out) {
    constexpr const char* op = "Replay.gather_rows";
    const SlotView ss = ref(src, op, "src"), rs = ref(rows, op, "rows"), os = ref(out, op, "out");
    steps_.emplace_back([ss, rs, os](const Bases& b) { ember::gather_rows(ss.at(b), rs.at(b), os.at(b)); });
  }

  using Pair = std::array<int64_t, 2>;

  void max_pool2d(const py::handle& x, const Pair& kernel, const Pair& stride, const Pair& padding,
                  const Pair& dilation, bool ceil_mode, bool relu, const py::handle& out) {
    constexpr const char* op = "Replay.max_pool2d";
    const SlotView xs = ref(x, op, "x"), os = ref(out, op, "out");
    const pool::Window2d window = pool_window(kernel, stride, padding, dilation, ceil_mode);
    steps_.emplace_back([xs, os, window, relu](const Bases& b) { pool::max_pool2d(xs.at(b), window, relu, os.at(b)); });
  }

  void avg_pool2d(const py::handle& x, const Pair& kernel, const Pair& stride, const Pair& padding, bool ceil_mode,
                  bool count_include_pad, int64_t divisor_override, const py::handle& out) {
    constexpr const char* op = "Replay.avg_pool2d";
    const SlotView xs = ref(x, op, "x"), os = ref(out, op, "out");
    const pool::Window2d window = pool_window(kernel, stride, padding, {1, 1}, ceil_mode);
    steps_.emplace_back([xs, os, window, count_include_pad, divisor_override](const Bases& b) {
      pool::avg_pool2d(xs.at(b), window, count_include_pad, divisor_override, os.at(b));
    });
  }

  void batch_norm(const py::handle& x, const py::handle& weight, const py::handle& bias, const py::handle& mean,
                  const py::handle& var, double eps, bool relu, const py::handle& out) {
    constexpr const char* op = "Replay.batch_norm";
    const SlotView xs = ref(x, op, "x"), ws = ref(weight, op, "weight"), bs = ref(bias, op, "bias"),
                   ms = ref(mean, op, "mean"), vs = ref(var, op, "var"), os = ref(out, op, "out");
    steps_.emplace_back([xs, ws, bs, ms, vs, eps, relu, os](const Bases& b) {
      norm::frozen_batch_norm(xs.at(b), ws.at(b), bs.at(b), ms.at(b), vs.at(b), eps, os.at(b), relu);
    });
  }

  void run(const TensorListArg& tensors, const py::object& cache_arg) {
    constexpr const char* op = "Replay.run";
    EMBER_CHECK(static_cast<int>(py::len(tensors)) == call_slots_, ValueError, op, ": takes ", call_slots_,
                " tensors (the recorded call's inputs and outputs), got ", py::len(tensors));
    std::vector<DLPackArg> args;
    args.reserve(static_cast<size_t>(call_slots_));
    Bases bases(static_cast<size_t>(slots()));
    for (int i = 0; i < call_slots_; ++i) {
      args.emplace_back(tensors[static_cast<size_t>(i)].ptr(), op, "tensors", i);
      const TensorView& t = args.back().view();
      EMBER_CHECK(t.byte_extent() >= reach_[static_cast<size_t>(i)], ValueError, op, ": tensors[", i, "] ",
                  t.describe(), " reaches ", t.byte_extent(), " bytes where the recorded calls read or write ",
                  reach_[static_cast<size_t>(i)]);
      bases[static_cast<size_t>(i)] = static_cast<char*>(t.data());
    }
    for (size_t c = 0; c < constants_.size(); ++c) {
      bases[static_cast<size_t>(call_slots_) + c] = static_cast<char*>(constants_[c]->view().data());
    }
    kv_cache::PagedCache* cache = cache_arg.is_none() ? nullptr : cache_arg.cast<kv_cache::PagedCache*>();
    py::gil_scoped_release release;
    struct Unset {  // the cache is the run's only
      kv_cache::PagedCache*& slot;
      ~Unset() { slot = nullptr; }
    } unset{cache_};
    cache_ = cache;
    for (const auto& step : steps_) step(bases);
  }

  int slots() const noexcept { return call_slots_ + static_cast<int>(constants_.size()); }
  int steps() const noexcept { return static_cast<int>(steps_.size()); }

 private:
  // An operand as Python records it: (slot, byte offset, a tensor of the recorded view's sizes, strides and dtype).
  SlotView ref(const py::handle& spec, std::string_view op, std::string_view arg) {
    EMBER_CHECK(py::isinstance<py::tuple>(spec) && py::len(spec) == 3, TypeError, op, ": ", arg,
                " must be a (slot, offset, tensor) tuple");
    const auto t = spec.cast<py::tuple>();
    SlotView s;
    s.slot = t[0].cast<int>();
    s.offset = t[1].cast<int64_t>();
    const DLPackArg tensor(t[2].ptr(), op, arg);
    s.view = tensor.view().with_data(nullptr);
    EMBER_CHECK(s.slot >= 0 && s.slot < slots(), ValueError, op, ": ", arg, "'s slot ", s.slot, " is not one of the ",
                slots(), " slots");
    const int64_t extent = s.view.byte_extent();
    EMBER_CHECK(s.offset >= 0 && extent >= 0, ValueError, op, ": ", arg, " must lie at a byte offset >= 0 with no ",
                "negative strides, got offset ", s.offset, " for ", s.view.describe());
    const auto slot = static_cast<size_t>(s.slot);
    if (s.slot >= call_slots_) {
      EMBER_CHECK(s.offset + extent <= extents_[slot - static_cast<size_t>(call_slots_)], ValueError, op, ": ", arg,
                  " reaches past the end of the tensor bound to slot ", s.slot);
    }
    reach_[slot] = std::max(reach_[slot], s.offset + extent);
    return s;
  }

  std::optional<SlotView> optional_ref(const py::handle& spec, std::string_view op, std::string_view arg) {
    if (spec.is_none()) return std::nullopt;
    return ref(spec, op, arg);
  }

  kv_cache::PagedCache& run_cache(const char* op) const {
    EMBER_CHECK(cache_ != nullptr, ValueError, op, ": the replay's run was given no key/value cache");
    return *cache_;
  }

  int call_slots_;
  kv_cache::PagedCache* cache_ = nullptr;  // during a run: the cache it was given
  std::vector<int64_t> reach_;             // per slot: the bytes the recorded views reach
  std::vector<int64_t> extents_;           // per constant: the bytes its tensor holds
  std::vector<std::unique_ptr<DLPackArg>> constants_;
  std::vector<py::object> keep_;  // the layers the steps call
  std::vector<std::function<void(const Bases&)>> steps_;
};

}  // namespace

void bind_replay(py::module_& m) {
  py::class_<Replay>(m, "Replay",
                     "Kernel calls recorded from one forward, run again in one call on the tensors of another: each "
                     "operand a view at a byte offset into a slot (the first `call_slots` given to each run, the "
                     "rest bound by constant()).")
      .def(py::init<int>(), py::arg("call_slots"))
      .def("constant", &Replay::constant, py::arg("tensor"),
           "Binds `tensor` to the next slot for the replay's life (it is kept alive); returns the slot.")
      .def("linear", &Replay::linear, py::arg("layer"), py::arg("x"), py::arg("weight"), py::arg("out"),
           py::arg("epilogue"), py::arg("residual"),
           "Appends Linear.forward(x, weight, out, epilogue, residual); each operand a (slot, offset, tensor) "
           "tuple or None.")
      .def("convolution", &Replay::convolution, py::arg("layer"), py::arg("x"), py::arg("out"), py::arg("epilogue"),
           py::arg("residual"), "Appends Convolution.forward(x, out, epilogue, residual).")
      .def("row_norm", &Replay::row_norm, py::arg("kind"), py::arg("x"), py::arg("residual"), py::arg("weight"),
           py::arg("bias"), py::arg("eps"), py::arg("out"), py::arg("sum_out"), py::arg("out_bf16"),
           "Appends row_norm(kind, x, residual, weight, bias, eps, out, sum_out, out_bf16).")
      .def("attention", &Replay::attention, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("mask"),
           py::arg("causal"), py::arg("scale"), py::arg("out"),
           "Appends scaled_dot_product_attention(q, k, v, mask, causal, scale, out).")
      .def("rotary_embedding", &Replay::rotary_embedding, py::arg("x"), py::arg("cos"), py::arg("sin"), py::arg("out"),
           "Appends rotary_embedding(x, cos, sin, out).")
      .def("round_bf16", &Replay::round_bf16, py::arg("x"), py::arg("out"),
           "Appends bf16.round(x, out): a float32 x rounded to bfloat16 (to nearest even).")
      .def("copy", &Replay::copy, py::arg("src"), py::arg("out"),
           "Appends copy(src, out): out (src's dtype and sizes, dense) = src, element for element.")
      .def("multiply", &Replay::multiply, py::arg("x"), py::arg("factor"), py::arg("out"),
           "Appends multiply(x, factor, out) (ember/epilogue.h).")
      .def("zero", &Replay::zero, py::arg("out"), "Appends zero(out): every element of out set to zero.")
      .def("gather_rows", &Replay::gather_rows, py::arg("src"), py::arg("rows"), py::arg("out"),
           "Appends gather_rows(src, rows, out): out[i] = src[rows[i]] for a [R, W] src and int64 rows.")
      .def("max_pool2d", &Replay::max_pool2d, py::arg("x"), py::arg("kernel"), py::arg("stride"), py::arg("padding"),
           py::arg("dilation"), py::arg("ceil_mode"), py::arg("relu"), py::arg("out"),
           "Appends max_pool2d(x, window, relu, out) (ember/pool.h).")
      .def("avg_pool2d", &Replay::avg_pool2d, py::arg("x"), py::arg("kernel"), py::arg("stride"), py::arg("padding"),
           py::arg("ceil_mode"), py::arg("count_include_pad"), py::arg("divisor_override"), py::arg("out"),
           "Appends avg_pool2d(x, window, count_include_pad, divisor_override, out) (ember/pool.h).")
      .def("batch_norm", &Replay::batch_norm, py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("mean"),
           py::arg("var"), py::arg("eps"), py::arg("relu"), py::arg("out"),
           "Appends frozen_batch_norm(x, weight, bias, mean, var, eps, out, relu) (ember/norm.h).")
      .def("kv_write", &Replay::kv_write, py::arg("layer"), py::arg("k"), py::arg("v"),
           "Appends KVCache.write(layer, k, v) on the cache of the run.")
      .def("attention_over_cache", &Replay::attention_over_cache, py::arg("q"), py::arg("layer"), py::arg("window"),
           py::arg("scale"), py::arg("out"), py::arg("softcap") = 0.0,
           "Appends attention_over_cache(q, cache, layer, None, window, scale, out) on the cache of the run.")
      .def("run", &Replay::run, py::arg("tensors"), py::arg("cache") = py::none(),
           "Runs the steps in order on `tensors` (one per call slot), each reaching at least as far as the "
           "recorded views into its slot; `cache`: the key/value cache the kv_write and attention_over_cache "
           "steps use.")
      .def_property_readonly("slots", &Replay::slots)
      .def_property_readonly("steps", &Replay::steps);
}

}  // namespace ember::binding
