// ember._C binding of the paged key/value cache (ember/kv_cache.h) and of the attention that reads it
// (ember/attention.h: over_cache): python/ember/llm/ keeps one pool per optimized model and one cache per generation.
#include "kv_cache_binding.h"

#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <vector>

#include "dlpack_arg.h"
#include "ember/attention.h"
#include "ember/errors.h"
#include "ember/kv_cache.h"
#include "tensor_args.h"

namespace py = pybind11;

namespace ember::binding {
namespace {

DType cache_dtype(const std::string& name) {
  if (name == "bfloat16") return DType::bf16;
  if (name == "float32") return DType::f32;
  throw TypeError("KVCachePool: dtype must be 'bfloat16' or 'float32', got '" + name + "'");
}

}  // namespace

void bind_kv_cache(py::module_& m) {
  using kv_cache::BlockPool;
  using kv_cache::PagedCache;

  py::class_<BlockPool, std::shared_ptr<BlockPool>>(
      m, "KVCachePool",
      "Blocks of a paged key/value cache, shared by the caches of one model's generations. See ember/kv_cache.h.")
      .def(py::init([](int64_t layers, int64_t heads, int64_t key_dim, int64_t value_dim, int64_t block_tokens,
                       const std::string& dtype) {
             kv_cache::Layout layout;
             layout.layers = layers;
             layout.heads = heads;
             layout.key_dim = key_dim;
             layout.value_dim = value_dim;
             layout.block_tokens = block_tokens;
             layout.dtype = cache_dtype(dtype);
             return std::make_shared<BlockPool>(layout);
           }),
           py::arg("layers"), py::arg("heads"), py::arg("key_dim"), py::arg("value_dim"), py::arg("block_tokens"),
           py::arg("dtype"))
      .def(
          "reserve",
          [](BlockPool& pool, int64_t blocks) {
            py::gil_scoped_release release;
            pool.reserve(blocks);
          },
          py::arg("blocks"), "Grows the pool to at least `blocks` blocks, their pages touched.")
      .def("trim", &BlockPool::trim, "Frees the trailing chunks with no block in use; returns the bytes freed.")
      .def_property_readonly("blocks", &BlockPool::blocks)
      .def_property_readonly("blocks_in_use", &BlockPool::blocks_in_use)
      .def_property_readonly("bytes", &BlockPool::bytes)
      .def_property_readonly("block_bytes", [](const BlockPool& p) { return p.layout().block_bytes(); })
      .def_property_readonly("block_tokens", [](const BlockPool& p) { return p.layout().block_tokens; })
      .def_property_readonly("layers", [](const BlockPool& p) { return p.layout().layers; })
      .def_property_readonly("heads", [](const BlockPool& p) { return p.layout().heads; })
      .def_property_readonly("key_dim", [](const BlockPool& p) { return p.layout().key_dim; })
      .def_property_readonly("value_dim", [](const BlockPool& p) { return p.layout().value_dim; })
      .def_property_readonly("dtype", [](const BlockPool& p) {
        return std::string(p.layout().dtype == DType::bf16 ? "bfloat16" : "float32");
      });

  py::class_<PagedCache>(
      m, "PagedKVCache",
      "The key/value cache of a batch of sequences, on blocks of a KVCachePool. See ember/kv_cache.h.")
      .def(py::init([](std::shared_ptr<BlockPool> pool) { return std::make_unique<PagedCache>(std::move(pool)); }),
           py::arg("pool"))
      .def_property_readonly("sequences", &PagedCache::sequences)
      .def_property_readonly("max_length", &PagedCache::max_length)
      .def_property_readonly("in_step", &PagedCache::in_step)
      .def_property_readonly(
          "pool", [](const PagedCache& c) { return &c.pool(); }, py::return_value_policy::reference)
      .def("length", &PagedCache::length, py::arg("sequence"))
      .def("lengths",
           [](const PagedCache& c) {
             std::vector<int64_t> out(static_cast<size_t>(c.sequences()));
             for (int64_t s = 0; s < c.sequences(); ++s) out[static_cast<size_t>(s)] = c.length(s);
             return out;
           })
      .def("blocks_held", &PagedCache::blocks_held)
      .def("bytes_held", &PagedCache::bytes_held)
      .def("set_sequences", &PagedCache::set_sequences, py::arg("count"))
      .def("begin", &PagedCache::begin, py::arg("counts"),
           "Starts a step of counts[s] new tokens for each sequence s, reserving their blocks.")
      .def(
          "write",
          [](PagedCache& c, int64_t layer, const TensorArg& k, const TensorArg& v, const OptionalTensorArg& keep) {
            constexpr const char* op = "KVCache.write";
            const DLPackArg ka(k.ptr(), op, "k"), va(v.ptr(), op, "v");
            const auto keepa = optional_arg(keep.ptr(), op, "keep");
            py::gil_scoped_release release;
            c.write(layer, ka, va, view_or_null(keepa));
          },
          py::arg("layer"), py::arg("k"), py::arg("v"), py::arg("keep") = py::none(),
          "Stores layer `layer`'s keys and values of the step: k [S, T, heads, key_dim], v [S, T, heads, value_dim], "
          "the tokens where keep [S, T] (bool) is True, or all.")
      .def("commit", &PagedCache::commit, "Ends the step: each sequence's length grows by its count.")
      .def("cancel", &PagedCache::cancel, "Abandons the step.")
      .def("reorder", &PagedCache::reorder, py::arg("rows"),
           "Sequence s becomes what sequence rows[s] was; blocks are shared, not copied.")
      .def("truncate", &PagedCache::truncate, py::arg("lengths"), "Keeps at most lengths[s] tokens of each sequence s.")
      .def("clear", &PagedCache::clear, "Releases every block; no sequences remain.");

  m.def(
      "attention_over_cache",
      [](const TensorArg& q, const PagedCache& cache, int64_t layer, const OptionalTensorArg& key_limits,
         int64_t window, double scale, const TensorArg& out, double softcap) {
        constexpr const char* op = "attention_over_cache";
        const DLPackArg qa(q.ptr(), op, "q"), oa(out.ptr(), op, "out");
        const auto la = optional_arg(key_limits.ptr(), op, "key_limits");
        py::gil_scoped_release release;
        attention::over_cache(qa, cache, layer, view_or_null(la), window, scale, oa, softcap);
      },
      py::arg("q"), py::arg("cache"), py::arg("layer"), py::arg("key_limits"), py::arg("window"), py::arg("scale"),
      py::arg("out"), py::arg("softcap") = 0.0,
      "out = softmax(scale * q @ k^T) @ v of each sequence's queries [B, Hq, Lq, key_dim] against its keys and "
      "values in the cache (layer `layer`); key_limits int64 [B, Lq] (query i sees keys [limit - window, limit)) or "
      "None for the causal bound of the sequence's newest Lq tokens. See ember/attention.h.");
}

}  // namespace ember::binding
