"""Runs, run configs, metric series, phase spans, alerts and clusters.

Empty for now: the control-plane issue fills it in.
"""
