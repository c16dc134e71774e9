#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Builds a libFuzzer target with clang (ASan + UBSan) in its own build
# directory and runs it for a while, starting from a small generated seed
# corpus. Exits non-zero when the fuzzer finds a crash, a leak or a failed
# check; the input that did it is left in <build>/artifacts/.
#
#   tools/fuzz.sh [seconds] [target]      defaults: 60 fuzz_codec
#                                          targets: fuzz_codec, fuzz_stream,
#                                          fuzz_rendezvous, fuzz_dist,
#                                          fuzz_safetensors
#
# Environment: FUZZ_BUILD_DIR (default build-fuzz), FUZZ_JOBS (parallel
# fuzzing processes; unset: one, in the foreground), FUZZ_ARGS (extra
# libFuzzer flags). FUZZ_CODEC_VERBOSE=1 makes fuzz_codec print what each
# input decodes to: `FUZZ_CODEC_VERBOSE=1 build-fuzz/tools/fuzz_codec FILE`.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
target=${2:-fuzz_codec}
build=${FUZZ_BUILD_DIR:-build-fuzz}

command -v clang > /dev/null || { echo "fuzz.sh: clang not found (Debian: clang, libclang-rt-14-dev)"; exit 1; }
cmake -S . -B "$build" -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DZDIST_FUZZ=ON > /dev/null
cmake --build "$build" --target "$target" -j "$(nproc)"

# Seeds: one valid input per value kind, in the layout fuzz_codec.c
# describes. seed NAME FLAGS META [FRAME...], bytes in hex; the frame count
# and sizes are filled in.
seeds="$build/seeds-$target"
corpus="$build/corpus-$target"
mkdir -p "$seeds" "$corpus" "$build/artifacts"
bytes() { for h in "$@"; do printf "\\x$h"; done; }
seed() {
  local name=$1 flags=$2 meta=$3 f n
  shift 3
  {
    bytes "$(printf '%02x' $((flags | $#)))"
    for f in "$@"; do
      n=$(wc -w <<< "$f")
      bytes "$(printf '%02x' $((n & 255)))" "$(printf '%02x' $((n >> 8)))"
    done
    # shellcheck disable=SC2086
    bytes $meta
    # shellcheck disable=SC2086
    for f in "$@"; do bytes $f; done
  } > "$seeds/$name"
}
if [ "$target" = fuzz_codec ]; then
  f32_1_2="00 00 80 3f 00 00 00 40"
  seed none        0 "01 00"
  seed ints        0 "01 07 03 01 02 00 03 02 61 62"
  seed float       0 "01 02 00 00 00 00 00 00 f8 3f"
  seed bytes       0 "01 04 03 00 01 ff"
  seed tensor_f32  0 "01 05 01 00 01 02" "$f32_1_2"
  seed grad_2d     0 "01 05 01 01 02 01 02" "$f32_1_2"
  # [u8 (3), [int64 (2)], "A"] with frames at odd addresses
  seed mixed_odd   16 "01 07 03 05 03 00 01 03 07 01 05 02 00 01 02 03 01 41" "01 02 03" \
                   "01 00 00 00 00 00 00 00 ff ff ff ff ff ff ff ff"
  seed lent_scalar 32 "01 05 01 00 00" "00 00 80 3f"
  seed empty       0 "01 05 01 00 02 00 05" ""
  seed rref        0 "01 07 02 06 $(seq -s ' ' 11 50) 00"
fi

