"""The Grafana dashboard and the Prometheus alert rules (deploy/) against Debian's Prometheus
scraping a real `chainstate up`: every panel's expression answers data after some traffic
(reads, errors, a dead node, refused requests), and no panel, variable or rule names a metric
the stack does not export (a misspelt name fails even where an expression is empty when all
is well, as most alert conditions are)."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import free_port
from tests.e2e.stack import DEV, Stack, wait_for, write_config
from tests.tenancy.redisserver import RedisServer, redis_binary

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "chainstate.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
TOKEN = "dashboards-t0ken"
JOBS = {  # job → ports of configs/devnet.toml (write_config maps them to free ones)
    "chainstate-proxy": ("8663", "proxy-2"),
    "chainstate-writer": ("8664", "8669"),
    "chainstate-state": ("8665", "8666"),
    "chainstate-checker": ("8667",),
}
PROXY = (sys.executable, "-m", "stack.cli", "proxy")
TARGETS = sum(len(ports) for ports in JOBS.values())
WINDOW = "30s"  # what Grafana's $__rate_interval stands for here: spans the traffic below
# PromQL words that are not metric names (functions are told apart by the "(" after them).
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or"}
KEYWORDS |= {"unless", "offset", "inf", "nan"}


def binary(name: str) -> str:
    """Debian's `prometheus`/`promtool`, or skip (locally) / fail (CI) with a clear reason."""
    path = shutil.which(name)
    if path:
        return path
    reason = f"{name} is not installed (apt-get install prometheus; ./dev test installs it)"
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


class Prometheus:
    """One Prometheus server scraping the stack every second, with the alert rules loaded."""

    def __init__(self, workdir: Path, stack: Stack) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(ALERTS)],
            "scrape_configs": [self._job(job, ports, stack) for job, ports in JOBS.items()],
        }
        self.config = workdir / "prometheus.yml"
        self.config.write_text(yaml.safe_dump(config))
        self.data = workdir / "tsdb"
        self.log = workdir / "prometheus.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @staticmethod
    def _job(job: str, ports: tuple[str, ...], stack: Stack) -> dict[str, Any]:
        targets = [f"127.0.0.1:{stack.ports[p]}" for p in ports]
        entry: dict[str, Any] = {"job_name": job, "static_configs": [{"targets": targets}]}
        if job == "chainstate-proxy":  # /metrics is under the admin API's rules
            entry["authorization"] = {"credentials": TOKEN}
        return entry

    def start(self) -> None:
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    binary("prometheus"),
                    f"--config.file={self.config}",
                    f"--storage.tsdb.path={self.data}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_for(self._ready, timeout=30, what="Prometheus ready")

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            pytest.fail("prometheus exited:\n" + self.log.read_text())
        try:
            with urllib.request.urlopen(self.url + "/-/ready", timeout=5) as resp:
                return resp.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def api(self, path: str, **params: Any) -> Any:
        """`data` of a GET on the HTTP API; an error answer fails with Prometheus's reason."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=30) as resp:
                answer = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            answer = json.loads(exc.read())
        if answer.get("status") != "success":
            raise AssertionError(f"{path} {params}: {answer.get('error', answer)}")
        return answer["data"]

    def query(self, expr: str, at: float) -> list[dict[str, Any]]:
        return self.api("query", query=expr, time=f"{at:.3f}")["result"]


def post(url: str, body: Any, **headers: str) -> int:
    """POST a JSON body; the HTTP status (errors are what some calls want)."""
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json", **headers}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            resp.read()
            return resp.status
    except urllib.error.HTTPError as exc:
        exc.read()
        return exc.code


def rpc(proxy: str, method: str, params: list[Any], **headers: str) -> int:
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    return post(proxy + "/1337", body, **headers)


def admin(stack: Stack, path: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(
        stack.url("8663") + path,
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", "authorization": f"Bearer {TOKEN}"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def set_up(stack: Stack) -> str:
    """A dead node in the up-proxy's pool (connection refused: failed attempts, retries, the
    node-down alert) and an API key whose project allows one request a second;
    returns the key. The dead node's weight outweighs the cost its failures add (the
    selector would otherwise keep to the live node while it is idle: no attempt fails)."""
    dead = f"http://127.0.0.1:{free_port()}"
    node = {"key": "dead-1", "url": dead, "kind": "state", "weight": 1_000_000}
    admin(stack, "/1337/addNode", node)
    admin(stack, "/tenancy/projects", {"id": "dash", "limits": {"requests_per_second": 1}})
    return admin(stack, "/tenancy/keys", {"project": "dash", "name": "test"})["key"]


def drive(stack: Stack, key: str) -> None:
    """Traffic through both proxies that puts a series behind every panel: reads (some
    cached, one batch, some with a client id), errors, and the key's requests sent five at
    once (refused: 429)."""
    for url in (stack.url("8663"), stack.url("proxy-2")):
        for i in range(10):
            rpc(url, "eth_blockNumber", [])
            rpc(url, "eth_getBalance", [DEV, "latest"], **{"client-id": "dashboards"})
            rpc(url, "eth_getBlockByNumber", [hex(i % 3), False])
        batch = [{"jsonrpc": "2.0", "id": n, "method": "eth_chainId", "params": []} for n in (1, 2)]
        assert post(url + "/1337", batch) == 200
        assert rpc(url, "eth_noSuchMethod", []) == 200  # a JSON-RPC error (outcome invalid)
        rpc(url, "eth_getBalance", ["0xnot-an-address", "latest"])
    key_url = stack.url("8663") + f"/1337/{key}"
    statuses = [
        post(key_url, {"jsonrpc": "2.0", "id": 1, "method": "eth_chainId"}) for _ in range(5)
    ]
    assert 429 in statuses, statuses


def panel_targets(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(panel title, expression) of every panel, rows' nested panels included."""
    for panel in dashboard["panels"]:
        for inner in (panel, *panel.get("panels", [])):
            for target in inner.get("targets", []):
                yield inner["title"], target["expr"]


