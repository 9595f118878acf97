#!/usr/bin/env bash
# run-gpu-checks.sh OUTDIR: the CUDA backend's checks on a GPU node, run from the GPU bundle
# (make gpu-bundle; README.md, "Checks on a GPU node without build tools"), which needs no
# compiler and no Debian package there. It finds CUDA's libraries (the toolkit's folder, or
# the Python wheels' nvidia/*/lib), says which it used, then runs each step under its own time
# budget, its log in OUTDIR/<step>.log, and writes OUTDIR/report.md, a table of every check:
# pass, fail, skip (with the reason) or timeout, its time and its key figures.
#
#   tests      make test-gpu's tests: tests/run cuda_ops cuda_model coll_nccl 'train_cuda_*'
#   bench      make bench-gpu's benchmark: bench/train_gpu at batch 16, 32 and 64, and the
#              largest batch again without CUDA graphs
#   anchor     the same model trained by PyTorch on the same GPU (bench/torch_gpt2.py: nanoGPT's
#              model, bf16 autocast, fused AdamW, torch.compile) at the same batches, where
#              python3 has torch with CUDA
#   attention  the model's attention alone, forward and backward at the benchmark's batches:
#              bench/train_gpu --attention-only (our kernels, cuDNN's) beside PyTorch's SDPA
#              backends (bench/torch_attention.py), TFLOP/s of the causal half
#   train      jobs/gpt2-124m.cfg's model for 300 steps on GPT-2 tokens of text found on the
#              node (tiktoken's GPT-2 encoding where it loads, else gpurun-train prep's bytes);
#              where it ran cuDNN's attention, again with train.attention=own: the loss at every
#              50th step within 2% (the train-attention row)
#   compare    20 steps alone against the same under gpurun (NCCL, world size 1), with
#              train.zero=1, and resumed from step 10's checkpoint (bit for bit)
#   memcheck   compute-sanitizer --tool memcheck over the kernel tests and a short training run
#   racecheck  the same with --tool racecheck
#   ddp        a user's own job: a torch DDP script (NCCL, one rank per GPU) under the bundle's
#              gpurun, reporting through gpurun.report, its progress seen in gpurun status
#              while it runs and in summary.json after (tests/ranks/torch_ddp.py)
#   kernels    where a training step's time goes: Nsight Compute's duration of every kernel of
#              bench/train_gpu's step at GPU_CHECKS_KERNELS_BATCH, summed by kernel (kernels.md)
#   seeds      not run unless GPU_CHECKS_ONLY names it: the randomized CUDA tests (cuda_ops,
#              cuda_model) once per seed 1..GPU_CHECKS_SEEDS (tests/seeds.sh), as many as its
#              budget allows; the row says how many seeds ran and which failed
# A step that fails, or runs out of its time, does not stop the others. Exit status: 0 when
# no check failed or timed out.
#
# The bundle's flavour (bundle.txt) says what runs: cuda, the real build; sim, the cudasim
# build, whose checks run on the CPU (a scaled-down model; the emulator's guard pages and
# reverse schedule in place of compute-sanitizer; timings that mean nothing).
#
# Environment (seconds for budgets):
#   GPU_CHECKS_TOTAL        all steps together (default 620); a step gets what is left if less
#   GPU_CHECKS_<STEP>_S     one step's budget: TESTS 75, BENCH 45, ANCHOR 90, ATTENTION 40,
#                           TRAIN 110, COMPARE 55, MEMCHECK 45, RACECHECK 105, DDP 30, KERNELS 25,
#                           SEEDS 300 (a step that finds less than 5 s of the total left counts
#                           as timed out)
#   GPU_CHECKS_ONLY         the steps to run, space-separated (default all but seeds, in the
#                           order above)
#   GPU_CHECKS_TESTS        tests/run's filters (default the four above)
#   GPU_CHECKS_SAN_TESTS    the unit runner's filters for the sanitizers (default 'cuda_*')
#   GPU_CHECKS_BATCHES      the benchmark's batches (default 16,32,64)
#   GPU_CHECKS_KERNELS_BATCH  the batch of the kernels step (default 64)
#   GPU_CHECKS_SEEDS        the seeds step's seeds (default 50; its budget, SEEDS_S, 300)
#   GPU_CHECKS_STEPS        the training run's steps (default 300)
#   GPU_CHECKS_CMP_STEPS    the comparisons' steps (default 20; even)
#   GPU_CHECKS_MODEL        overrides of jobs/gpt2-124m.cfg for both (default none; under sim
#                           a 2-layer, 32-wide byte-level model)
#   GPU_CHECKS_TOKENIZER    auto, tiktoken or bytes (default auto: tiktoken where the
#                           vocabulary is GPT-2's and it loads)
#   GPU_CHECKS_TEXT         text files or folders to tokenize (default: what the node has)
#   GPU_CHECKS_TEXT_MB      how much text (default 8)
#   GPU_CHECKS_CUDA_LIBS    folders to take CUDA's libraries from first (colon-separated)
#   CUDA_HOME, PYTHON       where to look for the toolkit, and the python3 with the wheels
set -euo pipefail
shopt -s nullglob

root=$(cd "$(dirname "$0")" && pwd)
bin=$root/bin
self=$root/$(basename "$0")

die() {
    echo "run-gpu-checks: $*" >&2
    exit 2
}

# --- set-up, shared by the parent and each step's child ---------------------------------------

flavour=$(sed -n 's/^flavour=//p' "$root/bundle.txt" 2>/dev/null) || true
flavour=${flavour:-cuda}
commit=$(sed -n 's/^commit=//p' "$root/bundle.txt" 2>/dev/null) || true
PYTHON=${PYTHON:-python3}

GPU_CHECKS_TOTAL=${GPU_CHECKS_TOTAL:-620}
GPU_CHECKS_TESTS=${GPU_CHECKS_TESTS:-cuda_ops cuda_model coll_nccl train_cuda_*}
GPU_CHECKS_SAN_TESTS=${GPU_CHECKS_SAN_TESTS:-cuda_*}
GPU_CHECKS_BATCHES=${GPU_CHECKS_BATCHES:-16,32,64}
GPU_CHECKS_KERNELS_BATCH=${GPU_CHECKS_KERNELS_BATCH:-64}
GPU_CHECKS_STEPS=${GPU_CHECKS_STEPS:-300}
GPU_CHECKS_CMP_STEPS=${GPU_CHECKS_CMP_STEPS:-20}
GPU_CHECKS_TOKENIZER=${GPU_CHECKS_TOKENIZER:-auto}
GPU_CHECKS_TEXT_MB=${GPU_CHECKS_TEXT_MB:-8}
if [ "$flavour" = sim ]; then
    GPU_CHECKS_MODEL=${GPU_CHECKS_MODEL:-model.n_layer=2 model.n_head=2 model.n_embd=32 \
model.seq_len=32 model.vocab_size=256 optim.lr=3e-3 optim.min_lr=3e-4 optim.warmup_steps=20 \
train.batch_size=4}
else
    GPU_CHECKS_MODEL=${GPU_CHECKS_MODEL:-}
