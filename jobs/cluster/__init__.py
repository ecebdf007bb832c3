"""The Ray cluster as the control plane sees it.

    ray.py          the Ray job client, its auth, submission ids
    status.py       the cluster page's view: nodes, GPUs, live run jobs, what they hold
    processes.py    each live run's processes, CPU and memory from where they run
"""
