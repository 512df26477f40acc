"""The bench's section across hosts (bench/hosts.py), without hosts: where
each launcher puts the ranks, what is refused before anything runs, what a machine that
cannot hold the test cluster records, and the tables. Nothing is measured here."""
from __future__ import annotations

import pytest

from bench import cluster, hosts, suite
from bench.jobs import Hosts, host_flags
from bench.trials import summarise
from asgd.command import main
from runconfig.settings import ConfigError

THREE = Hosts(("h1", "h2", "h3"), "/x/cluster-agent", {"ASGD_CLUSTER_DIR": "/run/c"})


def test_each_launcher_puts_one_rank_a_host_in_turn_through_the_agent_or_ssh():
    assert host_flags("hydra", THREE) == ["-launcher", "ssh", "-launcher-exec", "/x/cluster-agent",
                                          "-hosts", "h1,h2,h3"]
    assert host_flags("hydra", Hosts(("a", "b"))) == ["-hosts", "a,b"]
    assert host_flags("openmpi", THREE.part(1, 2)) == ["--mca", "plm_rsh_agent", "/x/cluster-agent",
                                                       "--host", "h2,h3", "--map-by", "node"]
    assert host_flags("openmpi", Hosts(("a", "b"))) == ["--host", "a,b", "--map-by", "node"]
    with pytest.raises(ConfigError, match="'other' cannot"):
        host_flags("other", THREE)


def test_parts_of_the_hosts_keep_how_they_are_reached():
    """The wire's 2 ranks on the first two hosts; DDP's on the clients' two."""
    assert THREE.part(0, 2) == Hosts(("h1", "h2"), "/x/cluster-agent", THREE.env)
    ddp = THREE.part(1, 2)
    assert ddp.names == ("h2", "h3") and ddp.agent == THREE.agent and ddp.env == THREE.env


@pytest.mark.parametrize("text", ["a,b", "a,b,c,d", "a,a,b", "a,,b", ""])
def test_hosts_other_than_three_distinct_names_are_refused(text):
    with pytest.raises(ConfigError, match="three distinct host names"):
        hosts.parse_hosts(text)


def test_three_hosts_are_taken_in_order_reached_by_ssh():
    assert hosts.parse_hosts("node1, node2,node3") == Hosts(("node1", "node2", "node3"))


@pytest.mark.parametrize("args, expected", [
    (["--hosts", "a,b"], "--hosts takes three distinct host names"),
    (["--only", "wires"], "--only: no section 'wires'"),
    (["--only", "hosts"], "--only hosts needs --cluster or --hosts"),
    (["--cluster", "--hosts", "a,b,c"], "not allowed with argument --cluster"),
])
def test_bad_bench_arguments_exit_2_with_one_line_before_measuring(args, expected, capsys, monkeypatch):
    monkeypatch.setattr(suite, "start_results", lambda *a: pytest.fail("measured despite a bad argument"))
    with pytest.raises(SystemExit) as exit_info:
        raise SystemExit(main(["bench", *args]))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("asgd: error: ") and expected in err, err


def test_the_sections_run_in_order_and_only_those_asked():
    assert list(suite.chosen(None, ())) == list(suite.SECTIONS[:-1])
    assert list(suite.chosen(hosts.CLUSTER, ())) == list(suite.SECTIONS)
    assert list(suite.chosen(THREE, ("hosts", "wire"))) == ["wire", "hosts"]


def test_a_machine_without_the_test_cluster_records_why_and_launches_nothing(monkeypatch, capsys):
    monkeypatch.setattr(hosts, "missing", lambda: "the test cluster needs root (network namespaces)")
    monkeypatch.setattr(hosts, "bench_cluster", lambda: pytest.fail("brought a cluster up"))
    section = hosts.measure_across(False, hosts.CLUSTER)
    assert section == {"skipped": "the test cluster needs root (network namespaces)"}
    assert "not measured: the test cluster needs root" in capsys.readouterr().err
    assert hosts.tables(section, "x") == ["", "Across hosts: not measured: the test cluster needs root "
                                              "(network namespaces)."]


def test_not_root_is_the_reason_given(monkeypatch):
    monkeypatch.setattr(cluster.os, "geteuid", lambda: 1000)
    assert cluster.missing() == "the test cluster needs root (network namespaces)"
    assert cluster.missing("the cluster tier") == "the cluster tier needs root (network namespaces)"


def test_the_bench_cluster_has_names_of_its_own_unless_the_environment_sets_them(monkeypatch):
    for name in cluster.BENCH_CLUSTER:
        monkeypatch.delenv(name, raising=False)
    assert cluster.cluster_env() == cluster.BENCH_CLUSTER
    assert cluster.BENCH_CLUSTER["ASGD_CLUSTER_PREFIX"] not in ("asgd", "asgdt")  # a user's, the tier's
    monkeypatch.setenv("ASGD_CLUSTER_PREFIX", "mine")
    assert cluster.cluster_env()["ASGD_CLUSTER_PREFIX"] == "mine"


SECTION = {
    "date": "1999-11-30 12:00 UTC", "hosts": ["h1", "h2", "h3"], "proxy_floats": 206922, "link": "a test link",
    "wire": [{"floats": 1e6, "mbytes": 4.0, "raw_round_trips_per_s": 125.0, "round_trips_per_s": 109.4,
              "apply_ms": 0.472, "vs_bound": summarise([1.1, 1.12, 1.2], [1.0, 1.0, 1.0], lower_bound=True),
              "load_avg": [5.07, 5.12]}],
    "load": [{"clients": 2, "floats": 206922, "pushes_per_s": 538.2, "server_busy": 0.15, "load_avg": [5.0, 5.04]}],
    "training": {"clients": 2, "steps": 150, "batch_size": 64, "trials": 2, "rule": "fresh",
                 "ours_samples_per_s": 2967.0, "ddp_samples_per_s": 4994.0,
                 "vs_ddp": summarise([2967.0, 3000.0], [4994.0, 5000.0]), "load_avg": [4.8, 5.0, 4.9]},
}


def test_the_tables_say_where_each_side_ran_and_the_load():
    text = "\n".join(hosts.tables(SECTION, "per trial"))
    assert "the server on h1, clients on h2 and h3; a test link" in text and "1999-11-30 12:00 UTC" in text
    assert "| 1e+06 | 4.00 | 125 | 109 | 0.472 | 1.12 (1.11-1.16) | 5.1-5.1 |" in text
    assert "| 2 | 2.07e+05 | 538 | 15% | 5.0-5.0 |" in text
    assert "| ours: async, n_sync 1, --rule fresh, server on h1 | 2967 | 0.60 (0.60-0.60) | 4.8-5.0 |" in text
    assert "| torch DDP (gloo), its ranks on h2 and h3 | 4994 | | |" in text
    skipped = {**SECTION, "training": {"skipped": "Fashion-MNIST is not installed"}}
    assert "Training across hosts: not measured: Fashion-MNIST is not installed." in hosts.tables(skipped, "x")
