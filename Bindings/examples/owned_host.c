/* A C host that lets libsessionflow own the loop.
 *
 * It plays the authority itself (a refresher that answers at once with new tokens),
 * signs in with a 2-second token, watches the state and the events while the library
 * refreshes on its own, then logs out and destroys the runtime.
 *
 *   cc owned_host.c $(pkg-config --cflags --libs sessionflow) -o owned_host
 */
#define _DEFAULT_SOURCE
#include <sessionflow.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static atomic_int refreshes;
static atomic_int refreshed_events;

static const char *state_name(sf_session_state state) {
    switch (state) {
    case SF_LOGGED_OUT: return "LOGGED_OUT";
    case SF_LOGGED_IN: return "LOGGED_IN";
    case SF_SESSION_EXPIRED: return "SESSION_EXPIRED";
    }
    return "?";
}

/* Runs on the library's loop thread. */
static void on_state(sf_session_state state, void *userdata) {
    (void)userdata;
    printf("state: %s\n", state_name(state));
    fflush(stdout);
}

static void on_event(const sf_event *event, void *userdata) {
    (void)userdata;
    switch (event->kind) {
    case SF_EVENT_SIGNED_IN: printf("event: signed in as %s\n", event->member_id ? event->member_id : "?"); break;
    case SF_EVENT_TOKEN_REFRESHED:
        atomic_fetch_add(&refreshed_events, 1);
        printf("event: token refreshed (%s), lives %lld ms\n", event->reason, (long long)event->expires_in_ms);
        break;
    case SF_EVENT_SIGNED_OUT: printf("event: signed out (%s)\n", event->reason); break;
    default: printf("event: kind %d\n", (int)event->kind); break;
    }
    fflush(stdout);
}

static void on_release(void *userdata) {
    printf("released: %s\n", (const char *)userdata);
}

/* The host's authority: answers every refresh at once (it could answer later, from any
 * thread). Token values never go to the output. */
static void refresh(sf_refresh_request *request, const char *refresh_token, void *userdata) {
    (void)refresh_token;
    (void)userdata;
    int n = atomic_fetch_add(&refreshes, 1) + 1;
    char access[32], rotated[32];
    snprintf(access, sizeof access, "access-%d", n);
    snprintf(rotated, sizeof rotated, "refresh-%d", n);
    sf_tokens tokens = {sizeof tokens, access, rotated, 2, NULL};
    sf_refresh_request_succeed(request, &tokens);
}

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int main(void) {
    printf("libsessionflow %s\n", sf_version_string());
    sf_options options;
    sf_options_init(&options);
    options.refresh = refresh;
    options.refresh_userdata = "refresher";  /* a real host would free its state in... */
    options.refresh_release = on_release;    /* ...this, called once after the last refresh */
    options.refresh_margin_ms = 1000;       /* a 2 s token is refreshed at its half-life */
    options.min_refresh_interval_ms = 500;  /* (the default, 10 s, suits real tokens) */

    sf_runtime *runtime = NULL;
    int rc = sf_runtime_create(&options, &runtime);
    if (rc != SF_OK) {
        fprintf(stderr, "sf_runtime_create: %s\n", sf_strerror(rc));
        return 1;
    }

    sf_observer observer = {.size = sizeof(sf_observer), .on_state = on_state, .release = on_release, .userdata = "state observer"};
    sf_event_observer events = {.size = sizeof(sf_event_observer), .on_event = on_event, .release = on_release, .userdata = "event observer"};
    sf_subscription state_subscription = 0, event_subscription = 0;
    sf_subscribe_session_state(runtime, &observer, &state_subscription);
    sf_subscribe_events(runtime, &events, &event_subscription);

    sf_tokens tokens = {sizeof tokens, "access-0", "refresh-0", 2, "member-42"};
    rc = sf_session_sign_in(runtime, &tokens);
    if (rc != SF_OK) {
        fprintf(stderr, "sign in: %s\n", sf_strerror(rc));
        return 1;
    }
    sleep_ms(3500); /* the library refreshes by itself meanwhile */

    rc = sf_session_logout(runtime);
    sleep_ms(100);
    sf_subscription_close(state_subscription);
    sf_subscription_close(event_subscription);
    size_t unclosed = 0;
    sf_runtime_destroy_report(runtime, &unclosed);
    printf("refreshes: %d, unclosed subscriptions: %zu\n", atomic_load(&refreshes), unclosed);
    return (rc == SF_OK && atomic_load(&refreshed_events) >= 2 && unclosed == 0) ? 0 : 1;
}
