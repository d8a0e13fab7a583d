#define _DEFAULT_SOURCE
#include "oauth_fixture.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

extern char **environ;

static char base_url[64];
static int started;

const char *oauth_server(void) {
    if (started) return base_url[0] ? base_url : NULL;
    started = 1;
    const char *script = getenv("SF_TEST_OAUTH_SERVER");
    if (!script) script = "Tests/Fixtures/oauth_server.py";
    int to_child[2], from_child[2];
    if (pipe(to_child) != 0 || pipe(from_child) != 0) {
        perror("    oauth_server: pipe");
        return NULL;
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, to_child[0], 0);
    posix_spawn_file_actions_adddup2(&actions, from_child[1], 1);
    posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addclose(&actions, to_child[1]);
    posix_spawn_file_actions_addclose(&actions, from_child[0]);
    char *argv[] = {"python3", (char *)script, NULL};
    pid_t pid;
    int spawned = posix_spawnp(&pid, "python3", &actions, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&actions);
    close(to_child[0]);
    close(from_child[1]);
    if (spawned != 0) {
        fprintf(stderr, "    oauth_server: cannot start python3 %s\n", script);
        return NULL;
    }
    /* The write end of its stdin stays open (never closed): the server lives as long as we do. */
    char line[64] = {0};
    size_t used = 0;
    while (used < sizeof line - 1) {
        ssize_t n = read(from_child[0], line + used, 1);
        if (n <= 0 || line[used] == '\n') break;
        used++;
    }
    line[used] = 0;
    close(from_child[0]);
    int port = 0;
    if (sscanf(line, "PORT %d", &port) != 1 || port <= 0) {
        fprintf(stderr, "    oauth_server: %s did not start (python3 with authlib and flask needed): '%s'\n", script, line);
        return NULL;
    }
    snprintf(base_url, sizeof base_url, "http://127.0.0.1:%d", port);
    return base_url;
}

int http_request(const char *url, const char *form, char *body, size_t length, char *location, size_t location_length) {
    return http_exchange(url, form, NULL, body, length, "Location", location, location_length);
}

int http_exchange(const char *url, const char *form, const char *header, char *body, size_t length,
                  const char *wanted, char *value_out, size_t value_length) {
    char *location = value_out;
    size_t location_length = value_length;
    if (body && length) body[0] = 0;
    if (location && location_length) location[0] = 0;
    int port = 0;
    int offset = 0;
    if (sscanf(url, "http://127.0.0.1:%d%n", &port, &offset) != 1 || port <= 0) return -1;
    const char *path = url + offset;
    if (*path == 0) path = "/";
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in address;
    memset(&address, 0, sizeof address);
    address.sin_family = AF_INET;
    address.sin_port = htons((unsigned short)port);
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&address, sizeof address) != 0) {
        close(fd);
        return -1;
    }
    size_t form_length = form ? strlen(form) : 0;
    size_t header_length = header ? strlen(header) : 0;
    size_t request_size = strlen(path) + form_length + header_length + 256;
    char *request = malloc(request_size);
    int head = form
        ? snprintf(request, request_size,
                   "POST %s HTTP/1.0\r\nHost: 127.0.0.1:%d\r\n%s%sContent-Type: application/x-www-form-urlencoded\r\n"
                   "Content-Length: %zu\r\n\r\n%s",
                   path, port, header ? header : "", header ? "\r\n" : "", form_length, form)
        : snprintf(request, request_size, "GET %s HTTP/1.0\r\nHost: 127.0.0.1:%d\r\n%s%s\r\n", path, port,
                   header ? header : "", header ? "\r\n" : "");
    for (int sent = 0; sent < head;) {
        ssize_t n = write(fd, request + sent, (size_t)(head - sent));
        if (n <= 0) break;
        sent += (int)n;
    }
    /* The buffers held tokens (a form, a token answer): zeroed, so that the memory test
     * (test_memory.c) counts only the library's copies. */
    explicit_bzero(request, request_size);
    free(request);
    size_t capacity = 1 << 16, used = 0;
    char *answer = malloc(capacity + 1);
    for (;;) {
        if (used == capacity) {
            capacity *= 2;
            answer = realloc(answer, capacity + 1);
        }
        ssize_t n = read(fd, answer + used, capacity - used);
        if (n <= 0) break;
        used += (size_t)n;
    }
    close(fd);
    answer[used] = 0;
    int status = -1;
    if (sscanf(answer, "HTTP/%*s %d", &status) != 1) status = -1;
    char *end = strstr(answer, "\r\n\r\n");
    if (location && location_length) {
        for (char *line = strstr(answer, "\r\n"); line && (!end || line < end); line = strstr(line + 2, "\r\n")) {
            size_t wanted_length = strlen(wanted);
            if (strncasecmp(line + 2, wanted, wanted_length) == 0 && line[2 + wanted_length] == ':') {
                const char *value = line + 3 + wanted_length;
                while (*value == ' ') value++;
                size_t n = strcspn(value, "\r\n");
                if (n >= location_length) n = location_length - 1;
                memcpy(location, value, n);
                location[n] = 0;
                break;
            }
        }
    }
    if (body && length && end) {
        snprintf(body, length, "%s", end + 4);
    }
    explicit_bzero(answer, capacity + 1);
    free(answer);
    return status;
}

