"""Views: pages.py (runs list, run detail); launch.py (new run, stop, fork)."""

from jobs.views.pages import index, run_detail

__all__ = ["index", "run_detail"]
