/* Real threads: four closers while the loop delivers. */
#include "harness.h"

#include <stdlib.h>

#define OBSERVERS 64
#define ROUNDS 20

typedef struct closer_job {
    sf_subscription *handles;
    recorder *recorders;
    int first, count;
    atomic_int *failures;
} closer_job;

static void *close_some(void *arg) {
    closer_job *job = arg;
    for (int i = job->first; i < job->first + job->count; i++) {
        if (i % 3 == 0) sf_test_sleep_ms(1);
        int rc = sf_subscription_close(job->handles[i]);
        if (rc != SF_OK) atomic_fetch_add(job->failures, 1);
        atomic_store(&job->recorders[i].closed, 1); /* from here on, no callback may run */
    }
    return NULL;
}

typedef struct toggler {
    sf_runtime *runtime;
    atomic_int stop;
} toggler;

static void *toggle_session(void *arg) {
    toggler *t = arg;
    sf_tokens tokens = test_tokens("access", "refresh", 3600, "m");
    while (!atomic_load(&t->stop)) {
        sf_session_sign_in(t->runtime, &tokens);
        sf_session_logout(t->runtime);
    }
    return NULL;
}

void test_threads_close_subscriptions_while_the_loop_delivers(void) {
    sf_runtime *runtime = NULL;
    CHECK_CODE(sf_runtime_create(NULL, &runtime), SF_OK);
    recorder *recorders = calloc(OBSERVERS, sizeof *recorders);
    sf_subscription handles[OBSERVERS];
    toggler t = {runtime, 0};
    pthread_t toggler_thread;
    pthread_create(&toggler_thread, NULL, toggle_session, &t);
    for (int round = 0; round < ROUNDS; round++) {
        for (int i = 0; i < OBSERVERS; i++) {
            recorder_init(&recorders[i]);
            sf_observer observer = recorder_observer(&recorders[i]);
            CHECK_CODE(sf_subscribe_session_state(runtime, &observer, &handles[i]), SF_OK);
        }
        pthread_t closers[4];
        closer_job jobs[4];
        atomic_int failures = 0;
        for (int c = 0; c < 4; c++) {
            jobs[c] = (closer_job){handles, recorders, c * (OBSERVERS / 4), OBSERVERS / 4, &failures};
            pthread_create(&closers[c], NULL, close_some, &jobs[c]);
        }
        for (int c = 0; c < 4; c++) pthread_join(closers[c], NULL);
        CHECK_EQ_INT(atomic_load(&failures), 0);
        for (int i = 0; i < OBSERVERS; i++) {
            WAIT_FOR(atomic_load(&recorders[i].releases) == 1);
            CHECK_EQ_INT(atomic_load(&recorders[i].releases), 1);
            CHECK_EQ_INT(atomic_load(&recorders[i].callbacks_after_close), 0);
            CHECK_EQ_INT(atomic_load(&recorders[i].wrong_thread), 0);
            CHECK_EQ_INT(atomic_load(&recorders[i].completes), 0);
        }
    }
    atomic_store(&t.stop, 1);
    pthread_join(toggler_thread, NULL);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
    sf_test_sleep_ms(10);
    for (int i = 0; i < OBSERVERS; i++) CHECK_EQ_INT(atomic_load(&recorders[i].releases), 1);
    free(recorders);
}
