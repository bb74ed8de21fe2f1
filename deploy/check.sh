#!/usr/bin/env bash
# Validates the deploy/ artefacts without Docker or a cluster:
#   * Prometheus rules (promtool check rules) and their unit tests
#     (promtool test rules), and prometheus.yml (promtool check config);
#   * the Grafana dashboard: valid JSON, first panel = opens/closes, every
#     PromQL expression parses, and the provisioning files;
#   * YAML of the Kubernetes manifests and docker-compose.yml, plus the
#     native-sidecar shape of deployment.yaml;
#   * the weir TOML configs and the compose userlist/credentials;
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
    grep -q '^  - alerts.yml$' "$TMP/prom/prometheus.yml"
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

# ---- weir configs --------------------------------------------------------------
check "weir TOML configs parse and match weir's rules" "$PY" - <<'EOF'
import tomllib, yaml
def parse_dur(s):
    assert s.endswith("s") and not s.endswith("ms"), s
    return float(s[:-1])
cfgs = {
    "deploy/compose/weir.toml": tomllib.load(open("deploy/compose/weir.toml", "rb")),
    "deploy/kubernetes/configmap.yaml": tomllib.loads(yaml.safe_load(open("deploy/kubernetes/configmap.yaml"))["data"]["weir.toml"]),
}
allowed_top = {"weir", "metrics", "databases"}
for name, c in cfgs.items():
    assert set(c) <= allowed_top, (name, set(c))
    w = c["weir"]
    assert w["listen_addr"].endswith(":6432"), name
    assert c["metrics"]["listen_addr"] == "0.0.0.0:9930", name
    assert w["auth_type"] in ("trust", "md5", "scram-sha-256"), name
    assert w["auth_type"] == "trust" or w.get("auth_file"), name
    assert w["pool_mode"] in ("session", "transaction"), name
    assert parse_dur(w["query_wait_timeout"]) < parse_dur(w["client_deadline"]), name
    assert "app" in c["databases"], name
EOF

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

check "Dockerfile: multi-stage, --locked build, non-root, ports, entrypoint" bash -c '
f=deploy/Dockerfile
grep -q "^FROM rust:1-bookworm AS builder" $f
grep -q "cargo build --release --locked -p weir" $f
grep -q "^FROM debian:bookworm-slim" $f
grep -q "ca-certificates" $f
grep -q "^USER 10001" $f
grep -q "^EXPOSE 6432 9930" $f
grep -q "^ENTRYPOINT \[\"/usr/local/bin/weir\"\]" $f
grep -q "^CMD \[\"--config\", \"/etc/weir/weir.toml\"\]" $f
'

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
