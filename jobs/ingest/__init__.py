"""The driver's door: what a run's engine sends and polls, with its run token.

    endpoints.py    POST /api/runs/<id>/events, GET .../controls (stop flag + live controls)
    batch.py        an event batch parsed and bounded before anything is stored
    store.py        do_ingest_events: store new events by (run, seq), derive the rows the
                    pages read, follow the engine's status, announce; alerts after commit
    bulk.py         metric points in bulk (PostgreSQL: COPY into a staging table, upsert)
"""
