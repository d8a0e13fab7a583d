/* Error codes, names, texts and the version. */
#include "harness.h"

void test_errors_every_code_has_a_name_and_a_text(void) {
    /* Every code of the header's list has its name and exactly its header text. */
#define SF_CHECK_CODE_(name, value, text)                         \
    CHECK_EQ_INT(SF_##name, value);                               \
    CHECK(strcmp(sf_err_name(SF_##name), "SF_" #name) == 0);      \
    CHECK(strcmp(sf_strerror(SF_##name), text) == 0);
    SF_ERRNO_MAP(SF_CHECK_CODE_)
#undef SF_CHECK_CODE_
    CHECK(strcmp(sf_err_name(SF_OK), "SF_OK") == 0);
}

void test_errors_unknown_codes_have_static_fallbacks(void) {
    CHECK(strcmp(sf_err_name(-9999), "SF_EUNKNOWN") == 0);
    CHECK(strcmp(sf_strerror(12345), "unknown error") == 0);
    /* Static: the same pointer every time. */
    CHECK(sf_strerror(SF_EINVAL) == sf_strerror(SF_EINVAL));
}

void test_version_macros_match_the_library(void) {
    CHECK_EQ_INT(sf_version(), SF_VERSION_HEX);
    char expected[32];
    snprintf(expected, sizeof expected, "%d.%d.%d", SF_VERSION_MAJOR, SF_VERSION_MINOR, SF_VERSION_PATCH);
    CHECK(strcmp(sf_version_string(), expected) == 0);
}
