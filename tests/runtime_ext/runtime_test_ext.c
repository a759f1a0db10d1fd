/* Test-only extension: drives the device runtime through its C ABI (npudist/runtime_c_api.h) exactly as a
 * separately built extension does (npudist.hccl._C): the table arrives as the PyCapsule from
 * npudist._C._runtime_api(). Plain C against Python.h only, so it builds in about a second. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "npudist/runtime_c_api.h"

static const NpudistRuntimeApi* table(PyObject* capsule) {
  const NpudistRuntimeApi* api = PyCapsule_GetPointer(capsule, NPUDIST_RUNTIME_API_CAPSULE);
  if (api && api->version != NPUDIST_RUNTIME_API_VERSION) {
    PyErr_Format(PyExc_RuntimeError, "runtime table version %u, this test extension expects %d", api->version,
                 NPUDIST_RUNTIME_API_VERSION);
    return NULL;
  }
  return api;
}

/* (status, last_error or None) */
static PyObject* status_tuple(const NpudistRuntimeApi* api, npudist_status s) {
  if (s == NPUDIST_SUCCESS) return Py_BuildValue("(iO)", s, Py_None);
  return Py_BuildValue("(is)", s, api->last_error());
}

/* A host function that sleeps, then fills `bytes` of device memory with a repeated pattern (copied
 * host-to-device through the table): stands in for asynchronous device work such as a collective. */
typedef struct {
  const NpudistRuntimeApi* api;
  void* dst;
  size_t bytes;
  char* pattern;
  size_t pattern_len;
  long delay_us;
} FillTask;

static void run_fill(void* arg) {
  FillTask* t = arg;
  struct timespec ts = {t->delay_us / 1000000, (t->delay_us % 1000000) * 1000};
  nanosleep(&ts, NULL);
  char* staging = malloc(t->bytes ? t->bytes : 1);
  if (staging) {
    for (size_t i = 0; i < t->bytes; ++i) staging[i] = t->pattern[i % t->pattern_len];
    t->api->memcpy(t->dst, staging, t->bytes, NPUDIST_MEMCPY_HOST_TO_DEVICE);
    free(staging);
  }
  free(t->pattern);
  free(t);
}

static PyObject* launch_host_fill(PyObject* self, PyObject* args) {
  PyObject* cap;
  unsigned long long dst, bytes;
  const char* pattern;
  Py_ssize_t pattern_len;
  long delay_us;
  int device;
  long long stream;
  if (!PyArg_ParseTuple(args, "OKKy#liL", &cap, &dst, &bytes, &pattern, &pattern_len, &delay_us, &device, &stream)) {
    return NULL;
  }
  const NpudistRuntimeApi* api = table(cap);
  if (!api) return NULL;
  if (pattern_len <= 0 || delay_us < 0) {
    PyErr_SetString(PyExc_ValueError, "launch_host_fill: need a non-empty pattern and delay_us >= 0");
    return NULL;
  }
  FillTask* t = malloc(sizeof(FillTask));
  char* pat = malloc((size_t)pattern_len);
  if (!t || !pat) {
    free(t);
    free(pat);
    return PyErr_NoMemory();
  }
  memcpy(pat, pattern, (size_t)pattern_len);
  *t = (FillTask){api, (void*)(uintptr_t)dst, (size_t)bytes, pat, (size_t)pattern_len, delay_us};
  npudist_status s = api->launch_host_func(device, stream, &run_fill, t);
  if (s != NPUDIST_SUCCESS) {
    free(pat);
    free(t);
  }
  return status_tuple(api, s);
}

/* A host function that holds its stream until the test opens it (or 60 s pass, so a failing test cannot
 * hang): everything queued behind it observably waits, independent of timing. */
typedef struct {
  volatile int open;
  volatile int done;
} Gate;

static void run_gate(void* arg) {
  Gate* g = arg;
  struct timespec ts = {0, 1000000};
  for (int i = 0; i < 60000 && !__atomic_load_n(&g->open, __ATOMIC_ACQUIRE); ++i) nanosleep(&ts, NULL);
  __atomic_store_n(&g->done, 1, __ATOMIC_RELEASE);
}

/* (status, gate handle) */
static PyObject* launch_host_gate(PyObject* self, PyObject* args) {
  PyObject* cap;
  int device;
  long long stream;
  if (!PyArg_ParseTuple(args, "OiL", &cap, &device, &stream)) return NULL;
  const NpudistRuntimeApi* api = table(cap);
  if (!api) return NULL;
  Gate* g = calloc(1, sizeof(Gate));
  if (!g) return PyErr_NoMemory();
  npudist_status s = api->launch_host_func(device, stream, &run_gate, g);
  if (s != NPUDIST_SUCCESS) {
    free(g);
    g = NULL;
  }
  return Py_BuildValue("(iK)", s, (unsigned long long)(uintptr_t)g);
}

