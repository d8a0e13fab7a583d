/* A C host that runs its own libuv loop, with timers of its own beside the session.
 *
 * The runtime borrows the host's uv_loop_t: every session callback runs inside the
 * host's uv_run, on the host's thread, interleaved with the host's own timer. When the
 * host is done it destroys the runtime on that thread, closes its own handles, and
 * uv_run returns; uv_loop_close gives 0.
 *
 *   cc -std=gnu11 borrowed_host.c $(pkg-config --cflags --libs sessionflow libuv) -o borrowed_host
 */
#define _DEFAULT_SOURCE
#include <sessionflow.h>
#include <stdio.h>
#include <uv.h>

typedef struct app {
    uv_loop_t loop;
    uv_timer_t heartbeat; /* the host's own work */
    sf_runtime *runtime;
    sf_subscription subscription;
    int beats;
    int states_seen;
} app;

static void on_state(sf_session_state state, void *userdata) {
    app *a = userdata;
    a->states_seen++; /* no lock needed: the host's loop thread, like the heartbeat */
    printf("state %d (callback %d, inside the host's uv_run)\n", (int)state, a->states_seen);
}

static void on_heartbeat(uv_timer_t *timer) {
    app *a = timer->data;
    a->beats++;
    printf("host heartbeat %d\n", a->beats);
    if (a->beats == 2) {
        sf_tokens tokens = {sizeof tokens, "access-0", "refresh-0", 3600, "member-7"};
        int rc = sf_session_sign_in(a->runtime, &tokens); /* on the loop thread: allowed */
        printf("sign in: %s\n", sf_err_name(rc));
    } else if (a->beats == 4) {
        printf("logout: %s\n", sf_err_name(sf_session_logout(a->runtime)));
    } else if (a->beats == 6) {
        sf_subscription_close(a->subscription);
        printf("destroy: %s\n", sf_err_name(sf_runtime_destroy(a->runtime)));
        uv_close((uv_handle_t *)&a->heartbeat, NULL); /* the host closes what it owns */
    }
}

int main(void) {
    app a = {0};
    uv_loop_init(&a.loop);
    uv_timer_init(&a.loop, &a.heartbeat);
    a.heartbeat.data = &a;
    uv_timer_start(&a.heartbeat, on_heartbeat, 50, 50);

    int rc = sf_runtime_create_on_loop(&a.loop, NULL, &a.runtime);
    if (rc != SF_OK) {
        fprintf(stderr, "sf_runtime_create_on_loop: %s\n", sf_strerror(rc));
        return 1;
    }
    sf_observer observer = {.size = sizeof(sf_observer), .on_state = on_state, .userdata = &a};
    sf_subscribe_session_state(a.runtime, &observer, &a.subscription);

    uv_run(&a.loop, UV_RUN_DEFAULT); /* returns once the runtime and the heartbeat are gone */
    rc = uv_loop_close(&a.loop);
    printf("uv_run returned; uv_loop_close: %d; heartbeats: %d; states seen: %d\n", rc, a.beats, a.states_seen);
    return (rc == 0 && a.beats == 6 && a.states_seen == 3) ? 0 : 1;
}
