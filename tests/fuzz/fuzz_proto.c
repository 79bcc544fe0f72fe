/* Every request message distd serves, unpacked from arbitrary bytes as the
 * RPC layer does (dist_bb_to_pb of a gRPC byte buffer, common/pbuf_recv.c,
 * whose slicing and large-field threshold the input picks so that small
 * inputs reach its walk of the fields), which must agree with
 * protobuf_c_message_unpack of the same bytes, then checked the way the
 * handlers check it before acting on it:
 * TensorPut's TensorMeta (daemon/tensor_meta.c: dtype, mesh, placements,
 * shapes) and the piece size store_piece computes, Reshard's meshes and
 * placements, Collective's dtype. The first input byte picks the message. */
#include "checkpoint.pb-c.h"
#include "dist.pb-c.h"
#include "fuzz_check.h"
#include "health.pb-c.h"
#include "moe.pb-c.h"
#include "param.pb-c.h"
#include "program.pb-c.h"
#include "mesh.h"
#include "pbuf.h"
#include "wire.h"

/* The fuzzed daemon's cluster: ranks 0..7. */
enum { WORLD_SIZE = 8 };

static const ProtobufCMessageDescriptor *const requests[] = {
    &grpc__health__v1__health_check_request__descriptor,
    &dist__v1__info_request__descriptor,
    &dist__v1__tensor_put_request__descriptor,
    &dist__v1__tensor_get_request__descriptor,
    &dist__v1__tensor_list_request__descriptor,
    &dist__v1__tensor_show_request__descriptor,
    &dist__v1__tensor_delete_request__descriptor,
    &dist__v1__reshard_request__descriptor,
    &dist__v1__collective_request__descriptor,
    &dist__v1__ops_request__descriptor,
    &dist__v1__experts_request__descriptor,
    &dist__v1__global_exchange_request__descriptor,
    &dist__v1__expert_layer_create_request__descriptor,
    &dist__v1__expert_forward_request__descriptor,
    &dist__v1__expert_backward_request__descriptor,
    &dist__v1__expert_release_request__descriptor,
    &dist__v1__program_register_request__descriptor,
    &dist__v1__program_invoke_request__descriptor,
    &dist__v1__program_backward_request__descriptor,
    &dist__v1__program_release_request__descriptor,
    &dist__v1__param_configure_request__descriptor,
    &dist__v1__param_push_request__descriptor,
    &dist__v1__param_pull_request__descriptor,
    &dist__v1__checkpoint_save_request__descriptor,
    &dist__v1__checkpoint_commit_request__descriptor,
    &dist__v1__checkpoint_manifest_request__descriptor,
    &dist__v1__checkpoint_load_request__descriptor,
    &dist__v1__checkpoint_read_request__descriptor,
    &dist__v1__checkpoint_discard_request__descriptor,
    &dist__v1__param_list_request__descriptor,
    /* Last, so that the checked-in seeds' first bytes keep their message. */
    &dist__v1__op_abort_request__descriptor,
};
#define NREQUESTS (sizeof requests / sizeof requests[0])

/* What distd_mesh_check_world refuses. */
static int in_world(const dist_mesh_desc *m) {
  for (int i = 0; i < m->nranks; i++)
    if (m->ranks[i] < 0 || m->ranks[i] >= WORLD_SIZE) return 0;
  return 1;
}

static void check_mesh(const dist_mesh_desc *m) {
  FUZZ_CHECK(m->ndim >= 1 && m->ndim <= DIST_MAX_MESH_DIMS);
  int n = 1;
  for (int d = 0; d < m->ndim; d++) {
    FUZZ_CHECK(m->shape[d] >= 1);
    n *= m->shape[d];
  }
  FUZZ_CHECK(n == m->nranks && n <= DIST_MAX_MESH_RANKS);
}

/* The byte count of every rank's piece, as distd_tensor_new computes it:
 * it must neither overflow nor come out negative. */
