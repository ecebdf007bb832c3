"""What an operator does to runs, and how a run gets onto the cluster.

    actions.py      do_launch_run, do_fork_run, do_stop_run, do_request_control, ...
    forms.py        a run's config from the launch and fork forms (TOML), field errors
    toml_lines.py   the line of a TOML text a dotted field path stands on
    queue.py        the capacity-aware queue: admit what fits, say why the rest waits
    submit.py       submit_run: the run's driver as a Ray job, once
    tasks.py        sync_runs (beat), stop_run, enforce_stop
"""
