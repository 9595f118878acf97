#!/usr/bin/env bash
# A resume never loses a checkpoint: a newest checkpoint of a newer format version, or one
# that cannot be read (a directory of its name; a file without read permission when not root),
# stops the run with exit 1 and one line naming it, every file left as it was; a damaged newest
# one (one flipped byte) gives way to the older valid one, with a warning naming it, and is
# kept as <name>.damaged, and the run continues bit for bit; the temp files of killed saves
# are removed at the next start, a live process's kept.
# timeout: 120
set -euo pipefail
# shellcheck source=train_common.sh
. "$(dirname "$0")/train_common.sh"

cd "$work"
train small.cfg train.ckpt_every=5 train.out_dir=a
expect_rc 0 "10 steps with ckpt_every=5"
c5=ckpt_00000005.bin
c10=ckpt_00000010.bin

# expect_stop DIR LINE: a resume in DIR exits 1 with LINE as its stderr and changes nothing.
expect_stop() {
    local before
    before=$(cd "$1" && ls -l --time-style=+%s.%N)
    train small.cfg train.out_dir="$1" train.resume=1 train.steps=12
    expect_rc 1 "a resume in '$1'"
    [ "$(cat "$work/err")" = "gpurun-train: $2" ] ||
        fail "stderr is '$(cat "$work/err")', expected 'gpurun-train: $2'"
    [ "$(cd "$1" && ls -l --time-style=+%s.%N)" = "$before" ] ||
        fail "'$1' changed: $(ls -l "$1")"
}

# A newer format version (the uint32 at byte 8).
cp -r a newer
printf '\x02' | dd of=newer/$c10 bs=1 seek=8 conv=notrunc status=none
expect_stop newer "cannot resume: 'newer/$c10': checkpoint format version 2 is newer than this gpurun-train's (1)"
cmp -s a/$c5 newer/$c5 || fail "the older checkpoint changed"

# Unreadable: a directory named like the newest checkpoint.
mkdir dir
cp a/$c5 a/metrics.jsonl dir/
mkdir dir/$c10
expect_stop dir "cannot resume: cannot read 'dir/$c10': not a regular file"
# Unreadable: no read permission. Root reads any file, so this case needs another user.
if [ "$(id -u)" != 0 ]; then
    cp -r a perm
    chmod 000 perm/$c10
    expect_stop perm "cannot resume: cannot open 'perm/$c10': Permission denied"
    chmod 644 perm/$c10
else
    echo "# as root: the unreadable-by-permission case is not run (root reads any file)"
fi
echo "# a newer or unreadable newest checkpoint stops the resume, nothing removed"

# Damaged: one byte flipped in the parameters of the newest.
cp -r a dmg
size=$(stat -c %s dmg/$c10)
printf '\x55' | dd of=dmg/$c10 bs=1 seek=$((size - 1000)) conv=notrunc status=none
cp dmg/$c10 damaged.bin
train small.cfg train.out_dir=dmg train.resume=1
expect_rc 0 "a resume past a damaged checkpoint"
want="gpurun-train: warning: 'dmg/$c10': checksum mismatch: the file is damaged; kept as 'dmg/$c10.damaged', resuming from the older 'dmg/$c5'"
[ "$(cat "$work/err")" = "$want" ] || fail "stderr is '$(cat "$work/err")', expected '$want'"
expect_out_line "resuming from 'dmg/$c5' at step 5"
cmp -s damaged.bin dmg/$c10.damaged || fail "the damaged file was not kept as it was"
diff <(losses a/metrics.jsonl) <(losses dmg/metrics.jsonl) >"$work/diff" || {
    cat "$work/diff"
    fail "the run resumed from step 5 differs from the one that went on"
}
cmp -s <(state_of a/$c10) <(state_of dmg/$c10) || fail "the new step-10 checkpoint differs from the uninterrupted run's"
# Once two newer checkpoints are saved, the damaged one goes with the old ones.
train small.cfg train.out_dir=dmg train.resume=1 train.steps=11 train.ckpt_every=1
expect_rc 0 "one more step"
[ -e dmg/$c10.damaged ] || fail "'dmg/$c10.damaged' removed with checkpoint 10 still kept"
train small.cfg train.out_dir=dmg train.resume=1 train.steps=12 train.ckpt_every=1
expect_rc 0 "two more steps"
[ "$(cd dmg && echo ckpt_*)" = "ckpt_00000011.bin ckpt_00000012.bin" ] ||
    fail "after steps 11 and 12 'dmg' holds $(cd dmg && echo ckpt_*)"
echo "# a damaged newest checkpoint: warned, kept aside, the older one resumed bit for bit"

# Damaged with nothing older: an error, the file left.
mkdir lone
cp damaged.bin lone/$c10
expect_stop lone "cannot resume: 'lone/$c10': checksum mismatch: the file is damaged; no older checkpoint in 'lone'"

# Temp files of killed saves: a dead pid's goes, a live one's (this shell's) stays.
cp -r a tmp
sh -c 'exit 0' &
dead=$!
wait "$dead"
head -c 5000 /dev/zero >tmp/ckpt_00000011.bin.tmp.$dead
head -c 100 /dev/zero >tmp/ckpt_00000012.bin.tmp.$$
touch -d '1 hour ago' tmp/ckpt_00000011.bin.tmp.$dead tmp/ckpt_00000012.bin.tmp.$$
train small.cfg train.out_dir=tmp train.resume=1 train.steps=12
expect_rc 0 "a resume with temp files"
expect_out_line "out_dir 'tmp': removed 1 temp file of interrupted saves (0.0 MB)"
[ ! -e tmp/ckpt_00000011.bin.tmp.$dead ] || fail "a dead pid's temp file was kept"
[ -e tmp/ckpt_00000012.bin.tmp.$$ ] || fail "a live pid's temp file was removed"
# A run that starts at step 0 (no checkpoint, train.resume=0) cleans them too.
mkdir tmp0
head -c 100 /dev/zero >tmp0/ckpt_00000012.bin.tmp.$dead
touch -d '1 hour ago' tmp0/ckpt_00000012.bin.tmp.$dead
train small.cfg train.out_dir=tmp0 train.steps=2 train.resume=0
expect_rc 0 "a fresh run with a temp file"
expect_out_line "out_dir 'tmp0': removed 1 temp file of interrupted saves (0.0 MB)"
echo "# killed saves' temp files removed at the next start, a live process's kept"
