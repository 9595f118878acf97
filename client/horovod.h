/* Whether a job uses horovod: only then does its leader open horovod's HTTP rendezvous, a
 * second listening port (daemon/hvd.h). gpurun --horovod says so, --horovod=off says not, and
 * by default the command shows it: a word of it names horovod, or the script it runs mentions
 * it (README.md, "Horovod"). */
#ifndef GPURUN_CLIENT_HOROVOD_H
#define GPURUN_CLIENT_HOROVOD_H

#include <stdbool.h>
#include <stddef.h>

/* --horovod's values (gpurun_args.horovod); 0, the default, is auto. */
enum horovod_choice { HOROVOD_AUTO, HOROVOD_ON, HOROVOD_OFF };

/* The rule: whether the command argv (argc words, borrowed) uses horovod, given the text of
 * the script it runs (text, n bytes, borrowed; NULL: none read). True when a word of argv
 * contains "horovod" (horovod_train.py, a horovodrun-style wrapper, python -m horovod...), or
 * the text does (import horovod.torch, strategy="horovod", HOROVOD_ variables), in any case.
 * Pure. */
bool horovod_seen(char *const *argv, int argc, const char *text, size_t n);

/* What job.json's "horovod" is for choice (an enum horovod_choice) and the command argv
 * (argc words, borrowed): 1 or 0. Reads the script (script_head, lib/scripthead.h) for
 * HOROVOD_AUTO. */
int horovod_decide(int choice, char *const *argv, int argc);

#endif
