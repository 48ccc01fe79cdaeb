"""The one settings object: every knob from the environment, CLI flags and pytest options by the
same code, with the same validation; and the topology a front end gets from it."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from obmm import envvars
from obmm.testbed import settings as settings_mod
from obmm.testbed.session import topology_for
from obmm.testbed.settings import KNOBS, Settings, SettingsError


def _parser(fields: list[str] | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    settings_mod.add_arguments(p, fields)
    return p


def test_every_knob_is_a_settings_field_and_a_testbed_variable() -> None:
    fields = {f.name for f in Settings.__dataclass_fields__.values()}
    assert {k.field for k in KNOBS} == fields
    assert {k.var for k in KNOBS} == set(envvars.in_group("testbed"))
    for knob in KNOBS:  # each field's default is its variable's
        assert getattr(Settings(), knob.field) == knob.var.default, knob.field


def test_defaults_without_environment() -> None:
    s = Settings.from_env({})
    assert (s.init, s.accel, s.snapshot, s.kernel, s.driver) == (
        "fast", "auto", "auto", "debian", "emu",
    )  # fmt: skip
    assert s.topology is None and s.name is None and s.params == ()


def test_the_environment_sets_every_kind_of_knob() -> None:
    env = {
        "OBMM_TESTBED_TOPOLOGY": "quad",
        "OBMM_TESTBED_NODES": "3",
        "OBMM_TESTBED_MEMORY_MIB": "2048",
        "OBMM_TESTBED_INIT": "systemd",
        "OBMM_TESTBED_TIMEOUT_SCALE": "2.5",
        "OBMM_TESTBED_PARAMS": "ubc_index=1 ubc_dev=00002",
    }
    s = Settings.from_env(env)
    assert (s.topology, s.nodes, s.memory_mib, s.init) == ("quad", 3, 2048, "systemd")
    assert s.timeout_scale == 2.5
    assert s.params == ("ubc_index=1", "ubc_dev=00002")
    assert s.param_map == {"ubc_index": "1", "ubc_dev": "00002"}


def test_a_flag_given_wins_over_the_environment_and_parameters_merge_by_name() -> None:
    env = {"OBMM_TESTBED_INIT": "systemd", "OBMM_TESTBED_PARAMS": "a=0 c=3"}
    args = _parser().parse_args(["--nodes", "2", "--param", "a=1", "--param", "b=2"])
    s = settings_mod.from_args(args, env)
    assert s.nodes == 2 and s.init == "systemd"  # unset flags leave the environment's value
    assert s.params == ("c=3", "a=1", "b=2")
    args = _parser().parse_args(["--init", "fast"])
    assert settings_mod.from_args(args, env).init == "fast"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"OBMM_TESTBED_INIT": "runit"}, "OBMM_TESTBED_INIT='runit': must be one of fast, systemd"),
        ({"OBMM_TESTBED_NODES": "two"}, "OBMM_TESTBED_NODES='two': not a valid int"),
        ({"OBMM_TESTBED_NODES": "9"}, "9 is not 1..8"),
        ({"OBMM_TESTBED_SNAPSHOT": "always"}, "must be one of auto, off"),
        ({"OBMM_TESTBED_PARAMS": "ubc_index"}, "'ubc_index' is not NAME=VALUE"),
        ({"OBMM_TESTBED_POOL_MIB": "0"}, "--pool: 0 must be positive"),
        ({"OBMM_TESTBED_NAME": "a/b"}, "invalid cluster name 'a/b'"),
    ],
)
def test_a_bad_value_is_refused_naming_the_variable_or_flag(
    env: dict[str, str], message: str
) -> None:
    with pytest.raises(SettingsError, match=message):
        Settings.from_env(env)


def test_a_bad_flag_value_is_an_argparse_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parser().parse_args(["--nodes", "x"])
    assert "argument --nodes: 'x' is not a valid value" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _parser().parse_args(["--accel", "hvf"])


def test_front_end_defaults_fill_only_what_is_unset() -> None:
    s = Settings.from_env({"OBMM_TESTBED_NAME": "mine"})
    filled = s.with_defaults(name="run-1", nodes=2, topology="pair")
    assert (filled.name, filled.nodes, filled.topology) == ("mine", 2, "pair")


def test_the_topology_gets_the_settings_shape() -> None:
    topo = topology_for(Settings(nodes=3, pool_mib=64), "pair")
    assert (topo.nodes, topo.pool_mib) == (3, 64)
    assert topology_for(Settings(), "single").nodes == 1
    assert topology_for(Settings(topology="quad"), "single").nodes == 4


def test_pytest_options_are_the_same_knobs(tmp_path: Path) -> None:
    """A pytest run of another project: --obmm-* options reach the plugin's settings."""
    (tmp_path / "test_probe.py").write_text(
        "import pytest\n"
        "from obmm.testbed.pytest_cluster import Testbed\n"
        "def test_settings(request: pytest.FixtureRequest) -> None:\n"
        "    s = Testbed(request.config).default_settings()\n"
        "    print('SETTINGS', s.nodes, s.init, s.params)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-s", "-q",
         "--obmm-nodes", "3", "--obmm-init", "systemd", "--obmm-param", "ubc_index=1",
         str(tmp_path / "test_probe.py")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False,
        env={"PATH": "/usr/bin:/bin", "OBMM_TESTBED_PARAMS": "ubc_dev=00002"},
    )  # fmt: skip
    assert "SETTINGS 3 systemd ('ubc_dev=00002', 'ubc_index=1')" in proc.stdout, proc.stdout