def alert_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def grafana(expr: str) -> str:
    """The expression as Grafana sends it with every variable on All (".*")."""
    expr = expr.replace("$__rate_interval", WINDOW).replace("$__interval", WINDOW)
    return re.sub(r"\$\{?\w+\}?", ".*", expr)


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects: what is left once strings, label matchers,
    range brackets, grouping lists, numbers, keywords and function names are taken out."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    text = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        word, rest = match.group(), text[match.end() :].lstrip()
        if word.lower() not in KEYWORDS and not rest.startswith("("):
            names.add(word)
    return names


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("stack")
    config, ports = write_config(tmp)
    text = config.read_text().replace("[proxy]\n", f'[proxy]\nadmin_token = "{TOKEN}"\n', 1)
    config.write_text(text)
    stack = Stack(config, ports)
    stack.start()
    yield stack
    stack.stop()


class SecondProxy:
    """`chainstate proxy` in its own process, reaching the stack's nodes, write node and
    checker over HTTP, as a fleet's other proxies do (it also exports what only a
    standalone proxy has: the config store's reachability), with a shared cache tier in a
    real Redis so that the tier's panel and alert have series."""

    def __init__(self, workdir: Path, stack: Stack, tier: str) -> None:
        port = stack.ports["proxy-2"] = free_port()
        node = '[[proxy.nodes]]\nchain = "1337"\nkey = "{}"\nurl = "{}"\nkind = "{}"\n'
        config = workdir / "proxy-2.toml"
        config.write_text(
            f'[proxy]\nhost = "127.0.0.1"\nport = {port}\nadmin_token = "{TOKEN}"\n'
            + f'cache_tier_url = "{tier}"\n'
            + node.format("state-1", stack.url("8665"), "state")
            + node.format("archive-1", stack.url("8666"), "archive")
            + f'[[proxy.writers]]\nchain = "1337"\nkey = "writer-1"\nurl = "{stack.url("8664")}"\n'
            + "leader = true\n"
            + f'[[proxy.checkers]]\nchain = "1337"\nurl = "{stack.url("8667")}"\n'
        )
        self.log = workdir / "proxy-2.log"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [*PROXY, "--config", str(config), "--store", str(workdir / "store.json")],
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_for(lambda: self._ready(stack.url("proxy-2")), timeout=30, what="proxy-2 ready")

    def _ready(self, url: str) -> bool:
        if self.proc.poll() is not None:
            pytest.fail("chainstate proxy exited:\n" + self.log.read_text())
        try:
            return rpc(url, "eth_chainId", []) == 200
        except OSError:
            return False

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def second_proxy(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecondProxy]:
    redis = RedisServer(redis_binary(), tmp_path_factory.mktemp("redis"))
    redis.start()
    try:
        proxy = SecondProxy(tmp_path_factory.mktemp("proxy-2"), stack, redis.url)
        yield proxy
        proxy.stop()
    finally:
        redis.stop()


@pytest.fixture(scope="module")
def prometheus(
    stack: Stack, second_proxy: SecondProxy, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Prometheus]:
    prom = Prometheus(tmp_path_factory.mktemp("prometheus"), stack)
    prom.start()
    yield prom
    prom.stop()


@pytest.fixture(scope="module")
def driven(stack: Stack, prometheus: Prometheus) -> float:
    """Wait for two scrapes of every target, drive the traffic, then wait until every target
    was scraped twice since: the time to evaluate expressions at."""

    def scraped_twice() -> bool:  # so that rates see the counters before the traffic
        up = prometheus.query("count_over_time(up[1m]) >= 2 and up == 1", time.time())
        return len(up) == TARGETS

    wait_for(scraped_twice, timeout=30, what="two scrapes of the 7 targets")
    key = set_up(stack)
    for _ in range(2):  # the first round makes series, the second one moves them
        drive(stack, key)
        moment = time.time() + 2
        wait_for(partial(scraped_after, prometheus, moment), timeout=30, what="two scrapes")
    return moment


