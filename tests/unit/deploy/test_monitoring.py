"""Prometheus scrape config and Grafana provisioning: every LLDS service is scraped, the dashboard
points at the provisioned datasource uid, and every llds_* metric it charts is one the services
actually define (so a renamed metric breaks this test, not a panel in production)."""

from __future__ import annotations

import json
import re

import yaml
from deploy_tools import COMPOSE_FILE, DEPLOY, REPO

METRIC_SOURCES = [*REPO.glob("services/*/llds_*/metrics.py"), REPO / "launcher/llds/dashboard/metrics.py"]


def _dashboards() -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((DEPLOY / "grafana" / "dashboards").glob("*.json"))]


def test_prometheus_scrapes_every_service_on_its_port() -> None:
    cfg = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    targets = {t for job in cfg["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    assert {"retriever:8000", "rollout:8001", "trainer:8002", "dashboard:8003"} <= targets
    compose = yaml.safe_load(COMPOSE_FILE.read_text())
    mounts = compose["services"]["prometheus"]["volumes"]
    assert "./deploy/prometheus/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in mounts


def test_grafana_datasource_and_dashboards_are_provisioned() -> None:
    ds = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text())
    uids = {d["uid"] for d in ds["datasources"]}
    assert ds["datasources"][0]["url"] == "http://prometheus:9090"
    prov = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "dashboards" / "llds.yml").read_text())
    assert prov["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
    dashboards = _dashboards()
    assert dashboards
    for dash in dashboards:
        assert dash["uid"] and dash["panels"]
        ids = [p["id"] for p in dash["panels"]]
        assert len(ids) == len(set(ids))
        for panel in dash["panels"]:
            assert panel["datasource"]["uid"] in uids, panel["title"]
            for target in panel["targets"]:
                assert target["datasource"]["uid"] in uids and target["expr"]


def test_dashboard_metrics_exist_in_the_services() -> None:
    defined = set()
    for src in METRIC_SOURCES:
        defined |= set(re.findall(r'"(llds_[a-z0-9_]+)"', src.read_text()))
    assert defined, "no metric definitions found"
    used = set()
    for dash in _dashboards():
        for panel in dash["panels"]:
            for target in panel["targets"]:
                used |= set(re.findall(r"\b(llds_[a-z0-9_]+)", target["expr"]))
    unknown = {m for m in used if re.sub(r"_(bucket|sum|count)$", "", m) not in defined}
    assert not unknown, f"charted but defined by no service: {sorted(unknown)}"
    for name in used:
        assert ":" not in name and re.fullmatch(
            r"llds_(retriever|rollout|trainer|dashboard)_[a-z0-9_]+", name
        )
