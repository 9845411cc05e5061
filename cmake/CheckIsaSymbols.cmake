# cmake -DNM=<nm> -DLIBRARY=<libember_core.a> -P CheckIsaSymbols.cmake
#
# Fails when an object compiled with ISA flags defines weak code (nm's W) whose name does not carry that ISA: the
# linker keeps one copy of a weak symbol for the whole library, so such code compiled for AVX-512 or AMX can be what a
# CPU without them runs (csrc/simd/local_vector.h says how std::vector did this). An object's ISA is in its name:
# <family>_kernels.<isa>.cpp.o (ember_kernel_family) or <name>_<isa>.cpp.o (EmberIsa.cmake's flags by file name).
# Weak code that carries the ISA (EMBER_KERNEL(name)<T>, an explicit instantiation of name_<isa>) is that object's
# alone. Data (V, u) is not code: it is the same bytes whatever the flags.
execute_process(COMMAND ${NM} -C --defined-only ${LIBRARY} OUTPUT_VARIABLE listing RESULT_VARIABLE failed)
if(failed)
  message(FATAL_ERROR "${NM} could not read ${LIBRARY}")
endif()
string(REPLACE ";" "," listing "${listing}")  # (CMake lists split at ";")
string(REPLACE "\n" ";" lines "${listing}")
set(isa "")
set(objects 0)
set(shared "")
foreach(line IN LISTS lines)
  if(line MATCHES "^(.+\\.o):$")
    set(member "${CMAKE_MATCH_1}")
    set(isa "")
    # (two ifs: a MATCHES that fails clears CMAKE_MATCH_1, and if() evaluates both sides of an OR)
    if(member MATCHES "\\.(avx2|avx512|avx512_bf16|amx)\\.cpp\\.o$")
      set(isa "${CMAKE_MATCH_1}")
    elseif(member MATCHES "_(avx2|avx512_bf16|avx512|amx)\\.cpp\\.o$")
      set(isa "${CMAKE_MATCH_1}")
    endif()
    if(NOT isa STREQUAL "")
      math(EXPR objects "${objects} + 1")
    endif()
  elseif(NOT isa STREQUAL "" AND line MATCHES "^[0-9a-f]+ W (.+)$")
    set(name "${CMAKE_MATCH_1}")
    if(NOT name MATCHES "_${isa}[<(]")
      string(APPEND shared "\n  ${member}: ${name}")
    endif()
  endif()
endforeach()
if(objects EQUAL 0)
  message(FATAL_ERROR "no ISA-flagged object in ${LIBRARY}: the check would pass on nothing")
endif()
if(NOT shared STREQUAL "")
  message(FATAL_ERROR "weak code in ISA-flagged objects that another object may end up calling "
                      "(use simd::LocalVector, or give the code internal linkage):${shared}")
endif()
message(STATUS "${objects} ISA-flagged objects, none defines weak code without its ISA in the name")
