"""Preflight checks: each is a command (batched into one probe script per host) plus a pure parser.

Public API::

    run_preflight(hosts, *, connect, job=None, options=None, only=None, progress=None) -> PreflightReport
    report.to_json() / report.to_dict() / report.interfaces() -> {host: nic}
    exit_code(report, strict=False) -> 0 | 1
    render_table(report, console); progress_display(console) -> progress callback
"""
from clusterctl.checks.job import DEFAULT_IMAGE, DEFAULT_RDZV_PORT, PreflightJob, PreflightOptions
from clusterctl.checks.preflight import run_preflight
from clusterctl.checks.registry import ALL_CHECKS, CLUSTER_CHECKS, HOST_CHECKS, LAUNCH_CHECKS
from clusterctl.checks.report import progress_display, render_table
from clusterctl.checks.results import CheckResult, ClusterCheck, HostReport, PreflightReport, exit_code

__all__ = [
    "ALL_CHECKS", "CLUSTER_CHECKS", "DEFAULT_IMAGE", "DEFAULT_RDZV_PORT", "HOST_CHECKS", "LAUNCH_CHECKS",
    "CheckResult", "ClusterCheck", "HostReport", "PreflightJob", "PreflightOptions", "PreflightReport",
    "exit_code", "progress_display", "render_table", "run_preflight",
]
