"""gunicorn settings for a servekit image: ``exec gunicorn -c gunicorn.conf.py servekit.server.wsgi:app``.

Every option is taken from ``servekit serve``'s own gunicorn application
(``servekit.server.gunicorn_app.ServekitApplication``) built from the same
``SERVEKIT_*`` variables, so the image and the CLI cannot drift apart: gthread
workers, threads, timeouts, draining on SIGTERM, gRPC beside HTTP, log format.
``GUNICORN_CMD_ARGS`` still overrides anything here.
"""

import sys

from gunicorn.config import Config

from servekit.hooks import manager as plugins
from servekit.dataplane.repository import discover
from servekit.server import ports
from servekit.server.gunicorn_app import ServekitApplication, prepare_server
from servekit.server.settings import resolve

_settings = resolve()
try:
    ports.check_temp_dir()  # `docker run --read-only` without `--tmpfs /tmp`: one line, not a traceback
    ports.check_ports(_settings)  # one line naming the port and its variable, as `servekit serve` says
except (ports.NoTempDir, ports.PortTaken) as _refused:
    sys.exit(f"servekit: {_refused}")
if _settings.server != "gunicorn":
    print(f"servekit: SERVEKIT_SERVER={_settings.server} does not apply: this image's command runs gunicorn "
          f"(make it `servekit serve --server {_settings.server}` to change engines)", file=sys.stderr)
_cleanup = prepare_server(_settings)  # shared folders (metrics, request log, model hosts) before the workers fork
_servekit = ServekitApplication(_settings)
_defaults = Config()
for _name, _setting in _servekit.cfg.settings.items():
    if _setting.value != _defaults.settings[_name].value:
        globals()[_name] = _setting.value


def when_ready(server):
    """The start-up summary `servekit serve` logs: models, plugins, and which URL serves what."""
    models = sorted(discover(_settings.model_paths, _settings.model_name))
    names, not_installed = plugins.usable(plugins.describe(plugins.build_manager(_settings.plugin)))
    for line in ports.startup_lines(_settings, models, names, not_installed):
        server.log.info("%s", line)


def post_worker_init(worker):
    """Each worker follows the control plane's model set (also with preload), then servekit's own setup."""
    worker.wsgi.extensions["servekit.control"].start()
    _servekit._post_worker_init(worker)


def on_exit(server):
    """The master is leaving: stop model hosts and remove the shared folders, as ``servekit serve`` does."""
    _cleanup()
