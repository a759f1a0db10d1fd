// libascendcl.so: streams, events and host functions over the runtime table's streams (torch's npu streams:
// a torch kernel and an ACL call queued on the same stream run in the order they were issued).
#include <cstdio>
#include <new>

#include "acl_internal.h"
#include "acl_stream_handle.h"

using npudist::acl::fail;
using npudist::acl::from_status;
using npudist::acl::on_stream;

namespace {

aclError check_event(aclrtEvent event, const char* call) {
  return event ? ACL_SUCCESS : fail(ACL_ERROR_INVALID_PARAM, std::string(call) + ": event is null");
}

NpudistEvent as_event(aclrtEvent e) { return static_cast<NpudistEvent>(e); }

}  // namespace

extern "C" {

// A stream from the current device's pool. Pooled streams are shared round robin with torch.npu.Stream()
// (as CUDA's stream pool): two streams may be one queue, which only adds ordering.
aclError aclrtCreateStream(aclrtStream* stream) {
  if (!stream) return fail(ACL_ERROR_INVALID_PARAM, "aclrtCreateStream: stream is null");
  ACL_RUNTIME_OR_RETURN(rt);
  const int device = rt->get_device();
  int64_t id = 0;
  npudist_status s = rt->stream_create(device, 0, &id);
  if (s != NPUDIST_SUCCESS) return from_status(rt, s, "aclrtCreateStream");
  *stream = npudist::acl::encode_stream(device, id);
  return ACL_SUCCESS;
}

// Waits for the stream's work first, so host functions and copies still queued never outlive the handle.
aclError aclrtDestroyStream(aclrtStream stream) {
  if (!stream) {
    return fail(ACL_ERROR_INVALID_PARAM, "aclrtDestroyStream: the default stream (null) cannot be destroyed");
  }
  return on_stream(stream, "aclrtDestroyStream", [](const NpudistRuntimeApi* rt, int32_t device, int64_t id) {
    npudist_status s = rt->stream_synchronize(device, id);
    return s == NPUDIST_SUCCESS ? rt->stream_destroy(device, id) : s;
  });
}

aclError aclrtSynchronizeStream(aclrtStream stream) {
  return on_stream(stream, "aclrtSynchronizeStream", [](const NpudistRuntimeApi* rt, int32_t device, int64_t id) {
    return rt->stream_synchronize(device, id);
  });
}

aclError aclrtStreamWaitEvent(aclrtStream stream, aclrtEvent event) {
  if (aclError e = check_event(event, "aclrtStreamWaitEvent")) return e;
  return on_stream(stream, "aclrtStreamWaitEvent", [&](const NpudistRuntimeApi* rt, int32_t device, int64_t id) {
    return rt->stream_wait_event(as_event(event), device, id);
  });
}

// fn runs on the stream's worker thread once the work queued before it has run; the stream waits for it
// (ACL_CALLBACK_BLOCK behaviour for both block types). No aclrtSubscribeReport thread is needed.
aclError aclrtLaunchCallback(aclrtCallback fn, void* userData, aclrtCallbackBlockType blockType, aclrtStream stream) {
  if (!fn) return fail(ACL_ERROR_INVALID_PARAM, "aclrtLaunchCallback: fn is null");
  if (blockType != ACL_CALLBACK_NO_BLOCK && blockType != ACL_CALLBACK_BLOCK) {
    return fail(ACL_ERROR_INVALID_PARAM, "aclrtLaunchCallback: unknown aclrtCallbackBlockType " +
                                             std::to_string(static_cast<int>(blockType)));
  }
  return on_stream(stream, "aclrtLaunchCallback", [&](const NpudistRuntimeApi* rt, int32_t device, int64_t id) {
    return rt->launch_host_func(device, id, fn, userData);
  });
}

aclError aclrtLaunchHostFunc(aclrtStream stream, aclrtHostFunc fn, void* args) {
  if (!fn) return fail(ACL_ERROR_INVALID_PARAM, "aclrtLaunchHostFunc: fn is null");
  return on_stream(stream, "aclrtLaunchHostFunc", [&](const NpudistRuntimeApi* rt, int32_t device, int64_t id) {
    return rt->launch_host_func(device, id, fn, args);
  });
}

aclError aclrtCreateEvent(aclrtEvent* event) {
  if (!event) return fail(ACL_ERROR_INVALID_PARAM, "aclrtCreateEvent: event is null");
  ACL_RUNTIME_OR_RETURN(rt);
  NpudistEvent e = nullptr;
  npudist_status s = rt->event_create(&e);
  if (s != NPUDIST_SUCCESS) return from_status(rt, s, "aclrtCreateEvent");
  *event = e;
  return ACL_SUCCESS;
}

// Every event records a timestamp, so ACL_EVENT_TIME_LINE needs nothing extra.
aclError aclrtCreateEventWithFlag(aclrtEvent* event, uint32_t flag) {
  if (flag & ~(ACL_EVENT_SYNC | ACL_EVENT_TIME_LINE)) {
    char buf[120];
    std::snprintf(buf, sizeof(buf),
                  "aclrtCreateEventWithFlag: unsupported flag 0x%x (ACL_EVENT_SYNC, ACL_EVENT_TIME_LINE)", flag);
    return fail(ACL_ERROR_INVALID_PARAM, buf);
  }
  return aclrtCreateEvent(event);
}

aclError aclrtDestroyEvent(aclrtEvent event) {
  if (aclError e = check_event(event, "aclrtDestroyEvent")) return e;
  ACL_RUNTIME_OR_RETURN(rt);
  return from_status(rt, rt->event_destroy(as_event(event)), "aclrtDestroyEvent");
}

aclError aclrtRecordEvent(aclrtEvent event, aclrtStream stream) {
  if (aclError e = check_event(event, "aclrtRecordEvent")) return e;
  return on_stream(stream, "aclrtRecordEvent", [&](const NpudistRuntimeApi* rt, int32_t device, int64_t id) {
    return rt->event_record(as_event(event), device, id);
  });
}

aclError aclrtSynchronizeEvent(aclrtEvent event) {
  if (aclError e = check_event(event, "aclrtSynchronizeEvent")) return e;
  ACL_RUNTIME_OR_RETURN(rt);
  return from_status(rt, rt->event_synchronize(as_event(event)), "aclrtSynchronizeEvent");
}

aclError aclrtQueryEvent(aclrtEvent event, aclrtEventStatus* status) {
  if (aclError e = check_event(event, "aclrtQueryEvent")) return e;
  if (!status) return fail(ACL_ERROR_INVALID_PARAM, "aclrtQueryEvent: status is null");
  ACL_RUNTIME_OR_RETURN(rt);
  *status = rt->event_query(as_event(event)) ? ACL_EVENT_STATUS_COMPLETE : ACL_EVENT_STATUS_NOT_READY;
  return ACL_SUCCESS;
}

aclError aclrtQueryEventStatus(aclrtEvent event, aclrtEventRecordedStatus* status) {
  if (aclError e = check_event(event, "aclrtQueryEventStatus")) return e;
  if (!status) return fail(ACL_ERROR_INVALID_PARAM, "aclrtQueryEventStatus: status is null");
  ACL_RUNTIME_OR_RETURN(rt);
  *status = rt->event_query(as_event(event)) ? ACL_EVENT_RECORDED_STATUS_COMPLETE : ACL_EVENT_RECORDED_STATUS_NOT_READY;
  return ACL_SUCCESS;
}

aclError aclrtEventElapsedTime(float* ms, aclrtEvent startEvent, aclrtEvent endEvent) {
  if (!ms) return fail(ACL_ERROR_INVALID_PARAM, "aclrtEventElapsedTime: ms is null");
  if (aclError e = check_event(startEvent, "aclrtEventElapsedTime")) return e;
  if (aclError e = check_event(endEvent, "aclrtEventElapsedTime")) return e;
  ACL_RUNTIME_OR_RETURN(rt);
  double out = 0;
  npudist_status s = rt->event_elapsed_ms(as_event(startEvent), as_event(endEvent), &out);
  if (s != NPUDIST_SUCCESS) return from_status(rt, s, "aclrtEventElapsedTime");
  *ms = static_cast<float>(out);
  return ACL_SUCCESS;
}

}  // extern "C"
