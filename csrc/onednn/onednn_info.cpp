// Every oneDNN call of ember lives under csrc/onednn/. This file only asks oneDNN what it is.
#include <oneapi/dnnl/dnnl.hpp>

#include "ember/config.h"

namespace ember {
namespace {

std::string runtime_name(unsigned runtime) {
  switch (runtime) {
    case DNNL_RUNTIME_NONE: return "none";
    case DNNL_RUNTIME_SEQ: return "sequential";
    case DNNL_RUNTIME_OMP: return "OpenMP";
    case DNNL_RUNTIME_TBB: return "TBB";
    case DNNL_RUNTIME_THREADPOOL: return "threadpool";
    default: return "other";
  }
}

std::string isa_name(dnnl::cpu_isa isa) {
  using dnnl::cpu_isa;
  switch (isa) {
    case cpu_isa::sse41: return "sse41";
    case cpu_isa::avx: return "avx";
    case cpu_isa::avx2: return "avx2";
    case cpu_isa::avx2_vnni: return "avx2_vnni";
    case cpu_isa::avx2_vnni_2: return "avx2_vnni_2";
    case cpu_isa::avx512_core: return "avx512_core";
    case cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case cpu_isa::avx512_core_fp16: return "avx512_core_fp16";
    case cpu_isa::avx512_core_amx: return "avx512_core_amx";
    case cpu_isa::avx512_core_amx_fp16: return "avx512_core_amx_fp16";
    default: return "other";
  }
}

}  // namespace

OneDnnInfo onednn_info() {
  const dnnl_version_t* v = dnnl_version();
  OneDnnInfo info;
  info.major = v->major;
  info.minor = v->minor;
  info.patch = v->patch;
  info.commit = v->hash;
  info.cpu_runtime = runtime_name(v->cpu_runtime);
  info.cpu_isa = isa_name(dnnl::get_effective_cpu_isa());
  return info;
}

}  // namespace ember
