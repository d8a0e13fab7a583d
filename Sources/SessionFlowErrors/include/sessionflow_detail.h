/* The library's side of sf_last_error_message: what a failing call has to say, kept per
 * thread. Internal: not in sessionflow.h, so the installed library does not export it. */
#ifndef SESSIONFLOW_DETAIL_H
#define SESSIONFLOW_DETAIL_H

/* Forgets what an earlier call of this thread had to say (at the start of each call). */
void sf_detail_clear(void);
/* What is wrong, for the call running on this thread (the last one said wins). */
void sf_detail_set(const char *detail);
/* Ends a call of `function` that returns `code`: a negative code becomes the thread's
 * last error message (the detail, or sf_strerror(code) without one). Returns `code`. */
int sf_detail_finish(const char *function, int code);

#endif
