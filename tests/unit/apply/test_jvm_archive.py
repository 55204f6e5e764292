"""The class archive's bookkeeping (apply/jvm_archive.py): its path, its one writer, its publication, its switches.

A fake pyspark (jars and a ``bin/spark-submit`` script that writes what the JVM would dump) and a fake JDK stand in
for the real ones here; tests/integration/test_jvm_archive.py has real JVMs write and map it.
"""

from __future__ import annotations

import fcntl
import os
import sys
import time
from pathlib import Path

import pytest

from airflow_provider_pglogical.apply import jvm_archive
from airflow_provider_pglogical.apply.jvm_archive import DIR_VARIABLE, DRIVER_OPTIONS, SWITCH

# Writes the file named by -XX:ArchiveClassesAtExit, as the JVM does at its exit; counts its calls next to itself;
# fails when a file ``fail`` is there; notes where it dumped and the environment it ran with.
FAKE_SUBMIT = r"""#!/bin/sh
here=$(dirname "$0")
echo call >> "$here/../calls"
env > "$here/../submit-env"
[ -e "$here/../fail" ] && exit 1
for arg in "$@"; do
  case "$arg" in *ArchiveClassesAtExit=*) out=${arg#*ArchiveClassesAtExit=}; out=${out%% *};; esac
done
echo "$out" >> "$here/../dumped"
printf 'archived classes' > "$out"
"""


class Machine:
    def __init__(self, root: Path) -> None:
        self.spark = root / "pyspark"
        (self.spark / "jars").mkdir(parents=True)
        (self.spark / "bin").mkdir()
        (self.spark / "jars" / "spark-core_2.13-4.0.0.jar").write_bytes(b"core")
        submit = self.spark / "bin" / "spark-submit"
        submit.write_text(FAKE_SUBMIT)
        submit.chmod(0o755)
        self.jdk = root / "jdk"
        (self.jdk / "bin").mkdir(parents=True)
        # A JDK whose JVM refuses its options when a file ``refuse`` is beside it (it only ever runs ``-version``).
        java = self.jdk / "bin" / "java"
        java.write_text('#!/bin/sh\n[ -e "$(dirname "$0")/../refuse" ] && exit 1\nexit 0\n')
        java.chmod(0o755)
        self.cache = root / "cache"
        self.env = {"JAVA_HOME": str(self.jdk), DIR_VARIABLE: str(self.cache), "PATH": os.environ["PATH"],
                    "HOME": str(root / "home")}

    def calls(self) -> int:
        calls = self.spark / "calls"
        return len(calls.read_text().splitlines()) if calls.exists() else 0


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Machine:
    found = Machine(tmp_path)
    monkeypatch.setattr(jvm_archive, "pyspark_dir", lambda: found.spark)
    return found


def test_the_archive_path_changes_with_the_jdk_and_with_pysparks_jars(machine, tmp_path):
    first = jvm_archive.archive_path(machine.env)
    assert first is not None and first.parent == machine.cache
    assert jvm_archive.archive_path(machine.env) == first
    (machine.spark / "jars" / "spark-core_2.13-4.0.0.jar").write_bytes(b"core, patched")
    second = jvm_archive.archive_path(machine.env)
    assert second != first
    other = tmp_path / "jdk21"
    (other / "bin").mkdir(parents=True)
    (other / "bin" / "java").write_text("#!/bin/sh\n")
    assert jvm_archive.archive_path({**machine.env, "JAVA_HOME": str(other)}) not in {first, second}


def test_no_jdk_means_no_archive(machine, tmp_path):
    assert jvm_archive.archive_path({**machine.env, "JAVA_HOME": str(tmp_path / "nowhere"), "PATH": ""}) is None
    assert jvm_archive.driver_conf("local[*]", {}, {**machine.env, "JAVA_HOME": str(tmp_path / "nowhere"),
                                                    "PATH": ""}, write=False) == {}


def test_the_archives_live_in_the_override_else_the_xdg_cache_else_the_home_cache():
    assert jvm_archive.cache_dir({DIR_VARIABLE: "/a", "XDG_CACHE_HOME": "/b", "HOME": "/c"}) == Path("/a")
    assert jvm_archive.cache_dir({"XDG_CACHE_HOME": "/b", "HOME": "/c"}) == Path("/b/pglogical/jvm")
    assert jvm_archive.cache_dir({"HOME": "/c"}) == Path("/c/.cache/pglogical/jvm")