fi
export GPU_CHECKS_TOTAL GPU_CHECKS_TESTS GPU_CHECKS_SAN_TESTS GPU_CHECKS_BATCHES \
    GPU_CHECKS_KERNELS_BATCH GPU_CHECKS_STEPS GPU_CHECKS_CMP_STEPS GPU_CHECKS_TOKENIZER GPU_CHECKS_TEXT_MB \
    GPU_CHECKS_MODEL PYTHON
STEPS=(tests bench anchor attention train compare memcheck racecheck ddp kernels seeds)
GPU_CHECKS_SEEDS=${GPU_CHECKS_SEEDS:-50}
# Each step's cap, adding up to the default total (measured on an H200: 39, 11, about 70, 32,
# 40, 34, about 95 and 18 s; ddp not yet: torch's import and NCCL's start, a few seconds).
declare -A BUDGET=([tests]=75 [bench]=45 [anchor]=90 [attention]=40 [train]=110 [compare]=55
    [memcheck]=45 [racecheck]=105 [ddp]=30 [kernels]=25 [seeds]=300)

# --- a step's child: rows of the report --------------------------------------------------------

# row STATUS NAME FIGURES: one row of the report (the time since the step's last row).
row() {
    local now=$SECONDS
    printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$((now - row_t0))" "$3" >>"$results"
    row_t0=$now
    echo "== $2: $1 ($3)"
}

# tap_counts FILE: "N ok, N failed, N skipped" of the TAP lines in FILE.
tap_counts() {
    awk '/^ok .*# SKIP/ { s++; next } /^ok / { p++ } /^not ok / { f++ }
         END { printf "%d passed, %d failed, %d skipped\n", p, f, s }' "$1"
}

# losses FILE: "step loss lr grad_norm [val_loss]" per line of a metrics.jsonl (tokens_per_s,
# a timing, left out).
losses() {
    sed -e 's/"tokens_per_s": [^,]*, //' -e 's/[{}",]//g' -e 's/[a-z_]*: //g' "$1"
}

# compare_losses A B: the largest relative difference between the losses and validation
# losses of two metrics.jsonl ("0" when bit-identical); fails when their steps differ.
compare_losses() {
    [ "$(losses "$1" | cut -d' ' -f1)" = "$(losses "$2" | cut -d' ' -f1)" ] || return 1
    paste -d ' ' <(losses "$1" | awk '{ print $2, ($5 == "" ? "-" : $5) }') \
        <(losses "$2" | awk '{ print $2, ($5 == "" ? "-" : $5) }') |
        awk 'function rel(x, y,   d, m) { d = x - y; if (d < 0) d = -d; if (x < 0) x = -x;
                 if (y < 0) y = -y; m = x > y ? x : y; return m > 0 ? d / m : 0 }
             { r = rel($1, $3); if (r > w) w = r
               if ($2 != "-" && $4 != "-" && rel($2, $4) > w) w = rel($2, $4) }
             END { printf "%.3g\n", w }'
}

# state_of CKPT: the parameters and both moments of a checkpoint, the 3 x nparams floats
# before the 32-byte checksum (nparams: the header's uint64 at byte 56).
state_of() {
    local n size
    n=$(od -An -t u8 -j 56 -N 8 "$1" | tr -d ' ')
    size=$(stat -c %s "$1")
    dd if="$1" iflag=skip_bytes,count_bytes skip=$((size - 12 * n - 32)) count=$((12 * n)) \
        status=none
}

# find_texts: text files of this node, one a line, about GPU_CHECKS_TEXT_MB in all.
find_texts() {
    local want=$((GPU_CHECKS_TEXT_MB * 1024 * 1024)) have=0 f p size stdlib
    local -a places=()
    if [ -n "${GPU_CHECKS_TEXT:-}" ]; then
        read -r -a places <<<"$GPU_CHECKS_TEXT"
    else
        places=(/usr/share/common-licenses)
        stdlib=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])' \
            2>/dev/null) || stdlib=
        [ -z "$stdlib" ] || places+=("$stdlib")
        places+=(/usr/share/doc "$root/tests" "$root/jobs")
    fi
    # The places in their order, each one's files sorted.
    while IFS= read -r f; do
        size=$(stat -c %s "$f" 2>/dev/null) || continue
        echo "$f"
        have=$((have + size))
        [ "$have" -lt "$want" ] || break
    done < <(for p in "${places[@]}"; do
        find "$p" -maxdepth 3 -type f -size +1k \( -name '*.py' -o -name '*.txt' -o -name '*.md' \
            -o -name '*.sh' -o -name '*.cfg' -o -name 'copyright' -o ! -name '*.*' \) 2>/dev/null |
            LC_ALL=C sort
    done)
}

# The GPT-2 tokenization of the files on stdin into llm.c's shards (the last 5% validation),
# each file ending in <|endoftext|>.
TIKTOKEN_PY='
import array, sys, tiktoken
enc = tiktoken.get_encoding("gpt2")
toks = []
for path in sys.stdin.read().split("\n"):
    if path:
        with open(path, encoding="utf-8", errors="replace") as f:
            toks += enc.encode_ordinary(f.read()) + [enc.eot_token]
cut = len(toks) - len(toks) // 20
for name, part in (("train", toks[:cut]), ("val", toks[cut:])):
    head = array.array("i", [20240520, 1, len(part)] + [0] * 253)
    with open(sys.argv[1] + "/" + name + "_000000.bin", "wb") as f:
        head.tofile(f)
        array.array("H", part).tofile(f)
print("tiktoken gpt2: %d tokens" % len(toks))
'

# make_data DIR VOCAB: token shards in DIR (once), and data_what says how they were made.
make_data() {
    local dir=$1 vocab=$2 how=$GPU_CHECKS_TOKENIZER texts=$1.texts
    if [ -f "$dir/done" ]; then
        data_what=$(cat "$dir/done")
        return 0
    fi
    mkdir -p "$dir"
    find_texts >"$texts"
    [ -s "$texts" ] || return 1
    if [ "$how" = auto ]; then
        how=bytes
        [ "$vocab" -lt 50257 ] || how=tiktoken
    fi
    # The encoding's files come from tiktoken's cache (no network on a GPU node): a short
    # bound on loading them, then one on the whole text.
    if [ "$how" = tiktoken ] &&
        timeout 20 "$PYTHON" -c 'import tiktoken; tiktoken.get_encoding("gpt2")' \
            >"$dir/prep.out" 2>&1 &&
        timeout 120 "$PYTHON" -c "$TIKTOKEN_PY" "$dir" <"$texts" >"$dir/prep.out" 2>&1; then
        data_what="GPT-2 BPE (tiktoken), $(sed -n 's/^tiktoken gpt2: //p' "$dir/prep.out")"
    else
        if [ "$how" = tiktoken ]; then
            echo "tiktoken's GPT-2 encoding did not load: byte-level tokens instead"
            tail -n 3 "$dir/prep.out"
        fi
        local -a files=()
        mapfile -t files <"$texts"
        "$bin/gpurun-train" prep "${files[@]}" -o "$dir" || return 1
        data_what="bytes (gpurun-train prep)"
    fi
    data_what="$data_what from $(wc -l <"$texts") files ($(tr '\n' '\0' <"$texts" |
        du -ch --files0-from=- 2>/dev/null | tail -n 1 | cut -f1))"
    echo "$data_what" >"$dir/done"
}

