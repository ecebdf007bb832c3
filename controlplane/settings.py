"""Settings for the rlplane control plane. Everything that differs per install comes from
the environment:

    RLPLANE_SECRET_KEY     default: generated once into .rlplane/secret_key
    RLPLANE_DEBUG          1/true/yes/on; default off (manage.py runserver turns it on)
    RLPLANE_ALLOWED_HOSTS  comma-separated; default localhost,127.0.0.1
    DATABASE_URL           postgres://...; default SQLite (WAL) at ./db.sqlite3
    REDIS_URL              channel layer, alert debounce keys; default redis://127.0.0.1:6379/0
    RLPLANE_RAY_JOB_PREFIX its runs' Ray job ids; default rlplane-run- (one per control
                           plane when two share a Ray cluster)

The rest (RAY_*, RLPLANE_RUNS_DIR, RLPLANE_URL, RLPLANE_DRIVER_RESOURCES, ...) are
described where they are read below; deploy/rlplane.env.example lists every one.

Behind TLS (the deploy switches; `manage.py check --deploy` is clean with them on):

    RLPLANE_SECURE                 1: secure cookies, HTTPS redirect, HSTS (a year)
    RLPLANE_PROXY_TLS              1: trust X-Forwarded-Proto from the reverse proxy (only
                                   when the proxy sets it and strips a client's own)
    RLPLANE_CSRF_TRUSTED_ORIGINS   comma-separated, e.g. https://rl.example.com
    RLPLANE_SESSION_HOURS          how long a login lasts; default 12
    RLPLANE_LOGIN_FAILURES         failed logins (per user and address) before a 15-minute
                                   lockout (django-axes); default 5
"""

import os
import re
from datetime import timedelta
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

from django.core.exceptions import ImproperlyConfigured

from controlplane.database import parse_database_url, sqlite_database
from controlplane.secret import load_or_create_secret_key

BASE_DIR = Path(__file__).resolve().parent.parent
STATE_DIR = BASE_DIR / ".rlplane"


def env_flag(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def parse_resources(items: list[str]) -> dict[str, float]:
    """RLPLANE_DRIVER_RESOURCES: ["name=amount", ...] -> {name: amount}; custom resources
    only (Ray takes CPUs and GPUs of an entrypoint by other arguments)."""
    resources = {}
    for item in items:
        name, _, amount = item.partition("=")
        name = name.strip()
        try:
            value = float(amount)
        except ValueError:
            value = 0.0
        if not name or name in {"CPU", "GPU", "memory"} or not value > 0:
            raise ImproperlyConfigured(
                f"RLPLANE_DRIVER_RESOURCES: {item!r} is not name=amount with a custom Ray "
                "resource (not CPU, GPU or memory) and an amount above 0, e.g. "
                "rlplane_driver=1")
        resources[name] = value
    return resources


def env_list(name: str, default: str = "") -> list[str]:
    """A comma-separated setting, blanks dropped."""
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


SECRET_KEY = load_or_create_secret_key(STATE_DIR / "secret_key")
DEBUG = env_flag("RLPLANE_DEBUG", default=False)
ALLOWED_HOSTS = env_list("RLPLANE_ALLOWED_HOSTS", "localhost,127.0.0.1")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "django_htmx",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # the docs page's Swagger UI, served locally (offline)
    "axes",
    "jobs",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Errors under /api/ are JSON, whichever layer answers (an unmatched path, a 500).
    "jobs.rest.middleware.ApiErrorsAsJson",
    # Static files from the ASGI process itself: no separate web server, works offline.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Login throttling; last, as django-axes asks.
    "axes.middleware.AxesMiddleware",
]

# --- Logins: throttled by django-axes (a well-kept lockout with an audit trail in the
# admin), per username and address, so one guessed account does not lock out the others.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = int(os.environ.get("RLPLANE_LOGIN_FAILURES", "5"))
AXES_COOLOFF_TIME = timedelta(minutes=15)
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
SESSION_COOKIE_AGE = int(float(os.environ.get("RLPLANE_SESSION_HOURS", "12")) * 3600)

