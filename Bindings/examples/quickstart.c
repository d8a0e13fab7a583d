/* The README's C quick start, built and run by the C suite: the README shows this file. */
#include <sessionflow.h>
#include <stdio.h>

static void on_state(sf_session_state state, void *userdata) { /* on the library's loop thread */
    (void)userdata;
    printf("session state %d\n", (int)state);
}

static int check(int rc, const char *call) {
    if (rc != SF_OK) fprintf(stderr, "%s: %s (%s)\n", call, sf_strerror(rc), sf_err_name(rc));
    return rc == SF_OK;
}

int main(void) {
    sf_options options;
    sf_options_init(&options);
    options.store_directory = NULL; /* or a directory: the session survives restarts, encrypted */
    /* options.issuer = "https://id.example.com"; options.client_id = "my-app"; refreshes by OAuth */
    sf_runtime *rt;
    if (!check(sf_runtime_create(&options, &rt), "sf_runtime_create")) return 1;
    sf_observer observer = {.size = sizeof observer, .on_state = on_state};
    sf_subscription sub;
    int ok = check(sf_subscribe_session_state(rt, &observer, &sub), "sf_subscribe_session_state");
    if (ok) {
        sf_tokens tokens = {.size = sizeof tokens, .access_token = "access", .refresh_token = "refresh",
                            .expires_in = 3600, .member_id = "member-42"};
        ok = check(sf_session_sign_in(rt, &tokens), "sf_session_sign_in") &&
             check(sf_session_logout(rt), "sf_session_logout");
        sf_subscription_close(sub); /* any thread, any number of times */
    }
    return check(sf_runtime_destroy(rt), "sf_runtime_destroy") && ok ? 0 : 1;
}