# model_args: the overrides every training run of train and compare gets.
model_args() {
    local -a extra=()
    read -r -a extra <<<"$GPU_CHECKS_MODEL"
    args=("$root/jobs/gpt2-124m.cfg" "data.train=$data/train_*.bin" "data.val=$data/val_*.bin"
        train.device=cuda train.grad_accum=1 train.resume=0 train.sample_every=0
        train.sample_tokens=0 train.eval_batches=4 "${extra[@]}")
}

# vocab_of: the vocabulary the runs train with (GPU_CHECKS_MODEL's, else the job's).
vocab_of() {
    local v
    v=$(tr ' ' '\n' <<<"$GPU_CHECKS_MODEL" | sed -n 's/^model\.vocab_size=//p' | tail -n 1)
    [ -n "$v" ] || v=$(sed -n 's/^vocab_size *= *\([0-9]*\).*/\1/p' "$root/jobs/gpt2-124m.cfg")
    echo "$v"
}

# small_cfg FILE DATA: the tests' small model (a training step is milliseconds even under a
# sanitizer) on byte-level DATA.
small_cfg() {
    cat >"$1" <<CFG
[model]
n_layer = 2
n_head = 2
n_embd = 32
seq_len = 32
vocab_size = 256
[data]
train = $2/train_*.bin
[train]
batch_size = 2
steps = 3
eval_every = 0
sample_tokens = 0
device = cuda
CFG
}

step_tests() {
    local log=$work/tests.tap rc=0 c
    local -a filters=()
    read -r -a filters <<<"$GPU_CHECKS_TESTS"
    if [ "$flavour" = sim ]; then
        BUILD=$bin GPURUN_TRAIN_SIM=$bin/gpurun-train "$root/tests/run" "${filters[@]}" |
            tee "$log" || rc=$?
    else
        BUILD=$bin TRAIN_CUDA_FLAVOUR=cuda "$root/tests/run" "${filters[@]}" | tee "$log" || rc=$?
    fi
    c=$(grep -E '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' "$log" | tail -n 1) ||
        c="no summary line"
    local bad skips
    bad=$(awk '/^not ok / { sub(/^not ok [0-9]+ - /, ""); printf "%s%s", sep, $0; sep = ", " }' "$log")
    skips=$(awk '/^ok .* # SKIP / { sub(/^ok [0-9]+ - /, ""); sub(/ # SKIP .*/, "")
                 if (++n <= 8) { printf "%s%s", sep, $0; sep = ", " } }
                 END { if (n > 8) printf ", ... (%d in all)", n }' "$log")
    local what="tests/run ${GPU_CHECKS_TESTS}: $c${bad:+; failed: $bad}${skips:+; skipped: $skips}"
    if [ "$rc" != 0 ]; then
        row fail tests "$what"
    elif [ -n "$GPU_CHECKS_NO_DEVICE" ]; then
        row skip tests "$GPU_CHECKS_NO_DEVICE: $what"
    elif ! grep -q '^ok .* - [^#]*$' "$log"; then
        row skip tests "$what (nothing ran: $(grep -m1 '# SKIP' "$log" | sed 's/.*# SKIP //'))"
    else
        row pass tests "$what"
    fi
}

step_bench() {
    local log=$work/bench.out rc=0 figs
    if [ "$flavour" = sim ]; then
        "$bin/bench/train_gpu" --smoke | tee "$log" || rc=$?
    else
        "$bin/bench/train_gpu" --cfg "$root/jobs/gpt2-124m.cfg" --batches "$GPU_CHECKS_BATCHES" |
            tee "$log" || rc=$?
        # The largest batch again with the kernels launched one by one: what the graph saves.
        "$bin/bench/train_gpu" --cfg "$root/jobs/gpt2-124m.cfg" \
            --batches "${GPU_CHECKS_BATCHES##*,}" --graphs off | tee "$work/bench-nographs.out" ||
            rc=$?
    fi
    # | batch | seq | ms/step | tokens/s | TFLOP/s | MFU | loss |
    figs=$(awk -F'|' '$2 ~ /^ *[0-9]+ *$/ { gsub(/[ *]/, "")
               if ($4 ~ /memory/) { printf "%sB=%s: out of device memory", sep, $2 }
               else { printf "%sB=%s: %s tok/s, MFU %s, %s ms/step", sep, $2, $5, $7, $4 }
               sep = "; " }' "$log")
    [ -s "$work/bench-nographs.out" ] && figs="$figs; without CUDA graphs: $(awk -F'|' '
        $2 ~ /^ *[0-9]+ *$/ { gsub(/[ *]/, ""); printf "B=%s: %s ms/step", $2, $4 }' \
        "$work/bench-nographs.out")"
    [ "$flavour" = cuda ] || figs="--smoke under cudasim (its timings mean nothing): $figs"
    if grep -q '^SKIP ' "$log"; then
        row skip bench "$(grep -m1 '^SKIP ' "$log" | sed 's/^SKIP //')"
    elif [ "$rc" != 0 ] || [ -z "$figs" ]; then
        row fail bench "train_gpu exited $rc${figs:+; $figs}"
    else
        row pass bench "$figs"
    fi
}

# step_anchor: bench/torch_gpt2.py's table at the benchmark's batches (anchor.out).
step_anchor() {
    local log=$work/anchor.out rc=0 figs
    if [ "$flavour" = sim ] || [ -n "$GPU_CHECKS_NO_DEVICE" ]; then
        row skip anchor "${GPU_CHECKS_NO_DEVICE:-PyTorch needs a GPU: no anchor under cudasim}"
        return 0
    fi
    # With the node's own library path: the one set above for the bundle's programs could give
    # torch another cuBLAS or NCCL than its wheels'.
    LD_LIBRARY_PATH=$GPU_CHECKS_NODE_LD_PATH PYTHONUNBUFFERED=1 "$PYTHON" \
        "$bin/bench/torch_gpt2.py" --batches "$GPU_CHECKS_BATCHES" 2>&1 | tee "$log" || rc=$?
    figs=$(awk -F'|' '$2 ~ /^ *[0-9]+ *$/ { gsub(/[ *]/, "")
               if ($4 ~ /memory/) { printf "%sB=%s: out of device memory", sep, $2 }
               else { printf "%sB=%s: %s tok/s, MFU %s, %s ms/step", sep, $2, $5, $7, $4 }
               sep = "; " }' "$log")
    if grep -q '^SKIP ' "$log"; then
        row skip anchor "$(grep -m1 '^SKIP ' "$log" | sed 's/^SKIP //')"
    elif [ "$rc" != 0 ] || [ -z "$figs" ]; then
        row fail anchor "torch_gpt2.py exited $rc (no torch with CUDA in $PYTHON?)${figs:+; $figs}"
    else
        row pass anchor "$(grep -m1 '^PyTorch ' "$log"): $figs"
    fi
}

