# What `cmake --install` puts where, besides the targets' own rules (shim/, tools/, hooks/):
# the hook ABI's header with a pkg-config file and a CMake package (an INTERFACE target: a
# framework includes hooks.h and declares the hooks weak; nothing links against libdpshim.so),
# and the example policy with the README as documentation. Every path is relative to the
# installed file, so a staged or relocated tree works as installed.
include(CMakePackageConfigHelpers)

install(FILES ${PROJECT_SOURCE_DIR}/hooks/include/dpshim/hooks.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/dpshim
  COMPONENT dev)

file(RELATIVE_PATH dpshim_pc_to_prefix ${CMAKE_INSTALL_FULL_LIBDIR}/pkgconfig ${CMAKE_INSTALL_PREFIX})
configure_file(${CMAKE_CURRENT_LIST_DIR}/dpshim.pc.in ${CMAKE_BINARY_DIR}/dpshim.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/dpshim.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT dev)

file(RELATIVE_PATH dpshim_cmake_to_prefix ${CMAKE_INSTALL_FULL_LIBDIR}/cmake/dpshim ${CMAKE_INSTALL_PREFIX})
configure_file(${CMAKE_CURRENT_LIST_DIR}/dpshimConfig.cmake.in ${CMAKE_BINARY_DIR}/dpshimConfig.cmake @ONLY)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/dpshimConfigVersion.cmake COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_BINARY_DIR}/dpshimConfig.cmake ${CMAKE_BINARY_DIR}/dpshimConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/dpshim COMPONENT dev)

install(FILES ${PROJECT_SOURCE_DIR}/policy/dpshim.conf ${PROJECT_SOURCE_DIR}/README.md ${PROJECT_SOURCE_DIR}/CHANGELOG.md
  DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT runtime)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR}/docs COMPONENT runtime
  FILES_MATCHING PATTERN "*.md" PATTERN "*.svg")
