# SPDX-License-Identifier: MIT
# Writes a copy of include/zdist/ (IN) into OUT as a later 1.x might have
# it: fields appended to every struct that carries its size, option structs
# the caller fills and out-structs the library writes. The library built
# against this copy is what test_abi_later_fields runs a 1.0 program on.
#   cmake -DIN=include/zdist -DOUT=build/.../zdist -P later_headers.cmake
file(GLOB headers "${IN}/*.h")
file(MAKE_DIRECTORY "${OUT}")
foreach(h ${headers})
  get_filename_component(name "${h}" NAME)
  file(READ "${h}" text)
  foreach(type zd_rpc_options_t zd_rpc_function_t zd_rpc_hooks_t zd_rpc_metrics_t
               zd_autograd_options_t zd_dist_autograd_limits_t zd_dist_autograd_stats_t
               zd_dist_optim_owner_limits_t zd_optim_config_t
               zd_autograd_node_ops_t zd_rpc_env_t zd_ps_options_t)
    string(REPLACE "} ${type};" "    unsigned char zd__later_fields[72];\n} ${type};" text "${text}")
  endforeach()
  file(WRITE "${OUT}/${name}.new" "${text}")
  file(COPY_FILE "${OUT}/${name}.new" "${OUT}/${name}" ONLY_IF_DIFFERENT)
  file(REMOVE "${OUT}/${name}.new")
endforeach()