# step_attention: the attention table of ours and of PyTorch's (attention.out).
step_attention() {
    local log=$work/attention.out rc=0 figs
    if [ "$flavour" = sim ] || [ -n "$GPU_CHECKS_NO_DEVICE" ]; then
        row skip attention "${GPU_CHECKS_NO_DEVICE:-timings need a GPU: none under cudasim}"
        return 0
    fi
    "$bin/bench/train_gpu" --cfg "$root/jobs/gpt2-124m.cfg" --batches "$GPU_CHECKS_BATCHES" \
        --attention-only 2>&1 | tee "$log" || rc=$?
    LD_LIBRARY_PATH=$GPU_CHECKS_NODE_LD_PATH PYTHONUNBUFFERED=1 "$PYTHON" \
        "$bin/bench/torch_attention.py" --batches "$GPU_CHECKS_BATCHES" 2>&1 | tee -a "$log" || rc=$?
    # | attention | batch | seq | heads | hs | fwd ms | fwd TFLOP/s | fwd+bwd ms | fwd+bwd TFLOP/s |
    figs=$(awk -F'|' '$3 ~ /^ *[0-9]+ *$/ { gsub(/^ +| +$/, "", $2); gsub(/ /, "", $3)
               if ($7 ~ /unavailable/) { printf "%s%s B=%s: unavailable", sep, $2, $3 }
               else { gsub(/ /, "", $10); printf "%s%s B=%s: %s TFLOP/s", sep, $2, $3, $10 }
               sep = "; " }' "$log")
    if [ "$rc" != 0 ] || [ -z "$figs" ]; then
        row fail attention "exit $rc${figs:+; $figs}"
    else
        row pass attention "fwd+bwd $figs"
    fi
}

# step_ddp: tests/ranks/torch_ddp.py with NCCL, one rank per GPU, under the bundle's gpurun:
# gpurun status must show a rank's report while the job runs (the package reached the ranks
# and their reports the leader), and summary.json its last step.
step_seeds() {
    local log=$work/seeds.out rc=0 last failing
    if [ -n "$GPU_CHECKS_NO_DEVICE" ]; then
        row skip seeds "$GPU_CHECKS_NO_DEVICE"
        return 0
    fi
    # Stop starting seeds 10 s before the step's budget ends (one seed's run is a few s).
    local budget=${GPU_CHECKS_STEP_BUDGET:-300}
    SEEDS_DEADLINE_S=$((budget > 15 ? budget - 10 : 5)) SEEDS_TIMEOUT_FACTOR=20 \
        "$root/tests/seeds.sh" "$bin/tests/runner" "$GPU_CHECKS_SEEDS" cuda_ops cuda_model |
        tee "$log" || rc=$?
    last=$(tail -n 1 "$log")
    failing=$(grep -E '^[a-z0-9_]+: failed with seeds ' "$log" | paste -sd';' | sed 's/;/; /g' || true)
    if [ "$rc" != 0 ]; then
        row fail seeds "$last${failing:+; $failing}"
    else
        row pass seeds "$last"
    fi
}

step_ddp() {
    local log=$work/ddp.out job=$work/ddp-job st=$work/ddp-status.json rc=0 pid seen="" i ngpu last
    if [ "$flavour" = sim ] || [ -n "$GPU_CHECKS_NO_DEVICE" ]; then
        row skip ddp "${GPU_CHECKS_NO_DEVICE:-NCCL needs a GPU: no DDP job under cudasim}"
        return 0
    fi
    ngpu=$(LD_LIBRARY_PATH=$GPU_CHECKS_NODE_LD_PATH "$PYTHON" -c \
        'import torch; print(torch.cuda.device_count())' 2>/dev/null) || ngpu=0
    if ! [ "$ngpu" -gt 0 ] 2>/dev/null; then
        row skip ddp "no torch with CUDA in $PYTHON"
        return 0
    fi
    LD_LIBRARY_PATH=$GPU_CHECKS_NODE_LD_PATH PYTHONUNBUFFERED=1 "$bin/gpurun" --local \
        --gpus-per-node "$ngpu" --job-dir "$job" -- "$PYTHON" "$bin/tests/torch_ddp.py" \
        --backend nccl --steps 60 --step-ms 100 >"$log" 2>&1 &
    pid=$!
    for ((i = 0; i < 200; i++)); do
        if "$bin/gpurun" status --job-dir "$job" --json >"$st" 2>/dev/null; then
            seen=$("$PYTHON" -c 'import json, sys
v = json.load(open(sys.argv[1])); r = (v.get("live") or {}).get("ranks") or []
print(r[0]["step"] if r and r[0].get("reported") else "")' "$st" 2>/dev/null) || seen=''
            [ -n "$seen" ] && break
        fi
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    wait "$pid" || rc=$?
    last=$("$PYTHON" -c 'import json, sys
v = json.load(open(sys.argv[1])); print(v["outcome"], v["ranks"][0]["step"])' \
        "$job/summary.json" 2>/dev/null) || last=''
    if [ "$rc" != 0 ]; then
        row fail ddp "gpurun exited $rc: $(grep -v '^\[' "$log" | tail -n 3 | tr '\n' ' ')"
    elif [ -z "$seen" ]; then
        row fail ddp "gpurun status never showed a rank's report (no 'import gpurun' in the ranks?)"
    elif [ "$last" != "completed 60" ]; then
        row fail ddp "summary.json: '$last', not 'completed 60'"
    else
        row pass ddp "$ngpu rank(s), NCCL: status showed step $seen while running; completed at step 60"
    fi
}

# The training run's figures from its metrics.jsonl: first and last losses (the means of the
# first and last ten steps), the last validation loss and the median tokens/s.
train_figures() {
    awk '{ l = $0; sub(/.*"loss": /, "", l); sub(/,.*/, "", l); loss[NR] = l + 0
           t = $0; sub(/.*"tokens_per_s": /, "", t); sub(/,.*/, "", t); tps[NR] = t + 0
           if ($0 ~ /"val_loss"/) { v = $0; sub(/.*"val_loss": /, "", v); sub(/[,}].*/, "", v); val = v } }
         END { k = NR < 10 ? NR : 10
               for (i = 1; i <= k; i++) { a += loss[i]; b += loss[NR - k + i] }
               for (i = 2; i <= NR; i++)
                   for (j = i; j > 1 && tps[j - 1] > tps[j]; j--) { x = tps[j]; tps[j] = tps[j - 1]; tps[j - 1] = x }
               printf "%.4f %.4f %s %.0f %d\n", a / k, b / k, (val == "" ? "-" : val), tps[int((NR + 1) / 2)], NR }' "$1"
}