static void check_pieces(const dist_mesh_desc *m, const dist_placement *p,
                         const dist_shape *global, dist_dtype dt) {
  int64_t gnumel = dist_shape_numel(global);
  FUZZ_CHECK(gnumel >= 0);
  for (int i = 0; i < m->nranks; i++) {
    int coords[DIST_MAX_MESH_DIMS];
    int64_t offset[DIST_MAX_DIMS];
    dist_shape local;
    dist_mesh_coords(m, i, coords);
    dist_local_box(m, p, global, coords, &local, offset);
    int64_t numel = dist_shape_numel(&local);
    FUZZ_CHECK(numel >= 0 && numel <= gnumel);
    size_t bytes;
    FUZZ_CHECK(!__builtin_mul_overflow((size_t)numel, dist_dtype_size(dt),
                                       &bytes));
    for (int d = 0; d < global->ndim; d++)
      FUZZ_CHECK(offset[d] >= 0 && offset[d] + local.dims[d] <= global->dims[d]);
  }
}

/* daemon/tensor_meta.c's distd_meta_parse, then the checks tensor_put
 * makes before it allocates. */
static void tensor_put(const Dist__V1__TensorPutRequest *rq) {
  const Dist__V1__TensorMeta *pb = rq->meta;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  dist_dtype dt;
  dist_mesh_desc mesh;
  dist_placement p[DIST_MAX_MESH_DIMS];
  dist_shape global, local;
  int rc;
  if (!pb || !pb->name) return;
  if ((rc = dist_dtype_from_pb((int)pb->dtype, &dt, &eb)) ||
      (rc = dist_mesh_from_pb(pb->mesh, &mesh, &eb))) {
    fuzz_check_rejection(rc, &eb);
    return;
  }
  check_mesh(&mesh);
  if (!in_world(&mesh) || pb->n_placements != (size_t)mesh.ndim) return;
  if ((rc = dist_placements_from_pb(pb->placements, pb->n_placements, p, &eb)) ||
      (rc = dist_shape_from_pb(pb->global_shape, pb->n_global_shape, &global, &eb)) ||
      (rc = dist_shape_from_pb(pb->local_shape, pb->n_local_shape, &local, &eb))) {
    fuzz_check_rejection(rc, &eb);
    return;
  }
  const dist_shape *shape = rq->derive_global_shape ? &local : &global;
  rc = dist_placements_check(&mesh, p, mesh.ndim, shape->ndim, &eb);
  if (rc != 0) {
    fuzz_check_rejection(rc, &eb);
    return;
  }
  size_t bytes;
  int64_t numel = dist_shape_numel(&local);
  FUZZ_CHECK(numel >= 0);
  FUZZ_CHECK(!__builtin_mul_overflow((size_t)numel, dist_dtype_size(dt), &bytes));
  if (!rq->derive_global_shape) check_pieces(&mesh, p, &global, dt);
  char text[256];
  dist_shape_format(&global, text, sizeof text);
  dist_placements_text(p, mesh.ndim, text, sizeof text);
}

static void reshard(const Dist__V1__ReshardRequest *rq) {
  dist_errbuf eb = DIST_ERRBUF_INIT;
  dist_mesh_desc src, dst;
  dist_placement p[DIST_MAX_MESH_DIMS];
  int rc;
  if (rq->src_mesh) {
    if ((rc = dist_mesh_from_pb(rq->src_mesh, &src, &eb))) {
      fuzz_check_rejection(rc, &eb);
      return;
    }
    check_mesh(&src);
  }
  if (rq->mesh) {
    if ((rc = dist_mesh_from_pb(rq->mesh, &dst, &eb))) {
      fuzz_check_rejection(rc, &eb);
      return;
    }
    check_mesh(&dst);
    char text[256];
    dist_mesh_format(&dst, text, sizeof text);
  } else if (rq->src_mesh) {
    dst = src;
  } else {
    return; /* the daemon takes the stored tensor's mesh */
  }
  if (rq->n_placements != (size_t)dst.ndim) return;
  rc = dist_placements_from_pb(rq->placements, rq->n_placements, p, &eb);
  if (rc != 0) fuzz_check_rejection(rc, &eb);
}

