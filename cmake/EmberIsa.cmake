# Per-file ISA flags. A kernel source named *_<isa>.cpp is compiled with that ISA's flags and no other file is,
# so the library runs on any x86-64 CPU and picks the widest path at run time (csrc/include/ember/isa.h).
# Never -march=native: the build machine's CPU says nothing about the machine that runs the code.
set(EMBER_ISA_FLAGS_avx2 -mavx2 -mfma -mf16c)
set(EMBER_ISA_FLAGS_avx512 ${EMBER_ISA_FLAGS_avx2} -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512cd)
set(EMBER_ISA_FLAGS_avx512_bf16 ${EMBER_ISA_FLAGS_avx512} -mavx512vnni -mavx512bf16)
set(EMBER_ISA_FLAGS_amx ${EMBER_ISA_FLAGS_avx512_bf16} -mavx512fp16 -mamx-tile -mamx-bf16 -mamx-int8)

# ember_apply_isa_flags(<source>...): gives each *_<isa>.cpp its flags.
function(ember_apply_isa_flags)
  foreach(src IN LISTS ARGN)
    if(src MATCHES "_(avx512_bf16|avx512|avx2|amx)\\.cpp$")
      set(flags ${EMBER_ISA_FLAGS_${CMAKE_MATCH_1}})
      if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_MATCH_1 MATCHES "avx512|amx")
        # GCC 12's own avx512fintrin.h trips -W(maybe-)uninitialized: its extract/reduce intrinsics pass
        # _mm*_undefined_*() registers as the merge source of an all-ones mask.
        list(APPEND flags -Wno-maybe-uninitialized -Wno-uninitialized)
      endif()
      set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS "${flags}")
    endif()
  endforeach()
endfunction()
