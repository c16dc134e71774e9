# SPDX-License-Identifier: MIT
# cmake --install: the public headers under include/zdist/, libzdist.so and
# libzdist.a, zdist.pc, and a CMake package (find_package(zdist) gives the
# targets zdist::zdist, the shared library, and zdist::zdist_static), and
# the launcher when tools are built; no test, example or benchmark. Every
# installed file names the others by relative paths, so the installed tree
# may be moved (or packaged with DESTDIR) and still work.
include(CMakePackageConfigHelpers)

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/zdist
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h")
install(TARGETS zdist zdist_static EXPORT zdistTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})

set(zd_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/zdist)
install(EXPORT zdistTargets NAMESPACE zdist:: DESTINATION ${zd_cmake_dir})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/zdistConfig.cmake.in
  ${PROJECT_BINARY_DIR}/zdistConfig.cmake INSTALL_DESTINATION ${zd_cmake_dir})
# Every 1.x keeps the API and ABI of 1.0 (docs/conventions.md, "Stability"):
# 1.3 satisfies a request for 1.0, not 2.0.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/zdistConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/zdistConfig.cmake
              ${PROJECT_BINARY_DIR}/zdistConfigVersion.cmake
        DESTINATION ${zd_cmake_dir})

# zdist.pc finds the prefix from its own place (${pcfiledir}) unless the
# directories were given as absolute paths.
set(zd_pc_dir ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(zd_pc_prefix "${CMAKE_INSTALL_PREFIX}")
  set(zd_pc_libdir "${CMAKE_INSTALL_FULL_LIBDIR}")
  set(zd_pc_includedir "${CMAKE_INSTALL_FULL_INCLUDEDIR}")
else()
  file(RELATIVE_PATH zd_pc_up /zd_prefix/${zd_pc_dir} /zd_prefix)
  string(REGEX REPLACE "/$" "" zd_pc_up "${zd_pc_up}")
  set(zd_pc_prefix "\${pcfiledir}/${zd_pc_up}")
  set(zd_pc_libdir "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
  set(zd_pc_includedir "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/zdist.pc.in ${PROJECT_BINARY_DIR}/zdist.pc @ONLY)
configure_file(${PROJECT_SOURCE_DIR}/cmake/zdist-static.pc.in ${PROJECT_BINARY_DIR}/zdist-static.pc
               @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/zdist.pc ${PROJECT_BINARY_DIR}/zdist-static.pc
        DESTINATION ${zd_pc_dir})

# The launcher, for starting worlds of a user's own programs (the tutorial
# does): installed as zdist-launch, a name no other package takes.
if(TARGET launch)
  install(PROGRAMS $<TARGET_FILE:launch> DESTINATION ${CMAKE_INSTALL_BINDIR} RENAME zdist-launch)
endif()
# The world key's maker, for worlds across hosts (rpc.h's key_file):
# zdist-keygen.
if(TARGET keygen)
  install(PROGRAMS $<TARGET_FILE:keygen> DESTINATION ${CMAKE_INSTALL_BINDIR} RENAME zdist-keygen)
endif()
# The metrics table, for worlds run with ZDIST_METRICS: zdist-metrics-summary.
if(TARGET metrics_summary)
  install(PROGRAMS $<TARGET_FILE:metrics_summary> DESTINATION ${CMAKE_INSTALL_BINDIR}
          RENAME zdist-metrics-summary)
endif()
