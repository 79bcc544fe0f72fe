#!/bin/sh
# Runs protoc-c on our .proto files and flattens the output names so meson
# can name them: gen.sh SRCDIR OUTDIR PROTOC_C
set -eu
src=$1 out=$2 protoc=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$protoc" -I"$src" --c_out="$tmp" dist/v1/dist.proto grpc/health/v1/health.proto
# Generated sources include their header by its proto path; rewrite to flat names.
sed 's|#include "dist/v1/dist.pb-c.h"|#include "dist.pb-c.h"|' "$tmp/dist/v1/dist.pb-c.c" > "$out/dist.pb-c.c"
cp "$tmp/dist/v1/dist.pb-c.h" "$out/dist.pb-c.h"
sed 's|#include "grpc/health/v1/health.pb-c.h"|#include "health.pb-c.h"|' "$tmp/grpc/health/v1/health.pb-c.c" > "$out/health.pb-c.c"
cp "$tmp/grpc/health/v1/health.pb-c.h" "$out/health.pb-c.h"
