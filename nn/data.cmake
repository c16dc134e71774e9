# MNIST-format data (IDX files, data sets) and checkpoints: part of zd_nn.
# Included at the end of nn/CMakeLists.txt, after zd_nn is defined.
target_sources(zd_nn PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/idx.c
  ${CMAKE_CURRENT_LIST_DIR}/dataset.c
  ${CMAKE_CURRENT_LIST_DIR}/checkpoint.c)
target_link_libraries(zd_nn PUBLIC PkgConfig::ZLIB)