def scraped_after(prometheus: Prometheus, moment: float) -> bool:
    stamps = prometheus.query('timestamp(up{job=~"chainstate-.*"})', time.time())
    return len(stamps) == TARGETS and all(float(s["value"][1]) > moment for s in stamps)


def label_values(variable: dict[str, Any]) -> tuple[str, str]:
    """(metric, label) of a query variable's `label_values(metric, label)`."""
    found = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", variable["query"]["query"])
    assert found, variable["query"]
    return found[1], found[2]


def known_names(prometheus: Prometheus) -> set[str]:
    """Every series name Prometheus holds, and every metric family the scrapes announced
    with `# TYPE` (a labelled counter that counted nothing yet exports no sample)."""
    names = set(prometheus.api("label/__name__/values"))
    for family, entries in prometheus.api("metadata").items():
        names.add(family)
        if any(e["type"] in ("histogram", "summary") for e in entries):
            names |= {family + "_bucket", family + "_sum", family + "_count"}
    return names


def test_promtool_accepts_the_rules() -> None:
    result = subprocess.run(
        [binary("promtool"), "check", "rules", str(ALERTS)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in result.stdout


def test_the_alerts_fire_at_their_thresholds() -> None:
    """promtool's unit tests of the rules (deploy/prometheus/alerts_test.yml): made-up
    series, and which alerts fire when."""
    result = subprocess.run(
        [binary("promtool"), "test", "rules", str(ALERTS.with_name("alerts_test.yml"))],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_the_dashboard_is_importable() -> None:
    """What Grafana 10 needs to import it anywhere: the data source as a variable that every
    panel and query variable uses, unique panel ids, a uid, and panels on the grid, none
    over another."""
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    source = {"type": "prometheus", "uid": "${datasource}"}
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert len(panels) >= 40
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in panels:
        assert panel["datasource"] == source, panel["title"]
        assert panel["targets"] and all(t["datasource"] == source for t in panel["targets"])
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, panel["title"]
    for variable in variables.values():
        if variable["type"] == "query":
            assert variable["datasource"] == source, variable["name"]
    taken: dict[tuple[int, int], str] = {}  # grid cell → the panel on it: none overlap
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in taken, f"{panel['title']} over {taken[x, y]}"
                taken[x, y] = panel["title"]


def test_every_panel_answers_data(prometheus: Prometheus, driven: float) -> None:
    """No dead panel: each expression, with the variables on All, gives at least one
    series whose value is a number (a ratio over no traffic would be NaN)."""
    dashboard = json.loads(DASHBOARD.read_text())
    dead = []
    for title, expr in panel_targets(dashboard):
        result = prometheus.query(grafana(expr), driven)
        values = [float(s["value"][1]) for s in result]
        if not any(not math.isnan(v) for v in values):
            dead.append(f"{title}: {expr} -> {result}")
    assert not dead, "panels without data:\n" + "\n".join(dead)


def test_every_variable_has_values(prometheus: Prometheus, driven: float) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        metric, label = label_values(variable)
        values = prometheus.api(f"label/{label}/values", **{"match[]": metric})
        assert values, f"variable {variable['name']}: no {label} on {metric}"


def test_no_expression_names_a_metric_the_stack_does_not_export(
    prometheus: Prometheus, driven: float
) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [expr for _, expr in panel_targets(dashboard)]
    exprs += [rule["expr"] for rule in alert_rules()]
    known = known_names(prometheus)
    unknown = {}
    for expr in exprs:
        names = metric_names(grafana(expr))
        assert names, f"no metric name found in {expr}"
        unknown.update({name: expr for name in names - known})
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            metric = label_values(variable)[0]
            unknown.update({metric: variable["name"]} if metric not in known else {})
    assert not unknown, f"metric names not in any scrape: {unknown}"


def test_every_alert_rule_evaluates(prometheus: Prometheus, driven: float) -> None:
    """Prometheus loaded every rule and evaluates each without error (a many-to-many match
    fails only at evaluation), and the dead node's alert is on its way."""
    loaded = {
        rule["name"]: rule
        for group in prometheus.api("rules", type="alert")["groups"]
        for rule in group["rules"]
    }
    assert set(loaded) == {rule["alert"] for rule in alert_rules()}
    broken = {name: r.get("lastError") for name, r in loaded.items() if r["health"] != "ok"}
    assert not broken, broken
    for rule in alert_rules():
        prometheus.query(rule["expr"], driven)  # no error at the time the panels are read
    down = {a["labels"]["node"]: a["state"] for a in loaded["ChainstateNodeDown"]["alerts"]}
    assert down.get("dead-1") in ("pending", "firing"), down


def test_a_misspelt_name_is_caught(prometheus: Prometheus, driven: float) -> None:
    """The name check itself: a name one letter off, inside an expression that still
    answers data, is reported."""
    expr = "sum(chainstate_proxy_inflight) or sum(chainstate_proxy_inflihgt)"
    assert prometheus.query(expr, driven)
    assert metric_names(expr) - known_names(prometheus) == {"chainstate_proxy_inflihgt"}
