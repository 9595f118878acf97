/* gpurun status for a job dir: the leader's live view over an authenticated TCP link, or the
 * summary.json of a job that has ended. */
#ifndef GPURUN_CLIENT_STATUS_H
#define GPURUN_CLIENT_STATUS_H

#include <stdbool.h>
#include <stdio.h>

#include <jansson.h>

#include "errmsg.h"

/* A failure below fills the caller's struct errmsg with one line: "cannot connect to
 * '127.0.0.1:4000': connection refused". */

/* Asks the leader of the job in job_dir (borrowed) for its status: reads endpoint.json and
 * key, connects, runs the auth.h handshake as client, sends {"type":"status","id":1} and
 * waits for the status_reply, each step bounded by timeout_ms. Returns 0 and sets *job to the
 * reply's "job" object (new: caller decrefs), or a negative errno with err filled:
 * -ENOENT when there is no endpoint.json, -EACCES when the leader does not hold the key,
 * -ETIMEDOUT, -EPROTO for a reply that is not a status_reply, or the socket's error. */
int status_query(const char *job_dir, int timeout_ms, json_t **job, struct errmsg *err);

/* Reads the job's summary.json. Returns 0 and sets *summary (new: caller decrefs), -ENOENT
 * when the job has not ended, or a negative errno with err filled. */
int status_load_summary(const char *job_dir, json_t **summary, struct errmsg *err);

/* What job_dir's summary.json says of ranks that never met ("the 4 ranks never met: ...",
 * its "alone"), into out (n bytes; "" when nothing). Returns whether there was any. */
bool status_alone(const char *job_dir, char *out, size_t n);

#endif
