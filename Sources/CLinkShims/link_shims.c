/* The oldest glibc the shipped library can run on (the manylinux tag of the Python wheel).
 *
 * Everything libsessionflow.so needs from glibc is as old as glibc 2.34 except one function:
 * hypotf, which the Swift runtime's Glibc overlay (libswiftGlibc.a) refers to, and which glibc
 * 2.35 gave a new symbol version (a new implementation; the old one stays, as
 * hypotf@GLIBC_2.2.5). Bindings/install.sh links the library with --wrap=hypotf, so that the
 * overlay's reference lands here, and this calls the old version: the library then needs
 * glibc 2.34, not 2.35. Other builds (debug, tests) do not wrap: this function goes unused.
 * x86_64 only: GLIBC_2.2.5 is that architecture's first symbol version. */
#include "sessionflow_link_shims.h"

#include <math.h> /* and with it __GLIBC__ */

#if defined(__x86_64__) && defined(__GLIBC__)
float sessionflow_hypotf_glibc_2_2_5(float x, float y);
__asm__(".symver sessionflow_hypotf_glibc_2_2_5, hypotf@GLIBC_2.2.5");

float __wrap_hypotf(float x, float y);
float __wrap_hypotf(float x, float y) { return sessionflow_hypotf_glibc_2_2_5(x, y); }
#endif