/* Opens the gate and waits until its host function returned, then frees it. */
static PyObject* open_host_gate(PyObject* self, PyObject* arg) {
  Gate* g = (Gate*)(uintptr_t)PyLong_AsUnsignedLongLong(arg);
  if (PyErr_Occurred()) return NULL;
  __atomic_store_n(&g->open, 1, __ATOMIC_RELEASE);
  struct timespec ts = {0, 100000};
  Py_BEGIN_ALLOW_THREADS
  while (!__atomic_load_n(&g->done, __ATOMIC_ACQUIRE)) nanosleep(&ts, NULL);
  Py_END_ALLOW_THREADS
  free(g);
  Py_RETURN_NONE;
}

static PyObject* version(PyObject* self, PyObject* cap) {
  const NpudistRuntimeApi* api = table(cap);
  return api ? PyLong_FromUnsignedLong(api->version) : NULL;
}

static PyObject* rt_memcpy(PyObject* self, PyObject* args) {
  PyObject* cap;
  unsigned long long dst, src, bytes;
  int kind;
  if (!PyArg_ParseTuple(args, "OKKKi", &cap, &dst, &src, &bytes, &kind)) return NULL;
  const NpudistRuntimeApi* api = table(cap);
  if (!api) return NULL;
  return status_tuple(api, api->memcpy((void*)(uintptr_t)dst, (const void*)(uintptr_t)src, bytes,
                                       (NpudistMemcpyKind)kind));
}

static PyObject* rt_memset(PyObject* self, PyObject* args) {
  PyObject* cap;
  unsigned long long dst, bytes;
  int value;
  if (!PyArg_ParseTuple(args, "OKiK", &cap, &dst, &value, &bytes)) return NULL;
  const NpudistRuntimeApi* api = table(cap);
  if (!api) return NULL;
  return status_tuple(api, api->memset((void*)(uintptr_t)dst, value, bytes));
}

/* malloc, write a byte at each end through memset, read it back with memcpy D2H, free. */
static PyObject* malloc_roundtrip(PyObject* self, PyObject* args) {
  PyObject* cap;
  int device;
  unsigned long long bytes;
  if (!PyArg_ParseTuple(args, "OiK", &cap, &device, &bytes)) return NULL;
  const NpudistRuntimeApi* api = table(cap);
  if (!api) return NULL;
  void* p = NULL;
  npudist_status s = api->malloc(device, bytes, &p);
  if (s != NPUDIST_SUCCESS) return status_tuple(api, s);
  unsigned char ends[2] = {0, 0};
  api->memset(p, 0x5a, bytes);
  api->memcpy(&ends[0], p, 1, NPUDIST_MEMCPY_DEVICE_TO_HOST);
  api->memcpy(&ends[1], (char*)p + bytes - 1, 1, NPUDIST_MEMCPY_DEVICE_TO_HOST);
  NpudistSharedRef ref;
  int shareable = api->shared_memory_lookup(p, bytes, &ref);
  s = api->free(p, bytes);
  return Py_BuildValue("(iOii)", s, Py_None, ends[0] == 0x5a && ends[1] == 0x5a, shareable);
}

/* reserve address space, map the second of two pages, write/read it, unmap, release. */
static PyObject* reserve_map_roundtrip(PyObject* self, PyObject* args) {
  PyObject* cap;
  unsigned long long page;
  if (!PyArg_ParseTuple(args, "OK", &cap, &page)) return NULL;
  const NpudistRuntimeApi* api = table(cap);
  if (!api) return NULL;
  void* base = NULL;
  npudist_status s = api->reserve_address(2 * page, &base);
  if (s != NPUDIST_SUCCESS) return status_tuple(api, s);
  char* second = (char*)base + page;
  int ok = 0;
  if ((s = api->map_memory(second, page)) == NPUDIST_SUCCESS) {
    unsigned char v = 0;
    api->memset(second + page - 1, 7, 1);
    api->memcpy(&v, second + page - 1, 1, NPUDIST_MEMCPY_DEVICE_TO_HOST);
    ok = v == 7;
    s = api->unmap_memory(second, page);
  }
  npudist_status r = api->release_address(base, 2 * page);
  return Py_BuildValue("(iOi)", s != NPUDIST_SUCCESS ? s : r, Py_None, ok);
}

/* Parses (capsule, device). */
static const NpudistRuntimeApi* table_and_device(PyObject* args, int* device) {
  PyObject* cap;
  if (!PyArg_ParseTuple(args, "Oi", &cap, device)) return NULL;
  return table(cap);
}

static PyObject* device_properties(PyObject* self, PyObject* args) {
  int device;
  const NpudistRuntimeApi* api = table_and_device(args, &device);
  if (!api) return NULL;
  NpudistDeviceProperties p;
  npudist_status s = api->get_device_properties(device, &p);
  if (s != NPUDIST_SUCCESS) return status_tuple(api, s);
  return Py_BuildValue("(iO(sKi))", s, Py_None, p.name, (unsigned long long)p.total_memory, p.physical_index);
}

static PyObject* device_count(PyObject* self, PyObject* cap) {
  const NpudistRuntimeApi* api = table(cap);
  return api ? PyLong_FromLong(api->device_count()) : NULL;
}

