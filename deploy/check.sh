#!/usr/bin/env bash
# Validates the deploy/ artefacts without Docker or a cluster:
#   * Prometheus rules (promtool check rules) and their unit tests
#     (promtool test rules), and prometheus.yml (promtool check config);
#   * the Grafana dashboard: valid JSON, first panel = opens/closes, every
#     PromQL expression parses, and the provisioning files;
#   * YAML of the Kubernetes manifests and docker-compose.yml, plus the
#     native-sidecar shape of deployment.yaml;
#   * every metric name in the alerts, their tests and the dashboard exists in
#     crates/metrics/src/names.rs;
#   * the Docker build, replayed as `docker build` would run it: the context
#     .dockerignore leaves, then exactly the paths the Dockerfile COPYs from
#     it go into a temp dir, and the Dockerfile's own
#     `cargo build` runs there offline (the registry cache is reused, nothing is
#     fetched; the target dir is $CHECK_TARGET_DIR, default this checkout's
#     target/, so a second run is quick); its binary has no test kit, no demo
#     and no debug info;
#   * every shipped weir config, loaded by that binary with `weir check-config`:
#     config/*.toml, deploy/**/*.toml, docker-compose.yml's weir with its mounts
#     at their container paths, the Kubernetes ConfigMap with the Secret's
#     userlist; and the compose userlist/credentials;
#   * `docker compose config -q` (or `docker-compose config -q`) when a compose
#     CLI is available; otherwise a loud SKIP.
# Installs promtool (Debian package `prometheus`) and PyYAML when missing.
#
# Usage: bash deploy/check.sh   (from anywhere; paths are repo-relative)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PASSED=0
FAILED=0
SKIPPED=0
FAILED_NAMES=()
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

PY="${PYTHON:-python3}"

# check NAME CMD...: runs CMD, counts and reports the result.
check() {
    local name="$1"
    shift
    local out
    if out="$("$@" 2>&1)"; then
        PASSED=$((PASSED + 1))
        echo "PASS  $name"
    else
        FAILED=$((FAILED + 1))
        FAILED_NAMES+=("$name")
        echo "FAIL  $name"
        printf '%s\n' "$out" | sed 's/^/      /'
    fi
}

skip() {
    SKIPPED=$((SKIPPED + 1))
    echo "################################################################"
    echo "SKIP  $1"
    echo "      $2"
    echo "################################################################"
}

apt_install() {
    # apt_install PKG...: install Debian packages, refreshing the index if needed.
    command -v apt-get >/dev/null 2>&1 || return 1
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get install -y --no-install-recommends "$@" >/dev/null 2>&1 \
        || { $sudo apt-get update >/dev/null 2>&1 && $sudo apt-get install -y --no-install-recommends "$@" >/dev/null 2>&1; }
}

# ---- tools -----------------------------------------------------------------
if ! command -v promtool >/dev/null 2>&1; then
    echo "promtool not found; installing Debian package 'prometheus'"
    # policy-rc.d / no systemd: the package's service is not started in
    # containers; stop one if the install did start it.
    apt_install prometheus || { echo "FATAL: cannot install promtool" >&2; exit 1; }
    if command -v systemctl >/dev/null 2>&1; then
        systemctl stop prometheus >/dev/null 2>&1 || true
    fi
fi

if ! "$PY" -c 'import yaml' >/dev/null 2>&1; then
    echo "PyYAML not found; installing it with pip"
    "$PY" -m pip install --quiet pyyaml >/dev/null 2>&1 \
        || apt_install python3-yaml \
        || { echo "FATAL: cannot install PyYAML" >&2; exit 1; }
    "$PY" -c 'import yaml' >/dev/null 2>&1 || PY=/usr/bin/python3
fi

# ---- Prometheus --------------------------------------------------------------
check "promtool check rules deploy/prometheus/alerts.yml" \
    promtool check rules deploy/prometheus/alerts.yml

check "promtool test rules deploy/prometheus/alerts_test.yml" \
    promtool test rules deploy/prometheus/alerts_test.yml

check_prom_config() {
    # rule_files points at /etc/prometheus/alerts.yml (the path inside the
    # container), so check a copy whose rule_files is relative to it.
    mkdir -p "$TMP/prom"
    cp deploy/prometheus/alerts.yml "$TMP/prom/alerts.yml"
    sed 's#/etc/prometheus/alerts.yml#alerts.yml#' deploy/prometheus/prometheus.yml >"$TMP/prom/prometheus.yml"
    grep -q '^  - alerts.yml$' "$TMP/prom/prometheus.yml" || { echo "rule_files does not name alerts.yml"; return 1; }
    promtool check config "$TMP/prom/prometheus.yml"
}
check "promtool check config deploy/prometheus/prometheus.yml (rule path relocated)" check_prom_config

