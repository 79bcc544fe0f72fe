#!/bin/sh
# Runs protoc-c on our .proto files and flattens the output names so meson
# can name them: gen.sh SRCDIR OUTDIR PROTOC_C
set -eu
src=$1 out=$2 protoc=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
protos="dist/v1/dist.proto dist/v1/program.proto grpc/health/v1/health.proto dist/v1/moe.proto dist/v1/param.proto dist/v1/checkpoint.proto"
(cd "$src" && "$protoc" -I. --c_out="$tmp" $protos)
# Generated files include each other by proto path; rewrite to flat names.
for p in $protos; do
  base=$(basename "$p" .proto)
  for ext in c h; do
    sed -e 's|#include "dist/v1/\([a-z_]*\).pb-c.h"|#include "\1.pb-c.h"|' \
        -e 's|#include "grpc/health/v1/\([a-z_]*\).pb-c.h"|#include "\1.pb-c.h"|' \
        "$tmp/${p%.proto}.pb-c.$ext" > "$out/$base.pb-c.$ext"
  done
done
