"""The target DSN of the apply app: from an environment variable or a private file named in its arguments.

Never from the arguments themselves: a command line shows in ``ps``, in spark-submit's log and in the Spark
UI. In client deploy mode the operator hands the DSN to spark-submit's environment (``--dsn-env``); a driver
that runs on the cluster (``--deploy-mode cluster``) gets it from the cluster's secret store, as an
environment variable (``spark.kubernetes.driver.secretKeyRef.*``) or as a file shipped or mounted next to it
(``--dsn-file``; docs/spark.md#cluster-deploy-mode). Errors name the variable or the file, never the value.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from airflow_provider_pglogical.apply.config import ApplyConfig
from airflow_provider_pglogical.exceptions import ApplyError


def read_dsn_file(name: str) -> str:
    """The DSN in file ``name`` (relative: to the driver's working directory, where YARN puts ``--files``).

    The file must be private to its owner: a DSN readable by the group or others is refused rather than used.
    """
    path = Path(name)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise ApplyError(f"DSN file {path} does not exist (working directory {Path.cwd()})") from None
    except OSError as e:
        raise ApplyError(f"DSN file {path} cannot be read: {e.strerror}") from None
    if not stat.S_ISREG(mode):
        raise ApplyError(f"DSN file {path} is not a regular file")
    if mode & 0o077:
        raise ApplyError(f"DSN file {path} must not be readable by group or others (chmod 600)")
    try:
        dsn = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        raise ApplyError(f"DSN file {path} cannot be read: {getattr(e, 'strerror', None) or type(e).__name__}") from None
    if not dsn:
        raise ApplyError(f"DSN file {path} is empty")
    return dsn


def read_dsn_env(name: str) -> str:
    """The DSN in environment variable ``name``."""
    dsn = os.environ.get(name, "").strip()
    if not dsn:
        raise ApplyError(f"environment variable {name} with the target DSN is not set" if name not in os.environ
                         else f"environment variable {name} with the target DSN is empty")
    return dsn


def read_dsn(config: ApplyConfig) -> str:
    """``config.dsn_file`` when given, else ``config.dsn_env``."""
    return read_dsn_file(config.dsn_file) if config.dsn_file else read_dsn_env(config.dsn_env)
