/* The project's version for Swift code: SF_VERSION_MAJOR.MINOR.PATCH of
 * Bindings/include/sessionflow.h (the one place it is written), as text. Only this function is
 * visible to the modules that import it; the C API's header stays out of their sight. */
#ifndef SESSIONFLOW_VERSION_H
#define SESSIONFLOW_VERSION_H

/* "MAJOR.MINOR.PATCH": a static string. */
const char *sessionflow_version_text(void);

#endif