static PyObject* stream_create(PyObject* self, PyObject* args) {
  PyObject* cap;
  int device, priority;
  if (!PyArg_ParseTuple(args, "Oii", &cap, &device, &priority)) return NULL;
  const NpudistRuntimeApi* api = table(cap);
  if (!api) return NULL;
  int64_t id = -1;
  npudist_status s = api->stream_create(device, priority, &id);
  if (s != NPUDIST_SUCCESS) return status_tuple(api, s);
  return Py_BuildValue("(iOLii)", s, Py_None, (long long)id, api->stream_priority(id),
                       api->stream_destroy(device, id));
}

/* Parses (capsule, device, stream). */
static const NpudistRuntimeApi* table_and_stream(PyObject* args, int* device, long long* stream) {
  PyObject* cap;
  if (!PyArg_ParseTuple(args, "OiL", &cap, device, stream)) return NULL;
  return table(cap);
}

static PyObject* stream_query(PyObject* self, PyObject* args) {
  int device;
  long long stream;
  const NpudistRuntimeApi* api = table_and_stream(args, &device, &stream);
  return api ? PyLong_FromLong(api->stream_query(device, stream)) : NULL;
}

static PyObject* device_busy_besides(PyObject* self, PyObject* args) {
  int device;
  long long stream;
  const NpudistRuntimeApi* api = table_and_stream(args, &device, &stream);
  return api ? PyLong_FromLong(api->device_busy_besides(device, stream)) : NULL;
}

/* device_drain(cap, device, stall_ms); the table's blocking hooks release the GIL while it waits. */
static PyObject* device_drain(PyObject* self, PyObject* args) {
  PyObject* cap;
  int device;
  unsigned int stall_ms;
  if (!PyArg_ParseTuple(args, "OiI", &cap, &device, &stall_ms)) return NULL;
  const NpudistRuntimeApi* api = table(cap);
  return api ? PyLong_FromLong(api->device_drain(device, stall_ms)) : NULL;
}

/* Record an event on (device, stream), report (query right after recording, query after synchronize,
 * elapsed ms from an event recorded before it). Releases the GIL while waiting. */
static PyObject* event_probe(PyObject* self, PyObject* args) {
  int device;
  long long stream;
  const NpudistRuntimeApi* api = table_and_stream(args, &device, &stream);
  if (!api) return NULL;
  NpudistEvent start = NULL, end = NULL;
  npudist_status s = api->event_create(&start);
  if (s == NPUDIST_SUCCESS) s = api->event_create(&end);
  if (s == NPUDIST_SUCCESS) s = api->event_record(start, device, 0);
  if (s == NPUDIST_SUCCESS) s = api->event_record(end, device, stream);
  if (s != NPUDIST_SUCCESS) {
    PyObject* r = status_tuple(api, s);
    api->event_destroy(start);
    api->event_destroy(end);
    return r;
  }
  int before = api->event_query(end);
  double early_ms = 0;
  npudist_status early = api->event_elapsed_ms(start, end, &early_ms);
  Py_BEGIN_ALLOW_THREADS
  s = api->event_synchronize(end);
  Py_END_ALLOW_THREADS
  int after = api->event_query(end);
  double ms = -1;
  if (s == NPUDIST_SUCCESS) s = api->event_elapsed_ms(start, end, &ms);
  api->event_destroy(start);
  api->event_destroy(end);
  return Py_BuildValue("(iOiiid)", s, Py_None, before, early, after, ms);
}

static PyObject* set_device_status(PyObject* self, PyObject* args) {
  int device;
  const NpudistRuntimeApi* api = table_and_device(args, &device);
  if (!api) return NULL;
  int before = api->get_device();
  npudist_status s = api->set_device(device);
  PyObject* r = status_tuple(api, s);
  if (s == NPUDIST_SUCCESS) api->set_device(before);
  return r;
}

static PyMethodDef kMethods[] = {
    {"launch_host_fill", launch_host_fill, METH_VARARGS, NULL},
    {"launch_host_gate", launch_host_gate, METH_VARARGS, NULL},
    {"open_host_gate", open_host_gate, METH_O, NULL},
    {"version", version, METH_O, NULL},
    {"memcpy", rt_memcpy, METH_VARARGS, NULL},
    {"memset", rt_memset, METH_VARARGS, NULL},
    {"malloc_roundtrip", malloc_roundtrip, METH_VARARGS, NULL},
    {"reserve_map_roundtrip", reserve_map_roundtrip, METH_VARARGS, NULL},
    {"device_properties", device_properties, METH_VARARGS, NULL},
    {"device_count", device_count, METH_O, NULL},
    {"stream_create", stream_create, METH_VARARGS, NULL},
    {"stream_query", stream_query, METH_VARARGS, NULL},
    {"device_busy_besides", device_busy_besides, METH_VARARGS, NULL},
    {"device_drain", device_drain, METH_VARARGS, NULL},
    {"event_probe", event_probe, METH_VARARGS, NULL},
    {"set_device_status", set_device_status, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "_npudist_runtime_test", NULL, -1, kMethods};

PyMODINIT_FUNC PyInit__npudist_runtime_test(void) { return PyModule_Create(&kModule); }
