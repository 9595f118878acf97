/* Tests of daemon/together: /proc/net/tcp's text as the kernel writes it, and the verdict on a
 * job whose ranks met or did not. */
#include <stdbool.h>
#include <string.h>

#include "../daemon/together.h"
#include "test.h"
#include "banned.h"

/* A real /proc/net/tcp: ssh listening on 22, rank 0's TCPStore on 29500 (0x733C) serving a
 * rank's connection from 127.0.0.1:41000 (0xA028). */
static const char tcp_store[] =
    "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout "
    "inode\n"
    "   0: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 "
    "1234 1 0000000000000000 100 0 0 10 0\n"
    "   1: 0100007F:733C 0100007F:A028 01 00000000:00000000 00:00000000 00000000     0        0 "
    "5678 1 0000000000000000 20 4 30 10 -1\n";

/* The other side of the link, on another node: only the remote port is MASTER_PORT. */
static const char tcp_client[] =
    "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout "
    "inode\n"
    "   7: 0B0AD60A:A028 0A0AD60A:733C 06 00000000:00000000 03:00000F2B 00000000     0        0 "
    "0 3 0000000000000000\n";

/* /proc/net/tcp6: 32 hex digits an address. */
static const char tcp6_listen[] =
    "  sl  local_address                         remote_address                        st "
    "tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    "   0: 00000000000000000000000000000000:733C 00000000000000000000000000000000:0000 0A "
    "00000000:00000000 00:00000000 00000000     0        0 999 1 0000000000000000 100 0 0 10 0\n";

TEST(together_sees_master_port_either_side)
{
    CHECK(together_tcp_uses_port(tcp_store, strlen(tcp_store), 29500));
    CHECK(together_tcp_uses_port(tcp_store, strlen(tcp_store), 41000));
    CHECK(together_tcp_uses_port(tcp_store, strlen(tcp_store), 22));
    CHECK(!together_tcp_uses_port(tcp_store, strlen(tcp_store), 29501));
    /* The sl column's number is no port. */
    CHECK(!together_tcp_uses_port(tcp_store, strlen(tcp_store), 1));
    CHECK(together_tcp_uses_port(tcp_client, strlen(tcp_client), 29500));
    CHECK(together_tcp_uses_port(tcp6_listen, strlen(tcp6_listen), 29500));
    CHECK(!together_tcp_uses_port(tcp6_listen, strlen(tcp6_listen), 0));
}

/* A header alone, a cut line, garbage: nothing seen, nothing read past the end. */
TEST(together_odd_text_is_not_a_port)
{
    static const char header[] = "  sl  local_address rem_address   st\n";
    static const char cut[] = "  sl  local_address rem_address\n   0: 0100007F:73";
    static const char junk[] = "hello\n:::: zz:zz\n  3: 0100007F:GGGG 0:0 01\n";

    CHECK(!together_tcp_uses_port(header, strlen(header), 29500));
    CHECK(!together_tcp_uses_port(cut, strlen(cut), 0x73));
    CHECK(!together_tcp_uses_port(cut, strlen(cut), 29500));
    CHECK(!together_tcp_uses_port(junk, strlen(junk), 0));
    CHECK(!together_tcp_uses_port("", 0, 29500));
    /* Only len bytes count: the store's line cut off before its ports. */
    CHECK(!together_tcp_uses_port(tcp_store, 200, 29500));
}

TEST(together_verdict)
{
    CHECK_EQ(together_judge(1, true, false, false), TOGETHER_NOT_APPLICABLE);
    CHECK_EQ(together_judge(2, true, false, false), TOGETHER_ALONE);
    CHECK_EQ(together_judge(2, false, false, false), TOGETHER_NOT_APPLICABLE);
    CHECK_EQ(together_judge(2, true, true, false), TOGETHER_MET);
    CHECK_EQ(together_judge(8, true, false, true), TOGETHER_MET);
}

TEST(together_python_commands)
{
    CHECK(together_runs_python("python3", NULL));
    CHECK(together_runs_python("/usr/bin/python3.11", NULL));
    CHECK(together_runs_python("/venv/bin/fairseq-hydra-train", "#!/venv/bin/python3\n# -*- "));
    CHECK(together_runs_python("torchrun", "#!/usr/bin/env python3\nimport re\n"));
    CHECK(!together_runs_python("sh", "\x7f"
                                      "ELF"));
    CHECK(!together_runs_python("/bin/true", NULL));
    CHECK(!together_runs_python("run.sh", "#!/bin/sh\nexec python3 x.py\n"));
}

TEST(together_fix_names_fairseq)
{
    char fix[256];

    char *fairseq[] = {(char *)"/venv/bin/fairseq-hydra-train", (char *)"-m", NULL};
    char *module[] = {(char *)"python3", (char *)"src/fairseq_cli/hydra_train.py", NULL};
    char *other[] = {(char *)"python3", (char *)"train.py", NULL};

    together_fix(fairseq, NULL, 0, 4, fix, sizeof(fix));
    CHECK_STR(fix, "fairseq trains alone while its distributed_world_size is 1: add "
                   "distributed_training.distributed_world_size=4 to its command");
    together_fix(module, NULL, 0, 4, fix, sizeof(fix));
    CHECK(strncmp(fix, "fairseq", 7) == 0);
    together_fix(NULL, NULL, 0, 4, fix, sizeof(fix));
    CHECK(strstr(fix, "init_process_group") != NULL);
    together_fix(other, NULL, 0, 2, fix, sizeof(fix));
    CHECK(strstr(fix, "init_process_group") != NULL);
    CHECK(strstr(fix, "set to 2") != NULL);
}

TEST(together_fix_names_mpi_for_an_mpi4py_script)
{
    char fix[320];
    static const char script[] = "import torch\nfrom mpi4py import MPI\ncomm = MPI.COMM_WORLD\n";

    char *py[] = {(char *)"python3", (char *)"hvd_like.py", NULL};
    char *module[] = {(char *)"python3", (char *)"-m", (char *)"mpi4py", (char *)"run.py", NULL};

    together_fix(py, script, sizeof(script) - 1, 8, fix, sizeof(fix));
    CHECK_STR(fix, "an MPI program's ranks started by gpurun are MPI singletons, each a world of "
                   "1 (MPI_Init finds no process manager): start it with mpirun or srun "
                   "--mpi=pmix, or join its 8 ranks with torch.distributed (env://)");
    /* python3 -m mpi4py: the command names it. */
    together_fix(module, NULL, 0, 2, fix, sizeof(fix));
    CHECK(strncmp(fix, "an MPI program", 14) == 0);
    /* The word cut by the end of what was read is not the word; nor another import. */
    together_fix(py, script, 20, 2, fix, sizeof(fix));
    CHECK(strstr(fix, "init_process_group") != NULL);
    together_fix(py, "import mpi4\n", 12, 2, fix, sizeof(fix));
    CHECK(strstr(fix, "init_process_group") != NULL);
    /* fairseq's own fix comes first: its ranks do meet once its world size is set. */
    char *fairseq[] = {(char *)"fairseq-train", NULL};
    together_fix(fairseq, script, sizeof(script) - 1, 2, fix, sizeof(fix));
    CHECK(strncmp(fix, "fairseq", 7) == 0);
}