def test_the_archive_is_written_once_and_appears_whole_under_its_name(machine):
    path = jvm_archive.ensure_archive(environ=machine.env)
    assert path == jvm_archive.archive_path(machine.env)
    assert path is not None and path.read_bytes() == b"archived classes"
    [dumped] = (machine.spark / "dumped").read_text().split()
    # The JVM dumps outside the cache directory; the archive only appears there, whole, by a rename.
    assert Path(dumped).parent != machine.cache and Path(dumped) != path
    assert [p.name for p in machine.cache.iterdir() if p.suffix == ".partial" or ".partial" in p.name] == []
    assert jvm_archive.ensure_archive(environ=machine.env) == path
    assert jvm_archive.start_writer(machine.env) is False
    assert machine.calls() == 1


def test_a_failed_write_leaves_a_marker_and_is_not_tried_again(machine):
    (machine.spark / "fail").touch()
    assert jvm_archive.ensure_archive(environ=machine.env) is None
    assert jvm_archive.ensure_archive(environ=machine.env) is None
    assert jvm_archive.start_writer(machine.env) is False
    assert machine.calls() == 1
    path = jvm_archive.archive_path(machine.env)
    assert path is not None and not path.exists() and path.with_suffix(".failed").exists()


def test_a_writer_holding_the_lock_makes_the_others_go_on_without_the_archive(machine):
    path = jvm_archive.archive_path(machine.env)
    assert path is not None
    machine.cache.mkdir(parents=True)
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        assert jvm_archive.ensure_archive(wait=False, environ=machine.env) is None
        assert jvm_archive.start_writer(machine.env) is False
    assert machine.calls() == 0
    assert jvm_archive.ensure_archive(wait=False, environ=machine.env) == path