# ---- Grafana -----------------------------------------------------------------
check "dashboard is valid JSON" "$PY" -m json.tool deploy/grafana/weir.json

check "dashboard first panel is opens/closes per second" "$PY" - <<'EOF'
import json
d = json.load(open("deploy/grafana/weir.json"))
p = min(d["panels"], key=lambda p: (p["gridPos"]["y"], p["gridPos"]["x"]))
t = p["title"].lower()
assert p is d["panels"][0] and p["id"] == 1, "first panel must be panels[0] with id 1"
assert (p["gridPos"]["x"], p["gridPos"]["y"]) == (0, 0), "first panel must be top-left"
assert "opens" in t and "closes" in t, p["title"]
exprs = " ".join(x["expr"] for x in p["targets"])
assert "weir_server_connections_opened_total" in exprs and "weir_server_connections_closed_total" in exprs, exprs
EOF

check "dashboard panels: unique ids, datasource uid prometheus, database/user variables" "$PY" - <<'EOF'
import json
d = json.load(open("deploy/grafana/weir.json"))
ids = [p["id"] for p in d["panels"]]
assert len(ids) == len(set(ids)), ids
for p in d["panels"]:
    assert p["datasource"]["uid"] == "${datasource}", p["title"]
    assert p["targets"], p["title"]
    for t in p["targets"]:
        assert t["datasource"]["uid"] == "${datasource}", p["title"]
        assert 'instance=~"$instance"' in t["expr"], t["expr"]
names = {v["name"] for v in d["templating"]["list"]}
assert {"datasource", "instance", "database", "user"} <= names, names
assert d.get("schemaVersion", 0) >= 36
EOF

check_dashboard_promql() {
    # Every panel expression must parse: wrap them as recording rules (with the
    # dashboard variables filled in) and let promtool parse them.
    "$PY" - "$TMP/dash_rules.yml" <<'EOF'
import json, sys, yaml
d = json.load(open("deploy/grafana/weir.json"))
rules = []
for p in d["panels"]:
    for t in p["targets"]:
        expr = t["expr"].replace("$instance", ".*").replace("$database", ".*").replace("$user", ".*")
        rules.append({"record": f"dashboard:panel{p['id']}:{t['refId']}", "expr": expr})
yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, open(sys.argv[1], "w"))
EOF
    [ -s "$TMP/dash_rules.yml" ] || return 1
    promtool check rules "$TMP/dash_rules.yml"
}
check "dashboard PromQL expressions parse" check_dashboard_promql

# ---- YAML --------------------------------------------------------------------
YAML_FILES=(
    deploy/kubernetes/configmap.yaml
    deploy/kubernetes/secret.yaml
    deploy/kubernetes/deployment.yaml
    deploy/prometheus/prometheus.yml
    deploy/prometheus/alerts.yml
    deploy/prometheus/alerts_test.yml
    deploy/grafana/provisioning/dashboards/weir.yml
    deploy/grafana/provisioning/datasources/prometheus.yml
    docker-compose.yml
)
for f in "${YAML_FILES[@]}"; do
    check "YAML parses: $f" "$PY" -c 'import sys, yaml; list(yaml.safe_load_all(open(sys.argv[1]))) or sys.exit("empty")' "$f"
done

check "kubernetes: weir is a native sidecar with probes, annotations, security" "$PY" - <<'EOF'
import yaml
dep = yaml.safe_load(open("deploy/kubernetes/deployment.yaml"))
assert dep["kind"] == "Deployment"
tpl = dep["spec"]["template"]
ann = tpl["metadata"]["annotations"]
assert ann["prometheus.io/scrape"] == "true" and ann["prometheus.io/port"] == "9930" and ann["prometheus.io/path"] == "/metrics", ann
spec = tpl["spec"]
assert spec["terminationGracePeriodSeconds"] > 30, "must exceed weir's shutdown_timeout (30s)"
weir = [c for c in spec["initContainers"] if c["name"] == "weir"]
assert weir and weir[0]["restartPolicy"] == "Always", "weir must be an initContainer with restartPolicy: Always"
w = weir[0]
assert w["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": 9930}
assert w["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": 9930}
assert w["resources"]["requests"] and w["resources"]["limits"]
sc = w["securityContext"]
assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"] and sc["capabilities"]["drop"] == ["ALL"], sc
app = spec["containers"][0]
env = {e["name"]: e.get("value") for e in app.get("env", [])}
assert env.get("PGHOST") == "127.0.0.1" and env.get("PGPORT") == "6432", env
cm = yaml.safe_load(open("deploy/kubernetes/configmap.yaml"))
assert "weir.toml" in cm["data"]
sec = yaml.safe_load(open("deploy/kubernetes/secret.yaml"))
assert "userlist.txt" in sec["stringData"]
EOF