step_train() {
    local out=$work/train rc=0 first last val tps n
    if [ -n "$GPU_CHECKS_NO_DEVICE" ]; then
        row skip train "$GPU_CHECKS_NO_DEVICE"
        return 0
    fi
    data=$work/data
    if ! make_data "$data" "$(vocab_of)"; then
        row fail train "could not make token data from the texts found"
        return 0
    fi
    model_args
    echo "data: $data_what"
    rm -rf "$out"
    mkdir -p "$out"
    "$bin/gpurun-train" "${args[@]}" train.steps="$GPU_CHECKS_STEPS" train.eval_every=100 \
        train.ckpt_every=0 train.log_every=10 train.out_dir="$out" 2>&1 | tee "$work/train.out" ||
        rc=$?
    cp "$work/train.out" "$out/run.out" 2>/dev/null || true
    rm -f "$out"/ckpt_*.bin
    if [ "$rc" != 0 ] || [ ! -s "$out/metrics.jsonl" ]; then
        row fail train "gpurun-train exited $rc; data: $data_what"
        return 0
    fi
    read -r first last val tps n < <(train_figures "$out/metrics.jsonl")
    local what="$n steps${GPU_CHECKS_MODEL:+ ($GPU_CHECKS_MODEL)}: loss $first -> $last (means of \
the first and last 10 steps), val $val, median $tps tok/s; data: $data_what"
    if [ "$n" = "$GPU_CHECKS_STEPS" ] && awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }'; then
        row pass train "$what"
    else
        row fail train "the loss did not fall, or steps are missing: $what"
    fi
    train_attention_own "$out"
}

# train_attention_own DIR: the training run again with our own attention kernels
# (train.attention=own) where the first ran cuDNN's: the loss at every 50th step and the last
# within 2% of the first run's (same data, same seed; the two attentions round differently).
train_attention_own() {
    local first=$1 own=$work/train-own rc=0 cmp
    grep -qs 'attention: cuDNN' "$first/run.out" || {
        row skip train-attention "the first run did not use cuDNN's attention: $(grep -ohs \
            'attention: [^;]*' "$first/run.out" | head -n 1)"
        return 0
    }
    rm -rf "$own"
    "$bin/gpurun-train" "${args[@]}" train.steps="$GPU_CHECKS_STEPS" train.eval_every=100 \
        train.ckpt_every=0 train.log_every=10 train.out_dir="$own" train.attention=own \
        >"$work/train-own.out" 2>&1 || rc=$?
    rm -f "$own"/ckpt_*.bin
    if [ "$rc" != 0 ] || [ ! -s "$own/metrics.jsonl" ]; then
        row fail train-attention "gpurun-train train.attention=own exited $rc"
        return 0
    fi
    cmp=$(awk 'FNR == 1 { f++ } { l = $0; sub(/.*"loss": /, "", l); sub(/,.*/, "", l); loss[f, FNR] = l + 0; n[f] = FNR }
               END { if (n[1] != n[2]) { print "FAIL steps " n[1] " and " n[2]; exit }
                     for (i = 50; i <= n[1] + 49; i += 50) { s = i > n[1] ? n[1] : i
                         d = (loss[1, s] - loss[2, s]) / loss[2, s]; d = d < 0 ? -d : d
                         if (d > worst) worst = d
                         out = out sprintf("%s%d: %.4f/%.4f", sep, s, loss[1, s], loss[2, s]); sep = ", " }
                     printf "%s worst %.2f%%; step: cuDNN/own %s\n", worst <= 0.02 ? "PASS" : "FAIL", worst * 100, out }' \
        "$first/metrics.jsonl" "$own/metrics.jsonl")
    case $cmp in
    PASS*) row pass train-attention "loss with cuDNN's attention against our kernels': ${cmp#PASS }" ;;
    *) row fail train-attention "loss with cuDNN's attention against our kernels' (2% allowed): ${cmp#FAIL }" ;;
    esac
}

# cmp_run NAME ARGS...: a comparison run of GPU_CHECKS_CMP_STEPS steps in $work/cmp/NAME.
cmp_run() {
    local name=$1
    shift
    "$bin/gpurun-train" "${args[@]}" train.steps="$GPU_CHECKS_CMP_STEPS" train.eval_every=0 \
        train.out_dir="$work/cmp/$name" "$@" >"$work/cmp/$name.out" 2>&1
}

