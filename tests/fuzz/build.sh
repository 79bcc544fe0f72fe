#!/bin/sh
# Builds every libFuzzer harness in tests/fuzz into OUTDIR:
#   tests/fuzz/build.sh OUTDIR
# The decoders under test and what they need are compiled here with clang
# (-fsanitize=fuzzer,address,undefined), independently of the meson build,
# because the project's own build uses gcc, which has no libFuzzer.
# Also builds make_seeds (not a fuzzer), which writes the binary seeds.
set -eu
here=$(cd "$(dirname "$0")" && pwd -P)
root=$(cd "$here/../.." && pwd)
out=${1:?usage: build.sh OUTDIR}
CC=${CC:-clang}
mkdir -p "$out/gen" "$out/obj"
out=$(cd "$out" && pwd)

"$root/proto/gen.sh" "$root/proto" "$out/gen" "$(command -v protoc-c)"

san="-fsanitize=address,undefined -fno-sanitize-recover=undefined"
cflags="-std=c11 -D_GNU_SOURCE -g -O1 -fno-omit-frame-pointer -Wall -Wextra -Werror"
inc="-I$root/common -I$root/common/include -I$out/gen"

# The decoders and their dependencies, with coverage instrumentation for the
# fuzzer but no fuzzer main.
sources="common/errbuf.c common/error.c common/fileio.c common/tensor.c common/npy.c
  common/frame.c common/config.c common/cluster.c common/mesh.c
  common/placement.c common/wire.c common/safetensors.c common/pbuf.c
  common/pbuf_recv.c common/utf8.c common/json_memory.c daemon/config.c"
objs=""
for s in $sources; do
  o="$out/obj/$(echo "$s" | tr / _ | sed 's/\.c$/.o/')"
  $CC $cflags $san -fsanitize=fuzzer-no-link $inc -c "$root/$s" -o "$o"
  objs="$objs $o"
done
for g in dist health program moe param checkpoint; do
  o="$out/obj/$g.pb-c.o"
  $CC $cflags -Wno-unused-parameter $san -fsanitize=fuzzer-no-link $inc \
    -c "$out/gen/$g.pb-c.c" -o "$o"
  objs="$objs $o"
done
rm -f "$out/libfuzzdist.a"
ar rcs "$out/libfuzzdist.a" $objs

for h in "$here"/fuzz_*.c; do
  name=$(basename "$h" .c)
  $CC $cflags $san -fsanitize=fuzzer $inc "$h" "$out/libfuzzdist.a" \
    -lprotobuf-c -ljansson $(pkg-config --libs grpc) -lm -o "$out/$name"
done

# The seed generator runs once by hand; plain sanitizers, no fuzzer.
$CC $cflags $san $inc "$here/make_seeds.c" "$out/libfuzzdist.a" \
  -fsanitize=fuzzer-no-link -lprotobuf-c -ljansson $(pkg-config --libs grpc) -lm -o "$out/make_seeds"
