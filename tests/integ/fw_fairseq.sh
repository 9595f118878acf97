#!/usr/bin/env bash
# The frameworks lane (fw_common.sh): fairseq-hydra-train from PyPI's fairseq-fixed 0.12.3.1
# (the 0.12 line that runs on Python 3.11), a 2-layer transformer_lm on CPUs over gloo
# (tests/python/fairseq/tiny_lm.yaml), launched as a guide launches it but with no
# MASTER_IP, RANK or WORLD_SIZE set by hand:
#   - with distributed_training.distributed_world_size=2, in both layouts of 2 ranks: fairseq
#     finds torch's env:// variables, the 2 ranks end with the same parameters in either
#     layout (each prints them through a user module, tests/python/fairseq/gpurun_lane_probe,
#     fairseq logging on its master only), each with its share of the CPU threads;
#   - without it, fairseq's default: each rank trains alone, as a world of 1, and gpurun's end
#     line, summary.json and status say the ranks never met, with fairseq's fix; with
#     --require-rendezvous the same job fails, exit 125.
#
# fairseq's source release is built here (only its two Cython modules the language-model
# task uses: its C++ and CUDA extensions are for other tasks) into the build dir's
# python-deps/fairseq, with its pure-Python dependencies, once (about 40 s), and kept there.
# timeout: 900
set -euo pipefail
# shellcheck source=fw_common.sh
. "$(dirname "$0")/fw_common.sh"

FAIRSEQ=fairseq-fixed==0.12.3.1
fw_need_python
# fairseq's install_requires that its training imports reach and Debian lacks (numpy, yaml
# and cffi are Debian's), pinned: hydra-core and omegaconf at fairseq-fixed's own pins,
# antlr4's runtime at omegaconf's; scikit-learn (with scipy) because fairseq imports all of
# its tasks, and two import sklearn; Cython to build fairseq's data modules.
fw_install fairseq-deps hydra-core==1.3.2 omegaconf==2.3.0 antlr4-python3-runtime==4.9.3 \
    bitarray==2.8.2 regex==2023.5.5 tqdm==4.65.0 packaging==23.1 sacrebleu==2.3.1 \
    portalocker==2.8.2 tabulate==0.9.0 colorama==0.4.6 lxml==4.9.3 scikit-learn==1.3.2 \
    scipy==1.11.4 joblib==1.3.2 threadpoolctl==3.2.0 Cython==3.0.5 || skip "$fw_why"