if [ "$target" = fuzz_stream ]; then
  # msg C TYPE FLAGS ID SEQ [FRAME...]: one built message in the layout
  # fuzz_stream.c describes (C: connection and switches; the frame count
  # goes into bits 4-6, the frame lengths are filled in). TYPE 01 is a
  # CALL, 02 a REPLY; FLAGS 01 streamed, 02 a piece.
  msg() {
    local c=$1 f n
    bytes "$(printf '%02x' $((c | ($# - 5) << 4)))" "$2" "$3" "$4" "$5"
    shift 5
    for f in "$@"; do
      n=$(wc -w <<< "$f")
      bytes "$(printf '%02x' $((n & 255)))" "$(printf '%02x' $((n >> 8)))"
      # shellcheck disable=SC2086
      bytes $f
    done
  }
  # Stream tables: 1 tensor of 5 bytes; 2 tensors of 10 and 3 bytes
  # (frames 0 and 2); chunks of 4096 bytes.
  t1="01 00 00 00 00 10 00 00 00 00 00 00 00 00 00 00 05 00 00 00 00 00 00 00"
  t2="02 00 00 00 00 10 00 00 00 00 00 00 00 00 00 00 0a 00 00 00 00 00 00 00
      02 00 00 00 00 00 00 00 03 00 00 00 00 00 00 00"
  ten="00 01 02 03 04 05 06 07 08 09"
  { msg 3 02 01 01 00 "" "$t1"; msg 3 00 02 01 00 "01 02 03 04 05"; } > "$seeds/reply"
  { msg 1 01 01 02 00 "" "aa bb cc" "" "$t2"; msg 1 00 02 02 00 "$ten"
    msg 1 00 02 02 01 "01 02 03"; } > "$seeds/call_two"
  { msg 0 01 01 03 00 "" "$t1"; msg 2 01 01 04 00 "" "aa" "" "$t2"
    msg 0 00 02 03 00 "01 02 03 04 05"; msg 2 00 02 04 00 "$ten"
    msg 2 00 02 04 01 "01 02 03"; } > "$seeds/interleaved"
  { msg 11 02 01 01 00 "" "$t1"; msg 3 00 02 01 00 "01 02 03 04 05"; } > "$seeds/expired"
  { msg 1 01 00 05 00 "01 02"; msg 2 02 00 05 00; } > "$seeds/plain"
fi

