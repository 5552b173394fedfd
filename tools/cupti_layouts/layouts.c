/*
 * layouts.c — prints the CUPTI record layout facts (offsetof/sizeof/enum values) of one header
 * set as rows of tools/cupti_layouts/layouts.golden. Compiled by gen.sh once per CUPTI wheel.
 *
 * Why compiled and not read by eye: the records are PACKED_ALIGNMENT structs with LP64-dependent
 * padding and unions; only the compiler's offsetof is the truth.
 *
 * gen.sh generates "gen_fields.h" per header set: it names the newest struct of each record kind
 * (e.g. CUpti_ActivityKernel10) and lists the fields that exist in it (FIELDS(X)) and the ones that
 * do not (MISSING(X)), so this file never names a versioned struct itself.
 */
#include <stddef.h>
#include <stdio.h>
#include <cupti.h>

#include "gen_fields.h"

#define FSIZE(T, f) sizeof(((T *)0)->f)

static void row(const char *generic, const char *field, unsigned long long off,
                unsigned long long size) {
  printf("%d\t%s\t%s\t%llu\t%llu\n", (int)CUPTI_API_VERSION, generic, field, off, size);
}

static void enum_row(const char *name, long long value) {
  printf("%d\tenum\t%s\t%lld\t0\n", (int)CUPTI_API_VERSION, name, value);
}

int main(void) {
  /* Comment lines first: which C struct each generic name is in this header set. */
#define STRUCT_COMMENT(generic, T) \
  printf("# api %d: %s = %s\n", (int)CUPTI_API_VERSION, #generic, #T);
  STRUCTS(STRUCT_COMMENT)
#define MISSING_COMMENT(generic, T, f) \
  printf("# api %d: %s (%s) has no field %s\n", (int)CUPTI_API_VERSION, #generic, #T, #f);
  MISSING(MISSING_COMMENT)

  enum_row("CUPTI_API_VERSION", (long long)CUPTI_API_VERSION);

#define SIZE_ROW(generic, T) row(#generic, "(sizeof)", 0, sizeof(T));
  STRUCTS(SIZE_ROW)
#define FIELD_ROW(generic, T, f) row(#generic, #f, offsetof(T, f), FSIZE(T, f));
  FIELDS(FIELD_ROW)

#define E(c) enum_row(#c, (long long)(c));
  E(CUPTI_ACTIVITY_KIND_MEMCPY)
  E(CUPTI_ACTIVITY_KIND_MEMSET)
  E(CUPTI_ACTIVITY_KIND_KERNEL)
  E(CUPTI_ACTIVITY_KIND_DRIVER)
  E(CUPTI_ACTIVITY_KIND_RUNTIME)
  E(CUPTI_ACTIVITY_KIND_DEVICE)
  E(CUPTI_ACTIVITY_KIND_CONTEXT)
  E(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)
  E(CUPTI_ACTIVITY_KIND_MARKER)
  E(CUPTI_ACTIVITY_KIND_OVERHEAD)
  E(CUPTI_ACTIVITY_KIND_SYNCHRONIZATION)
  E(CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION)
  E(CUPTI_SUCCESS)
  E(CUPTI_ERROR_INVALID_PARAMETER)
  E(CUPTI_ERROR_MAX_LIMIT_REACHED)
  E(CUPTI_ERROR_INVALID_KIND)
  E(CUPTI_ERROR_NOT_INITIALIZED)
  E(CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED)
  E(CUPTI_ERROR_UNKNOWN)
  E(CUPTI_ACTIVITY_FLAG_MARKER_INSTANTANEOUS) /* the brief called it MARKER_INSTANT */
  E(CUPTI_ACTIVITY_FLAG_MARKER_START)
  E(CUPTI_ACTIVITY_FLAG_MARKER_END)
  E(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED)
  E(CUPTI_CB_DOMAIN_DRIVER_API)
  E(CUPTI_CB_DOMAIN_RUNTIME_API)
  E(CUPTI_ACTIVITY_OBJECT_PROCESS)
  E(CUPTI_ACTIVITY_OBJECT_THREAD)
  E(CUPTI_ACTIVITY_OBJECT_DEVICE)
  E(CUPTI_ACTIVITY_OBJECT_CONTEXT)
  E(CUPTI_ACTIVITY_OBJECT_STREAM)
  E(CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM)
  E(CUPTI_ACTIVITY_MEMCPY_KIND_HTOD)
  E(CUPTI_ACTIVITY_MEMCPY_KIND_DTOH)
  E(CUPTI_ACTIVITY_MEMCPY_KIND_DTOD)
  E(CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_EVENT_SYNCHRONIZE)
  E(CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT)
  E(CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE)
  E(CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_CONTEXT_SYNCHRONIZE)
  E(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0)
  E(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM1)
  return 0;
}
