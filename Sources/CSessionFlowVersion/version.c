/* sessionflow_version_text, made from the header's macros by the preprocessor: the Swift
 * modules' version (SessionCore's SessionFlowVersion.string) cannot differ from the header's. */
#include "sessionflow.h"
#include "sessionflow_version.h"

#define SF_TEXT_(x) #x
#define SF_TEXT(x) SF_TEXT_(x)

const char *sessionflow_version_text(void) {
    return SF_TEXT(SF_VERSION_MAJOR) "." SF_TEXT(SF_VERSION_MINOR) "." SF_TEXT(SF_VERSION_PATCH);
}
