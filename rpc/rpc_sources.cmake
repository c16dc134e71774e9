# Values, futures and the value codec: the part of zd_rpc that does not touch
# sockets. rpc/CMakeLists.txt includes this file and adds these to zd_rpc.
set(ZD_RPC_CORE_SOURCES value.c value_format.c future.c codec.c)
