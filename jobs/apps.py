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
        group_send((session_group(key), {"type": "session.ended"}))
