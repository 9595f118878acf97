/* Whether a job's ranks ever met. A job of several ranks whose ranks never connected to one
 * another trained alone, each its own model (fairseq-hydra-train with its default world size
 * of 1 does this under any launcher, and reports success). gpurun offers the ranks torch's
 * env:// rendezvous (MASTER_ADDR:MASTER_PORT, served by rank 0's TCPStore), its own store
 * and barriers, and Horovod's store; a job that used none of them is said to have trained
 * alone. Pure: the callers read /proc and count store traffic, these judge. */
#ifndef GPURUN_TOGETHER_H
#define GPURUN_TOGETHER_H

#include <stdbool.h>
#include <stddef.h>

/* Whether the text (len bytes) of /proc/net/tcp or /proc/net/tcp6 holds a socket whose local
 * or remote port is port: rank 0's TCPStore listening on MASTER_PORT or serving a rank, a
 * rank connected to it, or what such a link left (TIME_WAIT). The text is the kernel's: a
 * header line, then one socket a line, "sl: HEXADDR:HEXPORT HEXADDR:HEXPORT ST ...". Lines
 * that do not parse, and a last one without its newline (a read cut short), are skipped. */
bool together_tcp_uses_port(const char *text, size_t len, int port);

enum together_verdict {
    TOGETHER_NOT_APPLICABLE, /* one rank, nobody to meet; or a command not judged */
    TOGETHER_MET,            /* the ranks used a rendezvous gpurun offered */
    TOGETHER_ALONE,          /* several ranks, and none used any */
};

/* Whether a command runs Python, whose training scripts are what can train alone without
 * noticing (a shell's "echo" on every rank meets nobody, rightly): argv0's file name starts
 * with "python", or head (the first bytes of the file argv0 resolves to, NULL: unknown) is a
 * "#!" line that names a python (fairseq-hydra-train, torchrun, a venv's entry points). */
bool together_runs_python(const char *argv0, const char *head);

/* The verdict on a job of world_size ranks that has ended: judged only where judged is set
 * (a Python command, or --require-rendezvous), master_port_seen when any node saw a socket on
 * MASTER_PORT, store_used when any rank used gpurun's store or barriers or Horovod's
 * store. */
enum together_verdict together_judge(int world_size, bool judged, bool master_port_seen,
                                     bool store_used);

/* The way to make a command's ranks meet, for the line that says they did not: a fix for the
 * frameworks known to train alone without one (fairseq's world size setting, for a command
 * of which a word's file name starts with "fairseq": fairseq-hydra-train, python3
 * fairseq_cli/train.py), for an MPI program (a word of the command or its script's text,
 * text: n bytes, NULL: none read, names mpi4py: MPI_Init in a rank gpurun started finds no
 * process manager, and each rank is a world of 1), else the general one. argv is
 * NULL-terminated (NULL: none). Writes into out (outn bytes). */
void together_fix(char *const *argv, const char *text, size_t n, int world_size, char *out,
                  size_t outn);

#endif
