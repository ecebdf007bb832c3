import logging

from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "RL jobs"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_logged_out

        user_logged_out.connect(close_sessions_sockets, dispatch_uid="jobs-close-sockets")


def close_sessions_sockets(sender, request, user, **kwargs) -> None:
    """Logging out closes the live sockets that login opened (jobs.consumers)."""
    from jobs.groups import group_send, session_group

    key = getattr(getattr(request, "session", None), "session_key", None)
    if key:
        try:
            group_send((session_group(key), {"type": "session.ended"}))
        except Exception:
            # The logout itself goes on (its session is flushed after this signal); the
            # sockets close before their next message (jobs.consumers: the session check).
            logging.getLogger(__name__).exception("logout: could not close its sockets")