if [ "$target" = fuzz_rendezvous ]; then
  # rdv BYTE0 TEXT...: byte 0 as fuzz_rendezvous.c describes, then each
  # text as a frame (u8 length, bytes).
  rdv() {
    local t
    bytes "$1"
    shift
    for t in "$@"; do bytes "$(printf '%02x' ${#t})"; printf '%s' "$t"; done
  }
  rdv 00 ZDREG1 1 2 trainer_1 tcp://10.0.0.2:41000 "" > "$seeds/reg"
  rdv 00 ZDREG1 3 4 w3 "tcp://[fd00::2]:5" "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7" > "$seeds/reg_ipv6"
  # world 2, rank 1 (byte 0: answer, (2-1)<<1, 1<<4)
  # tab BYTE0 WORLD (NAME ENDPOINT KEY)...: a table, its entries one frame
  # of fields (u8 length, bytes), as rendezvous.h describes.
  tab() {
    local t n=0
    bytes "$1"
    rdv_frame ZDTAB2
    rdv_frame "$2"
    shift 2
    for t in "$@"; do n=$((n + 1 + ${#t})); done
    bytes "$(printf '%02x' $n)"
    for t in "$@"; do bytes "$(printf '%02x' ${#t})"; printf '%s' "$t"; done
  }
  rdv_frame() { bytes "$(printf '%02x' ${#1})"; printf '%s' "$1"; }
  tab 13 2 w0 tcp://10.0.0.1:4000 "" w1 tcp://10.0.0.2:4001 "" > "$seeds/table"
  tab 13 2 w0 "tcp://[fd00::1]:4000" "" w1 "tcp://[::ffff:10.0.0.2]:4001" "" > "$seeds/table_ipv6"
  rdv 01 ZDERR1 "rendezvous: world size mismatch" > "$seeds/error"
fi

if [ "$target" = fuzz_dist ]; then
  # Operations in the layout fuzz_dist.c describes: a well-shaped gradient
  # for the recorded graph (accepted), a one-float one (E2), a uint8 one;
  # queries, flushes, releases from participants and strangers; a request
  # under a new context; our own call and its backward; RRef control
  # messages, fetches, wire forms, expiry and owned RRefs.
  bytes 00 01 00 01 01 00 01 01 > "$seeds/backward_ok"
  bytes 00 01 00 01 01 00 00 00 01 04 01 > "$seeds/backward_one_float"
  bytes 00 01 00 01 01 00 00 01 02 04 05 > "$seeds/backward_uint8"
  bytes 01 01 00 02 07 02 01 00 02 03 01 00 03 01 03 > "$seeds/queries"
  bytes 04 02 00 09 00 05 01 04 03 00 0d 00 05 01 > "$seeds/requests"
  bytes 05 01 00 03 01 01 05 02 00 03 01 00 > "$seeds/own_calls"
  bytes 06 03 01 04 02 00 0d 00 05 01 04 02 00 11 00 05 01 04 02 00 15 00 05 01 > "$seeds/limits"
  bytes 07 01 01 05 09 00 07 01 00 05 09 00 08 05 01 09 05 09 01 00 00 01 0a 07 0b 01 0b 00 \
        > "$seeds/rrefs"
  bytes 00 01 00 01 ff $(printf '00 %.0s' {1..8}) 00 > "$seeds/backward_raw_seq"
fi

dict=""
if [ "$target" = fuzz_safetensors ]; then
  # st NAME JSON [HEX...]: a safetensors file, the header's length (in
  # bytes) filled in, the data after it.
  st() {
    local name=$1 json=$2 n
    shift 2
    n=$(printf '%s' "$json" | wc -c)
    { bytes "$(printf '%02x' $((n & 255)))" "$(printf '%02x' $((n >> 8)))" 00 00 00 00 00 00
      printf '%s' "$json"
      # shellcheck disable=SC2068
      [ $# -eq 0 ] || bytes $@; } > "$seeds/$name"
  }
  st f32 '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}' 00 00 80 3f 00 00 00 40
  st empty '{}'
  st padded '{"__metadata__":{"format":"pt"}}     '
  # every dtype zdist reads, with metadata, out of order, zero-sized ones
  st dtypes '{"__metadata__":{"format":"pt","step":"200"},"v":{"dtype":"U8","shape":[3],"data_offsets":[24,27]},"i":{"dtype":"I64","shape":[1],"data_offsets":[0,8]},"d":{"dtype":"F64","shape":[1],"data_offsets":[8,16]},"f":{"dtype":"F32","shape":[],"data_offsets":[16,20]},"b":{"dtype":"BF16","shape":[1],"data_offsets":[20,22]},"h":{"dtype":"F16","shape":[1],"data_offsets":[22,24]},"u":{"dtype":"U8","shape":[2,0],"data_offsets":[24,24]}}' \
     ff ff ff ff ff ff ff 7f 00 00 00 00 00 00 f0 3f 00 00 c0 7f 80 3f 01 00 01 02 03
  st escapes '{"a\"\\\n\u0001é/x":{"dtype":"U8","shape":[1,1],"data_offsets":[0,1]}}' 2a
  # the words of a header, for the mutations
  dict="$build/fuzz_safetensors.dict"
  printf '%s\n' '"\"dtype\""' '"\"shape\""' '"\"data_offsets\""' '"\"__metadata__\""' \
    '"\"F32\""' '"\"F64\""' '"\"F16\""' '"\"BF16\""' '"\"I64\""' '"\"U8\""' '"\"I32\""' \
    '"\"BOOL\""' '"\\u00"' '"\\\""' '"[0,"' '"]}"' '":{"' '",\""' > "$dict"
fi

echo "fuzzing $target for ${seconds}s (corpus $corpus, seeds $seeds)"
# shellcheck disable=SC2086
"$build/tools/$target" -max_total_time="$seconds" -max_len=4096 -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$build/artifacts/" \
    ${FUZZ_JOBS:+-jobs=$FUZZ_JOBS -workers=$FUZZ_JOBS} ${dict:+-dict="$dict"} ${FUZZ_ARGS:-} \
    "$corpus" "$seeds"
