# SPDX-License-Identifier: MIT
# cmake --install: the public headers under include/zdist/, libzdist.so and
# libzdist.a, zdist.pc, and a CMake package (find_package(zdist) gives the
# targets zdist::zdist, the shared library, and zdist::zdist_static).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/zdist
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h")
install(TARGETS zdist EXPORT zdistTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/libzdist.a DESTINATION ${CMAKE_INSTALL_LIBDIR})

set(zd_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/zdist)
install(EXPORT zdistTargets NAMESPACE zdist:: DESTINATION ${zd_cmake_dir})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/zdistConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/zdistConfig.cmake INSTALL_DESTINATION ${zd_cmake_dir}
  PATH_VARS CMAKE_INSTALL_LIBDIR)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/zdistConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/zdistConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/zdistConfigVersion.cmake
        DESTINATION ${zd_cmake_dir})

configure_file(${PROJECT_SOURCE_DIR}/cmake/zdist.pc.in ${CMAKE_CURRENT_BINARY_DIR}/zdist.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/zdist.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