step_compare() {
    local n=$GPU_CHECKS_CMP_STEPS half=$((GPU_CHECKS_CMP_STEPS / 2)) d base=$work/cmp/base
    if [ -n "$GPU_CHECKS_NO_DEVICE" ]; then
        row skip compare "$GPU_CHECKS_NO_DEVICE"
        return 0
    fi
    data=$work/data
    if ! make_data "$data" "$(vocab_of)"; then
        row fail compare "could not make token data from the texts found"
        return 0
    fi
    model_args
    rm -rf "$work/cmp" && mkdir -p "$work/cmp"
    if ! cmp_run base train.ckpt_every="$half"; then
        tail -n 20 "$work/cmp/base.out"
        row fail compare "the $n-step run alone failed (compare/base.out)"
        return 0
    fi
    grep '^run:' "$work/cmp/base.out" || true

    # The same run as a job of one rank under gpurun: it joins through rendezvousd and opens
    # NCCL as a world of one, as the run alone does, so every loss must be the same.
    if timeout -k 5 300 "$bin/gpurun" --local --gpus-per-node 1 --job-dir "$work/cmp/nccl1.job" \
        -- "$bin/gpurun-train" \
        "${args[@]}" train.steps="$n" train.eval_every=0 train.ckpt_every=0 \
        train.out_dir="$work/cmp/nccl1" >"$work/cmp/nccl1.out" 2>&1; then
        grep '^\[0\] run:' "$work/cmp/nccl1.out" || true
        if d=$(compare_losses "$base/metrics.jsonl" "$work/cmp/nccl1/metrics.jsonl") &&
            awk -v d="$d" 'BEGIN { exit !(d <= 1e-5) }'; then
            row pass "NCCL, world size 1" "$n steps under gpurun --local against alone: largest \
relative loss difference $d$([ "$d" != 0 ] || echo ' (bit-identical)')"
        else
            row fail "NCCL, world size 1" "$n steps under gpurun against alone: loss difference \
${d:-unknown (steps differ)}, above 1e-5"
        fi
    else
        tail -n 20 "$work/cmp/nccl1.out"
        row fail "NCCL, world size 1" "gpurun --local --gpus-per-node 1 failed (compare/nccl1.out)"
    fi

    if cmp_run zero1 train.zero=1 train.ckpt_every=0; then
        if d=$(compare_losses "$base/metrics.jsonl" "$work/cmp/zero1/metrics.jsonl") &&
            awk -v d="$d" 'BEGIN { exit !(d <= 1e-5) }'; then
            row pass "train.zero=1" "$n steps against zero 0: largest relative loss difference \
$d$([ "$d" != 0 ] || echo ' (bit-identical)')"
        else
            row fail "train.zero=1" "$n steps against zero 0: loss difference \
${d:-unknown (steps differ)}, above 1e-5"
        fi
    else
        tail -n 20 "$work/cmp/zero1.out"
        row fail "train.zero=1" "the run failed (compare/zero1.out)"
    fi

    # Step half's checkpoint and the metrics up to it, resumed to step n: the same metrics and
    # the same parameters and moments at step n, bit for bit.
    local ck8 ckn
    ck8=$(printf 'ckpt_%08d.bin' "$half")
    ckn=$(printf 'ckpt_%08d.bin' "$n")
    mkdir -p "$work/cmp/resume"
    if [ ! -f "$base/$ck8" ] || [ ! -f "$base/$ckn" ]; then
        row fail resume "the run alone left no checkpoints of steps $half and $n: $(ls "$base")"
    elif ! cp "$base/$ck8" "$base/metrics.jsonl" "$work/cmp/resume/" ||
        ! cmp_run resume train.ckpt_every="$half" train.resume=1; then
        tail -n 20 "$work/cmp/resume.out"
        row fail resume "the resumed run failed (compare/resume.out)"
    elif ! diff <(losses "$base/metrics.jsonl") <(losses "$work/cmp/resume/metrics.jsonl"); then
        row fail resume "steps $((half + 1))..$n after a resume from step $half: the metrics differ"
    elif ! cmp -s <(state_of "$base/$ckn") <(state_of "$work/cmp/resume/$ckn"); then
        row fail resume "the step-$n checkpoints' parameters and moments differ after a resume"
    else
        row pass resume "resumed from step $half to $n: metrics and the step-$n parameters and \
moments bit-identical"
    fi
    rm -f "$work"/cmp/*/ckpt_*.bin
}

# sanitize TOOL: the kernel tests and a short training run under TOOL (memcheck, racecheck).
# Under sim, cudasim's own checks stand in: allocations that end at a guard page with their
# tails checked after every launch (memcheck), the reverse schedule of each barrier phase
# whose results must equal the forward one's (racecheck).
sanitize() {
    local tool=$1 cs log=$work/$1 rc=0 trc=0 tests
    local -a filters=() wrap=() envs=()
    read -r -a filters <<<"$GPU_CHECKS_SAN_TESTS"
    mkdir -p "$log"
    if [ ! -f "$work/small/done" ]; then
        mkdir -p "$work/small"
        "$bin/gpurun-train" prep "$root"/jobs/* "$root"/tests/integ/*.sh -o "$work/small" >/dev/null &&
            touch "$work/small/done"
    fi
    small_cfg "$log/small.cfg" "$work/small"
    # A run of an earlier check into the same OUTDIR left its checkpoints: these runs start
    # at step 0 (a re-run would resume them, with nothing left to do).
    rm -rf "$log/run" "$log/fwd"
    if [ "$flavour" = sim ]; then
        case $tool in
        memcheck) envs=(CUDASIM_TIGHT=1) ;;
        racecheck) envs=(CUDASIM_SCHEDULE=reverse CUDASIM_TIGHT=1) ;;
        esac
        wrap=(env "${envs[@]}")
    elif [ -n "$GPU_CHECKS_NO_DEVICE" ]; then
        row skip "$tool" "$GPU_CHECKS_NO_DEVICE"
        return 0
    else
        cs=$(find_sanitizer) || {
            row skip "$tool" "compute-sanitizer not found (PATH, CUDA_HOME/bin, /usr/local/cuda*/bin)"
            return 0
        }
        echo "compute-sanitizer: $cs"
        wrap=("$cs" --tool "$tool" --error-exitcode 99 --target-processes all --print-limit 20)
    fi
    "${wrap[@]}" "$bin/tests/runner" --timeout-factor 50 "${filters[@]}" >"$log/tests.out" 2>&1 ||
        rc=$?
    cat "$log/tests.out"
    tests=$(tap_counts "$log/tests.out")
    # The training run starts NCCL, which probes its kernels for other GPUs with
    # cudaFuncGetAttributes and clears the error it gets (error 209, no kernel image): API
    # errors are not reported there (gpurun-train checks every CUDA call's result itself).
    local -a quiet=()
    [ "$flavour" = sim ] || quiet=(--report-api-errors no)
    "${wrap[@]}" "${quiet[@]}" "$bin/gpurun-train" "$log/small.cfg" train.out_dir="$log/run" \
        >"$log/train.out" 2>&1 || trc=$?
    cat "$log/train.out"
    local what="kernel tests ($GPU_CHECKS_SAN_TESTS): $tests, exit $rc; 3 training steps: exit $trc"
    if [ "$flavour" = sim ]; then
        what="cudasim ${envs[*]}: $what"
        if [ "$tool" = racecheck ] && [ "$trc" = 0 ]; then
            env CUDASIM_TIGHT=1 "$bin/gpurun-train" "$log/small.cfg" train.out_dir="$log/fwd" \
                >"$log/fwd.out" 2>&1 || trc=$?
            if [ "$trc" = 0 ] && ! diff <(losses "$log/fwd/metrics.jsonl") \
                <(losses "$log/run/metrics.jsonl") >/dev/null; then
                trc=1
                what="$what; the reverse schedule's losses differ from the forward one's"
            else
                what="$what; losses bit-identical under both schedules"
            fi
        fi
    else
        local errs
        errs=$(cat "$log/tests.out" "$log/train.out" |
            awk '/ERROR SUMMARY: / { sub(/.*ERROR SUMMARY: /, ""); n[$0]++ }
                 END { for (e in n) { printf "%s%dx %s", sep, n[e], e; sep = ", " } }')
        what="$what; error summaries: ${errs:-none printed}"
    fi
    if [ "$rc" != 0 ] || [ "$trc" != 0 ]; then
        row fail "$tool" "$what"
    elif ! grep -q '^ok .* - [^#]*$' "$log/tests.out"; then
        row skip "$tool" "$what (no kernel test ran)"
    else
        row pass "$tool" "$what"
    fi
    rm -f "$log"/*/ckpt_*.bin
}

# The kernels step's table from ncu's raw CSV (one row a kernel launch): per kernel (its name
# without arguments), launches and milliseconds per step, and its share of the kernels' time.
# Per step: the run's total over its two steps (the set-up's few kernels, the initialisation,
# are counted in too: well under 1% of the time at GPT-2 124M's size).
KERNELS_PY='
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
head = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
names, col = rows[head], rows[head].index("Kernel Name")
dur = names.index("gpu__time_duration.sum")
steps, measured = int(sys.argv[2]), sys.argv[3]
unit = {"nsecond": 1, "usecond": 1e3, "msecond": 1e6, "second": 1e9}
scale, per, calls = 1, {}, {}
for r in rows[head + 1:]:
    if len(r) <= dur:
        continue
    if r[dur] in unit:
        scale = unit[r[dur]]
    if not r[dur].replace(".", "").replace(",", "").isdigit():
        continue
    k = r[col].split("(")[0].split("<")[0].replace("void ", "").strip()
    per[k] = per.get(k, 0.0) + float(r[dur].replace(",", "")) * scale
    calls[k] = calls.get(k, 0) + 1
total = sum(per.values())
print("kernel time per step %.1f ms (%d launches); the same step measured %s ms" % (
    total / steps / 1e6, sum(calls.values()) // steps, measured))
print()
print("| kernel | launches per step | ms per step | share |")
print("|---|---:|---:|---:|")
for k, t in sorted(per.items(), key=lambda kv: -kv[1]):
    print("| %s | %d | %.2f | %.1f%% |" % (k, calls[k] // steps, t / steps / 1e6, 100 * t / total))
'

# step_kernels: Nsight Compute times every kernel of train_gpu's step (one warm-up step and
# one timed step, the duration metric alone, caches and clocks left as they are); the table of
# KERNELS_PY goes to OUTDIR/kernels.md.
step_kernels() {
    local ncu log=$work/kernels rc=0 figs b=$GPU_CHECKS_KERNELS_BATCH
    if [ "$flavour" = sim ] || [ -n "$GPU_CHECKS_NO_DEVICE" ]; then
        row skip kernels "${GPU_CHECKS_NO_DEVICE:-no hardware counters under cudasim}"
        return 0
    fi
    ncu=$(find_tool ncu) || {
        row skip kernels "ncu not found (PATH, CUDA_HOME/bin, /usr/local/cuda*/bin)"
        return 0
    }
    mkdir -p "$log"
    # Kernels launched one by one (--graphs off): the same kernels, each profiled on its own.
    "$bin/bench/train_gpu" --cfg "$root/jobs/gpt2-124m.cfg" --batches "$b" --warmup 1 --steps 1 \
        --graphs off >"$log/plain.out" 2>&1 || rc=$?
    "$ncu" --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
        --page raw --print-units base --print-kernel-base function --log-file "$log/ncu.csv" "$bin/bench/train_gpu" \
        --cfg "$root/jobs/gpt2-124m.cfg" --batches "$b" --warmup 1 --steps 1 --graphs off \
        >"$log/ncu.out" 2>&1 || rc=$?
    if [ "$rc" != 0 ] || ! "$PYTHON" -c "$KERNELS_PY" "$log/ncu.csv" 2 \
        "$(awk -F'|' '$2 ~ /^ *[0-9]+ *$/ { gsub(/ /, "", $4); print $4 }' "$log/plain.out")" \
        >"$out/kernels.md"; then
        tail -n 20 "$log/ncu.out" "$log/plain.out"
        row fail kernels "ncu or its table failed (exit $rc; see kernels.log)"
        return 0
    fi
    cat "$out/kernels.md"
    figs=$(head -n 1 "$out/kernels.md")
    figs="$figs; top: $(sed -n '5,9p' "$out/kernels.md" | awk -F'|' '{ gsub(/ /, "")
        printf "%s%s %s", sep, $2, $5; sep = ", " }') (kernels.md)"
    row pass kernels "B=$b: $figs"
}

