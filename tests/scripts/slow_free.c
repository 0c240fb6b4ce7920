/* Timing amplifier for tests/test_engine_errors.py, loaded with LD_PRELOAD.

   On the stores' own threads (the funneled negotiator "mxmpi-funneled" and
   the concurrent lanes "mxmpi-lane*"), free() of a small block sleeps for
   $SLOW_FREE_NS first. Nothing else changes: a container that such a thread
   reallocates keeps its old buffer in use for longer, so a data race between
   that thread and MXNet's engine workers shows as a crash in a few tries
   instead of once in many suite runs. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

static void (*next_free)(void*);
static __thread int kind;          /* 0: not looked at yet, 1: a store thread, 2: other */
static __thread unsigned since_look;

void free(void* p) {
  if (!next_free) next_free = (void (*)(void*))dlsym(RTLD_NEXT, "free");
  if (p) {
    if (kind == 2 && (++since_look & 255) == 0) kind = 0;  /* threads are renamed */
    if (kind == 0) {
      char name[17] = {0};
      prctl(PR_GET_NAME, name, 0, 0, 0);
      if (strncmp(name, "mxmpi-funneled", 14) == 0 || strncmp(name, "mxmpi-lane", 10) == 0)
        kind = 1;
      else if (name[0])
        kind = 2;
    }
    if (kind == 1) {
      size_t n = malloc_usable_size(p);
      if (n >= 16 && n <= 120) {
        const char* ns = getenv("SLOW_FREE_NS");
        struct timespec nap = {0, ns ? atol(ns) : 200000};
        nanosleep(&nap, 0);
      }
    }
  }
  next_free(p);
}
