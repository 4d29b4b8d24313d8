# Abseil and Protobuf from Debian, linked STATICALLY so that a binary built on a
# machine with the -dev packages runs on a GPU machine that has neither. Not in a
# LOOM_PYTHON build: Debian's archives use initial-exec thread-locals, which a
# shared object (the extension module) cannot hold, so that build links them shared.
#
# Debian's abslTargets point at the shared objects; every imported absl:: target
# is redirected to the static archive that sits beside it.
find_package(absl CONFIG REQUIRED)
if(NOT LOOM_PYTHON)
get_directory_property(_loom_imported IMPORTED_TARGETS)
foreach(_t IN LISTS _loom_imported)
  if(NOT _t MATCHES "^absl::")
    continue()
  endif()
  get_target_property(_type ${_t} TYPE)
  if(NOT _type STREQUAL "SHARED_LIBRARY")
    continue()
  endif()
  get_target_property(_loc ${_t} IMPORTED_LOCATION_NONE)
  if(NOT _loc)
    continue()
  endif()
  string(REGEX REPLACE "\\.so(\\.[0-9.]+)?$" ".a" _static "${_loc}")
  if(EXISTS "${_static}")
    set_target_properties(${_t} PROPERTIES IMPORTED_LOCATION_NONE "${_static}")
  endif()
endforeach()

set(Protobuf_USE_STATIC_LIBS ON)
# libstdc++ and libgcc statically too: the GPU machine's may be older or newer.
add_link_options($<$<LINK_LANGUAGE:CXX>:-static-libstdc++> $<$<LINK_LANGUAGE:CXX>:-static-libgcc>)
endif()
find_package(Protobuf REQUIRED)

# loom_proto_library(NAME proto_file...): protoc-generated C++ in the build tree,
# paths relative to the source root, so `import "graph/graph.proto"` and
# `#include "graph/graph.pb.h"` both work.
function(loom_proto_library name)
  set(_srcs)
  foreach(_proto ${ARGN})
    get_filename_component(_abs ${_proto} ABSOLUTE)
    file(RELATIVE_PATH _rel ${CMAKE_SOURCE_DIR} ${_abs})
    string(REGEX REPLACE "\\.proto$" "" _stem ${_rel})
    add_custom_command(
      OUTPUT ${CMAKE_BINARY_DIR}/${_stem}.pb.cc ${CMAKE_BINARY_DIR}/${_stem}.pb.h
      COMMAND protobuf::protoc -I${CMAKE_SOURCE_DIR} --cpp_out=${CMAKE_BINARY_DIR} ${_abs}
      DEPENDS ${_abs} protobuf::protoc
      COMMENT "protoc ${_rel}")
    list(APPEND _srcs ${CMAKE_BINARY_DIR}/${_stem}.pb.cc ${CMAKE_BINARY_DIR}/${_stem}.pb.h)
  endforeach()
  add_library(${name} STATIC ${_srcs})
  target_link_libraries(${name} PUBLIC protobuf::libprotobuf)
  target_include_directories(${name} PUBLIC ${CMAKE_BINARY_DIR})
endfunction()