# --- Deploy switches (module docstring). Off by default: the embedded stack is plain
# HTTP on loopback.
if env_flag("RLPLANE_PROXY_TLS", default=False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
if env_flag("RLPLANE_SECURE", default=False):
    SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = True
    SECURE_SSL_REDIRECT = True
    SECURE_REDIRECT_EXEMPT = [r"^healthz$"]      # load balancer probes speak plain HTTP
    SECURE_HSTS_SECONDS = 365 * 24 * 3600
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
CSRF_TRUSTED_ORIGINS = env_list("RLPLANE_CSRF_TRUSTED_ORIGINS")

ROOT_URLCONF = "controlplane.urls"
WSGI_APPLICATION = "controlplane.wsgi.application"
ASGI_APPLICATION = "controlplane.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

if os.environ.get("DATABASE_URL"):
    DATABASES = {"default": parse_database_url(os.environ["DATABASE_URL"])}
else:
    DATABASES = {"default": sqlite_database(BASE_DIR / "db.sqlite3")}

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")


def channel_prefix(redis_url: str) -> str:
    """The channel layer's names for a Redis URL: pub/sub channels belong to the whole
    server, not to its numbered databases, so two control planes on one Redis (staging in
    /1, production in /0) heard each other's broadcasts, a run page showing another
    deployment's run of the same id. The database number (path or ?db=) keeps them apart."""
    parts = urlsplit(redis_url)
    db = dict(parse_qsl(parts.query)).get("db", "0")
    if parts.scheme in ("redis", "rediss") and parts.path.strip("/"):
        db = parts.path.strip("/")     # unix://'s path is its socket's
    return f"rlplane.db{db}."


CHANNEL_LAYERS = {
    "default": {
        # Pub/sub: a broadcast reaches each web process as one message, fanned out to its
        # sockets in memory (the list-based RedisChannelLayer took four Redis round trips
        # per message under one receive lock: seconds behind with 200 watchers). At most
        # once, like the list layer's dropped messages: a socket that misses one fills
        # the gap from the database (jobs/consumers.py).
        "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
        # redis-py's asyncio pool refuses a 101st connection in use at once (it does not
        # wait): 200 sockets opening together (watchers reloading a page) each join their
        # groups at once, and the ones past 100 failed with MaxConnectionsError.
        # A process sends on one kept connection (jobs.groups.group_send): checked before
        # use after 30 s idle, with TCP keepalive, so one that went half-open (a NAT or
        # firewall dropped it) is replaced instead of holding every send for its timeout.
        "CONFIG": {"hosts": [{"address": REDIS_URL, "max_connections": 2000,
                              "health_check_interval": 30, "socket_keepalive": True}],
                   "prefix": channel_prefix(REDIS_URL)},
    },
}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = STATE_DIR / "collected-static"
# WhiteNoise also serves straight from STATICFILES_DIRS, so a fresh clone needs no
# collectstatic; the vendored JS carries its version in its file name.
WHITENOISE_USE_FINDERS = True
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # WhiteNoise warns at startup when it is missing

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "index"
LOGOUT_REDIRECT_URL = "login"

# --- Celery: short tasks only (submit, reconcile, stop); the run itself is a Ray job.
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", REDIS_URL)
CELERY_TASK_IGNORE_RESULT = True  # nothing reads task results; no result backend needed
CELERY_TASK_ACKS_LATE = False  # a redelivered long task would run twice; ours are short
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A message is fetched only when a pool process is free (Redis brokers; others ignore it).
# A fetched message waits unacknowledged in the worker until a process takes it, and a
# Redis that dies meanwhile makes kombu's restore of it crash the worker ("Unrecoverable
# error: AttributeError" in the channel's close, kombu 5.7): a debounced alert evaluation
# queued behind a sync was enough. The tasks here are short: a message that waits in Redis
# rather than in the worker is taken as soon as a process is free.
CELERY_WORKER_DISABLE_PREFETCH = True
# Celery's Django fixup closes the database connection around every task unless this is
# set (then every 1,000th): the debounced alert evaluations, about one per ingested batch,
# each paid a new PostgreSQL backend. Our own task_prerun/task_postrun handlers do what a
# request does instead (controlplane.celery: CONN_MAX_AGE, the health check, and a close
# after a task that failed, whose connection may be mid-query).
CELERY_DB_REUSE_MAX = 1000
CELERY_BEAT_SCHEDULE = {
    "sync-runs": {"task": "jobs.runs.tasks.sync_runs", "schedule": 10.0},
    # "Nothing happened" alert rules (a hang, a lost run) need a clock, not an event.
    "evaluate-alerts": {"task": "jobs.alerts.tasks.evaluate_alerts", "schedule": 10.0},
    # A worker killed after claiming a notification, or a task lost with the broker.
    "redeliver-notifications": {"task": "jobs.alerts.delivery.redeliver_notifications",
                                "schedule": 30.0},
    # Raw metric points of runs finished past RLPLANE_RAW_POINTS_RETENTION_DAYS.
    "drop-expired-points": {"task": "jobs.rollups.drop_expired_points", "schedule": 3600.0},
}

# --- Ray: where runs go. RAY_ADDRESS is the GCS (host:port) for ray.init-style clients;
# jobs are submitted to the dashboard's HTTP address. Ray 2.60 clusters require a token
# (RAY_AUTH_MODE=token): RAY_AUTH_TOKEN holds it, or RAY_AUTH_TOKEN_PATH names its file.
RAY_ADDRESS = os.environ.get("RAY_ADDRESS", "127.0.0.1:6379")
RAY_DASHBOARD_ADDRESS = os.environ.get("RAY_DASHBOARD_ADDRESS", "http://127.0.0.1:8265")
RAY_AUTH_TOKEN_PATH = os.environ.get(
    "RAY_AUTH_TOKEN_PATH", str(Path.home() / ".ray" / "auth_token"))

# --- What a run's driver needs: where to write its run directory (on the Ray node), and
# the control plane's URL as the driver reaches it (ingest, stop poll).
RLPLANE_RUNS_DIR = Path(os.environ.get("RLPLANE_RUNS_DIR", BASE_DIR / "runs"))
RLPLANE_URL = os.environ.get("RLPLANE_URL", "http://127.0.0.1:8000")
# The Ray resources a run's driver reserves (its job's entrypoint_resources), as
# name=amount pairs, e.g. "rlplane_driver=1": only nodes started with that resource
# (`ray start --resources='{"rlplane_driver": 4}'`) hold drivers, at most that many each.
# Unset: the driver reserves nothing, and Ray runs it on the head node.
RLPLANE_DRIVER_RESOURCES = parse_resources(env_list("RLPLANE_DRIVER_RESOURCES"))
# How long a driver has to checkpoint and exit after a stop request before its Ray job is
# stopped (which kills it after a short grace period).
RLPLANE_STOP_TIMEOUT_S = float(os.environ.get("RLPLANE_STOP_TIMEOUT_S", "120"))
# An admitted run that no submission reached after this long (its submit_run lost with the
# broker or a worker) is queued for submission again by sync_runs.
RLPLANE_RESUBMIT_AFTER_S = float(os.environ.get("RLPLANE_RESUBMIT_AFTER_S", "120"))
# The prefix of this control plane's Ray job ids ("<prefix><run id>"): two control planes
# submitting to one Ray cluster (staging beside production) give each its own, or their
# run ids collide and each would mark the other's runs lost.
RLPLANE_RAY_JOB_PREFIX = os.environ.get("RLPLANE_RAY_JOB_PREFIX", "rlplane-run-")
if not re.fullmatch(r"[A-Za-z]([A-Za-z0-9_-]{0,39}[A-Za-z_-])?", RLPLANE_RAY_JOB_PREFIX):
    raise ImproperlyConfigured(
        f"RLPLANE_RAY_JOB_PREFIX={RLPLANE_RAY_JOB_PREFIX!r}: up to 41 letters, digits, '-' or "
        "'_', from a letter to a non-digit (it starts a Ray job id, the run id follows); "
        "unset it for 'rlplane-run-'")
# The rollout inspector keeps each run's samples of its last this many sampled steps
# (older ones are deleted at ingest); at least 1.
RLPLANE_SAMPLE_STEPS = max(1, int(os.environ.get("RLPLANE_SAMPLE_STEPS", "200")))
# A run's distinct metric names (jobs/ingest/name_cap.py): past this, an event that adds
# names is refused, so a run token cannot make every read and scrape megabytes.
RLPLANE_MAX_METRIC_NAMES = max(1, int(os.environ.get("RLPLANE_MAX_METRIC_NAMES", "1000")))

# --- Alerts after ingest (jobs/alerts/debounce.py): > 0, a run's rules run on the Celery
# worker after the batch committed, the batches that arrive while its evaluation waits in
# the queue coalesced into it; 0 evaluates in the ingest request itself, right after its
# transaction (tests; an install without a worker).
RLPLANE_ALERT_DEBOUNCE_S = max(0.0, float(os.environ.get("RLPLANE_ALERT_DEBOUNCE_S", "1")))

# Ingest batches one web process stores at once (jobs/ingest/endpoints.py); the others
# wait for a slot, holding no database connection.
RLPLANE_INGEST_CONCURRENCY = max(1, int(os.environ.get("RLPLANE_INGEST_CONCURRENCY", "4")))

# A finished run's raw metric points (one row per metric per step) are deleted this many
# days after it finished; its charts then draw from the tiers kept as points arrive
# (jobs/rollups.py: buckets of 10, 100, 1,000 and 10,000 steps with count, mean, min, max and
# last), and the API's series of it come from those. Unset or 0: raw points are kept.
RLPLANE_RAW_POINTS_RETENTION_DAYS = float(
    os.environ.get("RLPLANE_RAW_POINTS_RETENTION_DAYS", "0") or 0)

# --- The queue (jobs/runs/queue.py): how many in-process runs (the default colocated placement,
# which reserves nothing on Ray) may run at once on this host.
RLPLANE_MAX_LOCAL_RUNS = int(os.environ.get("RLPLANE_MAX_LOCAL_RUNS", "2"))

# --- Prometheus: /metrics answers only a scrape that sends this bearer token; unset, it
# answers 403 (a run's metrics are not public).
RLPLANE_METRICS_TOKEN = os.environ.get("RLPLANE_METRICS_TOKEN", "")
# A run's metrics /metrics exports: the canonical names (engine/metrics.py) and these,
# comma-separated (an external run's own names, e.g. "train/kl,train/entropy"); at most
# 100, so a run token cannot grow the scrape.
RLPLANE_PROMETHEUS_EXTRA_METRICS = env_list("RLPLANE_PROMETHEUS_EXTRA_METRICS")[:100]
# Webhook targets (jobs.alerts.http): hosts or networks let through although not public,
# and ones never reached; comma-separated, e.g. "hooks.internal,10.20.0.0/16".
RLPLANE_WEBHOOK_ALLOW = env_list("RLPLANE_WEBHOOK_ALLOW")
RLPLANE_WEBHOOK_DENY = env_list("RLPLANE_WEBHOOK_DENY")

# --- The REST API (jobs/rest/): API tokens or the session; reading needs a login,
# changing state needs an operator (jobs.auth), as on the pages.
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "jobs.rest.auth.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["jobs.rest.auth.ReadOrOperator"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["jobs.rest.parsers.BoundedJSONParser"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "jobs.rest.errors.exception_handler",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "rlplane API",
    "DESCRIPTION": "Runs, metrics, events, checkpoints, alerts, presets and the cluster. "
                   # A code span: the docs render Markdown, where a bare <token> is an
                   # HTML tag and vanishes ("Bearer '.").
                   "Send a token from /settings/tokens as `Authorization: Bearer <token>`.",
    "VERSION": "1",
    # Tags and operation ids from what follows /api/v1 (the pages' /api/runs/compare,
    # left out of the schema, would otherwise shorten the common prefix to /api).
    "SCHEMA_PATH_PREFIX": "/api/v1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],  # as every page
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums",
                             "jobs.rest.schema.declare_errors"],
}
