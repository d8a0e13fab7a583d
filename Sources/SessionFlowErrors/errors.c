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