# find_tool NAME: a CUDA tool's path (compute-sanitizer, ncu).
find_tool() {
    local c
    for c in "$(command -v "$1" 2>/dev/null)" ${CUDA_HOME:+"$CUDA_HOME/bin/$1"} \
        /usr/local/cuda/bin/"$1" /usr/local/cuda-*/bin/"$1" /usr/local/cuda/"$1/$1" \
        /opt/nvidia/*/"$1" /opt/nvidia/nsight-compute/*/"$1"; do
        [ -n "$c" ] && [ -x "$c" ] && {
            echo "$c"
            return 0
        }
    done
    return 1
}

# find_sanitizer: compute-sanitizer's path.
find_sanitizer() {
    find_tool compute-sanitizer
}

if [ "${1:-}" = --step ]; then
    [ $# -eq 3 ] || die "usage: $0 --step NAME OUTDIR"
    name=$2 out=$3 work=$3/work
    results=$out/$name.rows
    row_t0=$SECONDS
    : >"$results"
    mkdir -p "$work"
    case $name in
    tests) step_tests ;;
    bench) step_bench ;;
    anchor) step_anchor ;;
    attention) step_attention ;;
    train) step_train ;;
    compare) step_compare ;;
    memcheck) sanitize memcheck ;;
    racecheck) sanitize racecheck ;;
    ddp) step_ddp ;;
    kernels) step_kernels ;;
    seeds) step_seeds ;;
    *) die "no step '$name'" ;;
    esac
    exit 0
fi

# --- the parent: libraries, then the steps, then the report -----------------------------------

