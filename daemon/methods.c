#include "methods.h"

#include "dist.pb-c.h"
#include "health.pb-c.h"

#define DIST_METHOD(name, msg, fn)                                      \
  {"/dist.v1.Dist/" #name, #name, &dist__v1__##msg##__descriptor,       \
   distd_handle_##fn}

const distd_method distd_methods[] = {
    {"/grpc.health.v1.Health/Check", "grpc.health.v1.Health/Check",
     &grpc__health__v1__health_check_request__descriptor,
     distd_handle_health_check},
    DIST_METHOD(Info, info_request, info),
    DIST_METHOD(TensorPut, tensor_put_request, tensor_put),
    DIST_METHOD(TensorGet, tensor_get_request, tensor_get),
    DIST_METHOD(TensorList, tensor_list_request, tensor_list),
    DIST_METHOD(TensorShow, tensor_show_request, tensor_show),
    DIST_METHOD(TensorDelete, tensor_delete_request, tensor_delete),
    DIST_METHOD(Reshard, reshard_request, reshard),
    DIST_METHOD(Collective, collective_request, collective),
};

const int distd_method_count = sizeof distd_methods / sizeof distd_methods[0];
