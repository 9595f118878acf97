/* The rank shim: how the agent starts a rank. `rendezvousd --exec-rank AGENT_PID -- CMD...`
 * runs in the rank's new session, asks the kernel for a signal when the agent dies, starts
 * CMD as its child and passes CMD's exit status on as its own. If the agent is killed
 * outright (SIGKILL, OOM), the shim kills the rank's whole process group, so a dead agent
 * never leaves ranks running. */
#ifndef GPURUN_SHIM_H
#define GPURUN_SHIM_H

#define SHIM_FLAG "--exec-rank"

/* The shim's main: argv[1] is SHIM_FLAG. Returns (or exits with) CMD's status: its exit
 * code, the same signal re-raised, 127 when CMD is not found, 126 when it cannot run. */
int shim_main(int argc, char **argv);

#endif
