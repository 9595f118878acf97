# Shared by the tests/integ/train_cuda_*.sh scripts (sourced, not run): train_common.sh's data,
# small model and helpers, plus the CUDA flavour the scripts run train.device=cuda with:
#   cuda     the real build ($BUILD/gpurun-train) on a machine with a GPU (nvidia-smi -L);
#   cudasim  else the cudasim build (GPURUN_TRAIN_SIM, which tests/run exports when it built
#            one: the CUDA backend's own code on the CPU; it says nothing about speed, nor
#            about the real cuBLASLt or NCCL);
# else the script skips (pick_flavour). TRAIN_CUDA_FLAVOUR=cuda (make test-gpu) leaves cudasim
# out. Every result line names the flavour.
# shellcheck shell=bash
# shellcheck source=train_common.sh
. "$(dirname "${BASH_SOURCE[0]}")/train_common.sh"

# gpu_count: the GPUs nvidia-smi lists (0 without it).
gpu_count() {
    local n=0
    if command -v nvidia-smi >/dev/null 2>&1; then
        n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ') || n=0
    fi
    echo "$n"
}

# built_with_cuda BIN: whether BIN links the CUDA runtime (a build where nvcc was found).
built_with_cuda() {
    ldd "$1" 2>/dev/null | grep 'libcudart\.so' >/dev/null
}

# pick_flavour: sets cuda_bin, flavour and gpus (the devices a run may use) or skips.
pick_flavour() {
    gpus=$(gpu_count)
    if [ "$gpus" -gt 0 ] && built_with_cuda "$train_bin"; then
        cuda_bin=$train_bin
        flavour=cuda
    elif [ "${TRAIN_CUDA_FLAVOUR:-}" = cuda ]; then
        skip "no CUDA device here (nvidia-smi -L) or a build without the CUDA backend"
    elif [ -n "${GPURUN_TRAIN_SIM:-}" ] && [ -x "$GPURUN_TRAIN_SIM" ]; then
        cuda_bin=$GPURUN_TRAIN_SIM
        flavour=cudasim
        # One emulated device, which every process of the machine may use.
        gpus=1
    else
        skip "no CUDA device here (nvidia-smi -L) and no cudasim build (GPURUN_TRAIN_SIM unset)"
    fi
    echo "# flavour: $flavour ($cuda_bin)"
}

# A bound on one cuda run: seconds on a GPU, about a minute under cudasim.
CUDA_LIMIT=${CUDA_LIMIT:-240}

# train_cuda ARGS...: the flavour's gpurun-train ARGS train.device=cuda (one rank), stdout in
# $work/out and stderr in $work/err; sets rc.
train_cuda() {
    rc=0
    timeout -k 5 "$CUDA_LIMIT" "$cuda_bin" "$@" train.device=cuda >"$work/out" 2>"$work/err" \
        </dev/null || rc=$?
}

# ok TEXT: a result line of the script, with the flavour.
ok() {
    echo "# ok ($flavour): $*"
}

# rel_diff A B: |A - B| / max(|A|, |B|) (0 when both are 0).
rel_diff() {
    awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; if (a < 0) a = -a;
        if (b < 0) b = -b; m = a > b ? a : b; printf "%.3g\n", m > 0 ? d / m : 0 }'
}

# curves_close A B RTOL WHAT: every step of metrics.jsonl A and B (the same steps) has a loss
# within RTOL relative, and so have the validation losses; prints the largest difference.
curves_close() {
    local a=$1 b=$2 rtol=$3 what=$4 worst
    [ "$(steps_of "$a")" = "$(steps_of "$b")" ] ||
        fail "$what: steps $(steps_of "$a") against $(steps_of "$b")"
    # Files, not process substitutions: those of a command substitution outlive it.
    losses "$a" | awk '{ print $1, $2, ($5 == "" ? "-" : $5) }' >"$work/curve.a"
    losses "$b" | awk '{ print $1, $2, ($5 == "" ? "-" : $5) }' >"$work/curve.b"
    # The same steps in the same order (above): "step loss val step loss val" per line.
    worst=$(paste -d ' ' "$work/curve.a" "$work/curve.b" |
        awk -v rtol="$rtol" '
            function rel(x, y,   d, m) { d = x - y; if (d < 0) d = -d; if (x < 0) x = -x;
                if (y < 0) y = -y; m = x > y ? x : y; return m > 0 ? d / m : 0 }
            { r = rel($2, $5); if (r > worst) { worst = r; at = "loss of step " $1 ": " $2 " vs " $5 }
              if ($3 != "-" && $6 != "-") { r = rel($3, $6);
                  if (r > worst) { worst = r; at = "val loss of step " $1 ": " $3 " vs " $6 } } }
            END { printf "%.3g (%s)\n", worst, (worst > 0 ? at : "bit-identical");
                  exit !(worst <= rtol) }') ||
        fail "$what: largest relative difference $worst, above $rtol"
    ok "$what: largest relative difference $worst (tolerance $rtol)"
}

# curves_track A B RTOL VTOL WHAT: a looser curves_close for runs that may part ways for a
# step or two (a loss spike of a high learning rate lands on one run and not on the other):
# the median over the steps of the losses' relative difference within RTOL, every validation
# loss within VTOL.
curves_track() {
    local a=$1 b=$2 rtol=$3 vtol=$4 what=$5 got
    [ "$(steps_of "$a")" = "$(steps_of "$b")" ] ||
        fail "$what: steps $(steps_of "$a") against $(steps_of "$b")"
    losses "$a" | awk '{ print $1, $2, ($5 == "" ? "-" : $5) }' >"$work/curve.a"
    losses "$b" | awk '{ print $1, $2, ($5 == "" ? "-" : $5) }' >"$work/curve.b"
    got=$(paste -d ' ' "$work/curve.a" "$work/curve.b" |
        awk -v rtol="$rtol" -v vtol="$vtol" '
            function rel(x, y,   d, m) { d = x - y; if (d < 0) d = -d; if (x < 0) x = -x;
                if (y < 0) y = -y; m = x > y ? x : y; return m > 0 ? d / m : 0 }
            { r[NR] = rel($2, $5)
              if ($3 != "-" && $6 != "-" && rel($3, $6) > vworst) vworst = rel($3, $6) }
            END { n = NR
                  for (i = 2; i <= n; i++)    # insertion sort (POSIX awk has no asort)
                      for (j = i; j > 1 && r[j - 1] > r[j]; j--) { t = r[j]; r[j] = r[j - 1]; r[j - 1] = t }
                  med = n % 2 ? r[(n + 1) / 2] : (r[n / 2] + r[n / 2 + 1]) / 2
                  printf "median %.3g, largest %.3g; validation %.3g\n", med, r[n], vworst
                  exit !(med <= rtol && vworst <= vtol) }') ||
        fail "$what: loss differences $got, above $rtol (median) or $vtol (validation)"
    ok "$what: loss differences $got (tolerances $rtol, $vtol)"
}

# same_losses A B WHAT: metrics.jsonl A and B hold the same steps, losses, rates, norms and
# validation losses, bit for bit (tokens_per_s aside).
same_losses() {
    diff <(losses "$1") <(losses "$2") >"$work/diff" || {
        cat "$work/diff"
        fail "$3: the metrics differ"
    }
    ok "$3: bit-identical"
}
