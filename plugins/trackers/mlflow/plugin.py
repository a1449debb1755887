"""mlflow: metrics, config and plan as an MLflow run, in RUN_DIR/mlflow.db (offline) unless asked.

By default rank 0 writes an MLflow run into a SQLite store, ``RUN_DIR/mlflow.db`` (MLflow 3's
recommended local store: its file store, ``./mlruns``, is in maintenance mode and refused unless
``MLFLOW_ALLOW_FILE_STORE=true``), with the run's files under ``RUN_DIR/mlartifacts``, and sends
nothing anywhere. Read it with ``mlflow ui --backend-store-uri sqlite:///RUN_DIR/mlflow.db`` or
``MlflowClient(tracking_uri="sqlite:///RUN_DIR/mlflow.db")`` (RUN_DIR absolute: four slashes in
all). ``trackers.mlflow.tracking_uri`` names another store: a SQLite file
(``sqlite:///PATH.db``; a relative PATH is inside the run directory, runs may share one) or a
tracking server (``http(s)://``), which then receives the run as it trains; its credentials come
from MLflow's environment variables (``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD``
or ``MLFLOW_TRACKING_TOKEN``), never from the config, so they are never in the printed or saved
config, the plan or the logs.

The run holds every metric of every logged step under the names ``metrics.jsonl`` has
(:mod:`olmx.metrics`: ``loss``, ``lr``, ``eval/loss``, ..., OLMo-core's for the others), with the
one substitution MLflow needs: characters it refuses in a name become ``_``
(``eval/downstream/copa (accuracy)`` is ``eval/downstream/copa _accuracy_``); the resolved config
as parameters (dotted keys) and as ``olmx/config.yaml``, and the plan as ``olmx/plan.md``. A
resume continues the same MLflow run (its id is kept in ``RUN_DIR/mlflow_run.json``); steps that
a stopped attempt logged after its last checkpoint are logged again by the resumed one (MLflow
keeps every point: per step, the latest is the one that counts). ``trainer.resume=false`` starts
a new MLflow run. Needs ``pip install 'olmx[mlflow]'`` (MLflow with its SQL store and ``mlflow
ui``). MLflow's own telemetry is turned off.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlsplit

from olmx.api import Context, Contribution, TrackerPlugin, require_package
from olmx.errors import ConfigError
from olmx.planning import check_writable

#: URI schemes of ``trackers.mlflow.tracking_uri``: a SQLite store or a tracking server.
SCHEMES = ("sqlite", "http", "https")
#: The SQLite file of the default store, in the run directory.
DEFAULT_DB = "mlflow.db"
#: The folder beside a SQLite store that holds its runs' files (config, plan).
ARTIFACTS = "mlartifacts"
#: What the run holds, for the plan's rows.
WHAT = "every metric, the config, the plan"
#: The file in the run directory that keeps the MLflow run's id, so that a resume continues it.
RUN_FILE = "mlflow_run.json"


@dataclass(frozen=True)
class MLflowConfig:
    """Settings of ``trackers.mlflow``."""

    #: Where the run goes: null (the default) is a SQLite store, ``RUN_DIR/mlflow.db`` (files
    #: in ``RUN_DIR/mlartifacts``), nothing sent; ``sqlite:///PATH.db`` is another SQLite store
    #: (a relative PATH is inside the run directory; ``sqlite:////abs/mlflow.db`` is shared by
    #: runs; files in ``mlartifacts`` beside it); ``http(s)://host[:port]`` is a tracking
    #: server, sent to while training. Never with credentials: MLflow reads them from
    #: ``MLFLOW_TRACKING_USERNAME`` / ``_PASSWORD`` / ``_TOKEN``.
    tracking_uri: Optional[str] = None
    #: MLflow experiment (created if missing).
    experiment: str = "olmx"
    #: Run name; null: the run directory's name.
    run_name: Optional[str] = None
    #: Tags of the run (``{team: nlp}``).
    tags: dict[str, str] = field(default_factory=dict)


class MLflow(TrackerPlugin):
    """Every metric, the resolved config and the plan as an MLflow run, offline unless asked."""

    name = "mlflow"
    api = ">=3.0,<4"
    Config = MLflowConfig

    def resolve(self, cfg: MLflowConfig, ctx: Context) -> Contribution:
        """Check the tracking URI and the experiment, and that ``mlflow`` is installed; say where the run goes."""
        field_name = f"{self.section}.tracking_uri"
        if not cfg.experiment.strip():
            raise ConfigError(f"{self.section}.experiment", "must name an MLflow experiment")
        require_package("mlflow", extra="mlflow", field=self.section)
        parts = urlsplit(cfg.tracking_uri or f"sqlite:///{DEFAULT_DB}")
        scheme = parts.scheme
        if scheme in ("", "file") or len(scheme) == 1:  # a path (a Windows drive letter reads as a scheme)
            raise ConfigError(
                field_name,
                f"'{cfg.tracking_uri}' is a file store, which MLflow 3 keeps in maintenance mode (refused unless "
                "MLFLOW_ALLOW_FILE_STORE=true); use a SQLite store, its recommended local one: "
                "sqlite:///PATH/mlflow.db (or leave it null: RUN_DIR/mlflow.db)",
            )
        if scheme not in SCHEMES:
            raise ConfigError(
                field_name,
                f"'{scheme}:' is not a store olmx writes to; allowed: a SQLite file (sqlite:///PATH.db) or a tracking "
                f"server (http:// or https://)",
            )
        if parts.username or parts.password:
            raise ConfigError(
                field_name,
                "holds credentials, which would end up in the saved config and the logs; put them in "
                "MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD or MLFLOW_TRACKING_TOKEN instead",
            )
        if scheme == "sqlite":
            for package in ("sqlalchemy", "alembic"):  # MLflow's SQL store (the full mlflow package brings them)
                require_package(package, extra="mlflow", field=self.section)
            check_store(cfg.tracking_uri, field_name)
            db = shown_path(cfg.tracking_uri)
            where = f"offline: SQLite store {db}, files in {ARTIFACTS}/ beside it ({WHAT}); nothing is sent"
            return Contribution(
                rows=[("writes", where), ("read with", f"mlflow ui --backend-store-uri sqlite:///{db}")]
            )
        if not parts.hostname:
            raise ConfigError(field_name, f"'{cfg.tracking_uri}' names no host")
        server = f"online: tracking server {cfg.tracking_uri}, experiment {cfg.experiment} ({WHAT})"
        return Contribution(rows=[("sends", server)])

    def callbacks(self, cfg: MLflowConfig, plan: Any) -> dict[str, Any]:
        """The callback that writes the MLflow run (the core adds it on rank 0)."""
        from olmx_plugins.trackers.common import plan_markdown
        from olmx_plugins.trackers.mlflow.callback import MLflowCallback

        uri = store_uri(plan.run_dir, cfg.tracking_uri)
        return {
            "mlflow": MLflowCallback(
                tracking_uri=uri,
                artifact_location=artifact_location(uri),
                experiment=cfg.experiment,
                run_name=cfg.run_name or Path(plan.run_dir).name,
                tags=dict(cfg.tags),
                run_file=str(Path(plan.run_dir) / RUN_FILE),
                resuming=plan.resume_step is not None,
                config=plan.to_dict()["config"],
                config_yaml=plan.config_yaml(),
                plan_md=plan_markdown(plan),
            )
        }


def _db_path(value: str | None) -> str:
    """The file a ``sqlite:///PATH`` URI names, as written (null: the default store's)."""
    return DEFAULT_DB if value is None else value.removeprefix("sqlite:///")


