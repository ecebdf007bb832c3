"""Alerts that name the cause. Pure rules over a run's history; rows, delivery and pages
around them:

    history.py     RunHistory (built from event payloads), RunFacts, Thresholds, Finding
    rules.py       one function per rule: (history, facts, thresholds, now) -> findings
    lifecycle.py   findings -> Alert rows: open, dedup, auto-resolve; notifications queued
    tasks.py       Celery: the periodic evaluation, notification delivery (claimed once)
    transports.py  webhook and email, one contract: raise TransportError or return None
    http.py        the one module that sends outgoing HTTP
    views.py       the alerts page, acknowledge / resolve; thresholds.py: per-preset form
"""
