/* What each callback of a measured fan-out does, the floor's (baseline.c) and
 * libsessionflow's from C (sessionflow_fanout.c) alike: one body, one per-subscriber slot as
 * its userdata. Subscriber 0 notes the time; the last computes the time per callback, then
 * publishes the value and counts the delivery for the measuring thread. */
#ifndef SESSIONFLOW_FANOUT_VISIT_H
#define SESSIONFLOW_FANOUT_VISIT_H
#include <stdatomic.h>
#include <stdint.h>

#include "cbaseline.h"

/* What the callbacks read and write during a walk (`subscribers`, `first_ns`) is kept off the
 * cache line the measuring thread spins on (`deliveries`, `published`): on a shared line each
 * spin read takes the line back from the loop thread, and the last subscriber's read before
 * its clock paid a cross-core miss (~80-130 ns here) the walk does not cost. Allocate it with
 * aligned_alloc, never on a stack (see sessionflow_fanout.c). */
typedef struct fanout_shared {
    _Alignas(64) int subscribers;
    uint64_t first_ns;
    _Alignas(64) _Atomic double fanout_ns;
    _Atomic int64_t published;  /* the value the last subscriber saw */
    _Atomic int64_t deliveries; /* walks the last subscriber finished */
} fanout_shared;

/* A subscriber's own state (its userdata): what a C observer keeps, whatever it observes. */
typedef struct fanout_slot {
    fanout_shared *shared;
    int index;
} fanout_slot;

static inline void fanout_visit(fanout_slot *slot, int64_t value) {
    fanout_shared *shared = slot->shared;
    if (slot->index == 0) shared->first_ns = bl_now_ns();
    if (slot->index == shared->subscribers - 1) {
        if (shared->subscribers > 1) {
            atomic_store(&shared->fanout_ns, (double)(bl_now_ns() - shared->first_ns) / (shared->subscribers - 1));
        }
        atomic_store_explicit(&shared->published, value, memory_order_release);
        atomic_fetch_add_explicit(&shared->deliveries, 1, memory_order_release);
    }
}
#endif
