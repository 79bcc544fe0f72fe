/* Writes the binary seeds of the checked-in corpus:
 *   make_seeds CORPUS_DIR      (CORPUS_DIR/frame, /hello, /abort_range,
 *                               /proto must exist)
 * Frames, HELLO and ABORT_RANGE payloads come from the project's own
 * encoders; protobuf seeds are valid requests packed by protobuf-c, each
 * behind the byte that makes fuzz_proto pick its message (the index in
 * fuzz_proto.c's table) and the byte that picks how it is sliced
 * (PROTO_SLICING). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist.pb-c.h"
#include "frame.h"
#include "health.pb-c.h"

/* Indices into fuzz_proto.c's `requests` table. */
enum { HEALTH, INFO, PUT, GET, LIST, SHOW, DELETE, RESHARD, COLLECTIVE };

static const char *dir;

static void write_seed(const char *sub, const char *name, const void *buf,
                       size_t len) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s/%s", dir, sub, name);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(buf, 1, len, f) != len || fclose(f) != 0) {
    perror(path);
    exit(1);
  }
}

static void frame(const char *name, uint16_t kind, uint64_t op, uint32_t src,
                  uint32_t tag, uint64_t length, uint64_t aux) {
  dist_frame_header h = {DIST_FRAME_MAGIC, DIST_FRAME_VERSION, kind, op, src,
                         tag, length, aux};
  uint8_t out[DIST_FRAME_HEADER_SIZE];
  dist_frame_encode(&h, out);
  write_seed("frame", name, out, sizeof out);
}

static void hello(const char *name, uint32_t rank, uint32_t world,
                  const char *cluster, uint64_t boot) {
  dist_hello h = {rank, world, {0}, boot};
  snprintf(h.cluster_id, sizeof h.cluster_id, "%s", cluster);
  uint8_t out[DIST_HELLO_SIZE];
  dist_hello_encode(&h, out);
  write_seed("hello", name, out, sizeof out);
}

static void abort_range(const char *name, uint64_t count, const char *reason) {
  uint8_t out[DIST_ABORT_RANGE_MAX];
  size_t len = dist_abort_range_encode(&(dist_abort_range){count, reason}, out);
  write_seed("abort_range", name, out, len);
}

/* fuzz_proto's second byte: slices of 16 bytes, bytes fields of 8 bytes and
 * more taken out of the message. */
#define PROTO_SLICING (2 * 5 + 3)

static void proto(const char *name, int which, const ProtobufCMessage *msg) {
  size_t n = protobuf_c_message_get_packed_size(msg);
  uint8_t *buf = malloc(n + 2);
  buf[0] = (uint8_t)which;
  buf[1] = PROTO_SLICING;
  protobuf_c_message_pack(msg, buf + 2);
  write_seed("proto", name, buf, n + 2);
  free(buf);
}

static void frames_and_hellos(void) {
  frame("hello", DIST_FRAME_HELLO, 0, 1, 0, DIST_HELLO_SIZE, 0);
  frame("hello_ack", DIST_FRAME_HELLO_ACK, 0, 0, 0, 0, DIST_ACK_READS_ABORT_RANGE);
  frame("hello_reject", DIST_FRAME_HELLO_REJECT, 0, 0, 0, 24, 0);
  frame("data", DIST_FRAME_DATA, 42, 3, 7, 4096, 0);
  frame("abort", DIST_FRAME_ABORT, 42, 2, 0, 16, 0);
  frame("abort_range", DIST_FRAME_ABORT_RANGE, 42, 2, 0, 24, 0);
  frame("ping", DIST_FRAME_PING, 0, 1, 0, 0, 1234567890123ull);
  frame("pong", DIST_FRAME_PONG, 0, 0, 0, 0, 1234567890123ull);
  hello("rank1_of_4", 1, 4, "distd", 0x1122334455667788ull);
  hello("rank0_of_1", 0, 1, "", 1);
  hello("long_id", 7, 8, "a-cluster-id-that-is-exactly-sixty-three-bytes-long-0123456789",
        ~0ull);
}

static void abort_ranges(void) {
  abort_range("one_id_no_reason", 1, "");
  abort_range("plan_of_1000", 1000,
              "its trainer refused it: dist_tape_backward: outputs[0] is NULL");
  abort_range("count_max", DIST_ABORT_RANGE_COUNT_MAX, "its daemon refused it");
  char longest[DIST_ABORT_RANGE_MAX];
  memset(longest, 'r', sizeof longest - 1);
  longest[sizeof longest - 1] = 0;
  abort_range("reason_cut_to_fit", 3, longest);
}

