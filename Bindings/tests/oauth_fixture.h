/* The test OAuth 2.0 server (Tests/Fixtures/oauth_server.py: Authlib on loopback) for the
 * sign-in tests, and a minimal HTTP/1.0 client to play the user's side against it. */
#ifndef SF_TEST_OAUTH_FIXTURE_H
#define SF_TEST_OAUTH_FIXTURE_H

#include <stddef.h>

/* The server's base URL ("http://127.0.0.1:<port>", also its issuer), started once per
 * process (it exits with the process: it stops when its stdin closes). NULL if it could
 * not be started (the reason is printed). */
const char *oauth_server(void);

/* One HTTP/1.0 request to an http://127.0.0.1:<port>/... URL. `form` (may be NULL) is sent
 * as an application/x-www-form-urlencoded POST body, else it is a GET. Returns the status
 * (or -1), the body copied into `body` (NUL-terminated, cut to `length`; may be NULL) and,
 * when `location` is not NULL, the Location header (or ""). */
int http_request(const char *url, const char *form, char *body, size_t length, char *location, size_t location_length);

/* The same with one more header line `header` ("Name: value", no CRLF; may be NULL), and the
 * value of the response header `wanted` (e.g. "WWW-Authenticate") copied into `value` ("" if
 * absent; may be NULL). */
int http_exchange(const char *url, const char *form, const char *header, char *body, size_t length,
                  const char *wanted, char *value, size_t value_length);

/* POST `form` to the server's `path`; returns the status. */
int oauth_post(const char *path, const char *form);

/* The integer member `name` of the JSON object the server answers at `path`, or -1. */
long oauth_stat(const char *path, const char *name);

/* Percent-encodes `text` for a form value. */
void form_encode(const char *text, char *out, size_t length);

/* Plays the user's browser: GETs `authorization_url` (the server's consent form), submits it
 * with consent=allow or deny as alice, and follows the 302 to the redirect URI (the library's
 * loopback listener). Returns that last request's status (-1 if a step failed) and its body
 * in `page` (may be NULL). */
int play_browser(const char *authorization_url, const char *consent, char *page, size_t page_length);

#endif