# ---- metric names --------------------------------------------------------------
check "every metric in the alerts, their tests and the dashboard is in crates/metrics/src/names.rs" "$PY" - <<'EOF'
import re
defined = set(re.findall(r'"(weir_[a-z0-9_]+)"', open("crates/metrics/src/names.rs").read()))
assert len(defined) > 10, defined
missing = []
for f in ["deploy/prometheus/alerts.yml", "deploy/prometheus/alerts_test.yml", "deploy/grafana/weir.json"]:
    used = set(re.findall(r"\bweir_[a-z0-9_]+", open(f).read()))
    assert used, f"{f} uses no weir_ metric"
    for name in sorted(used):
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        if name not in defined and base not in defined:
            missing.append(f"{f}: {name}")
assert not missing, "not in names.rs: " + ", ".join(missing)
EOF

# ---- Docker build, replayed offline ----------------------------------------------
# Copies exactly what the builder stage COPYs (relative to its WORKDIR) into a
# temp dir and runs the Dockerfile's own `cargo build` there, offline: a
# missing workspace member or file fails here as it would in `docker build`.
CHECK_TARGET_DIR="${CHECK_TARGET_DIR:-$ROOT/target}"
# Emptied and filled afresh on every run; a fixed path (and cp -a's kept
# mtimes) lets cargo reuse the last run's build of the workspace's own crates.
CONTEXT="$CHECK_TARGET_DIR/docker-check-context"
WEIR_BIN=""

# Fills directory $1 with the build context `docker build` would send: the
# repository less what .dockerignore leaves out (Docker's rules: a pattern
# matches a path or one of its parents, `**` any number of folders, the last
# matching line decides, `!` keeps). Copies keep their mtimes.
docker_context() {
    "$PY" - "$1" <<'PYEOF'
import os, re, shutil, sys
dest = sys.argv[1]
rules = []
if os.path.exists(".dockerignore"):
    for line in open(".dockerignore"):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keep = line.startswith("!")
        pat = line.lstrip("!").strip("/")
        rx = ""
        i = 0
        while i < len(pat):
            if pat.startswith("**/", i):
                rx, i = rx + "(?:.*/)?", i + 3
            elif pat.startswith("**", i):
                rx, i = rx + ".*", i + 2
            elif pat[i] == "*":
                rx, i = rx + "[^/]*", i + 1
            elif pat[i] == "?":
                rx, i = rx + "[^/]", i + 1
            else:
                rx, i = rx + re.escape(pat[i]), i + 1
        rules.append((re.compile(rx + r"\Z"), keep, pat))

def excluded(rel):
    parts = rel.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    out = False
    for rx, keep, _ in rules:
        if any(rx.match(p) for p in prefixes):
            out = not keep
    return out

def may_keep_below(rel):
    return any(keep and (pat + "/").startswith(rel + "/") for _, keep, pat in rules)

for root, dirs, files in os.walk("."):
    base = os.path.relpath(root, ".")
    base = "" if base == "." else base + "/"
    dirs[:] = [d for d in dirs if not excluded(base + d) or may_keep_below(base + d)]
    for f in files:
        rel = base + f
        if not excluded(rel):
            os.makedirs(os.path.join(dest, base), exist_ok=True)
            shutil.copy2(rel, os.path.join(dest, rel), follow_symlinks=False)
PYEOF
}

