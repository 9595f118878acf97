/* gpurun-shim: the rank shim (daemon/shim.h) as a program of its own. The agent runs one per
 * rank, on the path of every rank's start; linked with libc alone, it starts in half the time
 * rendezvousd takes (whose libcrypto, libuv and jansson the loader would map and relocate for
 * nothing). Its arguments are rendezvousd's shim's: argv[1] is SHIM_FLAG. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "../shim.h"
#include "banned.h"

int main(int argc, char **argv)
{
    sigset_t none;

    /* As rendezvousd's main: a mask or a SIGCHLD disposition inherited across exec would
     * keep the shim from hearing its rank's end. */
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGCHLD, SIG_DFL);
    if (argc < 2 || strcmp(argv[1], SHIM_FLAG)) {
        fprintf(stderr,
                "gpurun-shim: the rank shim of rendezvousd, run by its agent (argv[1] is "
                "%s)\n",
                SHIM_FLAG);
        return 125;
    }
    return shim_main(argc, argv);
}
