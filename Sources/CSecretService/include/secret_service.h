/*
 * The desktop Secret Service (org.freedesktop.secrets: GNOME Keyring, KWallet, KeePassXC)
 * through libsecret, loaded at run time with dlopen("libsecret-1.so.0") as Chromium does:
 * the library has no link-time dependency on libsecret or glib, and a machine without them
 * simply has no Secret Service. Internal to SessionFlow (SessionFileStore wraps it).
 *
 * One item per store, found by the attributes `directory` (absolute) and `name` (the store
 * file's name) of the schema "org.sessionflow.StoreKey"; its secret is text the caller
 * chooses (the store's key ring, hex). Secrets are never logged or put in messages.
 *
 * Every call blocks (it runs on the store's worker thread, never on a loop thread) and is
 * bounded: without a session bus (no DBUS_SESSION_BUS_ADDRESS and no $XDG_RUNTIME_DIR/bus)
 * it fails at once without loading anything; otherwise a watchdog cancels the call after
 * `timeout_ms` (a service that does not answer, a keyring that wants to prompt).
 *
 * Results: SFSS_OK, SFSS_NOT_FOUND (lookup: no item), SFSS_UNAVAILABLE (no bus, no
 * libsecret, no service, locked, timed out: `message` says which, NUL-terminated).
 */
#ifndef SESSIONFLOW_SECRET_SERVICE_H
#define SESSIONFLOW_SECRET_SERVICE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { SFSS_OK = 0, SFSS_NOT_FOUND = 1, SFSS_UNAVAILABLE = -1 };

/* 1 if a session bus address is known (environment or $XDG_RUNTIME_DIR/bus), else 0. */
int sfss_session_bus_present(void);

/* Looks the store's item up. SFSS_OK: *secret is a copy the caller frees with
 * sfss_free_secret (which wipes it). */
int sfss_lookup(const char *directory, const char *name, int timeout_ms, char **secret,
                char *message, size_t message_size);

/* Creates or replaces the store's item with `secret`, labelled `label`, in the default
 * collection. */
int sfss_store(const char *directory, const char *name, const char *label, const char *secret,
               int timeout_ms, char *message, size_t message_size);

/* Removes the store's item (SFSS_OK also when there was none). */
int sfss_clear(const char *directory, const char *name, int timeout_ms, char *message, size_t message_size);

/* Wipes and frees a secret from sfss_lookup. NULL is ignored. */
void sfss_free_secret(char *secret);

#ifdef __cplusplus
}
#endif

#endif
