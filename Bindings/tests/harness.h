/* A tiny test harness: a file per area registers its tests; main runs them all and
 * prints "N passed, M failed". */
#ifndef SF_TEST_HARNESS_H
#define SF_TEST_HARNESS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "sessionflow.h"

typedef void (*sf_test_fn)(void);

typedef struct sf_test_case {
    const char *name;
    sf_test_fn fn;
} sf_test_case;

extern int sf_test_failures; /* failures in the running test */

#define CHECK(cond)                                                                   \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "    %s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            sf_test_failures++;                                                       \
        }                                                                             \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                            \
    do {                                                                              \
        long long sf_a_ = (long long)(a), sf_b_ = (long long)(b);                     \
        if (sf_a_ != sf_b_) {                                                         \
            fprintf(stderr, "    %s:%d: CHECK failed: %s == %s (%lld vs %lld)\n", __FILE__, \
                    __LINE__, #a, #b, sf_a_, sf_b_);                                  \
            sf_test_failures++;                                                       \
        }                                                                             \
    } while (0)

#define CHECK_CODE(call, expected)                                                    \
    do {                                                                              \
        int sf_rc_ = (call);                                                          \
        if (sf_rc_ != (expected)) {                                                   \
            fprintf(stderr, "    %s:%d: %s returned %s, expected %s\n", __FILE__, __LINE__, \
                    #call, sf_err_name(sf_rc_), sf_err_name(expected));               \
            sf_test_failures++;                                                       \
        }                                                                             \
    } while (0)

/* Sleeps for `ms` milliseconds. */
void sf_test_sleep_ms(long ms);

/* Waits (polling every millisecond, up to 10 s) until `cond` holds; CHECK it after. */
#define WAIT_FOR(cond) \
    for (int sf_wait_ = 0; sf_wait_ < 10000 && !(cond); sf_wait_++) sf_test_sleep_ms(1)

/* A recording observer: counts every callback and remembers states, thread-safely. */
typedef struct recorder {
    atomic_int states[64];
    atomic_int state_count;
    atomic_int errors;
    atomic_int completes;
    atomic_int releases;
    atomic_int callbacks_after_close;
    atomic_int closed;          /* set by the test after close returned */
    atomic_int wrong_thread;    /* a callback ran off the loop thread */
    atomic_int last_state;
    pthread_t first_thread;     /* the thread of the first callback */
    atomic_int first_thread_known;
} recorder;

void recorder_init(recorder *r);
void recorder_note_main_thread(void);
sf_observer recorder_observer(recorder *r);

/* Session tokens with fixed test values. */
sf_tokens test_tokens(const char *access, const char *refresh, int64_t expires_in, const char *member);

#endif