# fairseq itself, from its source release: the two Cython modules built in place, the one
# CPU fix below applied, and the console script pip would write.
src=$deps/fairseq
if [ "$(cat "$src/.stamp" 2>/dev/null)" != "$FAIRSEQ cpu-fix" ]; then
    rm -rf "$src" "$src.tmp"
    mkdir -p "$src.tmp/dl"
    t0=$(date +%s%N)
    # Its release is a source release only; pip reads its metadata by running its setup.py,
    # which imports torch: Debian's, not one pip would fetch into an isolated build.
    rc=0
    timeout -k 5 "$PIP_LIMIT" "$python" -m pip download --quiet --disable-pip-version-check \
        --no-deps --no-build-isolation -d "$src.tmp/dl" "$FAIRSEQ" >"$work/pip-fairseq.out" 2>&1 ||
        rc=$?
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        skip "fairseq: pip download took over $PIP_LIMIT s"
    fi
    [ "$rc" = 0 ] || skip "fairseq: pip download of $FAIRSEQ failed: $(grep -m1 -E 'ERROR|error' \
        "$work/pip-fairseq.out" || tail -n1 "$work/pip-fairseq.out")"
    tar -xzf "$src.tmp"/dl/*.tar.gz -C "$src.tmp" --strip-components=1
    rm -rf "$src.tmp/dl"
    # fairseq under torchrun's variables takes the rank's device as RANK modulo the GPUs,
    # a ZeroDivisionError on a machine without one (fairseq/distributed/utils.py,
    # _infer_torch_distributed_launch_init); a GPU node never meets it. The test's copy
    # counts at least one device.
    sed -i 's/cfg.distributed_rank % torch.cuda.device_count()/cfg.distributed_rank % max(1, torch.cuda.device_count())/' \
        "$src.tmp/fairseq/distributed/utils.py"
    grep -q 'max(1, torch.cuda.device_count())' "$src.tmp/fairseq/distributed/utils.py" ||
        fail "fairseq: $FAIRSEQ's distributed/utils.py no longer has the line the CPU fix is for"
    (cd "$src.tmp" && PYTHONPATH=$deps/fairseq-deps "$python" -c '
import numpy
from setuptools import Extension, setup
from Cython.Build import cythonize
mods = ["data_utils_fast", "token_block_utils_fast"]
setup(name="fairseq-data", script_args=["build_ext", "--inplace"], ext_modules=cythonize(
    [Extension("fairseq.data." + m, ["fairseq/data/%s.pyx" % m], language="c++",
               include_dirs=[numpy.get_include()], extra_compile_args=["-std=c++11", "-O2"])
     for m in mods], quiet=True))' >"$work/build-fairseq.out" 2>&1) ||
        fail "fairseq: building its Cython modules failed: $(tail -n 3 "$work/build-fairseq.out")"
    # pip's console script for setup.py's "fairseq-hydra-train = fairseq_cli.hydra_train:cli_main".
    mkdir -p "$src.tmp/bin"
    printf '#!%s\nimport sys\nfrom fairseq_cli.hydra_train import cli_main\nsys.exit(cli_main())\n' \
        "$python" >"$src.tmp/bin/fairseq-hydra-train"
    chmod +x "$src.tmp/bin/fairseq-hydra-train"
    echo "$FAIRSEQ cpu-fix" >"$src.tmp/.stamp"
    mv "$src.tmp" "$src"
    echo "# fairseq: source release built in $((($(date +%s%N) - t0) / 1000000)) ms"
fi
export PYTHONPATH=$src:$deps/fairseq-deps PATH=$src/bin:$PATH

# The corpus: 128 lines of 16 words over 40 words, binarised by fairseq's own preprocess.
"$python" -c '
import random, sys
r = random.Random(7)
for name, n in (("train", 128), ("valid", 16)):
    with open("%s/%s.txt" % (sys.argv[1], name), "w") as f:
        for _ in range(n):
            f.write(" ".join("w%d" % r.randrange(40) for _ in range(16)) + "\n")' "$work"
"$python" -m fairseq_cli.preprocess --only-source --trainpref "$work/train.txt" \
    --validpref "$work/valid.txt" --destdir "$work/data-bin" --workers 1 \
    >"$work/preprocess.out" 2>&1 || fail "fairseq-preprocess: $(tail -n 3 "$work/preprocess.out")"

conf=$root/tests/python/fairseq
cmd=(fairseq-hydra-train -m --config-dir "$conf" --config-name tiny_lm "task.data=$work/data-bin"
    "common.user_dir=$conf/gpurun_lane_probe" "hydra.sweep.dir=$work/hydra")
fw_both fairseq -- "${cmd[@]}" distributed_training.distributed_world_size=2

# Without the world size: 2 models of one rank each, said.
fix="fairseq trains alone while its distributed_world_size is 1: add"
fix+=" distributed_training.distributed_world_size=2 to its command"
fw_run fairseq-alone 1x2 -- "${cmd[@]}"
[ "$rc" = 0 ] || fail "fairseq alone: gpurun exited with status $rc, not 0 (no --require-rendezvous)"
[ "$(fw_lines fairseq-alone 1x2 | grep -c ' rank 0/1 ')" = 2 ] ||
    fail "fairseq alone: not both ranks trained as a world of 1: '$(fw_lines fairseq-alone 1x2)'"
grep -q "completed in [0-9.]* s, but the 2 ranks never met: .*; $fix; logs in " \
    "$work/fairseq-alone-1x2.err" || fail "fairseq alone: the end line does not say the ranks never met, with the fix"
grep -q '"ranks_met": false' "$work/fairseq-alone-1x2/summary.json" ||
    fail "fairseq alone: summary.json does not say ranks_met false"
grep -qF "$fix" "$work/fairseq-alone-1x2/summary.json" ||
    fail "fairseq alone: summary.json's alone lacks the fix"
run status --job-dir "$work/fairseq-alone-1x2"
grep -q "^warning: the 2 ranks never met" "$work/out" ||
    fail "fairseq alone: gpurun status has no 'warning: the 2 ranks never met' line"
echo "# fairseq alone: $(grep -o 'but the 2 ranks never met[^;]*' "$work/fairseq-alone-1x2.err")"

fw_run fairseq-alone 2x1 --require-rendezvous -- "${cmd[@]}"
[ "$rc" = 125 ] || fail "fairseq alone, --require-rendezvous: exit $rc, not 125"
grep -qF "$fix" "$work/fairseq-alone-2x1.err" ||
    fail "fairseq alone, --require-rendezvous: gpurun's error lacks the fix"