[ $# -eq 1 ] || die "usage: $0 OUTDIR"
mkdir -p "$1"
out=$(cd "$1" && pwd)
[ -x "$bin/gpurun-train" ] || die "'$bin/gpurun-train' not found: run this from the GPU bundle"
env_txt=$out/env.txt
: >"$env_txt"
# The steps' scratch (TMPDIR's too) under OUTDIR, so that a failure's files stay with it.
mkdir -p "$out/work"

# cuda_dirs: the folders that may hold CUDA's libraries, best first, one a line.
cuda_dirs() {
    local d nvcc p
    if [ -n "${GPU_CHECKS_CUDA_LIBS:-}" ]; then
        tr ':' '\n' <<<"$GPU_CHECKS_CUDA_LIBS"
    fi
    nvcc=$(command -v nvcc 2>/dev/null) || nvcc=
    for d in ${CUDA_HOME:+"$CUDA_HOME"} ${CUDA_PATH:+"$CUDA_PATH"} ${nvcc:+"${nvcc%/bin/nvcc}"} \
        /usr/local/cuda /usr/local/cuda-*; do
        for p in "$d/lib64" "$d/lib" "$d/targets/x86_64-linux/lib"; do
            [ -d "$p" ] && echo "$p"
        done
    done
    # The Python wheels (nvidia-cuda-runtime, nvidia-cublas, nvidia-nccl...): nvidia/*/lib.
    "$PYTHON" -c 'import nvidia, os
for p in nvidia.__path__:
    for root, dirs, files in os.walk(p):
        if root.count(os.sep) - p.count(os.sep) >= 2:
            dirs[:] = []
        if any(".so" in f for f in files):
            print(root)' 2>/dev/null | LC_ALL=C sort || true
}

# The CUDA libraries the programs need (the bundle leaves them out): each from the first
# folder that has it, else from the loader's own search (ldconfig's cache).
declare -A where=()
mapfile -t progs < <(find "$bin" -type f -perm -u+x | LC_ALL=C sort)
mapfile -t needed < <(for f in "${progs[@]}"; do ldd "$f" 2>/dev/null; done |
    awk '{ print $1 }' | grep -E '^lib(cuda|cudart|cublas|cublasLt|nccl|nvrtc|nvJitLink)\.so' |
    LC_ALL=C sort -u)
# cuDNN is loaded at run time (kernels/cuda/attention_cudnn.cpp): ldd does not list it.
if [ "$flavour" = cuda ] && grep -qs libcudnn.so.9 "$bin/gpurun-train"; then
    needed+=(libcudnn.so.9)
fi
mapfile -t dirs < <(cuda_dirs | awk '!seen[$0]++')
libpath=
lib_lines=()
for so in "${needed[@]}"; do
    for d in "${dirs[@]}"; do
        if [ -e "$d/$so" ]; then
            where[$so]=$d
            case ":$libpath:" in
            *":$d:"*) ;;
            *) libpath=${libpath:+$libpath:}$d ;;
            esac
            break
        fi
    done
    if [ -n "${where[$so]:-}" ]; then
        case ${where[$so]} in
        */nvidia/*) kind="a Python wheel" ;;
        *) kind="the CUDA toolkit" ;;
        esac
        lib_lines+=("$so: ${where[$so]} ($kind)")
    else
        p=$(ldd "${progs[@]}" 2>/dev/null | awk -v so="$so" '$1 == so && $3 != "not" { print $3; exit }')
        if [ -n "$p" ]; then
            lib_lines+=("$so: $p (the system loader's search)")
        else
            lib_lines+=("$so: NOT FOUND (searched: ${dirs[*]:-no CUDA folder found})")
        fi
    fi
done
[ ${#needed[@]} -gt 0 ] || lib_lines=("none needed (the $flavour flavour)")
export GPU_CHECKS_NODE_LD_PATH=${LD_LIBRARY_PATH:-}
if [ -n "$libpath" ]; then
    export LD_LIBRARY_PATH=$libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
missing=$(for f in "${progs[@]}"; do ldd "$f" 2>/dev/null; done |
    awk '/not found/ { print $1 }' | LC_ALL=C sort -u | tr '\n' ' ')

gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null |
    head -n 1) || gpu=
devices=$("$bin/tests/coll_rank" devices 2>&1 | head -n 1) || devices="coll_rank devices failed: $devices"
# Without a device (the cuda flavour), the training steps skip with coll_rank's reason.
no_device=
case $devices in
"nccl none: "*) no_device=${devices#nccl none: } ;;
"nccl "*" devices 0 "*) no_device="no CUDA device available" ;;
"nccl "*" devices "*) ;;
*) no_device="coll_rank does not run: $devices" ;;
esac
export GPU_CHECKS_NO_DEVICE=$no_device
{
    echo "bundle: flavour $flavour, commit ${commit:-unknown}"
    echo "host: $(uname -srm), $(nproc) CPUs"
    echo "GPU: ${gpu:-none listed by nvidia-smi}"
    echo "coll_rank devices: $devices"
    echo "CUDA libraries:"
    printf '  %s\n' "${lib_lines[@]}"
    echo "LD_LIBRARY_PATH: ${LD_LIBRARY_PATH:-unset}"
    echo "unresolved libraries: ${missing:-none}"
    echo "compute-sanitizer: $(find_sanitizer || echo 'not found')"
    echo "python3: $(command -v "$PYTHON" || echo 'not found')"
    echo
    for f in "${progs[@]}"; do
        echo "ldd ${f#"$root"/}:"
        ldd "$f" 2>&1 | sed 's/^/  /'
    done
} >>"$env_txt"
sed -n '1,/^$/p' "$env_txt"

# report: OUTDIR/report.md from the rows so far (rewritten after every step, so that a run
# cut short still leaves one).
report() {
    local f status name secs figs
    {
        echo "# GPU checks ($flavour flavour)"
        echo
        echo "- bundle: commit ${commit:-unknown}, flavour $flavour; $(date -u +%Y-%m-%dT%H:%MZ)"
        echo "- GPU: ${gpu:-none listed by nvidia-smi}; coll_rank: $devices"
        echo "- CUDA libraries: $(printf '%s; ' "${lib_lines[@]}" | sed 's/; $//')"
        [ -z "$missing" ] || echo "- unresolved libraries: $missing"
        echo "- logs: <step>.log beside this file; env.txt: the libraries and ldd of every program"
        echo
        echo "| check | result | time | figures |"
        echo "|---|---|---:|---|"
        for f in "${STEPS[@]}"; do
            [ -f "$out/$f.rows" ] || continue
            while IFS=$'\t' read -r status name secs figs; do
                echo "| $name | $status | $secs s | ${figs//|/\\|} |"
            done <"$out/$f.rows"
        done
        echo
        echo "$(cat "$out"/*.rows 2>/dev/null | cut -f1 | sort | uniq -c |
            awk '{ printf "%s%d %s", sep, $1, $2; sep = ", " }'); total $((SECONDS - t_start)) s"
    } >"$out/report.md"
}

# Stopped from outside: timeout(1) passes the signal on to the step's process group (out of
# reach of a signal to this script's group), and the report keeps what finished.
step_pid=
# shellcheck disable=SC2317 # run by the trap below
on_signal() {
    if [ -n "$step_pid" ]; then
        kill -TERM "$step_pid" 2>/dev/null || true
        wait "$step_pid" 2>/dev/null || true
    fi
    report
    echo "run-gpu-checks: stopped by a signal; $out/report.md holds the checks that finished" >&2
    exit 143
}
trap on_signal INT TERM

# Every step but the last, seeds, unless asked for.
all_steps="${STEPS[*]}"
only=${GPU_CHECKS_ONLY:-${all_steps% seeds}}
t_start=$SECONDS
failed=0
for s in "${STEPS[@]}"; do
    rm -f "$out/$s.rows" "$out/$s.log"
done
for s in "${STEPS[@]}"; do
    case " $only " in
    *" $s "*) ;;
    *) continue ;;
    esac
    var=GPU_CHECKS_${s^^}_S
    budget=${!var:-${BUDGET[$s]}}
    left=$((GPU_CHECKS_TOTAL - (SECONDS - t_start)))
    [ "$budget" -le "$left" ] || budget=$left
    if [ "$budget" -lt 5 ]; then
        printf 'timeout\t%s\t0\t%s\n' "$s" "not run: no time left of GPU_CHECKS_TOTAL=$GPU_CHECKS_TOTAL s" \
            >"$out/$s.rows"
        failed=1
        report
        continue
    fi
    echo "== $s (budget $budget s)"
    t0=$SECONDS
    rc=0
    # The step in a process group of its own under its budget: SIGTERM, then SIGKILL 10 s on.
    TMPDIR=$out/work GPU_CHECKS_STEP_BUDGET=$budget timeout -k 10 "$budget" "$self" --step "$s" \
        "$out" >"$out/$s.log" 2>&1 </dev/null &
    step_pid=$!
    wait "$step_pid" || rc=$?
    step_pid=
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        printf 'timeout\t%s\t%s\t%s\n' "$s" "$((SECONDS - t0))" \
            "stopped at its budget of $budget s (GPU_CHECKS_${s^^}_S); the rows above are its \
checks that finished" >>"$out/$s.rows"
    elif [ "$rc" != 0 ] || [ ! -s "$out/$s.rows" ]; then
        printf 'fail\t%s\t%s\t%s\n' "$s" "$((SECONDS - t0))" "the step exited $rc (see $s.log)" \
            >>"$out/$s.rows"
    fi
    grep -E '^== ' "$out/$s.log" | tail -n 5 || true
    cut -f1 "$out/$s.rows" | grep -qvxE 'pass|skip' && failed=1
    report
done
report
echo
cat "$out/report.md"
exit "$failed"
