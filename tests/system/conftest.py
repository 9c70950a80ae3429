"""Fixtures for fleetgate's system tests: `procs` holds every daemon a test starts and stops
them all at its end (SIGTERM, then SIGKILL), failing the test on an unclean exit; `sim`
starts a simulated phone, `gateway` starts fleetgate with a config. Helpers: fleet.py."""

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fleet  # noqa: E402


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item, call):
    # Lets fixtures see whether the test body failed (to print the daemons' logs).
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "once: checks the tree's scripts, files and documents rather than the daemons' "
        "code (an install layout, systemd-analyze, a manifest, the docs): run in the normal pass "
        "only, not again in the sanitizer pass (FLEETGATE_SANITIZER_PASS=1, deploy/test.sh)")
    config.addinivalue_line(
        "markers", "timed: measures a fleet's waits against a wall-clock target of a fraction "
        "of a second (the capacity advice followed): run in the normal pass only, since the "
        "sanitizers slow the gateway itself; the code it runs is run under them by the "
        "other tests of its file")


def pytest_collection_modifyitems(config, items):
    # deploy/test.sh sets FLEETGATE_SANITIZER_PASS for its ASan+UBSan pass: tests marked
    # `once` ran in the normal pass already, and the sanitizers add nothing to them.
    if os.environ.get("FLEETGATE_SANITIZER_PASS") != "1":
        return
    normal_only = ("once", "timed")
    keep = [i for i in items if not any(i.get_closest_marker(m) for m in normal_only)]
    dropped = [i for i in items if any(i.get_closest_marker(m) for m in normal_only)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


def pytest_report_header(config):
    return [f"fleetgate-agent: {fleet.agent_bin()}", f"fleetgate: {fleet.gateway_bin()}",
            f"valgrind: {fleet.under_valgrind()}, time multiplier: {fleet.time_mult()}"]


def _need_binary(path):
    if not os.access(path, os.X_OK):
        pytest.fail(f"{path} is missing or not executable: build it first "
                    "(meson setup build && meson compile -C build)", pytrace=False)


@pytest.fixture
def procs(request, tmp_path):
    """Every daemon this test starts; all are stopped at the end, even on failure. A
    daemon that died during the test, ignored SIGTERM, or exited non-zero after it
    (valgrind: 99) fails the test."""
    group = fleet.ProcessGroup(tmp_path)
    yield group
    problems = group.stop_all()
    rep = getattr(request.node, "rep_call", None)
    if problems or (rep is not None and rep.failed):
        for d in group.daemons:
            print(d.logs())
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


@pytest.fixture
def sim(procs, tmp_path):
    """Factory: sim(slots=2, prefill_tps=100, ...) starts `fleetgate-agent --engine sim`
    on a free port and returns a fleet.Daemon once the port accepts connections.
    fault_plan: a list of {"at_s","kind","dur_s"} (written to a file) or a path.
    token: sets FLEETGATE_REPLICA_TOKEN for the sim and sends it with d.request()."""
    seq = [0]

    def start(model="sim-model", slots=1, prefill_tps=2000, decode_tps=100, n_ctx=None,
              time_scale=None, loading_s=None, fault_plan=None, id=None, token=None,
              env=None, extra_args=(), name="sim", ready_timeout=10, check_exit=True):
        _need_binary(fleet.agent_bin())
        seq[0] += 1
        plan_file = None
        if fault_plan is not None:
            if isinstance(fault_plan, (str, Path)):
                plan_file = str(fault_plan)
            else:
                plan_file = str(tmp_path / f"{name}-{seq[0]}-faults.json")
                Path(plan_file).write_text(json.dumps(fault_plan, indent=1))
        e = dict(env or {})
        if token is not None:
            e["FLEETGATE_REPLICA_TOKEN"] = token

        def argv(ports):
            return fleet.sim_argv(ports[0], model=model, slots=slots, prefill_tps=prefill_tps,
                                  decode_tps=decode_tps, n_ctx=n_ctx, time_scale=time_scale,
                                  loading_s=loading_s, fault_plan_file=plan_file, id=id,
                                  extra_args=extra_args)

        d = procs.spawn(name, argv, env=e, ready_timeout=ready_timeout, check_exit=check_exit)
        d.model = model
        d.slots = slots
        d.token = token
        if token is not None:
            d.headers["Authorization"] = f"Bearer {token}"
        return d

    return start


@pytest.fixture
def gateway(procs, tmp_path):
    """Factory: gateway(config, n_ports=2) starts `fleetgate --config FILE`. config is a
    dict, or a function of the n_ports free ports picked for it returning the dict (so
    a retry after 'address in use' gets new ones); the daemon is ready when every one
    of those ports accepts connections and ready(daemon), if given, is truthy. prefix:
    a command the gateway runs under (e.g. prlimit)."""
    seq = [0]

    def start(config, n_ports=1, name="gateway", env=None, extra_args=(), ready=None,
              ready_timeout=10, check_exit=True, prefix=()):
        _need_binary(fleet.gateway_bin())
        seq[0] += 1
        path = tmp_path / f"{name}-{seq[0]}.json"

        def argv(ports):
            cfg = config(ports) if callable(config) else config
            path.write_text(json.dumps(cfg, indent=2))
            return [*prefix, fleet.gateway_bin(), "--config", str(path), *extra_args]

        d = procs.spawn(name, argv, n_ports=n_ports, env=env, ready=ready,
                        ready_timeout=ready_timeout, check_exit=check_exit)
        d.config_path = path
        return d

    return start
