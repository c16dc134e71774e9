# The RPC benchmark (bench_rpc): include(rpc.cmake) from bench/CMakeLists.txt.
add_executable(bench_rpc ${CMAKE_CURRENT_LIST_DIR}/bench_rpc.c)
target_link_libraries(bench_rpc PRIVATE zd_rpc)
