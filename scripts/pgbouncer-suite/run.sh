#!/usr/bin/env bash
# Runs PgBouncer's own test suite against weir.
#
#   scripts/pgbouncer-suite/run.sh [--tag TAG] [--weir PATH] [--bouncer PATH] [--keep] [ARGS...]
#
# The suite of PgBouncer TAG (default pgbouncer_1_25_2, its pytest suite) is
# taken from PgBouncer's git repository (PGBOUNCER_GIT: a clone or bare
# mirror; default the one in /work/.mirror, else a shallow clone into the
# cache) into a fresh temp dir, never into this repository. Its test.ini is
# used unchanged. In place of the `pgbouncer` binary the suite starts
# (`test/../pgbouncer`) goes ./pgbouncer, which runs weir on the ini
# (--bouncer PATH: that program instead, e.g. a real PgBouncer, for a
# baseline). Python needs are installed from PyPI into a venv in the cache
# (WEIR_SUITE_CACHE, default ~/.cache/weir-pgbouncer-suite).
#
# The suites before 1.19 are shell scripts (test/test.sh, then
# test/ssl/test.sh) on fixed ports (6666, 6667) and Unix sockets in /tmp:
# as root they run in a network and mount namespace of their own (a private
# /tmp), so they touch nothing of the machine's (not as root, on the
# machine's ports and /tmp, which must be free). ARGS then name tests of
# either script (test_show test_client_ssl).
#
# At the end: the pass/fail/error/skip counts, and each test whose outcome
# differs from expected-TAG.txt (every test not listed there is expected to
# pass). Exit status 0 when nothing differs from the list.
#
# Needs: Postgres server programs on PATH (initdb, pg_ctl), openssl, socat;
# for the shell suites as root, unshare(1) and ip(8).
# A test name or -k filter can follow: run.sh test/test_admin.py -k kill
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
tag=pgbouncer_1_25_2
weir=
bouncer=
keep=false
while (($#)); do
    case $1 in
        --tag) tag=$2; shift ;;
        --weir) weir=$2; shift ;;
        --bouncer) bouncer=$2; shift ;;
        --keep) keep=true ;;
        *) break ;;
    esac
    shift
done
# Postgres's initdb refuses root: as root the suite runs as `postgres`.
as_user=()
if ((EUID == 0)); then
    as_user=(runuser -u postgres --)
    cache=${WEIR_SUITE_CACHE:-/var/tmp/weir-pgbouncer-suite}
else
    cache=${WEIR_SUITE_CACHE:-$HOME/.cache/weir-pgbouncer-suite}
fi
mkdir -p "$cache"

# The PgBouncer sources (only test/ and two files the suite reads).
git_dir=${PGBOUNCER_GIT:-/work/.mirror/pgbouncer+pgbouncer/repo}
if ! git -C "$git_dir" rev-parse --verify -q "$tag^{commit}" >/dev/null 2>&1; then
    git_dir=$cache/pgbouncer.git
    [[ -d $git_dir ]] || git clone --bare --filter=blob:none https://github.com/pgbouncer/pgbouncer "$git_dir"
    git -C "$git_dir" fetch -q origin "refs/tags/$tag:refs/tags/$tag"
fi
# Before 1.19 the suite is shell scripts (no conftest.py).
legacy=false
git -C "$git_dir" cat-file -e "$tag:test/conftest.py" 2>/dev/null || legacy=true
# The shell suites get a private /tmp: their own dir must be elsewhere.
if $legacy; then
    work=$(mktemp -d /var/tmp/weir-pgbouncer-suite.XXXXXX)
else
    work=$(mktemp -d "${TMPDIR:-/tmp}/weir-pgbouncer-suite.XXXXXX")
fi
$keep || trap 'rm -rf "$work"' EXIT
files=(test/ include/bouncer.h)
$legacy || files+=(pyproject.toml)
git -C "$git_dir" archive "$tag" "${files[@]}" | tar -x -C "$work"
# What ./configure would have said: built with TLS, without LDAP.
printf 'tls_support = yes\nldap_support = no\n' >"$work/config.mak"
if [[ -n $bouncer ]]; then
    ln -s "$(command -v "$bouncer")" "$work/pgbouncer"
