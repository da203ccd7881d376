# The Debian packages, `cpack -G DEB` in the build folder: dpshim (the runtime: the library, its
# plugins and adapter, dpshim-diag and its helpers, the documentation), dpshim-dev (the hook
# ABI's header and package files) and, where it is built, dpshim-libtorch (the libtorch adapter,
# apart: it depends on libtorch), installed under /usr. dpkg-shlibdeps finds what the ELF files
# link (Open MPI, through the mpi plugin); what the shim opens with dlopen (PMIx, libffi) is
# declared by hand; ldconfig runs on install (a trigger), so that LD_PRELOAD=libdpshim.so works
# by its name.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME dpshim)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_VENDOR dpshim)
set(CPACK_PACKAGE_CONTACT "dpshim developers <dpshim@invalid>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "data-parallel training of unmodified single-process trainers")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL runtime dev)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_SECTION devel)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME dpshim)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_DEPENDS "libpmix2, libffi8")
set(CPACK_DEBIAN_RUNTIME_PACKAGE_RECOMMENDS "openmpi-bin")
set(CPACK_DEBIAN_DEV_PACKAGE_NAME dpshim-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "dpshim (= ${PROJECT_VERSION})")
set(CPACK_DEBIAN_DEV_PACKAGE_SHLIBDEPS OFF)
if(DPSHIM_HAVE_TORCH)
  list(APPEND CPACK_COMPONENTS_ALL libtorch)
  set(CPACK_DEBIAN_LIBTORCH_PACKAGE_NAME dpshim-libtorch)
  set(CPACK_DEBIAN_LIBTORCH_PACKAGE_DEPENDS "dpshim (= ${PROJECT_VERSION})")
endif()
file(WRITE ${CMAKE_BINARY_DIR}/deb/triggers "activate-noawait ldconfig\n")
set(CPACK_DEBIAN_RUNTIME_PACKAGE_CONTROL_EXTRA ${CMAKE_BINARY_DIR}/deb/triggers)
include(CPack)
