# The libtorch adapter's build, shared by dpshim's own (CMakeLists.txt, hooks/adapters/) and by
# the GPU check's, which builds the adapter alone against PyTorch's libtorch on a GPU machine
# (tests/gpu/libtorch/).
get_filename_component(dpshim_source_root ${CMAKE_CURRENT_LIST_DIR}/.. ABSOLUTE)

# dpshim_find_libtorch(): DPSHIM_HAVE_TORCH, and DPSHIM_TORCH_SONAME (libtorch_cpu's soname, or
# its file name where it has none), where TorchConfig.cmake is found on x86-64.
macro(dpshim_find_libtorch)
  find_package(Torch QUIET)
  set(DPSHIM_HAVE_TORCH OFF)
  if(Torch_FOUND AND CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64")
    foreach(suffix _RELWITHDEBINFO _RELEASE _NOCONFIG _DEBUG "")
      get_target_property(torch_cpu_file torch_cpu IMPORTED_LOCATION${suffix})
      if(torch_cpu_file)
        break()
      endif()
    endforeach()
    execute_process(COMMAND objdump -p ${torch_cpu_file} OUTPUT_VARIABLE torch_cpu_headers ERROR_QUIET)
    string(REGEX MATCH "SONAME +([^\n]+)" torch_soname_line "${torch_cpu_headers}")
    set(DPSHIM_TORCH_SONAME "${CMAKE_MATCH_1}")
    if(torch_cpu_file AND NOT DPSHIM_TORCH_SONAME)
      get_filename_component(DPSHIM_TORCH_SONAME ${torch_cpu_file} NAME)
    endif()
    if(DPSHIM_TORCH_SONAME AND Torch_VERSION) # the version goes into libdpshim-libtorch.needs
      set(DPSHIM_HAVE_TORCH ON)
    endif()
  endif()
endmacro()

# dpshim_add_libtorch_adapter(DIR): the target dpshim-libtorch, libdpshim-libtorch.so in DIR, and beside
# it libdpshim-libtorch.needs: libtorch_cpu's soname, then the libtorch version, which libdpshim.so
# reads before it opens the plugin (opening it would load that libtorch). The adapter's code is
# compiled once, as dpshim-libtorch-objects, for dpshim_add_libtorch_adapter_as to link again.
function(dpshim_add_libtorch_adapter dir)
  add_library(dpshim-libtorch-objects OBJECT ${dpshim_source_root}/hooks/adapters/libtorch/libtorch_adapter.cpp)
  target_include_directories(dpshim-libtorch-objects PRIVATE ${dpshim_source_root}/shim
    ${dpshim_source_root}/hooks/include)
  target_link_libraries(dpshim-libtorch-objects PRIVATE torch)
  set_target_properties(dpshim-libtorch-objects PROPERTIES CXX_STANDARD 17 CXX_VISIBILITY_PRESET hidden
    POSITION_INDEPENDENT_CODE ON)
  dpshim_add_libtorch_adapter_as(dpshim-libtorch "${Torch_VERSION}" ${dir})
  file(GENERATE OUTPUT ${dir}/libdpshim-libtorch.needs CONTENT "${DPSHIM_TORCH_SONAME}\n${Torch_VERSION}\n")
endfunction()

# dpshim_add_libtorch_adapter_as(TARGET VERSION DIR): the adapter's code as libdpshim-libtorch.so in
# DIR, saying it is built for libtorch VERSION.
function(dpshim_add_libtorch_adapter_as target version dir)
  add_library(${target} MODULE $<TARGET_OBJECTS:dpshim-libtorch-objects>
    ${dpshim_source_root}/hooks/adapters/libtorch/built_for.cpp)
  target_link_libraries(${target} PRIVATE torch)
  target_compile_definitions(${target} PRIVATE DPS_TORCH_VERSION="${version}")
  set_target_properties(${target} PROPERTIES OUTPUT_NAME dpshim-libtorch PREFIX "lib" CXX_STANDARD 17
    CXX_VISIBILITY_PRESET hidden LIBRARY_OUTPUT_DIRECTORY ${dir})
endfunction()