def test_an_unwritable_cache_directory_means_no_archive_silently(machine, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = {**machine.env, DIR_VARIABLE: str(blocker / "jvm")}
    assert jvm_archive.ensure_archive(environ=env) is None
    assert jvm_archive.start_writer(env) is False
    assert jvm_archive.driver_conf("local[*]", {DRIVER_OPTIONS: "-Dmine=1"}, env) == {DRIVER_OPTIONS: "-Dmine=1"}
    assert machine.calls() == 0


def test_a_local_driver_gets_the_archive_appended_to_the_users_own_options(machine):
    path = jvm_archive.ensure_archive(environ=machine.env)
    assert path is not None
    conf = jvm_archive.driver_conf("local[*]", {DRIVER_OPTIONS: "-Dmine=1 -Xss4m", "spark.x": "y"}, machine.env)
    assert conf["spark.x"] == "y"
    assert conf[DRIVER_OPTIONS] == f"-Dmine=1 -Xss4m {jvm_archive.archive_options(path)}"
    assert f"-XX:SharedArchiveFile={path}" in conf[DRIVER_OPTIONS].split()
    assert jvm_archive.driver_conf("local[2]", {}, machine.env)[DRIVER_OPTIONS] == jvm_archive.archive_options(path)


@pytest.mark.parametrize("master", ["spark://host:7077", "yarn", "k8s://https://host:443", "sc://host:15002", None])
def test_a_non_local_master_never_gets_the_archive_on_its_command_line(machine, master):
    assert jvm_archive.ensure_archive(environ=machine.env) is not None
    assert jvm_archive.driver_conf(master, {DRIVER_OPTIONS: "-Dmine=1"}, machine.env) == {DRIVER_OPTIONS: "-Dmine=1"}


@pytest.mark.parametrize(("extra", "options"), [
    ({SWITCH: "off"}, "-Dmine=1"),
    ({SWITCH: "0"}, ""),
    ({}, "-Dmine=1 -Xshare:off"),
    ({}, "-XX:SharedArchiveFile=/elsewhere/mine.jsa"),
    ({"SPARK_SUBMIT_OPTS": "-XX:SharedArchiveFile=/elsewhere/mine.jsa"}, ""),
    ({"JAVA_TOOL_OPTIONS": "-Xshare:off"}, ""),
    ({"SPARK_CONF_DIR": "/etc/spark"}, "-Dmine=1"),  # first on the class path: the JVM would refuse the archive
    ({"SPARK_HOME": "/opt/spark"}, ""),  # another Spark's jars
])
def test_the_switch_and_the_users_own_class_sharing_choices_leave_the_options_alone(machine, extra, options):
    assert jvm_archive.ensure_archive(environ=machine.env) is not None
    conf = {DRIVER_OPTIONS: options} if options else {}
    assert jvm_archive.driver_conf("local[*]", conf, {**machine.env, **extra}) == conf


def test_pysparks_own_spark_home_still_gets_the_archive(machine):
    path = jvm_archive.ensure_archive(environ=machine.env)
    conf = jvm_archive.driver_conf("local[*]", {}, {**machine.env, "SPARK_HOME": str(machine.spark)})
    assert conf == {DRIVER_OPTIONS: jvm_archive.archive_options(path)}  # type: ignore[arg-type]


def test_before_the_archive_is_written_a_driver_starts_as_it_did(machine):
    assert jvm_archive.driver_conf("local[*]", {DRIVER_OPTIONS: "-Dmine=1"}, machine.env, write=False) == \
        {DRIVER_OPTIONS: "-Dmine=1"}
    assert machine.calls() == 0


def test_an_archive_whose_options_this_jdk_refuses_is_not_published(machine):
    (machine.jdk / "refuse").touch()
    assert jvm_archive.ensure_archive(environ=machine.env) is None
    path = jvm_archive.archive_path(machine.env)
    assert path is not None and not path.exists() and path.with_suffix(".failed").exists()
    assert jvm_archive.driver_conf("local[*]", {}, machine.env, write=False) == {}


def test_a_cache_path_spark_would_split_adds_no_options(machine, tmp_path):
    env = {**machine.env, DIR_VARIABLE: str(tmp_path / "my cache")}
    path = jvm_archive.ensure_archive(environ=env)
    assert path is not None and path.exists()
    assert jvm_archive.driver_conf("local[*]", {DRIVER_OPTIONS: "-Xmx1g"}, env, write=False) == {
        DRIVER_OPTIONS: "-Xmx1g"}


def test_a_quote_in_the_users_options_is_not_an_error(machine):
    jvm_archive.ensure_archive(environ=machine.env)
    conf = jvm_archive.driver_conf("local[*]", {}, {**machine.env, "SPARK_SUBMIT_OPTS": "-Dname=O'Brien"}, write=False)
    assert "-XX:SharedArchiveFile=" in conf[DRIVER_OPTIONS]


# What a task's environment holds besides what finds the JDK: the source's password, object-store keys, Airflow's
# connections and secrets. The background writer runs ``java`` only: none of it may reach the writer's process or
# the spark-submit it runs (which would hand it on to its JVM and Python workers).
SECRETS = {"PGPASSWORD": "pg-secret", "AWS_ACCESS_KEY_ID": "aws-key", "AWS_SECRET_ACCESS_KEY": "aws-secret",
           "AWS_SESSION_TOKEN": "aws-token", "AIRFLOW_CONN_PG_SOURCE": "postgresql://u:conn-secret@db/src",
           "AIRFLOW__CORE__FERNET_KEY": "fernet-secret", "AZURE_STORAGE_ACCOUNT_KEY": "azure-secret",
           "GOOGLE_APPLICATION_CREDENTIALS": "/keys/gcs-secret.json", "PGLOGICAL_SOURCE_DSN": "dsn-secret"}


def environment(path: Path) -> dict[str, str]:
    """``env``'s output (one NAME=value a line) as a dict."""
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def assert_no_secrets(seen: dict[str, str]) -> None:
    assert sorted(set(SECRETS) & set(seen)) == []
    assert [name for name, value in seen.items() if any(s in value for s in SECRETS.values())] == []


def test_the_writer_process_gets_none_of_the_tasks_secrets(machine, tmp_path, monkeypatch):
    """``start_writer``'s background process: an interpreter standing in for Python notes its environment."""
    noted = tmp_path / "writer-env"
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nenv > "{noted}.partial" && mv "{noted}.partial" "{noted}"\n')
    python.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(python))
    assert jvm_archive.start_writer({**machine.env, **SECRETS}) is True
    deadline = time.monotonic() + 60
    while not noted.exists():
        assert time.monotonic() < deadline, "the writer process did not start"
        time.sleep(0.05)
    seen = environment(noted)
    assert_no_secrets(seen)
    # What finds the JDK and the cache directory is there (the writer works with it alone).
    assert {k: seen.get(k) for k in ("JAVA_HOME", DIR_VARIABLE, "HOME")} == {
        k: machine.env[k] for k in ("JAVA_HOME", DIR_VARIABLE, "HOME")}


def test_the_writers_spark_submit_gets_none_of_the_tasks_secrets(machine):
    """The spark-submit the writer runs (its JVM and Python workers inherit its environment)."""
    assert jvm_archive.ensure_archive(environ={**machine.env, **SECRETS}) is not None
    seen = environment(machine.spark / "submit-env")
    assert_no_secrets(seen)
    assert seen["JAVA_HOME"] == machine.env["JAVA_HOME"] and seen["PYSPARK_PYTHON"] == sys.executable
