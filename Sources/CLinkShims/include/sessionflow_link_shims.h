/* Nothing to call: this target only carries what the shipped library's link and load need
 * (link_shims.c, relocation_release.c). An empty header, so that SwiftPM builds it as a C
 * module. */
#ifndef SESSIONFLOW_LINK_SHIMS_H
#define SESSIONFLOW_LINK_SHIMS_H
#endif