# Prints a bash script that replays the builder stage's COPY lines (from the
# build context in $2) and its `cargo build` (plus --offline) in directory $1.
replay_script() {
    "$PY" - "$1" "$2" <<'PYEOF'
import shlex, sys
ctx, source = sys.argv[1], sys.argv[2]
lines, cur = [], ""
for raw in open("deploy/Dockerfile"):
    line = raw.rstrip("\n")
    if not cur and line.lstrip().startswith("#"):
        continue
    if line.endswith("\\"):
        cur += line[:-1] + " "
        continue
    lines.append((cur + line).strip())
    cur = ""
stages = [i for i, l in enumerate(lines) if l.upper().startswith("FROM ")]
builder = lines[stages[0]:stages[1]]
workdir, out, build = "/", [], None
for l in builder:
    word, _, rest = l.partition(" ")
    word = word.upper()
    if word == "WORKDIR":
        workdir = rest.strip()
    elif word == "COPY":
        *srcs, dest = [a for a in shlex.split(rest) if not a.startswith("--")]
        target = dest if dest.startswith("/") else workdir.rstrip("/") + "/" + dest
        rel = target.strip("/")[len(workdir.strip("/")):].strip("/")
        where = ctx + ("/" + rel if rel else "")
        for s in srcs:
            if dest.endswith("/") or len(srcs) > 1:
                out.append(f"mkdir -p {shlex.quote(where)} && cp -a {shlex.quote(s)} {shlex.quote(where + '/')}")
            else:
                out.append(f"mkdir -p {shlex.quote(ctx)} && cp -a {shlex.quote(s)} {shlex.quote(where)}")
    elif word == "RUN" and "cargo build" in rest:
        build = "cargo build" + rest.split("cargo build", 1)[1].split("&&")[0]
assert build, "no `cargo build` in the builder stage"
print("set -euo pipefail")
print(f"cd {shlex.quote(source)}")
print("\n".join(out))
print(f"cd {shlex.quote(ctx)}")
print(f"echo {shlex.quote('+ ' + build.strip() + ' --offline')}")
print(build.strip() + " --offline")
PYEOF
}

replay_docker_build() {
    rm -rf "$CONTEXT" "$CONTEXT.sent"
    docker_context "$CONTEXT.sent" || return 1
    replay_script "$CONTEXT" "$CONTEXT.sent" >"$TMP/replay.sh" || return 1
    # Cargo's registry cache and $CHECK_TARGET_DIR are shared; nothing is fetched.
    # The image's own profile (fat LTO, one codegen unit, full optimisation) costs ten
    # minutes or more on a 2-core machine. What this check proves -- the context
    # loads and builds, the binary is stripped and has no demo -- does not
    # depend on the optimisation level, so by default the replay lowers it;
    # WEIR_CHECK_FULL_BUILD=1 builds exactly as the image does.
    local quick=(CARGO_PROFILE_DIST_LTO=false CARGO_PROFILE_DIST_OPT_LEVEL=0 CARGO_PROFILE_DIST_CODEGEN_UNITS=64)
    [ "${WEIR_CHECK_FULL_BUILD:-0}" = 1 ] && quick=()
    env "${quick[@]}" CARGO_TARGET_DIR="$CHECK_TARGET_DIR" CARGO_NET_OFFLINE=true \
        bash "$TMP/replay.sh" >"$TMP/replay.log" 2>&1
    local rc=$?
    tail -n 25 "$TMP/replay.log"
    [ "$rc" -eq 0 ] || return "$rc"
    local profile
    profile="$(grep -oE -- '--profile[ =][a-z-]+' deploy/Dockerfile | head -n1 | sed -E 's/--profile[ =]//')"
    case "${profile:-release}" in
        dev) profile=debug ;;
        "") profile=release ;;
    esac
    local bin="$CHECK_TARGET_DIR/${profile:-release}/weir"
    [ -x "$bin" ] || { echo "the build left no $bin"; return 1; }
    grep -q "target/${profile:-release}/weir" deploy/Dockerfile \
        || { echo "deploy/Dockerfile does not install target/${profile:-release}/weir"; return 1; }
    "$bin" --version || return 1
    echo "$bin" >"$TMP/weir-bin"
}
check "docker build replayed offline in a copy of exactly what deploy/Dockerfile COPYs" replay_docker_build
if [ -s "$TMP/weir-bin" ]; then WEIR_BIN="$(cat "$TMP/weir-bin")"; fi

image_binary() {
    local tree
    tree="$(cargo tree --offline --locked -p weir -e normal --no-default-features --prefix none)" || return 1
    if grep -q '^weir-testkit' <<<"$tree"; then echo "weir-testkit is in the production graph"; return 1; fi
    grep -q -- '--no-default-features' deploy/Dockerfile \
        || { echo "the image is not built with --no-default-features"; return 1; }
    if "$WEIR_BIN" demo >/dev/null 2>&1; then echo "the image's binary runs the demo"; return 1; fi
    if readelf -S "$WEIR_BIN" | grep -qE '\.debug_|\.symtab'; then
        echo "$WEIR_BIN has debug info or a symbol table"
        return 1
    fi
}
if [ -n "$WEIR_BIN" ]; then
    check "image binary: no weir-testkit in its graph, no demo, stripped" image_binary
else
    FAILED=$((FAILED + 1))
    FAILED_NAMES+=("image binary")
    echo "FAIL  image binary: not checked, the replayed build failed"
fi