def test_the_settings_page_documents_every_variable() -> None:
    page = (Path(__file__).resolve().parents[3] / "docs" / "settings.md").read_text()
    assert envvars.render_markdown() in page
    for var in envvars.ALL:
        assert f"`{var.name}`" in page, var.name


def test_scaled_stretches_a_wait_by_the_timeout_scale() -> None:
    # The suites' waits for work of the machine's pace (the signal matrix's, the runner's).
    assert settings_mod.scaled(300, {}, busy=1.0) == 300
    assert settings_mod.scaled(300, {envvars.TIMEOUT_SCALE.name: "2.5"}, busy=1.0) == 750
    assert settings_mod.scaled(300, {envvars.TIMEOUT_SCALE.name: "2.5"}, busy=2.0) == 1500
    # a session's own scale (its Settings) wins over the environment's
    assert settings_mod.scaled(300, {envvars.TIMEOUT_SCALE.name: "2.5"}, scale=3, busy=2.0) == 1800
    with pytest.raises(ValueError, match="OBMM_TESTBED_TIMEOUT_SCALE"):
        settings_mod.scaled(1, {envvars.TIMEOUT_SCALE.name: "slow"})


def test_busy_factor_is_runnable_tasks_per_core_between_1_and_its_ceiling() -> None:
    # A busy machine stretches the waits (issue 33: a second cluster beside make test).
    assert settings_mod.busy_factor(load=0.3, cpus=2) == 1.0
    assert settings_mod.busy_factor(load=7.0, cpus=2) == 3.5
    assert settings_mod.busy_factor(load=100.0, cpus=2) == settings_mod.BUSY_FACTOR_MAX
    assert settings_mod.busy_factor(load=3.0, cpus=0) == 3.0
    assert 1.0 <= settings_mod.busy_factor() <= settings_mod.BUSY_FACTOR_MAX
    assert settings_mod.scaled(10, {}) >= 10


def test_the_coherence_model_reaches_the_driver_parameters_only_when_strict() -> None:
    # coherent (the default) loads exactly the parameters it loaded before the setting existed
    assert Settings.from_env({"OBMM_TESTBED_PARAMS": "a=1"}).driver_params == ("a=1",)
    s = Settings.from_env({"OBMM_TESTBED_COHERENCE": "strict", "OBMM_TESTBED_PARAMS": "a=1"})
    assert s.driver_params == ("coherence=strict", "a=1")
    args = _parser().parse_args(["--coherence", "strict"])
    assert settings_mod.from_args(args, {}).driver_params == ("coherence=strict",)
    # an explicit --param coherence=... wins, as any parameter given
    s = Settings.from_env({"OBMM_TESTBED_COHERENCE": "strict"}, params=("coherence=coherent",))
    assert s.driver_params == ("coherence=coherent",)


def test_strict_coherence_is_the_emulators_and_refused_for_the_real_driver() -> None:
    with pytest.raises(SettingsError, match="OBMM_TESTBED_COHERENCE: 'strict' is the emulator"):
        Settings.from_env({"OBMM_TESTBED_COHERENCE": "strict", "OBMM_TESTBED_DRIVER": "real"})
    with pytest.raises(SettingsError, match="must be one of coherent, strict"):
        Settings.from_env({"OBMM_TESTBED_COHERENCE": "loose"})