def check_store(value: str | None, field: str) -> None:
    """Refuse a SQLite store that MLflow could not open: no file named (``sqlite:///``: MLflow
    would open the run directory itself; ``sqlite://``: a store in memory, gone with the run), a
    folder, or an absolute file whose folder cannot be created or written (MLflow makes the
    missing folders; a relative file is inside the run directory, which the core checks)."""
    raw = _db_path(value)
    path = Path(raw)
    named = value is None or value.startswith("sqlite:///")
    if not named or not raw.strip() or raw.endswith("/") or (path.is_absolute() and path.is_dir()):
        raise ConfigError(field, f"'{value}' names no SQLite file: write sqlite:///PATH/mlflow.db")
    if path.is_absolute():
        check_writable(path.parent, field, hint=f"MLflow writes the store {path} there")


def shown_path(value: str | None) -> str:
    """A SQLite store's file as the plan shows it (relative paths read ``RUN_DIR/...``)."""
    path = _db_path(value)
    return path if Path(path).is_absolute() else f"RUN_DIR/{path}"


def store_uri(run_dir: str, value: Optional[str]) -> str:
    """The tracking URI MLflow gets: a SQLite store's file as an absolute path (null:
    ``RUN_DIR/mlflow.db``), or the server."""
    if value is not None and urlsplit(value).scheme in ("http", "https"):
        return value
    path = Path(_db_path(value))
    return f"sqlite:///{(Path(run_dir) / path if not path.is_absolute() else path).resolve()}"


def artifact_location(uri: str) -> str:
    """Where a new experiment in the store ``uri`` keeps its runs' files: ``mlartifacts``
    beside a SQLite file (as ``mlflow server`` keeps them beside its store by default); a
    server's own choice (empty)."""
    if not uri.startswith("sqlite:///"):
        return ""
    return (Path(uri.removeprefix("sqlite:///")).parent / ARTIFACTS).as_uri()


#: The plugin object the entry point names.
MLFLOW = MLflow()
