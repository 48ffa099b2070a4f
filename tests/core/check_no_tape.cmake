# core knows no tape: no object file of the lower layers (core/, kernels/, io/, data/) may reference a symbol
# that only the tape's layers (autograd/, amp/, nn/, optim/) define. A reference names the object and the
# symbol, e.g. "core/factories.cpp.o uses frugal::Tensor::fill_(double)", the method that records.
# Run by ctest as test_core_no_tape: cmake -DNM=nm -DOBJECTS=a.o|b.o|... -P check_no_tape.cmake
#
# The layers: core/ and kernels/ reach below them only; io/ and data/ may use nn/ and optim/ (a checkpoint
# saves a module and an optimizer) but, like core, never the recording in autograd/.
string(REPLACE "|" ";" objects "${OBJECTS}")
# Not yet changed over: another change makes core/ops_elementwise.cpp call ops:: directly; drop it from this
# list when that lands.
set(not_yet "/core/ops_elementwise.cpp.o$")

set(defined_above "")   # strong symbols of autograd/, amp/, nn/, optim/
set(defined_autograd "")
set(lower "")
set(middle "")
foreach(obj ${objects})
  if(obj MATCHES "/(autograd|amp|nn|optim)/[^/]+\\.o$")
    execute_process(COMMAND ${NM} --defined-only -P ${obj} OUTPUT_VARIABLE out RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "${NM} failed on ${obj}")
    endif()
    string(REGEX MATCHALL "[^\n]+ [TDBR] " syms "${out}")
    foreach(s ${syms})
      string(REGEX REPLACE " [TDBR] $" "" s "${s}")
      list(APPEND defined_above "${s}")
      if(obj MATCHES "/autograd/")
        list(APPEND defined_autograd "${s}")
      endif()
    endforeach()
  elseif(obj MATCHES "${not_yet}")
  elseif(obj MATCHES "/(core|kernels)/")
    list(APPEND lower ${obj})
  elseif(obj MATCHES "/(io|data)/")
    list(APPEND middle ${obj})
  endif()
endforeach()
list(LENGTH defined_autograd n_autograd)
list(LENGTH lower n_lower)
if(n_autograd EQUAL 0 OR n_lower EQUAL 0)
  message(FATAL_ERROR "check_no_tape: found no autograd/ or no core/ objects in OBJECTS; the check proves nothing")
endif()

set(failures "")
function(check_objects objs forbidden)
  foreach(obj ${objs})
    execute_process(COMMAND ${NM} -u -P ${obj} OUTPUT_VARIABLE out)
    string(REGEX MATCHALL "[^\n]+ U" syms "${out}")
    foreach(s ${syms})
      string(REGEX REPLACE " U$" "" s "${s}")
      list(FIND ${forbidden} "${s}" at)
      if(NOT at EQUAL -1)
        execute_process(COMMAND c++filt "${s}" OUTPUT_VARIABLE readable OUTPUT_STRIP_TRAILING_WHITESPACE)
        string(REGEX REPLACE ".*/CMakeFiles/[^/]+\\.dir/" "" short "${obj}")
        string(APPEND failures "\n  ${short} uses ${readable}")
      endif()
    endforeach()
  endforeach()
  set(failures "${failures}" PARENT_SCOPE)
endfunction()
check_objects("${lower}" defined_above)
check_objects("${middle}" defined_autograd)
if(failures)
  message(FATAL_ERROR "core knows no tape, yet these lower-layer objects call into the layers above them "
                      "(call the ops:: function instead of the recording Tensor method):${failures}")
endif()
message(STATUS "check_no_tape: ${n_lower} core/kernels objects reference nothing of autograd/, amp/, nn/, optim/")
