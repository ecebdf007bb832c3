"""What the pages, the websockets and the REST API read: the database queries and the
figures made of them, one place for both doors.

    run_page.py     a run's charts, logs, facts and progress, read in one snapshot
    compare.py      runs side by side: summaries, config differences, overlaid charts
    inspector.py    one step's sampled rollouts, filtered and ordered
    planning.py     the planner fitted from a run's timed steps; predicted vs measured
"""
