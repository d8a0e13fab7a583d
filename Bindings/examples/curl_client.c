/* curl_client: a libcurl (easy interface) host whose requests the session authorizes.
 *
 * Per request: sf_session_authorize gives the header fields to add (a curl_slist is built
 * from them); the request is sent; on HTTP 401 the refused Authorization value and the
 * server's WWW-Authenticate go to sf_session_unauthorized, whose answer the request is sent
 * with once more — once: a second refusal is the answer. Every return code is checked.
 * Built with -Werror and run by the C suite (Bindings/tests/test_authorize.c) against the test
 * server; Bindings/README.md shows it.
 *
 *   SF_ACCESS_TOKEN=... SF_REFRESH_TOKEN=... \
 *   curl_client RESOURCE_URL TOKEN_ENDPOINT CLIENT_ID [REQUESTS]
 *
 * Signs in with those tokens (the environment, not the command line: ps shows that; a real
 * app signs in with sf_session_sign_in_device / _browser or keeps a stored session), sends
 * REQUESTS (1 to 64, default 1) GETs of RESOURCE_URL at once, a thread each, prints a line
 * per request, then one summary line:
 *   requests=N ok=N retried=N failed=N error=<first session error or none> state=<state>
 * Exit status: 0 every request got a 2xx, 1 some did not, 2 bad usage or setup.
 */
#define _DEFAULT_SOURCE
#include <curl/curl.h>
#include <pthread.h>
#include <sessionflow.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define MAX_REQUESTS 64
#define OUT_OF_MEMORY 1 /* our own result, beside the library's SF_E* codes */

/* ---- The session's answer, carried from the loop thread to the request's thread ---------- */

typedef struct authorized {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int done;
    int result;                  /* SF_OK, an SF_E* code, or OUT_OF_MEMORY */
    struct curl_slist *headers;  /* "Name: value" lines: copies of secrets (wiped when freed) */
    char *authorization;         /* the Authorization value sent, to hand back on a refusal (wiped) */
} authorized;

/* Zeroes what the copies hold, then frees them. */
static void wipe(char *text) {
    if (text) explicit_bzero(text, strlen(text));
}

static void authorized_free(authorized *a) {
    for (struct curl_slist *line = a->headers; line; line = line->next) wipe(line->data);
    curl_slist_free_all(a->headers);
    wipe(a->authorization);
    free(a->authorization);
    a->headers = NULL;
    a->authorization = NULL;
    pthread_mutex_destroy(&a->lock);
    pthread_cond_destroy(&a->cond);
}

/* Appends "name: value" to *list (curl_slist_append copies the line; ours is wiped). */
static int append_header(struct curl_slist **list, const sf_header *header) {
    size_t size = strlen(header->name) + 2 + strlen(header->value) + 1;
    char *line = malloc(size);
    if (!line) return 0;
    snprintf(line, size, "%s: %s", header->name, header->value);
    struct curl_slist *longer = curl_slist_append(*list, line);
    explicit_bzero(line, size);
    free(line);
    if (!longer) return 0;
    *list = longer;
    return 1;
}

/* On the loop thread. The authorization is borrowed for this call only: copy what curl needs. */
static void on_authorized(int result, const sf_authorization *authorization, void *userdata) {
    authorized *a = userdata;
    struct curl_slist *list = NULL;
    char *value = NULL;
    if (result == SF_OK) {
        for (size_t i = 0; i < authorization->header_count && result == SF_OK; i++) {
            const sf_header *header = &authorization->headers[i];
            if (!append_header(&list, header)) result = OUT_OF_MEMORY;
            if (result == SF_OK && strcasecmp(header->name, "Authorization") == 0 && !value) {
                value = strdup(header->value);
                if (!value) result = OUT_OF_MEMORY;
            }
        }
        if (result == SF_OK && !value) result = OUT_OF_MEMORY; /* never: there is always one */
    }
    pthread_mutex_lock(&a->lock);
    a->result = result;
    if (result == SF_OK) {
        a->headers = list;
        a->authorization = value;
    } else {
        for (struct curl_slist *line = list; line; line = line->next) wipe(line->data);
        curl_slist_free_all(list);
        wipe(value);
        free(value);
    }
    a->done = 1;
    pthread_cond_signal(&a->cond);
    pthread_mutex_unlock(&a->lock);
}

/* Asks the session for an authorization (refused == NULL) or for the one to retry with after
 * a refusal, and waits for the answer. Returns its result. */