check "Dockerfile runtime stage: numeric non-root USER, entrypoint, config path" "$PY" - <<'EOF'
text = open("deploy/Dockerfile").read()
runtime = text.split("\nFROM ")[-1]
users = [l.split()[1] for l in runtime.splitlines() if l.startswith("USER ")]
uid = users[-1].split(":")[0] if users else ""
assert uid.isdigit() and uid != "0", f"the runtime USER must be a numeric non-root uid: {users}"
assert "COPY --from=builder" in runtime, "the runtime stage copies the binary from the builder"
assert 'ENTRYPOINT ["/usr/local/bin/weir"]' in runtime, "ENTRYPOINT"
assert 'CMD ["--config", "/etc/weir/weir.toml"]' in runtime, "CMD"
EOF

# ---- weir configs, loaded by weir itself ------------------------------------------
# check_config FILE: `weir check-config FILE` with the image's binary.
check_config() {
    [ -n "$WEIR_BIN" ] || { echo "no weir binary: the replayed build failed"; return 1; }
    "$WEIR_BIN" check-config "$1"
}
for f in config/*.toml $(find deploy -name '*.toml' | sort); do
    check "weir check-config $f" check_config "$f"
done

# The files docker-compose.yml mounts into the weir container, copied to their
# container paths under a temp root; then the config its command names.
compose_config() {
    local root="$TMP/compose-root" config
    config="$("$PY" - "$root" <<'EOF'
import os, shutil, sys, yaml
root = sys.argv[1]
svc = yaml.safe_load(open("docker-compose.yml"))["services"]["weir"]
for v in svc["volumes"]:
    src, dest = v.split(":")[:2]
    os.makedirs(os.path.dirname(root + dest), exist_ok=True)
    shutil.copy(src, root + dest)
cmd = svc["command"]
print(root + cmd[cmd.index("--config") + 1])
EOF
)" || return 1
    check_config "$config"
}
check "weir check-config on docker-compose.yml's weir (its mounts at their container paths)" compose_config

kubernetes_config() {
    local dir="$TMP/k8s/etc/weir"
    mkdir -p "$dir"
    "$PY" - "$dir" <<'EOF' || return 1
import sys, yaml
d = sys.argv[1]
open(d + "/weir.toml", "w").write(yaml.safe_load(open("deploy/kubernetes/configmap.yaml"))["data"]["weir.toml"])
open(d + "/userlist.txt", "w").write(yaml.safe_load(open("deploy/kubernetes/secret.yaml"))["stringData"]["userlist.txt"])
EOF
    check_config "$dir/weir.toml"
}
check "weir check-config on the Kubernetes ConfigMap (the Secret's userlist beside it)" kubernetes_config

check "compose userlist matches the postgres service credentials" "$PY" - <<'EOF'
import re, tomllib, yaml
compose = yaml.safe_load(open("docker-compose.yml"))
env = compose["services"]["postgres"]["environment"]
users = dict(re.findall(r'^"([^"]*)"\s+"([^"]*)"', open("deploy/compose/userlist.txt").read(), re.M))
assert users.get(env["POSTGRES_USER"]) == env["POSTGRES_PASSWORD"], users
cfg = tomllib.load(open("deploy/compose/weir.toml", "rb"))
assert env["POSTGRES_DB"] in cfg["databases"], cfg["databases"]
assert cfg["databases"][env["POSTGRES_DB"]]["host"] == "postgres"
lg = compose["services"]["loadgen"]["environment"]
assert lg["PGPASSWORD"] == env["POSTGRES_PASSWORD"] and lg["PGHOST"] == "weir"
EOF

# ---- docker compose ------------------------------------------------------------
# `config` only parses and interpolates: it needs the compose CLI, not an engine.
if docker compose version >/dev/null 2>&1; then
    check "docker compose config -q" docker compose -f docker-compose.yml config -q
elif command -v docker-compose >/dev/null 2>&1 || apt_install docker-compose; then
    check "docker-compose config -q ($(docker-compose version --short 2>/dev/null || echo v1))" \
        docker-compose -f docker-compose.yml config -q
else
    skip "docker compose config" "no compose CLI (neither the 'docker compose' plugin nor docker-compose) could be found or installed"
fi

# ---- summary -------------------------------------------------------------------
if [ "$FAILED" -gt 0 ]; then
    echo "failed: ${FAILED_NAMES[*]}"
fi
if [ "$SKIPPED" -gt 0 ]; then
    echo "deploy checks: $PASSED passed, $FAILED failed, $SKIPPED skipped"
else
    echo "deploy checks: $PASSED passed, $FAILED failed"
fi
[ "$FAILED" -eq 0 ]
