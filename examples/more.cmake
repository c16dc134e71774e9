# Programs on the public API (issue 6): synchronous and asynchronous
# parameter servers (ps_sync_async), pipeline parallelism (pipeline), and
# bench_examples. Included from examples/CMakeLists.txt.
#
# Their logic lives in zd_examples_dist, registered like a module's library
# so that tests/test_ps_sync_async.c and tests/test_pipeline.c can run it in
# worlds of real processes.
add_library(zd_examples_dist STATIC
  ${CMAKE_CURRENT_LIST_DIR}/ps_actor.c
  ${CMAKE_CURRENT_LIST_DIR}/ps_objects.c
  ${CMAKE_CURRENT_LIST_DIR}/ps_driver.c
  ${CMAKE_CURRENT_LIST_DIR}/ps_launch.c
  ${CMAKE_CURRENT_LIST_DIR}/pipeline_core.c
  ${CMAKE_CURRENT_LIST_DIR}/pipeline_driver.c)
target_link_libraries(zd_examples_dist PUBLIC zd_examples_common zd_dist_optim zd_dist zd_rpc
                      zd_optim zd_nn zd_autograd)
get_property(zd_examples_dist_deps GLOBAL PROPERTY ZDIST_LIBS)
set_property(GLOBAL APPEND PROPERTY ZDIST_LIBS zd_examples_dist)

add_executable(ps_sync_async ${CMAKE_CURRENT_LIST_DIR}/ps_sync_async.c)
target_link_libraries(ps_sync_async PRIVATE zd_examples_dist ${zd_examples_dist_deps})

add_executable(pipeline ${CMAKE_CURRENT_LIST_DIR}/pipeline.c)
target_link_libraries(pipeline PRIVATE zd_examples_dist ${zd_examples_dist_deps})

# bench_examples runs each program in a world of processes with
# tests/support/world.c (zd_testsupport, defined in tests/); it lands in
# build/bench with the other benchmarks.
add_executable(bench_examples ${CMAKE_SOURCE_DIR}/bench/bench_examples.c)
target_link_libraries(bench_examples PRIVATE zd_examples_dist zd_testsupport
                      ${zd_examples_dist_deps})
set_target_properties(bench_examples PROPERTIES RUNTIME_OUTPUT_DIRECTORY
                      ${CMAKE_BINARY_DIR}/bench)