static int authorize(sf_runtime *rt, const char *url, const char *refused, int status, const char *challenge,
                     authorized *a) {
    memset(a, 0, sizeof *a);
    pthread_mutex_init(&a->lock, NULL);
    pthread_cond_init(&a->cond, NULL);
    int rc = refused ? sf_session_unauthorized(rt, "GET", url, refused, status, challenge, on_authorized, a)
                     : sf_session_authorize(rt, "GET", url, on_authorized, a);
    if (rc != SF_OK) return rc; /* a call that fails never calls back */
    pthread_mutex_lock(&a->lock);
    while (!a->done) pthread_cond_wait(&a->cond, &a->lock);
    rc = a->result;
    pthread_mutex_unlock(&a->lock);
    return rc;
}

/* ---- One request with libcurl ------------------------------------------------------------- */

typedef struct response {
    long status;
    char challenge[8192]; /* WWW-Authenticate (the library reads up to 8 KiB of it) */
} response;

static size_t on_header(char *buffer, size_t size, size_t count, void *userdata) {
    response *r = userdata;
    size_t length = size * count;
    static const char name[] = "WWW-Authenticate:";
    if (length > sizeof name - 1 && strncasecmp(buffer, name, sizeof name - 1) == 0 && !r->challenge[0]) {
        const char *value = buffer + sizeof name - 1;
        size_t n = length - (sizeof name - 1);
        while (n > 0 && (*value == ' ' || *value == '\t')) value++, n--;
        while (n > 0 && (value[n - 1] == '\r' || value[n - 1] == '\n' || value[n - 1] == ' ')) n--;
        if (n >= sizeof r->challenge) n = sizeof r->challenge - 1;
        memcpy(r->challenge, value, n);
        r->challenge[n] = 0;
    }
    return length;
}

static size_t discard_body(char *buffer, size_t size, size_t count, void *userdata) {
    (void)buffer, (void)userdata;
    return size * count;
}

/* Sends GET `url` with `headers`; the status and WWW-Authenticate in *r. */
static CURLcode send_request(CURL *curl, const char *url, struct curl_slist *headers, response *r) {
    r->status = 0;
    r->challenge[0] = 0;
    CURLcode rc;
    if ((rc = curl_easy_setopt(curl, CURLOPT_URL, url)) != CURLE_OK ||
        (rc = curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers)) != CURLE_OK ||
        (rc = curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, on_header)) != CURLE_OK ||
        (rc = curl_easy_setopt(curl, CURLOPT_HEADERDATA, r)) != CURLE_OK ||
        (rc = curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, discard_body)) != CURLE_OK ||
        /* A token never follows a redirect to wherever it points. */
        (rc = curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 0L)) != CURLE_OK ||
        (rc = curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L)) != CURLE_OK ||
        (rc = curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, 20000L)) != CURLE_OK) {
        return rc;
    }
    rc = curl_easy_perform(curl);
    /* The list is freed after this request: curl must not keep pointing at it. */
    CURLcode unset = curl_easy_setopt(curl, CURLOPT_HTTPHEADER, (struct curl_slist *)NULL);
    if (rc != CURLE_OK) return rc;
    if (unset != CURLE_OK) return unset;
    return curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &r->status);
}

typedef struct job {
    sf_runtime *rt;
    const char *url;
    int index;
    long status;         /* the last answer's HTTP status (0: none) */
    int sends;           /* 1, or 2 after a refusal */
    int session_error;   /* the session's answer when it gave no authorization (SF_OK: none) */
    CURLcode curl_error; /* CURLE_OK, or what failed */
} job;

/* authorize, send; on 401 (or 403) unauthorized, then send once more. */
/* README begin (Bindings/README.md shows this function; test_readme.py compares them) */
static void *run_request(void *argument) {
    job *j = argument;
    CURL *curl = curl_easy_init();
    if (!curl) {
        j->curl_error = CURLE_FAILED_INIT;
        return NULL;
    }
    response *r = calloc(1, sizeof *r);
    authorized first, retry;
    int rc = r ? authorize(j->rt, j->url, NULL, 0, NULL, &first) : OUT_OF_MEMORY;
    if (rc != SF_OK) {
        j->session_error = rc;
        if (r) authorized_free(&first);
        free(r);
        curl_easy_cleanup(curl);
        return NULL;
    }
    j->curl_error = send_request(curl, j->url, first.headers, r);
    j->sends = 1;
    if (j->curl_error == CURLE_OK && (r->status == 401 || r->status == 403)) {
        /* The session decides: a refresh (compare-and-refresh), the current token, or an error
         * (SF_EAUTH: the session is dead; SF_EUNAUTHORIZED: a 403 no token cures). */
        rc = authorize(j->rt, j->url, first.authorization, (int)r->status, r->challenge[0] ? r->challenge : NULL,
                       &retry);
        if (rc == SF_OK) {
            j->curl_error = send_request(curl, j->url, retry.headers, r);
            j->sends = 2;
        } else {
            j->session_error = rc;
        }
        authorized_free(&retry);
    }
    j->status = r->status;
    authorized_free(&first);
    free(r);
    curl_easy_cleanup(curl);
    return NULL;
}
/* README end */