else
    ln -s "$here/pgbouncer" "$work/pgbouncer"
fi
# The user the suite runs as, when root: `postgres`; for the shell suites
# `nobody`, since their userlist.txt names `postgres` and the script adds
# its long-password user only for a user the list lacks.
suite_user=postgres
! $legacy || suite_user=nobody
((EUID != 0)) || chown -R "$suite_user" "$work"
((EUID != 0)) || chown -R postgres "$cache"

# weir: the given binary, else a debug build of this tree.
if [[ -z $weir && -z $bouncer ]]; then
    (cd "$repo" && cargo build -q -p weir --bin weir)
    weir=$repo/target/debug/weir
fi
export WEIR_BIN=$(cd "$(dirname "$weir")" && pwd)/$(basename "$weir")
export PATH=$work:$PATH

for tool in initdb pg_ctl openssl socat; do
    command -v "$tool" >/dev/null || echo "run.sh: warning: $tool is not on PATH; the tests that need it fail" >&2
done

if $legacy; then
    isolated=()
    ((EUID != 0)) || isolated=(unshare --mount --net --)
    status=0
    WEIR_SUITE_USER=$suite_user "${isolated[@]}" python3 "$here/legacy.py" "$work" "$here/expected-${tag#pgbouncer_}.txt" "$@" || status=$?
    exit $status
fi

# Python: a venv in the cache with the suite's requirements (the system's
# python3 when root, whose own python may sit in root's home).
venv=$cache/venv
python=python3
((EUID != 0)) || python=/usr/bin/python3
[[ -x $venv/bin/python ]] || "${as_user[@]}" "$python" -m venv "$venv"
if ! "${as_user[@]}" "$venv/bin/python" -c 'import pytest, pytest_asyncio, pytest_timeout, xdist, psycopg, filelock' 2>/dev/null; then
    "${as_user[@]}" "$venv/bin/pip" install -q pytest pytest-asyncio pytest-timeout pytest-xdist 'psycopg[binary]' filelock
fi

cd "$work"
report=$work/junit.xml
set +e
(($#)) || set -- test/
# Absolute paths: the suite's utils.py changes directory into test/ as it is
# imported, before pytest-xdist's workers collect.
args=()
for a in "$@"; do
    [[ $a == test/* ]] && a=$work/$a
    args+=("$a")
done
# The suite's port locks and pytest's temp dirs: in the work dir, away from
# files of other users.
mkdir -p "$work/t" && ((EUID != 0)) || chown postgres "$work/t"
export TMPDIR=$work/t
# pytest's own temp dirs hold the Unix sockets, whose paths must stay short.
basetemp=$(mktemp -d /tmp/wps.XXXXXX)
((EUID != 0)) || chown postgres "$basetemp"
# At the end, any weir the suite left running (a test that failed before it
# stopped its own) is stopped, found by the pid files the launcher writes.
stop_leftovers() {
    local f pid
    while IFS= read -r f; do
        pid=$(cat "$f" 2>/dev/null) || continue
        [[ -n $pid ]] && grep -qs -- "$basetemp" "/proc/$pid/cmdline" && kill -QUIT "$pid" 2>/dev/null
    done < <(find "$basetemp" -name '*.weir.pid' 2>/dev/null)
    true
}
if $keep; then
    trap stop_leftovers EXIT
else
    trap 'stop_leftovers; rm -rf "$work" "$basetemp"' EXIT
fi
# The suite's own limit is 30 s a test; on a loaded machine its Postgres
# fixtures alone can take that long (WEIR_SUITE_TIMEOUT, seconds).
"${as_user[@]}" "$venv/bin/python" -m pytest -p no:cacheprovider -n "${WEIR_SUITE_JOBS:-2}" --junitxml="$report" -q -rN --tb=native --basetemp="$basetemp" \
    --timeout="${WEIR_SUITE_TIMEOUT:-90}" \
    -o asyncio_default_fixture_loop_scope=function "${args[@]}"
set -e
"$venv/bin/python" "$here/compare.py" "$report" "$here/expected-${tag#pgbouncer_}.txt"