static void requests(void) {
  Grpc__Health__V1__HealthCheckRequest hc = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  hc.service = "dist.v1.Dist";
  proto("health", HEALTH, &hc.base);
  Dist__V1__InfoRequest info = DIST__V1__INFO_REQUEST__INIT;
  proto("info", INFO, &info.base);

  /* A 2x2 mesh, Shard(0) x Replicate, global 10x3 float32: rank 0's piece
   * is 5x3 (derive_global_shape variant carries it too). */
  uint32_t mshape[] = {2, 2}, mranks[] = {0, 1, 2, 3};
  char *names[] = {"dp", "mp"};
  Dist__V1__Mesh mesh = DIST__V1__MESH__INIT;
  mesh.n_shape = 2, mesh.shape = mshape;
  mesh.n_ranks = 4, mesh.ranks = mranks;
  mesh.n_dim_names = 2, mesh.dim_names = names;
  Dist__V1__Placement shard = DIST__V1__PLACEMENT__INIT, rep = DIST__V1__PLACEMENT__INIT,
                      part = DIST__V1__PLACEMENT__INIT;
  shard.kind = DIST__V1__PLACEMENT__KIND__SHARD, shard.dim = 0;
  part.kind = DIST__V1__PLACEMENT__KIND__PARTIAL, part.reduce = DIST__V1__REDUCE_OP__REDUCE_MAX;
  Dist__V1__Placement *pl[] = {&shard, &rep}, *pl2[] = {&rep, &part};
  uint64_t global[] = {10, 3}, local[] = {5, 3};
  float values[15] = {0};
  Dist__V1__TensorMeta meta = DIST__V1__TENSOR_META__INIT;
  meta.name = "w";
  meta.dtype = DIST__V1__DTYPE__FLOAT32;
  meta.n_global_shape = 2, meta.global_shape = global;
  meta.mesh = &mesh;
  meta.n_placements = 2, meta.placements = pl;
  Dist__V1__TensorPutRequest put = DIST__V1__TENSOR_PUT_REQUEST__INIT;
  put.meta = &meta;
  put.data.data = (uint8_t *)values, put.data.len = sizeof values;
  proto("put_shard", PUT, &put.base);
  meta.n_global_shape = 0, meta.global_shape = NULL;
  meta.n_local_shape = 2, meta.local_shape = local;
  put.derive_global_shape = 1, put.op_id = 17;
  proto("put_derive", PUT, &put.base);

  Dist__V1__TensorGetRequest get = DIST__V1__TENSOR_GET_REQUEST__INIT;
  get.name = "w", get.full = 1, get.op_id = 9;
  proto("get_full", GET, &get.base);
  Dist__V1__TensorListRequest list = DIST__V1__TENSOR_LIST_REQUEST__INIT;
  proto("list", LIST, &list.base);
  Dist__V1__TensorShowRequest show = DIST__V1__TENSOR_SHOW_REQUEST__INIT;
  show.name = "w";
  proto("show", SHOW, &show.base);
  Dist__V1__TensorDeleteRequest del = DIST__V1__TENSOR_DELETE_REQUEST__INIT;
  del.name = "w";
  proto("delete", DELETE, &del.base);

  Dist__V1__ReshardRequest rs = DIST__V1__RESHARD_REQUEST__INIT;
  rs.name = "w", rs.dst_name = "w2", rs.op_id = 5;
  rs.mesh = &mesh, rs.src_mesh = &mesh;
  rs.n_placements = 2, rs.placements = pl2;
  proto("reshard", RESHARD, &rs.base);

  uint32_t group[] = {0, 1, 2, 3};
  uint64_t counts[] = {1, 1, 1, 1};
  Dist__V1__CollectiveRequest c = DIST__V1__COLLECTIVE_REQUEST__INIT;
  c.kind = DIST__V1__COLLECTIVE_REQUEST__KIND__ALL_TO_ALL;
  c.op_id = 3, c.n_group = 4, c.group = group;
  c.dtype = DIST__V1__DTYPE__INT64, c.reduce = DIST__V1__REDUCE_OP__REDUCE_SUM;
  c.data.data = (uint8_t *)values, c.data.len = 32;
  c.n_send_counts = 4, c.send_counts = counts;
  c.n_recv_counts = 4, c.recv_counts = counts;
  proto("collective_all_to_all", COLLECTIVE, &c.base);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: make_seeds CORPUS_DIR\n");
    return 2;
  }
  dir = argv[1];
  frames_and_hellos();
  abort_ranges();
  requests();
  return 0;
}
