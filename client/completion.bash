# bash completion of gpurun (installed as PREFIX/share/bash-completion/completions/gpurun,
# where bash-completion loads it; or source it). The subcommands and each one's options come
# from the help of the gpurun being completed (`gpurun --help`, `gpurun SUBCOMMAND --help`), so
# that they cannot drift from it; job ids are the job dirs of the jobs root ($GPURUN_JOBS, else
# ~/.gpurun/jobs). It needs bash alone, not the bash-completion package's helpers.
# shellcheck shell=bash

# _gpurun_help GPURUN [SUBCOMMAND]: that help, or nothing when gpurun cannot be run.
_gpurun_help() {
    local prog=$1
    shift
    command -v "$prog" >/dev/null 2>&1 || return 0
    "$prog" "$@" --help 2>/dev/null
}

# _gpurun_subcommands HELP: the names listed under "subcommands" in gpurun's help.
_gpurun_subcommands() {
    local line in=0
    while IFS= read -r line; do
        if [[ $line == subcommands* ]]; then
            in=1
        elif [ "$in" = 1 ]; then
            [[ $line =~ ^\ \ ([a-z][a-z-]*)\  ]] || break
            printf '%s\n' "${BASH_REMATCH[1]}"
        fi
    done <<<"$1"
}

# _gpurun_options HELP: each option of the "options:" section, as "NAME ARG" lines: ARG is
# "-" for a flag, "=" for an optional "=VALUE", else the option's metavariable.
_gpurun_options() {
    local line in=0 re='^  (-([A-Za-z]), |    )--([a-z][a-z-]*)(\[=|[ ]([^ ]+))?'
    while IFS= read -r line; do
        if [ "$line" = options: ]; then
            in=1
        elif [ "$in" = 1 ]; then
            [ -n "$line" ] || break
            [[ $line =~ $re ]] || continue
            local arg=${BASH_REMATCH[5]:-"-"}
            [ "${BASH_REMATCH[4]}" = "[=" ] && arg="="
            printf -- '--%s %s\n' "${BASH_REMATCH[3]}" "$arg"
            [ -n "${BASH_REMATCH[2]}" ] && printf -- '-%s %s\n' "${BASH_REMATCH[2]}" "$arg"
        fi
    done <<<"$1"
}

# _gpurun_job_ids: the ids of the job dirs in the jobs root (what `gpurun status` lists).
_gpurun_job_ids() {
    local root=${GPURUN_JOBS:-$HOME/.gpurun/jobs} f
    for f in "$root"/*/job.json; do
        [ -e "$f" ] || continue
        f=${f%/job.json}
        printf '%s\n' "${f##*/}"
    done
}

# _gpurun_add WORDS CUR: appends the lines of WORDS that start with CUR to COMPREPLY. (Here
# strings, not process substitutions: a shell that ends at once, as a test's does, would leave
# those behind unreaped.)
_gpurun_add() {
    local w
    while IFS= read -r w; do
        [ -n "$w" ] && [[ $w == "$2"* ]] && COMPREPLY+=("$w")
    done <<<"$1"
}

# _gpurun_files CUR: appends the files and directories that start with CUR to COMPREPLY.
_gpurun_files() {
    compopt -o filenames 2>/dev/null || true
    _gpurun_add "$(compgen -f -- "$1")" "$1"
}

_gpurun() {
    local cur=${COMP_WORDS[COMP_CWORD]} prog=${COMP_WORDS[0]} opt='' eq='' sub='' help sub_help
    local opts arg i w a
    COMPREPLY=()
    [ "$COMP_CWORD" -gt 0 ] && opt=${COMP_WORDS[COMP_CWORD - 1]}
    # After "--" (or a SCRIPT.py) the words are the ranks' command: a command, then bash's
    # own completion.
    for ((i = 1; i < COMP_CWORD; i++)); do
        w=${COMP_WORDS[i]}
        if [ "$w" = -- ] || [[ $w == *.py && ${COMP_WORDS[i - 1]} != -* ]]; then
            if [ "$i" = $((COMP_CWORD - 1)) ] && [ "$w" = -- ]; then
                _gpurun_add "$(compgen -c -- "$cur" | LC_ALL=C sort -u)" "$cur"
            fi
            return 0
        fi
    done
    help=$(_gpurun_help "$prog")
    sub_help=$help
    if [ "$COMP_CWORD" -gt 1 ]; then
        while IFS= read -r w; do
            [ "$w" = "${COMP_WORDS[1]}" ] && sub=$w
        done <<<"$(_gpurun_subcommands "$help")"
        [ -n "$sub" ] && sub_help=$(_gpurun_help "$prog" "$sub")
    fi
    opts=$(_gpurun_options "$sub_help")
    # "--opt=VALUE": bash splits the word at '=' (COMP_WORDBREAKS).
    if [ "$cur" = = ]; then
        eq=1 cur=''
    elif [ "$opt" = = ] && [ "$COMP_CWORD" -gt 1 ]; then
        eq=1 opt=${COMP_WORDS[COMP_CWORD - 2]}
    fi
    arg=$(while read -r w a; do [ "$w" = "$opt" ] && printf '%s\n' "$a"; done <<<"$opts")
    case $arg in
    "" | -) [ -z "$eq" ] || return 0 ;;
    =)
        # --exclusive[=user|mcs]: a value only after '='.
        if [ -n "$eq" ]; then
            _gpurun_add $'user\nmcs' "$cur"
            return 0
        fi
        ;;
    LEVEL)
        _gpurun_add $'error\nwarn\ninfo\ndebug' "$cur"
        return 0
        ;;
    MODE)
        _gpurun_add $'none\nsingle' "$cur"
        return 0
        ;;
    DIR)
        compopt -o filenames 2>/dev/null || true
        _gpurun_add "$(compgen -d -- "$cur")" "$cur"
        return 0
        ;;
    FILE)
        _gpurun_files "$cur"
        return 0
        ;;
    *) return 0 ;;
    esac
    if [[ $cur == -* ]]; then
        _gpurun_add "$(while read -r w a; do printf '%s\n' "$w"; done <<<"$opts")" "$cur"
        return 0
    fi
    case $sub in
    "")
        # gpurun's first word: a subcommand, else (as any later word) a train.cfg, a script or
        # an override.
        [ "$COMP_CWORD" = 1 ] && _gpurun_add "$(_gpurun_subcommands "$help")" "$cur"
        _gpurun_files "$cur"
        ;;
    status | logs | cancel) _gpurun_add "$(_gpurun_job_ids)" "$cur" ;;
    help) [ "$COMP_CWORD" = 2 ] && _gpurun_add "$(_gpurun_subcommands "$help")" "$cur" ;;
    esac
    return 0
}

complete -o bashdefault -o default -F _gpurun gpurun
