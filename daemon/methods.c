#include "methods.h"

#include "dist.pb-c.h"
#include "health.pb-c.h"
#include "checkpoint.pb-c.h"
#include "param.pb-c.h"
#include "moe.pb-c.h"
#include "program.pb-c.h"

/* Every row says who may call it (rpc.h, distd_access): DISTD_ACCESS_READ
 * opens a method to read-only tokens, DISTD_ACCESS_OPEN to anyone. The
 * metrics label is the method name, prefixed by its service outside
 * dist.v1.Dist ("Param/PushGrad"). */
#define DIST_METHOD(name, msg, fn, access)                              \
  {"/dist.v1.Dist/" #name, #name, &dist__v1__##msg##__descriptor,       \
   distd_handle_##fn, access}
#define SERVICE_METHOD(svc, name, msg, fn, access)                      \
  {"/dist.v1." #svc "/" #name, #svc "/" #name,                         \
   &dist__v1__##msg##__descriptor, distd_handle_##fn, access}
#define R DISTD_ACCESS_READ
#define W DISTD_ACCESS_WRITE

const distd_method distd_methods[] = {
    {"/grpc.health.v1.Health/Check", "grpc.health.v1.Health/Check",
     &grpc__health__v1__health_check_request__descriptor,
     distd_handle_health_check, DISTD_ACCESS_OPEN},
    DIST_METHOD(Info, info_request, info, R),
    DIST_METHOD(TensorPut, tensor_put_request, tensor_put, W),
    DIST_METHOD(TensorGet, tensor_get_request, tensor_get, W),
    DIST_METHOD(TensorList, tensor_list_request, tensor_list, R),
    DIST_METHOD(TensorShow, tensor_show_request, tensor_show, R),
    DIST_METHOD(TensorDelete, tensor_delete_request, tensor_delete, W),
    DIST_METHOD(Reshard, reshard_request, reshard, W),
    DIST_METHOD(Collective, collective_request, collective, W),
    DIST_METHOD(Ops, ops_request, ops, R),
    DIST_METHOD(Experts, experts_request, experts, R),
    DIST_METHOD(OpAbort, op_abort_request, op_abort, W),
    SERVICE_METHOD(Moe, GlobalScatter, global_exchange_request, global_scatter, W),
    SERVICE_METHOD(Moe, GlobalGather, global_exchange_request, global_gather, W),
    SERVICE_METHOD(Moe, ExpertLayerCreate, expert_layer_create_request, expert_layer_create, W),
    SERVICE_METHOD(Moe, ExpertForward, expert_forward_request, expert_forward, W),
    SERVICE_METHOD(Moe, ExpertBackward, expert_backward_request, expert_backward, W),
    SERVICE_METHOD(Moe, ExpertRelease, expert_release_request, expert_release, W),
    SERVICE_METHOD(LocalLayer, RegisterProgram, program_register_request, program_register, W),
    SERVICE_METHOD(LocalLayer, Invoke, program_invoke_request, program_invoke, W),
    SERVICE_METHOD(LocalLayer, Backward, program_backward_request, program_backward, W),
    SERVICE_METHOD(LocalLayer, Release, program_release_request, program_release, W),
    SERVICE_METHOD(Param, Configure, param_configure_request, param_configure, W),
    SERVICE_METHOD(Param, PushGrad, param_push_request, param_push, W),
    SERVICE_METHOD(Param, PushGradBatch, param_push_batch_request, param_push_batch, W),
    SERVICE_METHOD(Param, ConfigureBatch, param_configure_batch_request, param_configure_batch,
                   W),
    SERVICE_METHOD(Param, Pull, param_pull_request, param_pull, W),
    SERVICE_METHOD(Param, List, param_list_request, param_list, R),
    SERVICE_METHOD(Checkpoint, Save, checkpoint_save_request, checkpoint_save, W),
    SERVICE_METHOD(Checkpoint, Commit, checkpoint_commit_request, checkpoint_commit, W),
    SERVICE_METHOD(Checkpoint, Manifest, checkpoint_manifest_request, checkpoint_manifest, W),
    SERVICE_METHOD(Checkpoint, Load, checkpoint_load_request, checkpoint_load, W),
    SERVICE_METHOD(Checkpoint, Read, checkpoint_read_request, checkpoint_read, W),
    SERVICE_METHOD(Checkpoint, Discard, checkpoint_discard_request, checkpoint_discard, W),
};
#undef R
#undef W

const int distd_method_count = sizeof distd_methods / sizeof distd_methods[0];
