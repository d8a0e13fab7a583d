/* sf_strerror and sf_err_name, both expanded from the header's SF_ERRNO_MAP: the one
 * table of codes, names and texts (libuv's uv-common.c does the same with UV_ERRNO_MAP).
 * Linked into libsessionflow.so through SessionFlowC, which depends on this target. */
#include "sessionflow.h"

#define SF_STRERROR_CASE_(name, value, text) \
    case SF_##name:                          \
        return text;

const char *sf_strerror(int code) {
    switch (code) {
    case SF_OK:
        return "success";
        SF_ERRNO_MAP(SF_STRERROR_CASE_)
    default:
        return "unknown error";
    }
}

#define SF_ERR_NAME_CASE_(name, value, text) \
    case SF_##name:                          \
        return "SF_" #name;

const char *sf_err_name(int code) {
    switch (code) {
    case SF_OK:
        return "SF_OK";
        SF_ERRNO_MAP(SF_ERR_NAME_CASE_)
    default:
        return "SF_EUNKNOWN";
    }
}

/* sf_last_error_message: per thread, as errno. `pending` is what the running call said,
 * `last` the message of the thread's last failing call. */
#include "sessionflow_detail.h"
#include <stdio.h>
#include <string.h>

static _Thread_local char pending[448];
static _Thread_local int has_pending;
static _Thread_local char last[512];
static _Thread_local int has_last;

void sf_detail_clear(void) { has_pending = 0; }

void sf_detail_set(const char *detail) {
    if (detail == NULL) return;
    snprintf(pending, sizeof pending, "%s", detail);
    has_pending = 1;
}

int sf_detail_finish(const char *function, int code) {
    if (code >= 0) return code;
    snprintf(last, sizeof last, "%s: %s", function, has_pending ? pending : sf_strerror(code));
    has_last = 1;
    has_pending = 0;
    return code;
}

const char *sf_last_error_message(void) { return has_last ? last : NULL; }
