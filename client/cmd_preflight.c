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

/* A line per node of the summary in job_dir: its check's verdict (or a check it could not
 * make, or skip: one the options ask that no node makes; NULL: none) and its link's figure. */
static void print_nodes(const char *job_dir, const char *skip)
{
    char path[PATH_MAX];
    json_t *s, *n;
    size_t i;
    int failed = 0, total = 0, skipped = 0;

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
        const char *unmade = json_string_value(json_object_get(n, "preflight_skipped"));
        json_t *link = json_object_get(n, "link_mbit");

        if (!unmade || !*unmade)
            unmade = skip;
        total++;
        failed += why && *why;
        printf("node %d (%s): ", (int)json_integer_value(json_object_get(n, "node")),
               host && *host ? host : "never joined");
        if (why && *why) {
            printf("FAILED: %s", why);
        } else if (unmade && *unmade) {
            printf("skipped: %s; the other checks passed", unmade);
            skipped++;
        } else {
            printf("passed");
        }
        if (json_is_number(link))
            printf("; link %.0f Mbit/s", json_number_value(link));
        printf("\n");
    }
    printf("pre-flight: %d of %d nodes passed", total - failed, total);
    if (skipped)
        printf(", %d with a check skipped", skipped);
    printf("\n");
    json_decref(s);
}

int cmd_preflight(struct gpurun_args *args, int *fatal_signal)
{
    char skip[160] = "";
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
    /* The nodes check GPU memory only where the job asks Slurm for GPUs. */
    if (args_given(args, "min-gpu-free") && args->spec.min_gpu_free_pct > 0 &&
        (args->local || args->no_gpus))
        snprintf(skip, sizeof(skip),
                 "GPU memory (--min-gpu-free %d): the job asks for no GPUs (%s)",
                 args->spec.min_gpu_free_pct,
                 args->local ? "--local asks none of this machine" : "--no-gpus");
    ret = cmd_run(args, fatal_signal);
    if (args->ran_dir && !*fatal_signal && !args->emit_sbatch)
        print_nodes(args->ran_dir, skip[0] ? skip : NULL);
    return ret;
}