int oauth_post(const char *path, const char *form) {
    const char *base = oauth_server();
    if (!base) return -1;
    char url[512];
    snprintf(url, sizeof url, "%s%s", base, path);
    return http_request(url, form, NULL, 0, NULL, 0);
}

long oauth_stat(const char *path, const char *name) {
    const char *base = oauth_server();
    if (!base) return -1;
    char url[512], body[8192], key[128];
    snprintf(url, sizeof url, "%s%s", base, path);
    if (http_request(url, NULL, body, sizeof body, NULL, 0) != 200) return -1;
    snprintf(key, sizeof key, "\"%s\":", name);
    const char *found = strstr(body, key);
    if (!found) return -1;
    return strtol(found + strlen(key), NULL, 10);
}

void form_encode(const char *text, char *out, size_t length) {
    static const char hex[] = "0123456789ABCDEF";
    size_t used = 0;
    for (const unsigned char *c = (const unsigned char *)text; *c && used + 4 < length; c++) {
        if ((*c >= 'A' && *c <= 'Z') || (*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '-' ||
            *c == '_' || *c == '.' || *c == '~') {
            out[used++] = (char)*c;
        } else {
            out[used++] = '%';
            out[used++] = hex[*c >> 4];
            out[used++] = hex[*c & 15];
        }
    }
    out[used] = 0;
}

/* Copies the HTML attribute value starting at `value` (after the opening quote) into `out`,
 * undoing html.escape (&amp; &lt; &gt; &quot; &#x27; &#39;). */
static const char *html_value(const char *value, char *out, size_t length) {
    size_t used = 0;
    while (*value && *value != '"') {
        char c = *value++;
        if (c == '&') {
            static const struct { const char *entity; char c; } entities[] = {
                {"amp;", '&'}, {"lt;", '<'}, {"gt;", '>'}, {"quot;", '"'}, {"#x27;", '\''}, {"#39;", '\''}};
            for (size_t i = 0; i < sizeof entities / sizeof entities[0]; i++) {
                size_t n = strlen(entities[i].entity);
                if (strncmp(value, entities[i].entity, n) == 0) {
                    c = entities[i].c;
                    value += n;
                    break;
                }
            }
        }
        if (used + 1 < length) out[used++] = c;
    }
    out[used] = 0;
    return value;
}

int play_browser(const char *authorization_url, const char *consent, char *page, size_t page_length) {
    if (page && page_length) page[0] = 0;
    const char *base = oauth_server();
    if (!base) return -1;
    size_t size = 1 << 16;
    char *html = malloc(size);
    int status = http_request(authorization_url, NULL, html, size, NULL, 0);
    if (status != 200) {
        fprintf(stderr, "    play_browser: the authorization page answered %d: %.200s\n", status, html);
        free(html);
        return -1;
    }
    /* Every hidden input, then the user and the decision, as the form would post them. */
    char *form = malloc(size);
    size_t used = 0;
    form[0] = 0;
    char name[512], value[4096], encoded_name[1600], encoded_value[12300];
    for (const char *at = strstr(html, "<input type=\"hidden\" name=\""); at;
         at = strstr(at, "<input type=\"hidden\" name=\"")) {
        at = html_value(at + strlen("<input type=\"hidden\" name=\""), name, sizeof name);
        const char *v = strstr(at, "value=\"");
        if (!v) break;
        at = html_value(v + strlen("value=\""), value, sizeof value);
        form_encode(name, encoded_name, sizeof encoded_name);
        form_encode(value, encoded_value, sizeof encoded_value);
        used += (size_t)snprintf(form + used, size - used, "%s%s=%s", used ? "&" : "", encoded_name, encoded_value);
    }
    snprintf(form + used, size - used, "%suser=alice&consent=%s", used ? "&" : "", consent);
    char url[512], location[4096];
    snprintf(url, sizeof url, "%s/oauth/authorize", base);
    status = http_request(url, form, NULL, 0, location, sizeof location);
    free(form);
    free(html);
    if (status != 302 || !location[0]) {
        fprintf(stderr, "    play_browser: the consent answered %d (no redirect)\n", status);
        return -1;
    }
    /* The redirect to the library's loopback listener. */
    return http_request(location, NULL, page, page_length, NULL, 0);
}
