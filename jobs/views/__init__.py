"""Views: pages.py (run detail); runs_list.py (the list, archive, delete); launch.py (new
run, stop, fork); compare.py (runs side by side)."""

from jobs.views.pages import run_detail
from jobs.views.runs_list import index

__all__ = ["index", "run_detail"]
