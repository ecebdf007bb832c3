"""An MLflow-compatible tracking endpoint, so anything that logs to MLflow (veRL, TRL's
and transformers' MLflowCallback, NeMo-RL, a script) reports into rlplane with

    MLFLOW_TRACKING_URI=http://<rlplane>/mlflow
    MLFLOW_TRACKING_TOKEN=<a run's ingest token, or an operator's API token>

The subset served (MLflow REST API 2.0, the paths mlflow-skinny 3.18's client calls for
set_experiment / start_run / log_params / log_metrics / set_tags / end_run):

    GET  api/2.0/mlflow/experiments/get-by-name  every name is an experiment (stateless:
    GET  api/2.0/mlflow/experiments/get          its id is its name, "0" is "Default")
    POST api/2.0/mlflow/experiments/create
    POST api/2.0/mlflow/runs/create              a run token: its own run; an operator's
                                                 token: a new external run
    GET  api/2.0/mlflow/runs/get
    POST api/2.0/mlflow/runs/update              FINISHED/FAILED/KILLED end the run
    POST api/2.0/mlflow/runs/log-batch           metrics -> one metrics event per step,
    POST api/2.0/mlflow/runs/log-metric            through the ingest path; params -> the
    POST api/2.0/mlflow/runs/log-parameter         run's params; tags -> params["mlflow"]
    POST api/2.0/mlflow/runs/set-tag
    POST api/2.0/mlflow/runs/log-inputs          accepted and dropped (datasets, models:
    POST api/2.0/mlflow/runs/log-model             rlplane keeps neither)
    POST api/2.0/mlflow/runs/outputs
    PUT  api/2.0/mlflow-artifacts/artifacts/rlplane/runs/<id>/<path>
                                                 an artifact upload (the runs' artifact_uri
                                                 points here): dropped, noted in the run's
                                                 log, so NeMo-RL's plots don't fail it

Anything else answers 404 ENDPOINT_NOT_FOUND in MLflow's error shape, so the client
raises a clear MlflowException (3.18 also asks api/3.0/mlflow/server-info, once, and
takes the 404 as "no extra features").
"""
