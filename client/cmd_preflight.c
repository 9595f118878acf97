/* gpurun preflight [options]: the pre-flight checks alone. A run of the job the options
 * describe whose job spec says preflight_only: its agents check their nodes and join, the
 * leader times their links and judges, and the job ends before any rank starts (0 when every
 * node passed, 125 when one failed). Then a line per node from the job's summary.json. */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "cmd.h"
#include "banned.h"

/* The command the job spec names; no rank runs it. */
static char *no_command[] = {"true", NULL};

/* A line per node of the summary in job_dir: its check's verdict and its link's figure. */
static void print_nodes(const char *job_dir)
{
    char path[PATH_MAX];
    json_t *s, *n;
    size_t i;
    int failed = 0, total = 0;

    snprintf(path, sizeof(path), "%.4000s/summary.json", job_dir);
    s = json_load_file(path, 0, NULL);
    if (!json_is_array(json_object_get(s, "nodes"))) {
        fprintf(stderr, "gpurun: preflight: no node's result in '%s'\n", path);
        json_decref(s);
        return;
    }
    json_array_foreach(json_object_get(s, "nodes"), i, n)
    {
        const char *host = json_string_value(json_object_get(n, "hostname"));
        const char *why = json_string_value(json_object_get(n, "preflight"));
        json_t *link = json_object_get(n, "link_mbit");

        total++;
        failed += why && *why;
        printf("node %d (%s): %s%s", (int)json_integer_value(json_object_get(n, "node")),
               host && *host ? host : "never joined", why && *why ? "FAILED: " : "passed",
               why && *why ? why : "");
        if (json_is_number(link))
            printf("; link %.0f Mbit/s", json_number_value(link));
        printf("\n");
    }
    printf("pre-flight: %d of %d nodes passed\n", total - failed, total);
    json_decref(s);
}

int cmd_preflight(struct gpurun_args *args, int *fatal_signal)
{
    int ret;

    if (args_given(args, "preflight") && !args->spec.preflight)
        return error_out(EXIT_FAILED, "gpurun preflight --preflight off: nothing to check");
    args->spec.preflight = 1;
    args->spec.preflight_only = 1;
    args->wait = true;
    args->cmd_argv = no_command;
    args->cmd_argc = 1;
    if (!args->job_name)
        args->job_name = "preflight";
    ret = cmd_run(args, fatal_signal);
    if (args->ran_dir && !*fatal_signal && !args->emit_sbatch)
        print_nodes(args->ran_dir);
    return ret;
}