static void collective(const Dist__V1__CollectiveRequest *rq) {
  dist_errbuf eb = DIST_ERRBUF_INIT;
  dist_dtype dt;
  int rc = dist_dtype_from_pb((int)rq->dtype, &dt, &eb);
  if (rc != 0)
    fuzz_check_rejection(rc, &eb);
  else
    FUZZ_CHECK(dist_dtype_size(dt) > 0);
}

/* buf as a byte buffer in slices of `step` bytes (0: one slice). */
static grpc_byte_buffer *sliced(const uint8_t *buf, size_t len, size_t step) {
  grpc_slice s[64];
  size_t n = 0;
  for (size_t off = 0; off < len || n == 0;) {
    size_t k = step && n < 63 ? (len - off < step ? len - off : step) : len - off;
    s[n++] = grpc_slice_from_copied_buffer((const char *)buf + off, k);
    off += k;
  }
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(s, n);
  for (size_t i = 0; i < n; i++) grpc_slice_unref(s[i]);
  return bb;
}

/* The RPC layer's unpack gives what protobuf-c gives: nothing, or a message
 * that packs to the same bytes. */
static void check_same(const ProtobufCMessage *got, const ProtobufCMessage *want) {
  FUZZ_CHECK((got == NULL) == (want == NULL));
  if (!got) return;
  size_t n = protobuf_c_message_get_packed_size(got);
  FUZZ_CHECK(n == protobuf_c_message_get_packed_size(want));
  uint8_t *a = malloc(n ? n : 1), *b = malloc(n ? n : 1);
  FUZZ_CHECK(a && b);
  protobuf_c_message_pack(got, a);
  protobuf_c_message_pack(want, b);
  FUZZ_CHECK(memcmp(a, b, n) == 0);
  free(a);
  free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const size_t steps[] = {0, 1, 3, 16, 100};
  static const size_t split_min[] = {1, 2, 8, 64};
  if (size < 2) return 0;
  const ProtobufCMessageDescriptor *desc = requests[data[0] % NREQUESTS];
  size_t step = steps[data[1] % 5], min = split_min[(data[1] / 5) % 4];
  /* An exact-size copy, so ASan sees any read past the message. */
  size_t len = size - 2;
  uint8_t *buf = malloc(len ? len : 1);
  if (!buf) return 0;
  memcpy(buf, data + 2, len);
  ProtobufCMessage *want = protobuf_c_message_unpack(desc, NULL, len, buf);
  grpc_byte_buffer *bb = sliced(buf, len, step);
  free(buf);
  ProtobufCMessage *msg = dist_bb_to_pb_split(bb, desc, min, NULL);
  grpc_byte_buffer_destroy(bb);
  check_same(msg, want);
  protobuf_c_message_free_unpacked(want, NULL);
  if (!msg) return 0; /* the RPC layer answers INVALID_ARGUMENT */
  FUZZ_CHECK(protobuf_c_message_check(msg));
  if (desc == &dist__v1__tensor_put_request__descriptor)
    tensor_put((const void *)msg);
  else if (desc == &dist__v1__reshard_request__descriptor)
    reshard((const void *)msg);
  else if (desc == &dist__v1__collective_request__descriptor)
    collective((const void *)msg);
  /* Replies carry request fields back (names, metas): packing must work. */
  size_t n = protobuf_c_message_get_packed_size(msg);
  uint8_t *out = malloc(n ? n : 1);
  FUZZ_CHECK(out && protobuf_c_message_pack(msg, out) == n);
  free(out);
  protobuf_c_message_free_unpacked(msg, NULL);
  return 0;
}
