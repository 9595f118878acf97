/* gpurun help [SUBCOMMAND]: the help that --help prints, as git's "git help" gives it. */
#include <stdio.h>

#include "cmd.h"
#include "banned.h"

int cmd_help(struct gpurun_args *args, int *fatal_signal)
{
    (void)fatal_signal;
    args_usage(stdout, args->help_cmd);
    return 0;
}