/* ---- The host -------------------------------------------------------------------------------- */

static int check(int rc, const char *call) {
    if (rc != SF_OK) fprintf(stderr, "curl_client: %s: %s (%s): %s\n", call, sf_err_name(rc), sf_strerror(rc),
                             sf_last_error_message());
    return rc == SF_OK;
}

static const char *state_name(sf_session_state state) {
    switch (state) {
    case SF_LOGGED_OUT: return "SF_LOGGED_OUT";
    case SF_LOGGED_IN: return "SF_LOGGED_IN";
    case SF_SESSION_EXPIRED: return "SF_SESSION_EXPIRED";
    }
    return "unknown";
}

int main(int argc, char **argv) {
    char *access = getenv("SF_ACCESS_TOKEN"), *refresh = getenv("SF_REFRESH_TOKEN");
    int count = argc == 5 ? atoi(argv[4]) : 1;
    if ((argc != 4 && argc != 5) || !access || !refresh || count < 1 || count > MAX_REQUESTS) {
        fprintf(stderr, "usage: SF_ACCESS_TOKEN=... SF_REFRESH_TOKEN=... %s RESOURCE_URL TOKEN_ENDPOINT CLIENT_ID "
                        "[REQUESTS (1-%d)]\n", argv[0], MAX_REQUESTS);
        return 2;
    }
    const char *url = argv[1];
    CURLcode global = curl_global_init(CURL_GLOBAL_DEFAULT); /* before any thread */
    if (global != CURLE_OK) {
        fprintf(stderr, "curl_client: curl_global_init: %s\n", curl_easy_strerror(global));
        return 2;
    }
    sf_options options;
    sf_options_init(&options);
    options.token_endpoint = argv[2];
    options.client_id = argv[3];
    sf_runtime *rt = NULL;
    if (!check(sf_runtime_create(&options, &rt), "sf_runtime_create")) {
        curl_global_cleanup();
        return 2;
    }
    sf_tokens tokens = {.size = sizeof tokens, .access_token = access, .refresh_token = refresh, .expires_in = 3600};
    int signed_in = check(sf_session_sign_in(rt, &tokens), "sf_session_sign_in");
    /* The library copied them: our copies go. */
    explicit_bzero(access, strlen(access));
    explicit_bzero(refresh, strlen(refresh));
    if (!signed_in) {
        check(sf_runtime_destroy(rt), "sf_runtime_destroy");
        curl_global_cleanup();
        return 2;
    }

    job jobs[MAX_REQUESTS];
    pthread_t threads[MAX_REQUESTS];
    int started = 0;
    for (int i = 0; i < count; i++) {
        jobs[i] = (job){.rt = rt, .url = url, .index = i};
        if (pthread_create(&threads[i], NULL, run_request, &jobs[i]) != 0) {
            fprintf(stderr, "curl_client: pthread_create failed\n");
            break;
        }
        started++;
    }
    int ok = 0, retried = 0, failed = 0, first_error = SF_OK;
    for (int i = 0; i < started; i++) {
        pthread_join(threads[i], NULL);
        job *j = &jobs[i];
        retried += j->sends == 2;
        if (j->session_error != SF_OK) {
            failed++;
            if (first_error == SF_OK) first_error = j->session_error;
            printf("request %d: %s (%s)\n", i, j->session_error == OUT_OF_MEMORY ? "out of memory"
                                                   : sf_err_name(j->session_error),
                   j->session_error == OUT_OF_MEMORY ? "" : sf_strerror(j->session_error));
        } else if (j->curl_error != CURLE_OK) {
            failed++;
            printf("request %d: curl: %s\n", i, curl_easy_strerror(j->curl_error));
        } else {
            int success = j->status >= 200 && j->status < 300;
            ok += success;
            failed += !success;
            printf("request %d: HTTP %ld after %d send(s)\n", i, j->status, j->sends);
        }
    }
    failed += count - started;
    sf_session_state state = SF_LOGGED_OUT;
    int state_known = check(sf_session_state_get(rt, &state), "sf_session_state_get");
    printf("requests=%d ok=%d retried=%d failed=%d error=%s state=%s\n", count, ok, retried, failed,
           first_error == SF_OK ? "none" : first_error == OUT_OF_MEMORY ? "out-of-memory" : sf_err_name(first_error),
           state_known ? state_name(state) : "unknown");
    int destroyed = check(sf_runtime_destroy(rt), "sf_runtime_destroy");
    curl_global_cleanup();
    return !destroyed ? 2 : failed == 0 ? 0 : 1;
}
